"""The dense layer's WebGL2 routines (the hand templates: sample-blocked, split-K) against its generic kernels (the
kernel language, codegen/ops/dense.py), which the CPU backend runs: one bundle, the same weights and batches on both
backends, the outputs, every gradient and a training trajectory compared with each other and with PyTorch.

The model (300 -> 64 tanh -> 256 relu -> 7): its first layer is split-K (75 input texels: 5 parts) and
sample-blocked, the second sample-blocked with the first's tanh gradient fused into its grad_input (dact), the last
split-K (4 parts). At a batch of 3 the one-sample and split passes run, at 10 the blocked ones (a block of 8 and 2
more) and the optimizers read the blocked weight gradients through the interleave (ops/optim.py). On WebGPU (a bundle
built with --webgpu) the same model runs the one-sample passes with the vectorised kernels (several samples, or rows
of dW, an invocation) and the split-K layers' one-pass forward in place of their split passes (Pass.webgpu); those
kernels also run printed as JavaScript against the generic ones on odd shapes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import (FIT, FWD, GRAD, TRAJ_LOSS, TRAJ_W, assert_close, build_module, run_kl_js, run_model, torch_fit,
                     torch_state)
from texelfit.codegen.ops import dense
from texelfit.codegen.schedule import build_schedule
from texelfit.prep.fuse import fuse_activations
from texelfit.prep.graph import to_ir
from texelfit.codegen.webgl2.blocking import BLOCK_MIN_BATCH
from texelfit.codegen.webgl2.layout import plan_layout
from texelfit.prep.load import export_simplified

SHAPE = (300,)


def routed_mlp():
    return nn.Sequential(nn.Linear(300, 64), nn.Tanh(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 7))


def test_the_model_schedules_the_routines():
    """(What the comparisons below rely on: the bundle's passes are the blocked and split-K routines, each with its
    generic kernel.)"""
    torch.manual_seed(0)
    graph = fuse_activations(to_ir(export_simplified(routed_mlp(), SHAPE), SHAPE, "float32"))
    s = build_schedule(graph, plan_layout(graph, 64))
    names = {p.kernel.name for p in s.forward + s.backward + [p for ps in s.optimizer.values() for p in ps]}
    routines = {p.kernel.name for p in s.forward + s.backward if p.kernel.routine}
    for what in ("dense_forward 300->64 tanh blocked", "dense_forward 300->64 tanh split",
                 "dense_reduce 300->64 tanh", "dense_forward 256->7 split", "dense_reduce 256->7",
                 "dense_forward 64->256 relu blocked", "dense_grad_input 64->256 tanh blocked",
                 "dense_grad_weight blocked", "dense_grad_weight", "interleave"):
        assert any(n.startswith(what) for n in routines), (what, sorted(routines))
    dact = [p for p in s.backward if p.kernel.name.startswith("dense_grad_input") and p.kernel.consts.get("dact")]
    assert len(dact) == 3 and all(p.kernel.kl is not None for p in dact)  # (relu into the last, tanh both twins)
    assert any(n.startswith("adam interleave") for n in names) and any(n.startswith("adam dense_grad_weight")
                                                                           for n in names)
    # WebGPU's passes: the split layers' one-pass forward (theirs alone), the split ones everyone else's
    mine = [p.kernel.name for p in s.forward if p.webgpu]
    assert mine == ["dense_forward 300->64 tanh", "dense_forward 256->7"], mine
    assert sorted(p.kernel.name.split(" split")[0] for p in s.forward if p.webgpu is False) == \
        ["dense_forward 256->7", "dense_forward 300->64 tanh", "dense_reduce 256->7", "dense_reduce 300->64 tanh"]


def _tex(a: np.ndarray, rows: int, past: float = np.nan) -> np.ndarray:
    """[n, f] -> the texture [rows, ceil(f/4), 4]: padding lanes zero, rows past n `past` (a batch's: NaN, never
    read; a weight's padding rows: zero)."""
    n, f = a.shape
    t = np.full((rows, -(-f // 4) * 4), past)
    t[:n] = 0.0
    t[:n, :f] = a
    return t.reshape(rows, -1, 4).astype(np.float32)


@pytest.mark.parametrize("o", [6, 13])
def test_vectorised_kernels_compute_what_the_generic_ones_do(o):
    """WebGPU's vectorised dense kernels (ops/dense.py: the forward and grad_input 8 samples an invocation, the
    last block past the batch, the forward 1 or FORWARD_COLS output texels of each, grad_weight 4, 8 or 16 rows of dW: each its out4 allows), printed as JavaScript,
    against the generic kernels on the same inputs and against PyTorch: 9 inputs (a last texel of 1 lane), 6 or 13
    outputs, 11 samples of a texture of 16 (rows past them NaN), a fused tanh and the gradient of the layer before's
    tanh (dact)."""
    g = torch.Generator().manual_seed(3)
    i, n, rows, scale = 9, 11, 16, 4.0
    out4 = -(-o // 4)
    c = dict(in_features=i, out_features=o, in4=3, out4=out4, has_bias=True)
    zp = torch.randn(n, i, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(o, i, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(o, generator=g, dtype=torch.float64)
    x = torch.tanh(zp)
    z = x @ w.T + b
    y = torch.tanh(z)
    dz = torch.randn(n, o, generator=g, dtype=torch.float64)
    dzp, dw = torch.autograd.grad(z, (zp, w), dz)
    xs, ws = _tex(x.detach().numpy(), rows), _tex(w.detach().numpy(), 4 * out4, 0.0)
    u = {"u_batch": n, "u_loss_scale": scale}
    fwd_in = {"X": xs, "W": ws, "B": _tex(b.numpy()[None], 1)}
    gi_in = {"DZ": _tex(dz.numpy(), rows), "W": ws, "Y": xs}
    gw_in = {"DZ": _tex(dz.numpy() * scale, rows), "X": xs}
    runs = [(dense.forward_vec_kl(c, "tanh", {}, dense.ROWS, cols), dense.forward_kl(c, "tanh", {}), fwd_in, out4, n,
             dense.ROWS, y, cols) for cols in (1, dense.FORWARD_COLS)]
    runs += [(dense.grad_input_vec_kl(c, ("tanh", {})), dense.grad_input_kl(c, ("tanh", {})), gi_in, 3, n,
              dense.ROWS, dzp, 1),
             *((dense.grad_weight_vec_kl(t), dense.grad_weight_kl(), gw_in, 3, 4 * out4, 4 * t, dw, 1)
               for t in (1, 2, 4) if out4 % t == 0)]
    assert len(runs) == 3 + {6: 2, 13: 3}[o] and dense.grad_weight_texels(out4) == {6: 2, 13: 4}[o]
    for vec, generic, ins, width, count, block, ref, cols in runs:
        got, want = run_kl_js(vec, ins, width, count, u, block, cols), run_kl_js(generic, ins, width, count, u)
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        flat = got.reshape(count, -1)
        assert not flat[:, ref.shape[1]:].any() and not flat[ref.shape[0]:].any(), "padding lanes and rows are zero"
        np.testing.assert_allclose(flat[:ref.shape[0], :ref.shape[1]], ref.detach().numpy(), rtol=1e-5, atol=1e-5)


OPS = """
    const x = new Float32Array(args.x), y = Int32Array.from(args.y);
    const out = Array.from(await m.predict(x, args.batch));
    const grads = arr(await m.gradients(x, y, { loss: 'cross_entropy' }));
    return { out, grads, backend: m.info.backend };
"""


@pytest.mark.parametrize("batch", [3, BLOCK_MIN_BATCH + 2])
def test_forward_and_gradients_webgl2_vs_cpu(web, site, batch):
    torch.manual_seed(batch)
    module = routed_mlp().eval()
    g = torch.Generator().manual_seed(batch)
    x = torch.randn((batch,) + SHAPE, generator=g)
    y = torch.randint(0, 7, (batch,), generator=g)
    url = build_module(site, "kl_dense_ops", module, SHAPE, max_batch=64)
    args = {"x": x.reshape(-1).tolist(), "y": y.tolist(), "batch": batch}
    gl = run_model(web, url, OPS, args, {"backend": "webgl2"})
    cpu = run_model(web, url, OPS, args, {"backend": "cpu"})
    assert (gl["backend"], cpu["backend"]) == ("webgl2", "cpu")
    module.zero_grad()
    out = module(x)
    F.cross_entropy(out, y).backward()
    assert_close("forward: WebGL2 routines vs CPU generic", gl["out"], np.asarray(cpu["out"]), **FWD)
    for side, got in (("webgl2", gl), ("cpu", cpu)):
        assert_close(f"{side} forward", got["out"], out.detach().numpy(), **FWD)
    for name, p in module.named_parameters():
        assert_close(f"d/d{name}: WebGL2 routines vs CPU generic", gl["grads"][name], np.asarray(cpu["grads"][name]),
                     **GRAD)
        for side, got in (("webgl2", gl), ("cpu", cpu)):
            assert_close(f"{side} d/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)


def _fit_case(site, folder: str, opt: dict, webgpu: bool = False):
    """A fresh model (PyTorch's initialisation) served as a bundle, 23 samples, and FIT's arguments: 2 epochs of
    batches of 10 and a last one of 3 with `opt`."""
    torch.manual_seed(11)
    module = routed_mlp()
    url = build_module(site, folder, module, SHAPE, max_batch=16, webgpu=webgpu)
    samples, batch_size, epochs = 23, BLOCK_MIN_BATCH + 2, 2
    x = torch.randn((samples,) + SHAPE)
    y = torch.randint(0, 7, (samples,))
    args = {"x": x.reshape(-1).tolist(), "y": y.tolist(), "loss": "cross_entropy", "optimizer": opt,
            "batchSize": batch_size, "epochs": epochs, "shuffle": False, "ids": False, "mu": 0.0}
    return module, url, x, y, args


@pytest.mark.parametrize("opt", [{"type": "adam", "lr": 1e-2, "weightDecay": 1e-2},
                                 {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weightDecay": 1e-3},
                                 {"type": "sgd", "lr": 0.1}], ids=["adam", "sgd_momentum", "sgd"])
def test_training_webgl2_vs_cpu(web, site, opt):
    """From a fresh model (PyTorch's initialisation), batches of 10 (blocked: the optimizers include the
    interleave of the blocked weight gradients) and a last one of 3 (the one-sample and split passes, the
    optimizers the plain weight gradient): each step's loss and the weights at the end, both backends against
    each other and against PyTorch."""
    module, url, x, y, args = _fit_case(site, "kl_dense_train", opt)
    batch_size, epochs = args["batchSize"], args["epochs"]
    gl = run_model(web, url, FIT, args, {"backend": "webgl2"})
    cpu = run_model(web, url, FIT, args, {"backend": "cpu"})
    assert (gl["info"]["backend"], cpu["info"]["backend"]) == ("webgl2", "cpu")
    ref_losses = torch_fit(module, x, y, "cross_entropy", opt, batch_size, epochs)
    assert len(gl["loss"]) == len(cpu["loss"]) == epochs * 3
    assert_close("losses: WebGL2 vs CPU", gl["loss"], np.asarray(cpu["loss"]), **TRAJ_LOSS)
    for side, got in (("webgl2", gl), ("cpu", cpu)):
        assert_close(f"{side} losses", got["loss"], ref_losses, **TRAJ_LOSS)
    for name, ref in torch_state(module).items():
        assert_close(f"{name}: WebGL2 vs CPU", gl["weights"][name], np.asarray(cpu["weights"][name]).reshape(-1),
                     **TRAJ_W)
        for side, got in (("webgl2", gl), ("cpu", cpu)):
            assert_close(f"{side} {name} after the fit", np.asarray(got["weights"][name]).reshape(-1),
                         ref.reshape(-1), **TRAJ_W)


@pytest.mark.parametrize("batch", [3, BLOCK_MIN_BATCH + 2])
def test_forward_and_gradients_on_webgpu(webgpu_web, site, batch):
    """The model on WebGPU: its one-sample passes' vectorised kernels and the split-K layers' one-pass forward, at a
    batch within one block of 8 samples and past it, against PyTorch; and the same bundle on WebGL2 (which runs the
    split passes, never WebGPU's one pass)."""
    torch.manual_seed(batch)
    module = routed_mlp().eval()
    g = torch.Generator().manual_seed(batch)
    x = torch.randn((batch,) + SHAPE, generator=g)
    y = torch.randint(0, 7, (batch,), generator=g)
    url = build_module(site, "kl_dense_webgpu", module, SHAPE, max_batch=64, webgpu=True)
    args = {"x": x.reshape(-1).tolist(), "y": y.tolist(), "batch": batch}
    got = {b: run_model(webgpu_web, url, OPS, args, {"backend": b}) for b in ("webgpu", "webgl2")}
    assert [g["backend"] for g in got.values()] == ["webgpu", "webgl2"]
    module.zero_grad()
    out = module(x)
    F.cross_entropy(out, y).backward()
    for b, g in got.items():
        assert_close(f"{b} forward", g["out"], out.detach().numpy(), **FWD)
        for name, p in module.named_parameters():
            assert_close(f"{b} d/d{name}", g["grads"][name], p.grad.numpy(), **GRAD)


def test_training_on_webgpu(webgpu_web, site):
    """From a fresh model, batches of 10 and a last one of 3 with Adam on WebGPU (the optimizers' gradients the
    vectorised weight gradient): each step's loss and the weights at the end against PyTorch."""
    opt = {"type": "adam", "lr": 1e-2, "weightDecay": 1e-2}
    module, url, x, y, args = _fit_case(site, "kl_dense_train_webgpu", opt, webgpu=True)
    got = run_model(webgpu_web, url, FIT, args, {"backend": "webgpu"})
    assert got["info"]["backend"] == "webgpu"
    assert_close("webgpu losses", got["loss"],
                 torch_fit(module, x, y, "cross_entropy", opt, args["batchSize"], args["epochs"]), **TRAJ_LOSS)
    for name, ref in torch_state(module).items():
        assert_close(f"webgpu {name} after the fit", np.asarray(got["weights"][name]).reshape(-1), ref.reshape(-1),
                     **TRAJ_W)
