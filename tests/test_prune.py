"""Channel pruning (prep/prune.py): identity at 0, consistent across adds, concats, depthwise convs
and flattens, the pruned graph exports to the same model, and pruned bundles run and train like
PyTorch in the browser.

Tolerances:
  PyTorch against PyTorch (same float32 model, other summation order)  atol 1e-5 + rtol 1e-5 * |ref|
  the browser against PyTorch: as tests/test_ops.py and tests/test_train.py (helpers.FWD, GRAD,
  TRAJ_W, TRAJ_LOSS)
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from helpers import FIT, FWD, GRAD, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, run_model, torch_fit
from models import CNN_CASES, OP_CASES, PRUNABLE_SHAPE, DigitsCNNWidth, PrunableNet, ResidualCNN
from texelfit.build import compile_onnx
from texelfit.examples import digits_cnn
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.graph import to_ir
from texelfit.prep.load import BuildError, export_simplified
from texelfit.prep.prune import keep_count, plan_prune, prune
from texelfit.prep.torch_ir import IRModule, export_onnx, name as param_name

TORCH_TOL = dict(atol=1e-5, rtol=1e-5)
ALL_CASES = {**{k: (f, s) for k, (f, s) in OP_CASES.items()}, **{k: (f, s) for k, (f, s, _) in CNN_CASES.items()},
             "prunable": (PrunableNet, PRUNABLE_SHAPE), "digits_cnn": (digits_cnn, (1, 8, 8)),
             "residual_cnn": (ResidualCNN, (1, 12, 12))}


def ir(factory, shape, seed=0):
    torch.manual_seed(seed)
    return fold_batchnorm(to_ir(export_simplified(factory().eval(), shape), shape))


def forward(graph, x):
    with torch.no_grad():
        return IRModule(graph)(x).numpy()


@pytest.mark.parametrize("count,ratio,round_to,kept", [
    (16, 0.0, 4, 16), (16, 0.5, 4, 8), (32, 0.5, 4, 16), (10, 0.5, 4, 8), (10, 0.5, 1, 5), (10, 0.3, 1, 7),
    (10, 0.3, 4, 8), (6, 0.5, 4, 4), (5, 0.2, 4, 4), (3, 0.9, 4, 3), (3, 0.9, 1, 1), (16, 0.99, 4, 4),
    (1, 0.5, 4, 1), (7, 0.0, 4, 7), (13, 0.0, 1, 13), (32, 0.875, 4, 4), (32, 0.7, 4, 12),
])
def test_keep_count(count, ratio, round_to, kept):
    # ceil((1 - ratio) * C) rounded up to a multiple of round_to, never 0, never more than C
    assert keep_count(count, ratio, round_to) == kept


@pytest.mark.parametrize("case", sorted(ALL_CASES))
def test_prune_zero_is_the_identity(case):
    g = ir(*ALL_CASES[case])
    p = prune(g, 0.0)
    assert p.shapes == g.shapes and [l.attrs for l in p.layers] == [l.attrs for l in g.layers]
    assert list(p.params) == list(g.params)
    for n in g.params:
        assert np.array_equal(p.params[n].array, g.params[n].array) and p.params[n].transposed == g.params[n].transposed


def zero_pruned_channels(graph, plan):
    """The unpruned graph with every channel the plan drops zeroed at its producers (weights and bias of
    every conv/dense row not kept). With activations f(0) = 0 that computes what the pruned graph does."""
    params = dict(graph.params)
    for layer in graph.layers:
        if layer.op not in ("conv", "dense"):
            continue
        drop = np.setdiff1d(np.arange(graph.shapes[layer.outputs[0]][0]), plan.kept(layer.outputs[0]))
        for role, n in layer.params.items():
            arr = params[n].canonical().copy()
            arr[drop] = 0
            params[n] = dataclasses.replace(params[n], array=arr.T if params[n].transposed else arr)
    return dataclasses.replace(graph, params=params)


@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.75])
@pytest.mark.parametrize("round_to", [1, 4])
def test_pruned_equals_original_with_dropped_channels_zeroed(ratio, round_to):
    # A wrong input selection anywhere (after the add, the concat offsets, the depthwise multiplier, the
    # flatten columns) would mix up channels and change the output.
    g = ir(PrunableNet, PRUNABLE_SHAPE)
    plan = plan_prune(g, ratio, round_to=round_to)
    pruned = prune(g, ratio, round_to=round_to)
    assert pruned.parameter_count() < g.parameter_count()
    x = torch.randn((9,) + PRUNABLE_SHAPE, generator=torch.Generator().manual_seed(1))
    assert_close(f"pruned {ratio}/{round_to}", forward(pruned, x), forward(zero_pruned_channels(g, plan), x),
                 **TORCH_TOL)


def test_groups_follow_adds_concats_depthwise_and_flatten():
    g = ir(PrunableNet, PRUNABLE_SHAPE)
    plan = plan_prune(g, 0.5, round_to=1)
    groups = {tuple(gr.producers): gr for gr in plan.groups if gr.producers}
    stem = next(k for k in groups if "/stem/Conv+/bn/BatchNormalization" in k)
    assert stem == ("/stem/Conv+/bn/BatchNormalization", "/block/Conv"), "the add joins stem and block"
    keep_a = groups[stem].kept
    keep_b = groups[("/side/Conv",)].kept
    keep_c = groups[("/mix/Conv",)].kept
    assert (len(keep_a), len(keep_b), len(keep_c)) == (5, 3, 6)
    p = prune(g, 0.5, round_to=1)
    w = lambda graph, n: graph.params[n].canonical()  # noqa: E731
    # both operands of the add keep the same rows; block's input columns are the same selection
    assert np.array_equal(w(p, "block.weight"), w(g, "block.weight")[keep_a][:, keep_a])
    assert np.array_equal(w(p, "stem.weight"), w(g, "stem.weight")[keep_a])
    # depthwise passes the selection: its rows, and its groups attribute
    assert np.array_equal(w(p, "dw.weight"), w(g, "dw.weight")[keep_a])
    assert next(l for l in p.layers if l.name == "/dw/Conv").attrs["groups"] == 5
    # the concat: a's channels at 0.., b's at offset 10
    assert np.array_equal(w(p, "mix.weight"), w(g, "mix.weight")[keep_c][:, keep_a + [10 + i for i in keep_b]])
    # channel multiplier 2: output 2c, 2c+1 come from input c
    rows = [2 * c + j for c in keep_c for j in (0, 1)]
    assert np.array_equal(w(p, "dw2.weight"), w(g, "dw2.weight")[rows])
    # flatten: channel c of (22, 3, 3) is columns 9c .. 9c+8
    cols = [9 * r + k for r in rows for k in range(9)]
    keep_fc1 = groups[("/fc1/Gemm",)].kept
    assert np.array_equal(w(p, "fc1.weight"), w(g, "fc1.weight")[keep_fc1][:, cols])
    assert np.array_equal(w(p, "fc2.weight"), w(g, "fc2.weight")[:, keep_fc1])
    assert p.input_shape == g.input_shape and p.output_shape == g.output_shape


def test_lowest_l1_channels_go_first():
    g = ir(lambda: DigitsCNNWidth(8, 8, 8), (1, 8, 8))
    norms = np.linspace(0.1, 2.0, 8)[[3, 7, 0, 5, 1, 6, 2, 4]]  # channel c has L1 norm norms[c]
    w = np.ones((8, 1, 3, 3), np.float32) * (norms[:, None, None, None] / 9).astype(np.float32)
    g.params["conv1.weight"] = dataclasses.replace(g.params["conv1.weight"], array=w)
    (group,) = [gr for gr in plan_prune(g, 0.5, round_to=1).groups if gr.producers == ["/conv1/Conv"]]
    assert group.kept == [1, 3, 5, 7] == sorted(np.argsort(-norms)[:4])


def test_model_output_and_grouped_convs_are_left_whole():
    g = ir(CNN_CASES["conv_groups2"][0], (6, 13, 11))
    plan = plan_prune(g, 0.5)
    (group,) = [gr for gr in plan.groups if gr.producers]
    assert len(group.kept) == group.channels == 4
    assert "grouped conv" in group.reason and "groups=2" in group.reason
    g = ir(CNN_CASES["residual_add"][0], (3, 13, 11))  # every conv feeds the output through adds
    assert prune(g, 0.5).shapes == g.shapes


@pytest.mark.parametrize("ratio", [1.0, -0.1, 1.5, float("nan"), "half"])
def test_bad_ratio_is_a_clear_error(ratio):
    g = ir(digits_cnn, (1, 8, 8))
    with pytest.raises(BuildError, match=r"--prune must be (in|a number in) \[0, 1\), got"):
        prune(g, ratio)


def test_pruned_digits_cnn_equals_a_narrow_pytorch_model():
    # An independent reference: DigitsCNN built with the pruned widths, its weights sliced by hand.
    torch.manual_seed(0)
    full = digits_cnn().eval()
    g = fold_batchnorm(to_ir(export_simplified(full, (1, 8, 8)), (1, 8, 8)))
    plan = plan_prune(g, 0.5)
    kept = [plan.groups[i].kept for i in range(1, 4)]  # groups 1.. are conv1, conv2, conv3 (0 is the input)
    assert [plan.groups[i].producers for i in range(1, 4)] == [["/conv1/Conv"], ["/conv2/Conv"], ["/conv3/Conv"]]
    narrow = DigitsCNNWidth(*map(len, kept)).eval()
    sd = full.state_dict()
    k1, k2, k3 = (torch.tensor(k) for k in kept)
    cols = (k3[:, None] * 16 + torch.arange(16)[None, :]).reshape(-1)
    narrow.load_state_dict({
        "conv1.weight": sd["conv1.weight"][k1], "conv1.bias": sd["conv1.bias"][k1],
        "conv2.weight": sd["conv2.weight"][k2][:, k1], "conv2.bias": sd["conv2.bias"][k2],
        "conv3.weight": sd["conv3.weight"][k3][:, k2], "conv3.bias": sd["conv3.bias"][k3],
        "fc.weight": sd["fc.weight"][:, cols], "fc.bias": sd["fc.bias"]})
    x = torch.randn(17, 1, 8, 8)
    assert_close("pruned IR vs narrow DigitsCNN", forward(prune(g, 0.5), x), narrow(x).detach().numpy(), **TORCH_TOL)


@pytest.mark.parametrize("case", ["prunable", "digits_cnn", "residual_cnn", "flatten_nchw_linear", "concat",
                                  "conv_depthwise_multiplier", "matmul_add", "no_bias"])
def test_pruned_onnx_forward_equals_pruned_pytorch(case):
    factory, shape = ALL_CASES[case]
    pruned = prune(ir(factory, shape), 0.5, round_to=1)
    back = fold_batchnorm(to_ir(export_onnx(pruned), shape))
    assert list(back.params) == list(pruned.params)
    for n, p in pruned.params.items():
        assert np.array_equal(back.params[n].array, p.array) and back.params[n].transposed == p.transposed, n
    assert [(l.op, l.attrs) for l in back.layers] == [(l.op, l.attrs) for l in pruned.layers]
    x = torch.randn((7,) + shape)
    assert_close(f"{case}: ONNX -> IR forward", forward(back, x), forward(pruned, x), **TORCH_TOL)


# ---- the browser ----------------------------------------------------------------------------------

def pruned_bundle(site, folder, factory, shape, ratio, *, round_channels=True, max_batch=64):
    """The bundle `texelfit build --prune` makes, and the reference: the pruned graph in PyTorch."""
    torch.manual_seed(0)
    onnx_model = export_simplified(factory().eval(), shape)
    result = compile_onnx(onnx_model, name="model", input_shape=shape, prune=ratio, round_channels=round_channels,
                          max_batch=max_batch)
    ref = prune(fold_batchnorm(to_ir(onnx_model, shape)), ratio, round_to=4 if round_channels else 1)
    assert result.report["parameters"] == ref.parameter_count() < fold_batchnorm(to_ir(onnx_model, shape)).parameter_count()
    return f"{site.add_files(folder, result.files)}/model.js", IRModule(ref)


def torch_named(module):
    return {param_name(k[len("p."):]): v for k, v in module.named_parameters()}


@pytest.mark.parametrize("case,ratio,round_channels", [("prunable", 0.5, False), ("prunable", 0.4, True),
                                                      ("digits_cnn", 0.5, True)])
def test_pruned_bundle_forward_and_gradients(web, site, case, ratio, round_channels):
    factory, shape = ALL_CASES[case]
    url, module = pruned_bundle(site, f"pruned_{case}_{ratio}", factory, shape, ratio, round_channels=round_channels)
    torch.manual_seed(4)
    x = torch.randn((11,) + shape)
    y = torch.randint(0, 7 if case == "prunable" else 10, (11,))
    got = run_model(web, url, """
        const x = new Float32Array(args.x);
        const out = Array.from(await m.predict(x, 11));
        const grads = arr(await m.gradients(x, Int32Array.from(args.y), { loss: 'cross_entropy' }));
        return { out, grads };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()})
    out = module(x)
    torch.nn.functional.cross_entropy(out, y).backward()
    assert_close(f"pruned {case} forward", got["out"], out.detach().numpy(), **FWD)
    named = torch_named(module)
    assert sorted(got["grads"]) == sorted(named)
    for n, p in named.items():
        assert_close(f"pruned {case} d/d{n}", got["grads"][n], p.grad.numpy(), **GRAD)


@pytest.mark.parametrize("case,opt_name", [("prunable", "adam"), ("digits_cnn", "sgd_momentum_wd")])
def test_pruned_bundle_trajectory(web, site, case, opt_name):
    # 2 epochs of 21 samples in batches of 8 (8, 8, 5), as tests/test_cnn_train.py
    factory, shape = ALL_CASES[case]
    url, module = pruned_bundle(site, f"pruned_train_{case}", factory, shape, 0.5, max_batch=8)
    torch.manual_seed(5)
    x = torch.randn((21,) + shape)
    y = torch.randint(0, 7 if case == "prunable" else 10, (21,))
    cfg = OPTIMIZERS[opt_name]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "loss": "cross_entropy",
                                    "optimizer": cfg, "batchSize": 8, "epochs": 2})
    ref = torch_fit(module, x, y, "cross_entropy", cfg, 8, 2)
    assert_close(f"pruned {case} losses", got["loss"], ref, **TRAJ_LOSS)
    for n, p in torch_named(module).items():
        assert_close(f"pruned {case} {n} after 6 steps", got["weights"][n], p.detach().numpy(), **TRAJ_W)
