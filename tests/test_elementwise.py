"""Elementwise ops (prep/elementwise.py), reductions, the blocks of mobile CNNs built from them, and softmax outputs,
against PyTorch: forward, every gradient, and optimizer trajectories, on WebGL2 (float32), in the rgba8
tier and on the CPU backend.

Every unary op runs twice in its model (models.Unary): on the input, as a pass of its own, and after a
conv, fused into it where its derivative reads its output alone. Tolerances are the README's:
  forward    atol 2e-5 + rtol 2e-4 * |ref|          gradients  atol 2e-6 + rtol 2e-4 * |ref|
  trajectories: losses TRAJ_LOSS, weights TRAJ_W (helpers.py)
"""
from __future__ import annotations

import re
import zlib

import pytest
import torch
import torch.nn.functional as F

from helpers import (FWD, GRAD, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, build_module, check_op,
                     check_training, run_model, torch_optimizer, torch_state)
from models import BLOCK_CASES, UNARY_FNS, UNARY_SHAPE, SoftmaxHead, unary_case
from texelfit.build import compile_onnx
from texelfit.prep.load import BuildError, export_simplified

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}


def _seed(case: str) -> int:
    return zlib.crc32(case.encode()) % 1000


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("case", sorted(UNARY_FNS))
def test_unary_forward_and_gradients(web, site, case, backend):
    check_op(web, site, f"unary_{case}", unary_case(case), UNARY_SHAPE, "cross_entropy", batch=5, seed=_seed(case),
             options=BACKENDS[backend])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("case", sorted(BLOCK_CASES))
def test_block_forward_and_gradients(web, site, case, backend):
    factory, shape = BLOCK_CASES[case]
    check_op(web, site, f"block_{case}", factory, shape, "cross_entropy", batch=6, seed=_seed(case),
             options=BACKENDS[backend])


def _named(factory, name):
    def make():
        return factory()
    make.__name__ = name
    return make


@pytest.mark.parametrize("case", sorted(BLOCK_CASES))
def test_block_trains_like_pytorch(web, site, case):
    """Adam over 2 epochs of 19 samples in batches of 8 (the last partial), losses and weights against torch."""
    factory, shape = BLOCK_CASES[case]
    check_training(web, site, _named(factory, case), shape, "adam", "cross_entropy", samples=19, batch_size=8,
                   epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=_seed(case))


@pytest.mark.parametrize("backend", ["cpu", "rgba8"])
@pytest.mark.parametrize("case", ["efficientnet_mbconv", "mobilenet_v3_block", "prelu", "unet_decoder", "resize_and_pad"])
def test_block_trains_like_pytorch_on_every_backend(web, site, case, backend):
    factory, shape = BLOCK_CASES[case]
    check_training(web, site, _named(factory, f"{case}_{backend}"), shape, "sgd_momentum_wd", "cross_entropy",
                   samples=11, batch_size=4, epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=_seed(case),
                   options=BACKENDS[backend])


def _kernels(module, shape) -> list[str]:
    js = compile_onnx(export_simplified(module, shape), name="m", input_shape=shape, max_batch=16).files["m.js"]
    return re.findall(r"// texelfit kernel: ([^\\]*?) \(generated", js)


def test_what_fuses_and_what_runs_on_its_own():
    """ReLU6 (its derivative in Y) fuses into the conv before it; HardSwish (its derivative needs X) runs as a
    pass of its own; SiLU and GELU are recognised as one op each (no sigmoid or erf pass, no product pass); a
    residual add passes its gradient on without a pass."""
    torch.manual_seed(0)
    k = _kernels(unary_case("relu6")(), UNARY_SHAPE)
    assert any(n.startswith("conv_forward") and n.endswith(" clip") for n in k), k
    assert sum(n.startswith("elementwise_forward clip") for n in k) == 1, k  # the one on the input
    k = _kernels(unary_case("hardswish")(), UNARY_SHAPE)
    assert sum(n.startswith("elementwise_forward hardswish") for n in k) == 2, k
    k = _kernels(unary_case("silu")(), UNARY_SHAPE)
    assert sum(n.startswith("elementwise_forward silu") for n in k) == 2, k
    assert not any("sigmoid" in n or "elementwise_forward mul" in n for n in k), k
    k = _kernels(unary_case("gelu")(), UNARY_SHAPE)  # GELU's 5 nodes as one op (prep/fuse.py: fuse_gelu)
    assert sum(n.startswith("elementwise_forward gelu") for n in k) == 2, k
    assert sum(n.startswith("elementwise_grad d0 gelu") for n in k) == 1, k
    assert not any(w in n for n in k for w in ("erf", "elementwise_forward mul", "elementwise_forward div")), k
    k = _kernels(unary_case("gelu_tanh")(), UNARY_SHAPE)  # (its tanh form stays as it is)
    assert not any(n.startswith("elementwise_forward gelu") for n in k), k
    factory, shape = BLOCK_CASES["mobilenet_v2_inverted_residual"]
    k = _kernels(factory(), shape)
    assert any(n.startswith("elementwise_forward add") for n in k), k
    assert not any(n.startswith("elementwise_grad") for n in k), k  # both operands take dY as it is


class _ErfChain(torch.nn.Module):
    """x * (erf(x / d) + 1) * 0.5 through a conv: GELU where d is sqrt 2; `shared`: erf's output read again."""

    def __init__(self, d=2 ** 0.5, shared=False):
        super().__init__()
        self.conv, self.d, self.shared = torch.nn.Conv2d(3, 4, 3), d, shared

    def forward(self, x):
        y = self.conv(x)
        e = torch.erf(y / self.d)
        out = y * (e + 1) * 0.5
        return (out + e if self.shared else out).mean((2, 3))


@pytest.mark.parametrize("case,fused", [("gelu", True), ("other_constant", False), ("erf_read_again", False)])
def test_gelu_is_fused_only_where_it_is_gelu(case, fused):
    """prep/fuse.py: fuse_gelu takes the five layers for one only where they compute GELU (the divisor sqrt 2, the
    constants 1 and 0.5) and nothing else reads what is between them; else they stay as they are."""
    from texelfit.prep.fuse import fuse_activations
    from texelfit.prep.graph import to_ir

    module = {"gelu": _ErfChain(), "other_constant": _ErfChain(d=1.5), "erf_read_again": _ErfChain(shared=True)}[case]
    ops = [layer.op for layer in fuse_activations(to_ir(export_simplified(module.eval(), (3, 7, 6)))).layers]
    assert ("gelu" in ops) == fused and ("erf" in ops) != fused, ops


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_a_model_ending_in_softmax_predicts_it_and_trains_on_its_logits(web, site, log):
    """predict returns the probabilities (log-probabilities); gradients and an SGD trajectory are those of
    cross_entropy on the logits entering the softmax (CrossEntropyLoss of the logits, NLLLoss of the
    log-probabilities); the softmax inside the model is differentiated through."""
    torch.manual_seed(3)
    module = SoftmaxHead(log=log).eval()
    shape = (3, 11, 9)
    url = build_module(site, f"softmax_out_{log}", module, shape)
    x = torch.randn(12, *shape)
    y = torch.randint(0, 5, (12,))
    cfg = OPTIMIZERS["sgd_momentum_wd"]
    got = run_model(web, url, """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const out = Array.from(await m.predict(x, 12));
        const grads = arr(await m.gradients(x, y));
        const fit = await m.fit(x, y, { batchSize: 5, epochs: 2, shuffle: false, optimizer: args.cfg });
        return { out, grads, loss: fit.loss, weights: arr(await m.getWeights()), losses: m.info.loss };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "cfg": cfg})
    assert_close("softmax model output", got["out"], module(x).detach().numpy(), **FWD)
    module.zero_grad()
    ref = F.nll_loss(module(x), y) if log else F.cross_entropy(module.logits(x), y)
    ref.backward()
    for name, p in module.named_parameters():
        assert_close(f"d cross_entropy / d {name}", got["grads"][name], p.grad.numpy(), **GRAD)
    opt = torch_optimizer(cfg, module.parameters())
    losses = []
    for _ in range(2):
        for s in range(0, 12, 5):
            opt.zero_grad()
            value = F.cross_entropy(module.logits(x[s:s + 5]), y[s:s + 5])
            value.backward()
            opt.step()
            losses.append(value.item())
    assert_close("softmax model losses", got["loss"], losses, **TRAJ_LOSS)
    for name, ref_w in torch_state(module).items():
        assert_close(f"softmax model {name} after 6 steps", got["weights"][name], ref_w, **TRAJ_W)


def test_unsupported_ops_are_listed_all_at_once_with_their_modules():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(6)
            self.gn = torch.nn.GroupNorm(2, 4)
            self.conv = torch.nn.Conv2d(4, 4, 1)

        def forward(self, x):
            y = self.gn(self.conv(x))  # (GroupNorm builds: InstanceNormalization is lowered, prep/normalization.py)
            return self.ln(y.flatten(2).prod(-1).repeat(1, 2)[:, :6] + torch.logsumexp(y.flatten(2), -1).repeat(1, 2)[:, :6])

    with pytest.raises(BuildError) as e:
        compile_onnx(export_simplified(Net(), (4, 3, 3)), name="m", input_shape=(4, 3, 3))
    msg = str(e.value)
    assert "unsupported ONNX ops " in msg, msg
    for op, hint in (("ReduceLogSumExp", "torch.logsumexp"), ("ReduceProd", "Tensor.prod")):
        assert f"{op} (from {hint}) at node" in msg, msg
    assert "supported ops: Gemm" in msg, msg
