"""Training parity with PyTorch: one step of each optimizer, and whole trajectories.

Same initial weights, same batches in the same order (shuffle: false, the last batch
partial), same settings; compared tensor by tensor and loss by loss, driven from a list.

Tolerances (float32 on both sides, summation order differs; errors grow with steps):
  one step      weights atol 1e-6 + rtol 1e-5 * |ref|
  trajectory    weights atol 2e-5 + rtol 2e-4 * |ref|, losses atol 1e-5 + rtol 1e-4
"""
from __future__ import annotations

import pytest

from helpers import ONE_STEP, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, check_training
from models import mlp_45_31_7, sample_blocked_mlp

@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_one_step(web, site, opt_name):
    check_training(web, site, mlp_45_31_7, (45,), opt_name, "cross_entropy", samples=13, batch_size=13, epochs=1,
                   tol_w=ONE_STEP, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("opt_name", ["sgd_momentum_wd", "sgd_nesterov", "adam", "adamw"])
def test_trajectory(web, site, opt_name, loss):
    # 50 samples in batches of 16: 16, 16, 16 and a partial 2, for 3 epochs = 12 steps
    check_training(web, site, mlp_45_31_7, (45,), opt_name, loss, samples=50, batch_size=16, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


def test_long_trajectory_reads_losses_across_the_ring(web, site):
    # 150 steps: more than two loss-ring readbacks (64 steps each) plus a partial one
    check_training(web, site, mlp_45_31_7, (45,), "adam", "cross_entropy", samples=50, batch_size=1, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("opt_name", ["sgd_momentum_wd", "adam"])
def test_trajectory_with_a_sample_blocked_layer(web, site, opt_name):
    # batches of 14 (a block of 8 samples and 6 more), the last of 5 (below 8: the one-sample twins);
    # 2 epochs = 8 steps, switching between the two kinds of passes and their optimizer passes
    check_training(web, site, sample_blocked_mlp, (45,), opt_name, "cross_entropy", samples=47, batch_size=14,
                   epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)
