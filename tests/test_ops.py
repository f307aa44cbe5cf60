"""Every op of the dense pipeline, forward and gradient, against PyTorch autograd on odd shapes.

One helper (`helpers.check_op`) drives every case of models.OP_CASES: it builds the bundle, runs
`predict` and `gradients` in Chromium, and compares with PyTorch.

Tolerances (float32 on both sides; only the summation order differs):
  forward    atol 2e-5 + rtol 2e-4 * |ref|
  gradients  atol 2e-6 + rtol 2e-4 * |ref|   (gradients here are of order 1e-3 .. 1e-1)
"""
from __future__ import annotations

import zlib

import pytest
import torch

from helpers import build_module, check_op, predict_draws, run_model
from models import BLOCKED_CASES, CNN_CASES, OP_CASES
from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified

BATCH = 11


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_forward_and_gradients_cross_entropy(web, site, case):
    factory, shape = OP_CASES[case]
    check_op(web, site, case, factory, shape, "cross_entropy", batch=BATCH, seed=zlib.crc32(case.encode()) % 1000)


@pytest.mark.parametrize("case", ["linear_relu_linear", "sigmoid_output", "unfused_activations", "matmul_add"])
def test_forward_and_gradients_mse(web, site, case):
    factory, shape = OP_CASES[case]
    check_op(web, site, case, factory, shape, "mse", batch=BATCH, seed=zlib.crc32(case.encode()) % 1000)


@pytest.mark.parametrize("case", BLOCKED_CASES)
def test_blocked_layers_run_their_one_sample_twins_at_small_batches(web, site, case):
    """Below 8 samples a sample-blocked layer runs its one-sample passes (no interleave), from 8 on
    its blocked passes: both match PyTorch (the blocked ones in the op tests at BATCH), and each
    batch size draws the passes of one kind."""
    factory, shape = {**{k: v[:2] for k, v in CNN_CASES.items()}, **OP_CASES}[case]
    loss = CNN_CASES[case][2] if case in CNN_CASES else "cross_entropy"
    check_op(web, site, case, factory, shape, loss, batch=3, seed=zlib.crc32(case.encode()) % 1000)
    url = build_module(site, f"draws_{case}", factory(), shape)
    draws = predict_draws(web, url, [1, 7, 8, 10, 3])
    # forwards with blk textures (the *_is_blocked tests); a column-blocked conv's forward computes 4
    # positions a fragment at every batch (blocking.column_blocked), so its draws do not change at 8
    blocked_layers = {"sample_blocked": 1, "conv_column_blocked": 0}.get(case, 2)
    split_layers = 1 if case == "sample_blocked" else 0  # one-sample forwards in 2 passes (blocking.split_k)
    assert draws["1"] == draws["7"] == draws["3"], draws
    # a blocked forward adds its interleave; a split-K one-sample forward draws 2 passes
    assert draws["8"] == draws["10"] == draws["1"] + blocked_layers - split_layers, draws


@pytest.mark.parametrize("case", BLOCKED_CASES)
def test_without_8_draw_buffers_blocked_layers_run_one_sample_passes(web, site, case):
    """WebGL2 promises 4 render targets; the blocked passes write 8. With fewer (forced here), the
    one-sample passes run at every batch size, and match PyTorch."""
    factory, shape = {**{k: v[:2] for k, v in CNN_CASES.items()}, **OP_CASES}[case]
    loss = CNN_CASES[case][2] if case in CNN_CASES else "cross_entropy"
    check_op(web, site, case, factory, shape, loss, batch=BATCH, seed=zlib.crc32(case.encode()) % 1000,
             options={"maxDrawBuffers": 4})
    url = build_module(site, f"draws4_{case}", factory(), shape)
    draws = predict_draws(web, url, [1, 10], options={"maxDrawBuffers": 4})
    assert draws["1"] == draws["10"], draws


def folded_mlp():
    """45-300-260-7: the two dense layers past blocking.SAMPLE_BLOCK_MIN_MACS write blocked parts of 65 (forward)
    and 75 (the second's grad_input) texels a row."""
    return torch.nn.Sequential(torch.nn.Linear(45, 300), torch.nn.ReLU(), torch.nn.Linear(300, 260), torch.nn.ReLU(),
                               torch.nn.Linear(260, 7))


@pytest.mark.parametrize("precision", ["float32", "rgba8"])
def test_blocked_parts_of_few_rows_are_folded(web, site, precision):
    """blocking.blocked_fold: at a max batch of 16 a blocked part is 2 rows of 65 or 75 texels, folded into 8 rows
    (the tiled layout, on every device; rgba8: 4 texels a float). The forward and every gradient match PyTorch at
    a batch of 10 (a block of 8 and one of 2, blocked) and of 3 (the one-sample passes), and m.info counts no
    texture folded past the size limit."""
    from texelfit.codegen.webgl2.blocking import blocked_fold
    assert blocked_fold(65, 2) == 17 and blocked_fold(75, 2) == 19 and blocked_fold(65, 8) == 0
    js = compile_onnx(export_simplified(folded_mlp(), (45,)), name="m", input_shape=(45,), max_batch=16).files["m.js"]
    assert js.count('"fold":') == 16, "the 8 parts of the forward and of the grad_input"
    for batch in (10, 3):
        check_op(web, site, f"folded_{precision}_{batch}", folded_mlp, (45,), "cross_entropy", batch=batch, seed=batch,
                 options={"precision": precision}, max_batch=16)
    url = build_module(site, f"folded_info_{precision}", folded_mlp(), (45,), max_batch=16)
    info = run_model(web, url, "return m.info;", {}, {"precision": precision})
    assert info["foldedTextures"] == 0 and info["precision"] == precision


def blocked_out(names) -> str:
    """The tensor whose activation is sample-blocked, from the texture names."""
    return next(n for n in names if n.startswith("blk0:act:"))[len("blk0:act:"):]


def test_a_fused_activation_gradient_goes_into_the_next_dense_layers_grad_input():
    """45-200-96-7 with relus: each relu's one consumer is a dense layer, whose grad_input applies relu'
    (no activation_grad pass); an activation read by a conv or a flatten keeps its pass."""
    def bundle(module, shape):
        return compile_onnx(export_simplified(module, shape), name="m", input_shape=shape, max_batch=64).files["m.js"]
    factory, shape = OP_CASES["sample_blocked"]
    js = bundle(factory(), shape)
    assert "// texelfit kernel: activation_grad" not in js
    assert "// texelfit kernel: dense_grad_input 200->96 relu" in js  # applies the 45->200 layer's relu'
    for case in ("conv_tanh_sigmoid_leaky", "flatten_nchw_linear"):
        factory, shape, _ = CNN_CASES[case]
        assert "// texelfit kernel: activation_grad" in bundle(factory(), shape), case


def test_sample_blocked_case_is_blocked_and_small_layers_are_not():
    """The sample_blocked case really runs the 8-samples-a-fragment forward and grad_input (and their
    interleaves) for its 200->96 layer, and only there; below 8 samples that layer's forward is split-K."""
    factory, shape = OP_CASES["sample_blocked"]
    result = compile_onnx(export_simplified(factory(), shape), name="m", input_shape=shape, max_batch=64)
    names = {t["name"] for t in result.report["textures"]}
    blocked = sorted(n.split(":", 1)[1].split(":")[0] for n in names if n.startswith("blk0:"))
    # the 200->96 layer: output, input gradient (times the relu' before it: layout.py act_grad_fused), weight gradient
    assert blocked == ["act", "dz", "pgrad"], names
    assert "// texelfit kernel: interleave" in result.files["m.js"]
    # the same layer's one-sample forward sums its 200 inputs in 4 slices (blocking.split_k); the others are narrow
    assert sorted(n for n in names if n.startswith("split:")) == ["split:" + blocked_out(names)], names
    assert "// texelfit kernel: dense_forward 200->96 relu split" in result.files["m.js"]
    small = compile_onnx(export_simplified(factory(), shape), name="m", input_shape=shape, max_batch=4)
    assert not any(t["name"].startswith("blk") for t in small.report["textures"])  # batches of 4 at most
