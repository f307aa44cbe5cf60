"""The Python side alone: conversion errors that name the node and attribute, and layout limits."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from texelfit.build import compile_onnx
from texelfit.prep.packing import Packing
from texelfit.codegen.memory import check_layout
from texelfit.codegen.webgl2.layout import TextureSpec, plan_layout
from texelfit.prep.load import BuildError


def conv_model(*, auto_pad=None, pool=None, pool_attrs=None):
    """input (1, 3, 9, 9) -> Conv 3->4 k3 [-> pool] as a hand-written ONNX graph."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.ones(108, np.float32).tolist())
    conv_attrs = {"kernel_shape": [3, 3]}
    if auto_pad:
        conv_attrs["auto_pad"] = auto_pad
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", **conv_attrs)]
    out = "c"
    if pool:
        nodes.append(helper.make_node(pool, ["c"], ["p"], name="pool", kernel_shape=[2, 2], **(pool_attrs or {})))
        out = "p"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 9, 9])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("model,words", [
    (conv_model(auto_pad="BOGUS"), ["Conv node 'conv'", "unsupported attribute auto_pad='BOGUS'"]),
    (conv_model(pool="MaxPool", pool_attrs={"dilations": [2, 2]}),
     ["MaxPool node 'pool'", "unsupported attribute dilations=[2, 2]"]),
    (conv_model(pool="MaxPool", pool_attrs={"storage_order": 1}), ["MaxPool node 'pool'", "storage_order=1"]),
    (conv_model(pool="LpPool"), ["unsupported ONNX op LpPool at node 'pool'", "supported ops: Gemm"]),
], ids=["conv_auto_pad", "maxpool_dilation", "maxpool_storage_order", "lppool"])
def test_unsupported_attributes_name_node_and_attribute(model, words):
    with pytest.raises(BuildError) as e:
        compile_onnx(model, name="m")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("auto_pad,out_hw", [("VALID", (7, 7)), ("SAME_UPPER", (9, 9)), ("SAME_LOWER", (9, 9))])
def test_conv_auto_pad_modes(auto_pad, out_hw):
    r = compile_onnx(conv_model(auto_pad=auto_pad), name="m")
    assert r.graph.output_shape == (4,) + out_hw


def test_texture_no_device_can_hold_fails_at_build_time():
    plan = plan_layout(compile_onnx(conv_model(), name="m").graph, 8)
    huge = TextureSpec("act:huge", "activation", (8, 4, 40000, 40000), Packing(8 * 40000, 40000, 40000, 4, 0, 0, 0, 0),
                       8 * 40000, 40000)
    plan.textures[huge.name] = huge
    with pytest.raises(BuildError, match=r"texture 'act:huge' of activation with shape \[8, 4, 40000, 40000\] "
                                         r"needs 40000x320000 texels"):
        check_layout(plan)


@pytest.mark.parametrize("inputs", [15, 16, 40])
def test_a_concat_of_more_tensors_than_a_pass_reads_builds_in_pieces(inputs):
    """A pass reads at most 15 tensors (WebGL2 promises 16 texture units; the runtime keeps one for uploads): a concat
    of more is imported in pieces of at most 15 (the steps of an unrolled RNN's output), and computes the same."""
    import torch

    from texelfit.prep.load import export_simplified
    from texelfit.prep.torch_ir import IRModule

    class Cat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.branches = torch.nn.ModuleList([torch.nn.Linear(5, 2) for _ in range(inputs)])

        def forward(self, x):
            return torch.cat([b(x) for b in self.branches], 1)

    torch.manual_seed(0)
    module = Cat().eval()
    r = compile_onnx(export_simplified(module, (5,)), name="m", input_shape=(5,), loss="mse")
    assert max(len(layer.inputs) for layer in r.graph.layers) <= 15
    x = torch.randn(3, 5)
    with torch.no_grad():
        torch.testing.assert_close(IRModule(r.graph)(x), module(x), atol=1e-6, rtol=1e-6)


def test_report_lists_every_texture():
    r = compile_onnx(conv_model(pool="MaxPool"), name="m", max_batch=4)
    names = {t["name"] for t in r.report["textures"]}
    assert {"act:x", "act:c", "act:p", "argmax:p", "grad:c", "grad:p", "param:w", "pgrad:w", "m:w", "v:w"} <= names
    conv_act = next(t for t in r.report["textures"] if t["name"] == "act:c")
    # (4, 7, 7) per sample, channel-packed: 7 positions x 1 texel wide, 4 samples x 7 rows high
    assert conv_act["texture"] == [7, 28] and conv_act["pad_lanes"] == 0 and conv_act["bytes"] == 7 * 28 * 16
    w = next(t for t in r.report["textures"] if t["name"] == "param:w")
    # W[4, 3, 3, 3]: 4 output channels a texel, kw = 3 texels wide, kh * ic = 9 rows high
    assert w["texture"] == [3, 9] and w["pad_lanes"] == 0 and w["double"]
