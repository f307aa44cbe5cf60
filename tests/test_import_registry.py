"""ONNX import is a dispatch over a registry of import rules (issue 31: prep/onnx_import/): every supported op
has a rule or a lowering, the rules of an op are tried in the one declared order, the first that converts a
node wins, and an op with no rule fails naming the op and the node."""
from __future__ import annotations

import ast
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from texelfit.prep import graph
from texelfit.prep.errors import BuildError
from texelfit.prep.graph import SUPPORTED_OPS, to_ir
from texelfit.prep.lower import LOWERINGS
from texelfit.prep.onnx_import import conv, linear, rules, shape_ops, tables
from texelfit.prep.onnx_import.constants import SHAPE_ONLY, constant_fold, shape_only
from texelfit.prep.onnx_import.registry import ANY, Registry, imports
from texelfit.prep.onnx_import.rules import ORDER, REGISTRY

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "prep", "onnx_import")


def test_every_supported_op_has_a_rule_or_a_lowering():
    for op in SUPPORTED_OPS:
        assert op in REGISTRY.ops or op in LOWERINGS, op
        assert REGISTRY.rules_for(op), op
    # and the supported ops are exactly those: a rule makes an op supported, the error's listing only orders them
    assert set(SUPPORTED_OPS) == set(REGISTRY.ops) | set(LOWERINGS)
    assert set(graph._LISTED) <= set(REGISTRY.ops)
    assert SUPPORTED_OPS[0] == "Gemm"  # (the build error lists them from Gemm: tests/test_prep.py)
    assert set(SHAPE_ONLY) <= set(REGISTRY.ops)


def test_dispatch_order_is_the_declared_order():
    position = {rule: k for k, rule in enumerate(ORDER)}
    assert len(position) == len(ORDER)
    for op in REGISTRY.ops:
        tried = REGISTRY.rules_for(op)
        assert list(tried) == [r for r in ORDER if op in r.onnx_ops or ANY in r.onnx_ops], op
        assert [position[r] for r in tried] == sorted(position[r] for r in tried), op
    # an op no rule names gets the rules for ANY alone (constant folding, the table guard), in order
    assert REGISTRY.rules_for("NoSuchOp") == tuple(r for r in ORDER if ANY in r.onnx_ops)
    assert constant_fold in REGISTRY.rules_for("NoSuchOp")
    # the orders that matter: special cases before the op's general rule
    assert REGISTRY.rules_for("MatMul")[-3:] == (linear.matmul_of_activations, linear.matmul_of_tokens,
                                                 linear.matmul_dense)
    gather = REGISTRY.rules_for("Gather")
    assert gather.index(tables.table_gather) < gather.index(tables.position_gather) < \
        gather.index(constant_fold) < gather.index(shape_ops.batch_view) < gather.index(tables.token_embedding) < \
        gather.index(shape_only) == len(gather) - 1
    assert REGISTRY.rules_for("Conv")[0] is conv.twin_1d and REGISTRY.rules_for("Conv")[-1] is conv.conv
    # the rules that only prepare a node come before every rule that converts one
    prepares = [position[r] for r in ORDER if r.prepares]
    assert prepares and max(prepares) < min(position[r] for r in ORDER if not r.prepares)


def test_the_first_rule_that_converts_a_node_wins():
    calls = []

    def rule(name, result, *ops):
        @imports(*ops)
        def fn(ctx, step):
            calls.append(name)
            return result
        fn.__name__ = name
        return fn

    a, b, c, d = rule("a", False, "Foo"), rule("b", False, ANY), rule("c", True, "Foo", "Bar"), rule("d", True, "Foo")
    reg = Registry([a, b, c, d])
    step = type("Step", (), {"op": "Foo"})()
    assert reg.dispatch(None, step) and calls == ["a", "b", "c"]
    calls.clear()
    step.op = "Baz"  # no rule of its own: the ANY rule alone, which does not convert it
    assert not reg.dispatch(None, step) and calls == ["b"]
    assert reg.ops == ("Foo", "Bar")
    with pytest.raises(ValueError):
        Registry([a, a])
    with pytest.raises(ValueError):
        Registry([lambda ctx, step: True])


def _model(op="Gemm"):
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "fc.weight")
    nodes = [helper.make_node("Gemm", ["x", "fc.weight"], ["h"], name="fc", transB=1),
             helper.make_node(op, ["h"], ["y"], name="odd")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_supported_model_builds_through_the_registry():
    ir = to_ir(_model("Relu"), (4,))
    assert [l.op for l in ir.layers] == ["dense", "relu"] and ir.shapes[ir.output] == (3,)


def test_an_unknown_op_names_the_op_and_the_node(monkeypatch):
    with pytest.raises(BuildError, match=r"unsupported ONNX op NoSuchOp at node 'odd'; supported ops: Gemm"):
        to_ir(_model("NoSuchOp"), (4,))
    # past the up-front check (an op a lowering could leave), the dispatch finds no rule: the same message
    monkeypatch.setattr(graph, "SUPPORTED_OPS", SUPPORTED_OPS + ("NoSuchOp",))
    with pytest.raises(BuildError, match=r"unsupported ONNX op NoSuchOp at node 'odd'"):
        to_ir(_model("NoSuchOp"), (4,))


def _imports_of(path) -> set[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = set()
    for node in tree.body:  # module level only
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
            out.add("prep." + node.module.split(".")[0])
    return out


def test_the_package_has_no_import_cycle_and_small_modules():
    mods = {f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py")}
    edges = {m: _imports_of(os.path.join(PACKAGE, m + ".py")) for m in mods}
    for m, out in edges.items():
        assert "prep.graph" not in out, f"{m} imports prep/graph.py, which imports the package"
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(edges[m] & mods):
            assert state.get(n) != 1, " -> ".join(path + [m, n])
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, [])
    for m in mods:
        with open(os.path.join(PACKAGE, m + ".py"), encoding="utf-8") as f:
            assert len(f.read().splitlines()) <= 400, m
    assert {r.__module__.rsplit(".", 1)[1] for r in ORDER} <= mods and rules.REGISTRY is REGISTRY
