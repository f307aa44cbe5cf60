"""prep/torch_ir.py: the IR run in PyTorch (what fine-tuning trains and what pruned and quantised
graphs are evaluated with) computes what the source model and the bundle compute.

Tolerances: PyTorch against PyTorch atol 1e-5 + rtol 1e-5 * |ref|; the page against PyTorch as
tests/test_ops.py (helpers.FWD).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from helpers import FWD, assert_close, run_model
from models import CNN_CASES, OP_CASES, PRUNABLE_SHAPE, BatchNormNet, PrunableNet
from texelfit.build import compile_onnx
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.fuse import fuse_activations
from texelfit.prep.graph import to_ir
from texelfit.prep.load import export_simplified
from texelfit.prep.torch_ir import IRModule, key, name, write_back

CASES = {**{k: (f, s) for k, (f, s) in OP_CASES.items()}, **{k: (f, s) for k, (f, s, _) in CNN_CASES.items()},
         "batchnorm": (BatchNormNet, (3, 13, 11)), "prunable": (PrunableNet, PRUNABLE_SHAPE)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ir_module_computes_the_source_model(case):
    factory, shape = CASES[case]
    torch.manual_seed(0)
    m = factory().eval()
    raw = to_ir(export_simplified(m, shape), shape)
    x = torch.randn((5,) + shape)
    ref = m(x).detach().numpy()
    for stage, g in (("IR", raw), ("folded", fold_batchnorm(raw)), ("fused", fuse_activations(fold_batchnorm(raw)))):
        with torch.no_grad():
            assert_close(f"{case} ({stage})", IRModule(g)(x).numpy(), ref, atol=1e-5, rtol=1e-5)


def test_param_names_round_trip_and_write_back():
    for n in ["conv1.weight", "layer1.0.bn.bias", "onnx::MatMul_8", "a%2Eb", "w@/fc/Gemm", "100%.x"]:
        assert "." not in key(n) and name(key(n)) == n
    torch.manual_seed(0)
    g = fold_batchnorm(to_ir(export_simplified(PrunableNet().eval(), PRUNABLE_SHAPE), PRUNABLE_SHAPE))
    m = IRModule(g)
    assert [name(k[2:]) for k, _ in m.named_parameters()] == list(g.params)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(2)
    back = write_back(g, m)
    for n, p in g.params.items():
        assert np.array_equal(back.params[n].array, 2 * p.array) and back.params[n].transposed == p.transposed


def pool_model(op, pads, **attrs):
    """input (N, 3, 9, 8) -> Conv 3->5 k3 pad 1 -> {op} k3 s2 with the given pads, hand-written ONNX
    (PyTorch cannot export asymmetric pool pads)."""
    rng = np.random.default_rng(1)
    w = helper.make_tensor("w", TensorProto.FLOAT, [5, 3, 3, 3], rng.standard_normal(135).astype(np.float32).tolist())
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=list(pads),
                              **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 9, 8])],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


POOLS = {
    "maxpool_asymmetric": ("MaxPool", (0, 1, 2, 0), {}),
    "maxpool_asymmetric_ceil": ("MaxPool", (1, 0, 0, 1), {"ceil_mode": 1}),
    "avgpool_asymmetric_include": ("AveragePool", (0, 2, 1, 0), {"count_include_pad": 1}),
    "avgpool_asymmetric_exclude_ceil": ("AveragePool", (2, 0, 0, 1), {"ceil_mode": 1, "count_include_pad": 0}),
}


@pytest.mark.parametrize("case", sorted(POOLS))
def test_asymmetric_pools_match_the_bundle(web, site, case):
    op, pads, attrs = POOLS[case]
    result = compile_onnx(pool_model(op, pads, **attrs), name="model", max_batch=4)
    url = site.add_files(f"torch_ir_{case}", result.files) + "/model.js"
    x = torch.randn(4, 3, 9, 8, generator=torch.Generator().manual_seed(2))
    got = run_model(web, url, "return Array.from(await m.predict(new Float32Array(args), 4));", x.reshape(-1).tolist())
    with torch.no_grad():
        ref = IRModule(result.graph)(x).numpy()
    assert ref.shape[1:] == result.graph.output_shape
    assert_close(f"{case}: page vs IRModule", got, ref, **FWD)
