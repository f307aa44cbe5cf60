"""Training convolutional networks: trajectories against PyTorch, and folding past a forced
texture limit, which must not change what is computed.

Tolerances as in test_train.py: weights atol 2e-5 + rtol 2e-4 * |ref|, losses atol 1e-5 + rtol 1e-4.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import TRAJ_LOSS, TRAJ_W, assert_close, build_module, check_training, run_model
from models import ResidualCNN, ShuffleNetTiny, SmallCNN, blocked_cnn

SHAPE = (1, 12, 12)


def small_cnn():
    return SmallCNN(1, 10)


@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum_wd"])
def test_small_cnn_trajectory(web, site, opt_name):
    # 2 epochs of 21 samples in batches of 8 (8, 8, 5)
    check_training(web, site, small_cnn, SHAPE, opt_name, "cross_entropy", samples=21, batch_size=8, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("opt_name", ["adamw", "sgd_nesterov"])
def test_residual_cnn_trajectory(web, site, opt_name):
    check_training(web, site, ResidualCNN, SHAPE, opt_name, "cross_entropy", samples=21, batch_size=8, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum_wd"])
def test_sample_blocked_cnn_trajectory(web, site, opt_name):
    # batches of 10 (a block of 8 samples and 2 more), the last of 3 (the one-sample twins)
    check_training(web, site, blocked_cnn, SHAPE, opt_name, "cross_entropy", samples=23, batch_size=10, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum_wd"])
def test_shufflenet_units_trajectory(web, site, opt_name):
    # channel split (chunk), concat and channel shuffle (gather passes) on the path of every weight
    check_training(web, site, ShuffleNetTiny, (3, 13, 11), opt_name, "cross_entropy", samples=21, batch_size=8,
                   epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


def wide_mlp():
    return torch.nn.Sequential(torch.nn.Linear(300, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))


@pytest.mark.parametrize("factory,shape,limit", [(small_cnn, SHAPE, 64), (ResidualCNN, SHAPE, 64),
                                                 (wide_mlp, (300,), 64), (blocked_cnn, SHAPE, 80),
                                                 (ShuffleNetTiny, (3, 13, 11), 48)],
                         ids=["small_cnn", "residual_cnn", "wide_mlp", "blocked_cnn", "shufflenet"])
def test_forced_texture_limit_folds_and_changes_nothing(web, site, factory, shape, limit):
    # maxBatch 8: the 12x12 activations are 8*12 = 96 rows, the MLP's input 75 texels wide: over the limit
    # (blocked_cnn's 16-channel activation, 48x96 texels, needs more than 64x64)
    kw = dict(samples=21, batch_size=8, epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, max_batch=8)
    plain = check_training(web, site, factory, shape, "adam", "cross_entropy", **kw)
    folded = check_training(web, site, factory, shape, "adam", "cross_entropy", options={"maxTextureSize": limit},
                            **kw)
    assert folded["info"]["maxTextureSize"] == limit and plain["info"]["maxTextureSize"] > limit
    assert folded["folded"] > 0, "nothing was folded: the test would not test folding"
    assert_close("losses folded vs not", folded["loss"], plain["loss"], atol=1e-6, rtol=1e-6)
    for name in plain["weights"]:
        assert_close(f"{name} folded vs not", folded["weights"][name], plain["weights"][name], atol=1e-6, rtol=1e-6)
    torch.manual_seed(3)
    x = torch.randn((8,) + shape)
    url = build_module(site, "folded_predict", factory(), shape, max_batch=8)
    preds = [run_model(web, url, "return Array.from(await m.predict(new Float32Array(args), 8));",
                       x.reshape(-1).tolist(), opts) for opts in ({}, {"maxTextureSize": limit})]
    np.testing.assert_array_equal(preds[0], preds[1])
