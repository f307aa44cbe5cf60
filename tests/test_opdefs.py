"""The op registry (prep/ops/): every IR op has one definition with every rule, the op lists derive from one
table, an op without a definition fails naming it, and the FLOPs the rules give are those the build report gave
before the registry (numbers taken from texelfit/report.py's if-chain, before it became a dispatch)."""
from __future__ import annotations

import importlib
import os

import pytest
import torch

import models as M
import test_embedding as TE
import test_sequence as TS
from texelfit.codegen.ops import FAMILIES
from texelfit.prep import elementwise as ew
from texelfit.prep import ir
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.fuse import fuse_activations
from texelfit.prep.graph import to_ir
from texelfit.prep.ir import Graph, Layer
from texelfit.prep.load import export_simplified
from texelfit.prep.ops import REGISTRY, RULES, UnknownOp, names, opdef
from texelfit.prep.ops.registry import register
from texelfit.prep.ops.torch_expr import AS_ONNX_OP
from texelfit.report import flops

CODEGEN_OPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "codegen", "ops")


def test_every_ir_op_has_one_definition_with_every_rule():
    assert tuple(REGISTRY) == ir.OPS
    assert len(set(ir.OPS)) == len(ir.OPS)
    for name, d in REGISTRY.items():
        assert d.name == name and d.group == ir.GROUP_OF[name] and opdef(name) is d
        for rule in RULES:
            if rule == "kernels":
                continue
            assert callable(getattr(d, rule)), (name, rule)
        if d.group == "folded away":  # batchnorm: prep.fold removes it before codegen
            assert d.kernels is None, name
        else:
            assert isinstance(d.kernels, str) and os.path.isfile(os.path.join(CODEGEN_OPS, d.kernels + ".py")), name


def test_the_op_lists_derive_from_one_table():
    assert ir.OPS == tuple(op for ops in ir.GROUPS.values() for op in ops)
    assert ir.ELEMENTWISE == names("elementwise") == tuple(ew.OPS)
    assert ir.ACTIVATIONS == tuple(ew.UNARY)
    assert ir.POOLS == names("pooling") == ("maxpool", "avgpool", "global_avgpool")
    assert ir.SOFTMAX == names("normalising") == ("softmax", "log_softmax")
    assert ir.REDUCE == names("reducing") == ("reduce",)
    assert set(ir.WEIGHTED) <= set(names("parametric"))
    assert set(AS_ONNX_OP) <= set(ir.ELEMENTWISE)
    # codegen's families are the registry's kernels, for every op that reaches codegen
    assert FAMILIES == {op: importlib.import_module(f"texelfit.codegen.ops.{d.kernels}")
                        for op, d in REGISTRY.items() if d.kernels}
    assert set(ir.OPS) - set(FAMILIES) == {"batchnorm"}


def test_an_unknown_op_fails_naming_it():
    with pytest.raises(UnknownOp, match="'fancy_op'"):
        opdef("fancy_op")
    with pytest.raises(UnknownOp, match="'fancy_op'"):
        register("fancy_op", **{r: (lambda *a: 0) for r in RULES})
    assert "fancy_op" not in REGISTRY


def test_a_definition_missing_a_rule_fails_naming_the_rule():
    rules = {r: getattr(REGISTRY["relu"], r) for r in RULES if r != "flops"}
    with pytest.raises(TypeError, match="'relu' has no flops rule"):
        _register_fresh("relu", rules)


def test_an_op_that_reaches_codegen_needs_kernels():
    rules = {r: getattr(REGISTRY["relu"], r) for r in RULES}
    with pytest.raises(TypeError, match="'relu' has no kernels"):
        _register_fresh("relu", dict(rules, kernels=None))


def _register_fresh(name, rules):
    """register() of an op as if it were not yet registered (the registry left as it was)."""
    saved = REGISTRY.pop(name)
    try:
        register(name, **rules)
    finally:
        REGISTRY[name] = saved


def test_an_op_without_parameters_has_no_weight_layout():
    layer = Layer("maxpool", "pool", ["x"], ["y"])
    with pytest.raises(AssertionError, match="'maxpool' has no parameters"):
        opdef("maxpool").weight_layout(layer, None, ir.Param("w", None), "weight")


def test_only_a_maxpool_a_max_and_a_layernorm_save_textures_for_their_backward():
    layer = lambda op, **attrs: Layer(op, op, ["x"], ["y"], attrs)  # noqa: E731
    assert opdef("maxpool").saves(layer("maxpool"), None) == ("argmax:",)
    assert opdef("reduce").saves(layer("reduce", kind="max"), None) == ("ties:",)
    assert opdef("reduce").saves(layer("reduce", kind="mean"), None) == ()
    others = (d for op, d in REGISTRY.items() if op not in ("maxpool", "reduce", "layernorm"))
    assert all(d.saves(layer(d.name), None) == () for d in others)


@pytest.mark.parametrize("input_trains", [True, False])
def test_a_layernorm_saves_its_statistics_and_where_its_input_needs_a_gradient_its_sums(input_trains):
    class Graph:  # (the two things the rule reads)
        shapes = {"y": (6, 10)}

        def needs_grad(self):
            return {"x", "y"} if input_trains else {"y"}

    got = opdef("layernorm").saves(Layer("layernorm", "ln", ["x"], ["y"]), Graph())
    assert got == (("lnstat:", "partial", (6, 2)),) + ((("lnsum:", "partial", (6, 2)),) if input_trains else ())


def _per_op(graph) -> dict:
    out: dict[str, int] = {}
    for layer in graph.layers:
        out[layer.op] = out.get(layer.op, 0) + flops(layer, graph)
    return out


# per op, the sum of its layers' FLOPs a sample: as imported, and as built (batch-norm folded, activations fused)
FLOPS = {
    "unet_decoder": (M.BLOCK_CASES["unet_decoder"],
                     {"concat": 0, "conv": 195754, "conv_transpose": 3264, "dense": 1545, "flatten": 0, "maxpool": 192,
                      "relu": 1690, "resample": 7680},
                     {"concat": 0, "conv": 197252, "conv_transpose": 3456, "dense": 1545, "flatten": 0, "maxpool": 192,
                      "resample": 7680}),
    # (a token Linear's bias is its matmul's: 336 FLOPs of adds there, where they were adds of their own)
    "encoder": ((TS.encoder, TS.SHAPE),
                {"add": 224, "dense": 165, "gather": 0, "layernorm": 1568, "matmul": 32592, "mul": 672, "reduce": 112,
                 "relu": 224, "softmax": 392}, None),
    "mobilenet_v3_block": (M.BLOCK_CASES["mobilenet_v3_block"],
                           {"conv": 59392, "dense": 125, "flatten": 0, "global_avgpool": 560, "hardsigmoid": 16,
                            "hardswish": 1328, "mul": 320, "relu": 512},
                           {"conv": 59920, "dense": 125, "flatten": 0, "global_avgpool": 560, "hardswish": 1328,
                            "mul": 320}),
    "prunable": ((M.PrunableNet, M.PRUNABLE_SHAPE),
                 {"add": 1200, "avgpool": 792, "batchnorm": 2400, "concat": 0, "conv": 329550, "dense": 8638,
                  "flatten": 0, "maxpool": 1200, "relu": 2931, "tanh": 1992},
                 {"add": 1200, "avgpool": 792, "concat": 0, "conv": 334452, "dense": 8659, "flatten": 0,
                  "maxpool": 1200, "relu": 1200}),
    "prelu": (M.BLOCK_CASES["prelu"], {"conv": 6600, "dense": 2245, "flatten": 0, "prelu": 129}, None),
    "dropout": (M.OP_CASES["dropout_identity"], {"dense": 3262, "dropout": 31, "relu": 31}, None),
}


@pytest.mark.parametrize("case", sorted(FLOPS))
def test_flops_of_small_models_are_unchanged(case):
    (factory, shape), imported, built = FLOPS[case]
    torch.manual_seed(0)
    g = to_ir(export_simplified(factory().eval(), shape))
    assert _per_op(g) == imported
    assert _per_op(fuse_activations(fold_batchnorm(g))) == (built or imported)


def test_flops_of_the_other_ops_are_unchanged():
    g = to_ir(export_simplified(TE.bag().eval(), (TE.T,), input_dtype="int64"), (TE.T,))
    assert _per_op(g) == {"dense": 165, "embedding": 0, "reduce": 112}
    g = Graph("x", "z", {"x": (4, 3, 2), "a": (4, 3, 2), "b": (4, 3, 2), "c": (24,), "z": (24,)},
              [Layer("batchnorm_affine", "bn", ["x"], ["a"]), Layer("select_eq", "m", ["a"], ["b"]),
               Layer("flatten", "f", ["b"], ["c"]), Layer("log_softmax", "s", ["c"], ["z"])], {})
    assert _per_op(g) == {"batchnorm_affine": 24, "select_eq": 24, "flatten": 0, "log_softmax": 96}
