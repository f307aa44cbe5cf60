"""Every op of convolutional networks, forward and gradient, against PyTorch autograd.

Odd shapes: 3 and 5 channels, 13x11 images, stride 2, padding 1, (0, 2) and asymmetric, dilation 2,
groups 1, 2 and depthwise, ceil_mode both ways, batch 7 (a group of 4 samples and 3 more; the
sample-blocked case at models.BLOCKED_BATCH, where its blocked passes run);
driven from models.CNN_CASES through the one `check_op` helper. Tolerances as in test_ops.py:
  forward    atol 2e-5 + rtol 2e-4 * |ref|
  gradients  atol 2e-6 + rtol 2e-4 * |ref|
"""
from __future__ import annotations

import zlib

import pytest
import torch

from helpers import (FWD, TRAJ_LOSS, TRAJ_W, assert_close, build_module, check_op, check_training, predict_draws,
                     run_model)
from models import BLOCKED_BATCH, BLOCKED_CASES, CNN_CASES, BatchNormNet, ColumnChain
from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified


@pytest.mark.parametrize("case", sorted(CNN_CASES))
def test_forward_and_gradients(web, site, case):
    factory, shape, loss = CNN_CASES[case]
    batch = BLOCKED_BATCH if case in BLOCKED_CASES else 7
    check_op(web, site, case, factory, shape, loss, batch=batch, seed=zlib.crc32(case.encode()) % 1000)


def test_conv_sample_blocked_case_is_blocked():
    factory, shape, _ = CNN_CASES["conv_sample_blocked"]
    result = compile_onnx(export_simplified(factory(), shape), name="m", input_shape=shape, max_batch=64)
    blocked = sorted(t["name"] for t in result.report["textures"] if t["name"].startswith("blk0:"))
    assert [n.split(":")[1] for n in blocked] == ["act", "act", "grad", "pgrad"], blocked  # 2 forwards, 1 grad_input, 1 dW


def test_conv_column_blocked_case_is_blocked():
    factory, shape, _ = CNN_CASES["conv_column_blocked"]
    result = compile_onnx(export_simplified(factory(), shape), name="m", input_shape=shape, max_batch=8)
    parts = [t for t in result.report["textures"] if t["name"].startswith("col0:")]
    assert len(parts) == 4, [t["name"] for t in parts]  # every conv's one-sample forward: 4 positions a fragment
    # ceil(w / 4) * ceil(ceil(c / 4) / 2): a half of the channel texels
    assert sorted(t["texture"][0] for t in parts) == [3 * 3, 5 * 4, 5 * 6, 5 * 6]
    names = {t["name"] for t in result.report["textures"]}
    assert all(n.replace("col0:", f"col{k}:") in names for n in {t["name"] for t in parts} for k in range(8))
    assert not any(n.startswith("col8:") for n in names)


COLUMN_TRUNK = ("stem.*", "expand.*", "dw.*", "down.*", "project.*", "mix.*")
CHAIN = (3, 23, 23)


def test_frozen_convs_keep_column_parts_for_the_convs_that_read_them():
    """blocking.column_only: frozen, the stem, expand, dw and down outputs are their 8 parts alone (no act:
    texture); trainable, every conv output has its usual texture (the backward reads it)."""
    m = ColumnChain().eval()
    onnx_model = export_simplified(m, CHAIN)

    def textures(trainable):
        r = compile_onnx(onnx_model, name="m", input_shape=CHAIN, max_batch=8, trainable=trainable)
        return [t["name"] for t in r.report["textures"]], r.files["m.js"]
    frozen, js = textures("fc.*")
    trainable, _ = textures("*")
    assert sum(n.startswith("col0:") for n in frozen) == sum(n.startswith("col0:") for n in trainable) == 6
    gone = {n[len("col0:"):] for n in trainable if n.startswith("col0:")} - set(frozen)
    assert len(gone) == 4, gone  # the project and mix outputs feed the add: interleaved
    # the readers of those: expand and project (1x1), dw and down (depthwise, stride 1 and 2)
    for kernel in ("34x23x23->90x23x23 k1x1 s1x1 g1 columns, read as columns",
                   "90x23x23->90x23x23 k5x5 s1x1 g90 tanh columns, read as columns",
                   "90x23x23->90x12x12 k5x5 s2x2 g90 relu columns, read as columns",
                   "90x12x12->48x12x12 k1x1 s1x1 g1 columns, read as columns"):
        assert f"// texelfit kernel: conv_forward {kernel} (generated" in js, kernel
    assert "48x12x12->48x12x12 k1x1 s1x1 g1 columns, read as columns" not in js  # project's output feeds the add


@pytest.mark.parametrize("backend", ["webgl", "cpu", "rgba8", "webgl-4-targets"])
def test_convs_reading_column_parts_match_pytorch(web, site, backend):
    """The frozen chain's predict (convs reading their input's column parts: 1x1 and depthwise, stride 1 and
    2, padded, a partial last block) equals PyTorch's, with 4 draws fewer than the trainable build (the
    interleaves); its head trains on it as in PyTorch. With 4 draw buffers (forced) each column-blocked
    forward draws its halves one at a time (Pass.wide), into the same parts."""
    options = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"},
               "webgl-4-targets": {"maxDrawBuffers": 4}}[backend]
    torch.manual_seed(11)
    m = ColumnChain().eval()
    x = torch.randn(3, *CHAIN)
    url = build_module(site, "column_chain", m, CHAIN, max_batch=8, trainable="fc.*")
    got = run_model(web, url, "return Array.from(await m.predict(new Float32Array(args), 3));", x.reshape(-1).tolist(),
                    options)
    assert_close(f"column chain forward ({backend})", got, m(x).detach().numpy(), **FWD)
    if backend == "webgl":
        every = build_module(site, "column_chain_all", m, CHAIN, max_batch=8)
        assert predict_draws(web, url, [3])["3"] == predict_draws(web, every, [3])["3"] - 4
    if backend == "webgl-4-targets":  # 6 column-blocked convs: a draw more each
        assert predict_draws(web, url, [3], options=options)["3"] == predict_draws(web, url, [3])["3"] + 6
    check_training(web, site, ColumnChain, CHAIN, "adam", "cross_entropy", samples=6, batch_size=3, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=12, options=options, max_batch=8, frozen=COLUMN_TRUNK)


def test_convs_reading_column_parts_on_webgpu(webgpu_web, site):
    """The same on WebGPU, which keeps a tensor held as column parts alone as whole rows instead (webgpu.js: #whole:
    its producer writes them, its readers read them; no deal into parts, no interleave back)."""
    torch.manual_seed(11)
    m = ColumnChain().eval()
    x = torch.randn(3, *CHAIN)
    url = build_module(site, "column_chain_webgpu", m, CHAIN, max_batch=8, trainable="fc.*", webgpu=True)
    backend, got = run_model(webgpu_web, url, "return [m.info.backend, Array.from(await m.predict(new Float32Array(args), 3))];",
                             x.reshape(-1).tolist(), {"backend": "webgpu"})
    assert backend == "webgpu"
    assert_close("column chain forward (webgpu)", got, m(x).detach().numpy(), **FWD)
    check_training(webgpu_web, site, ColumnChain, CHAIN, "adam", "cross_entropy", samples=6, batch_size=3, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=12, options={"backend": "webgpu"}, max_batch=8,
                   frozen=COLUMN_TRUNK)


def test_batchnorm_is_folded_into_the_conv(web, site):
    torch.manual_seed(5)
    m = BatchNormNet()
    for bn in (m.bn, m.bn2, m.bn3):  # non-trivial running statistics and affine parameters
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.3, 0.3)
    m.eval()
    url = build_module(site, "batchnorm", m, (3, 13, 11))
    x = torch.randn(4, 3, 13, 11)
    got = run_model(web, url, """
        const out = Array.from(await m.predict(new Float32Array(args), 4));
        return { out, weights: arr(await m.getWeights()) };
    """, x.reshape(-1).tolist())
    assert_close("batch-norm net forward", got["out"], m(x).detach().numpy(), **FWD)
    # the folded tensors, under the conv's (and linear's) names; a conv without bias gains one
    assert sorted(got["weights"]) == ["conv.bias", "conv.weight", "conv2.bias", "conv2.weight", "fc.bias", "fc.weight"]
    s = (m.bn.weight / torch.sqrt(m.bn.running_var + m.bn.eps)).detach()
    assert_close("folded conv.weight", got["weights"]["conv.weight"],
                 (m.conv.weight * s[:, None, None, None]).detach().numpy(), atol=1e-7, rtol=1e-6)
    assert_close("folded conv.bias", got["weights"]["conv.bias"],
                 (m.bn.bias - m.bn.running_mean * s).detach().numpy(), atol=1e-7, rtol=1e-6)
