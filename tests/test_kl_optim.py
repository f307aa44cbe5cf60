"""The optimizers printed from the kernel language (codegen/ops/optim.py) on the CPU backend: every optimizer of
helpers.OPTIMIZERS and fit's proximal term against torch.optim, where the other CPU trajectories
(test_cpu_backend.py) take four of them and no proximal term (test_train.py runs all on WebGL2). The update's
gradient is a template's twin (dense_grad_weight, conv_grad_weight), a printed kernel (the bias gradients), or
a sample-blocked pass's interleave (the MLP at batch 14); tolerances as everywhere (helpers: TRAJ_W, TRAJ_LOSS)."""
from __future__ import annotations

import pytest

from helpers import OPTIMIZERS, TRAJ_LOSS, TRAJ_W, check_training
from models import SmallCNN, mlp_45_31_7, sample_blocked_mlp

CPU = {"backend": "cpu"}


@pytest.mark.parametrize("mu", [0.0, 0.5])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_cpu_trajectory_of_every_optimizer(web, site, opt_name, mu):
    got = check_training(web, site, mlp_45_31_7, (45,), opt_name, "cross_entropy", samples=50, batch_size=16,
                         epochs=3, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, mu=mu, options=CPU)
    assert got["info"]["backend"] == "cpu"


@pytest.mark.parametrize("opt_name", ["sgd_nesterov", "adamw"])
def test_cpu_proximal_trajectory_sample_blocked(web, site, opt_name):
    # batches of 14 run the blocked passes (their gradient: interleave), the last of 5 the one-sample twins
    got = check_training(web, site, sample_blocked_mlp, (45,), opt_name, "cross_entropy", samples=33, batch_size=14,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, mu=0.5, options=CPU)
    assert got["info"]["backend"] == "cpu"


def small_cnn():  # (test_cpu_backend's: one name, one bundle)
    return SmallCNN(1, 10)


@pytest.mark.parametrize("opt_name", ["sgd_dampening", "adam"])
def test_cpu_proximal_trajectory_cnn(web, site, opt_name):
    got = check_training(web, site, small_cnn, (1, 12, 12), opt_name, "cross_entropy", samples=21, batch_size=8,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, mu=0.5, options=CPU)
    assert got["info"]["backend"] == "cpu"
