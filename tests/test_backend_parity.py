"""The CPU backend (runtime/cpu.js) and the WebGPU backend (runtime/webgpu.js, a bundle built with --webgpu): the
same schedule as WebGL2, in plain JavaScript and in WGSL compute shaders, each kernel printed from its one
declaration. The parity checks of test_ops.py, test_cnn_ops.py, test_train.py and test_cnn_train.py are re-run on
each through the same helpers with createModel({ backend }), with the same tolerances:
  forward    atol 2e-5 + rtol 2e-4 * |ref|       gradients  atol 2e-6 + rtol 2e-4 * |ref|
  trajectory weights atol 2e-5 + rtol 2e-4 * |ref|, losses atol 1e-5 + rtol 1e-4
WebGPU runs in a Chromium with --enable-unsafe-webgpu (SwiftShader's adapter; conftest.webgpu_web: a missing
adapter fails, it is no skip). The API around each backend: test_cpu_backend.py, test_webgpu_backend.py.
"""
from __future__ import annotations

import zlib

import pytest

from helpers import TRAJ_LOSS, TRAJ_W, check_op, check_training
from models import (BLOCKED_BATCH, BLOCKED_CASES, CNN_CASES, OP_CASES, ShuffleNetTiny, SmallCNN, mlp_45_31_7,
                    sample_blocked_mlp)


@pytest.fixture(params=["cpu", "webgpu"])
def backend(request):
    """(createModel's options, a page of a browser that runs the backend)."""
    page = request.getfixturevalue("web" if request.param == "cpu" else "webgpu_web")
    return {"backend": request.param}, page


def _seed(case):
    return zlib.crc32(case.encode()) % 1000


# ---- ops: forward and every gradient -------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_cross_entropy(backend, site, case):
    factory, shape = OP_CASES[case]
    check_op(backend[1], site, case, factory, shape, "cross_entropy", batch=11, seed=_seed(case), options=backend[0])


@pytest.mark.parametrize("case", ["linear_relu_linear", "sigmoid_output", "unfused_activations", "matmul_add"])
def test_op_mse(backend, site, case):
    factory, shape = OP_CASES[case]
    check_op(backend[1], site, case, factory, shape, "mse", batch=11, seed=_seed(case), options=backend[0])


@pytest.mark.parametrize("case", sorted(CNN_CASES))
def test_cnn_op(backend, site, case):
    factory, shape, loss = CNN_CASES[case]
    batch = BLOCKED_BATCH if case in BLOCKED_CASES else 3  # (the blocked passes run from 8 samples on)
    check_op(backend[1], site, case, factory, shape, loss, batch=batch, seed=_seed(case), options=backend[0])


# ---- training trajectories -----------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("opt_name", ["sgd", "sgd_momentum_wd", "adam", "adamw"])
def test_mlp_trajectory(backend, site, opt_name, loss):
    # 50 samples in batches of 16 (the last one partial), 3 epochs = 12 steps
    got = check_training(backend[1], site, mlp_45_31_7, (45,), opt_name, loss, samples=50, batch_size=16, epochs=3,
                         tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=backend[0])
    assert got["info"]["backend"] == backend[0]["backend"]


def test_sample_blocked_mlp_trajectory(backend, site):
    # batches of 14 run the blocked passes, the last of 5 the one-sample twins
    got = check_training(backend[1], site, sample_blocked_mlp, (45,), "adam", "cross_entropy", samples=47, batch_size=14,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=backend[0])
    assert got["info"]["backend"] == backend[0]["backend"]


def small_cnn():
    return SmallCNN(1, 10)


def test_small_cnn_trajectory(backend, site):
    got = check_training(backend[1], site, small_cnn, (1, 12, 12), "adam", "cross_entropy", samples=21, batch_size=8,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=backend[0])
    assert got["info"]["backend"] == backend[0]["backend"]


def test_shufflenet_units_trajectory(backend, site):
    got = check_training(backend[1], site, ShuffleNetTiny, (3, 13, 11), "adam", "cross_entropy", samples=21, batch_size=8,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=backend[0])
    assert got["info"]["backend"] == backend[0]["backend"]
