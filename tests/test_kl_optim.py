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


def test_a_routine_gradient_is_included_on_webgl2_and_printed_for_the_cpu():
    """An optimizer whose gradient is a WebGL2 routine (Kernel.routine: a template beside its generic `kl`, as the
    dense and conv weight gradients become): its program includes the template, exactly the program of the template
    alone; its CPU record calls the generic kernel's printed function (record gradient.cpu) with that kernel's
    symbols and the routine's blocking constants (cpuBlocked deals the rows out), and ships no template twin."""
    import dataclasses

    from texelfit.codegen import kl
    from texelfit.codegen.kernels import render_kernel
    from texelfit.codegen.schedule import build_schedule, serialize
    from texelfit.prep.graph import to_ir
    from texelfit.codegen.webgl2.layout import plan_layout
    from texelfit.prep.load import export_simplified

    graph = to_ir(export_simplified(mlp_45_31_7(), (45,)), (45,), "float32")
    plan = plan_layout(graph, 16)
    s = build_schedule(graph, plan)
    p = next(p for p in s.optimizer["adam"] if p.kernel.gradient.template == "dense_grad_weight.glsl.j2")
    g = p.kernel.gradient
    generic = kl.KernelDef()  # (a stand-in for the generic kernel: its wiring, not its values, is checked here)
    scale = generic.sym("rows_of_x", 7)
    generic.out(kl.load("DZ", kl.ROW, kl.COL) * kl.to_float(scale) + kl.load("X", kl.ROW, kl.COL))
    routine = dataclasses.replace(g, kl=generic)
    assert routine.routine
    k = dataclasses.replace(p.kernel, gradient=routine)
    assert render_kernel(k) == render_kernel(p.kernel)
    s.optimizer = {"adam": [dataclasses.replace(p, kernel=k)]}
    kernels, _, generated = serialize(s, list(plan.textures))
    rec = next(r for r in kernels if r["name"] == k.name)
    fns = {f["id"]: f["fn"] for f in generated}
    assert "template" not in rec["gradient"] and rec["gradient"]["inputs"] == 2
    assert rec["consts"] == {"rows_of_x": 7, "blocked": g.consts["blocked"]}
    assert fns[rec["gradient"]["cpu"]].startswith("(c, [DZ, X], [out0], u, rows) =>")
    assert fns[rec["cpu"]].startswith("(c, [G, P0, P, M, V], [out0, out1, out2], u, rows) =>")
