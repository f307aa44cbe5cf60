"""Fuse an activation into the conv or dense layer that feeds it, where that removes a pass; and first, GELU's five
elementwise layers into one (fuse_gelu).

Only an activation whose derivative reads its output alone (`Elementwise.fusable`: relu, sigmoid,
clip, ...) fuses: the backward then has the layer's output Y and no longer its input. HardSwish,
SiLU, softplus and the like keep a pass of their own.

The producer's output must have no other consumer and must not be the model's
output; the fused layer then writes the activation's output tensor. Takes and
returns the IR.
"""
from __future__ import annotations

import dataclasses
import math

from .elementwise import UNARY
from .ir import WEIGHTED, Graph, Layer


def _const_operand(layer, value: float):
    """The index of `layer`'s activation operand where its other operand is the constant `value` (one value, to
    float32's precision), else None."""
    ops = layer.attrs.get("operands", [])
    if len(ops) != 2 or len(layer.inputs) != 1:
        return None
    kinds = [o.get("kind") for o in ops]
    if sorted(kinds) != ["act", "const"]:
        return None
    c = ops[kinds.index("const")].get("values", [])
    return kinds.index("act") if len(c) == 1 and abs(c[0] - value) <= 1e-6 * abs(value) else None


def fuse_gelu(graph: Graph) -> Graph:
    """x * (erf(x / sqrt 2) + 1) * 0.5, five elementwise layers as torch exports nn.GELU (Div, Erf, Add, Mul, Mul),
    as one layer `gelu` (prep/elementwise.py) where the four in between have no other reader and are no output:
    MiniLM's feed-forward ran 5 passes of 1536 x 32 a layer forward, 5 backward."""
    layers, drop = list(graph.layers), set()

    def only(t):  # the one reader of t, where t is no output
        readers = graph.consumers(t)
        return readers[0] if len(readers) == 1 and t not in graph.outputs else None

    for div in layers:
        if div.op != "div" or _const_operand(div, math.sqrt(2.0)) != 0:
            continue
        x = div.inputs[0]
        erf = only(div.outputs[0])
        add = erf and erf.op == "erf" and only(erf.outputs[0])
        mul = add and add.op == "add" and _const_operand(add, 1.0) is not None and only(add.outputs[0])
        half = (mul and mul.op == "mul" and sorted(mul.inputs) == sorted([x, add.outputs[0]])
                and graph.shapes[x] == graph.shapes[mul.outputs[0]] and only(mul.outputs[0]))
        if not (half and half.op == "mul" and _const_operand(half, 0.5) is not None):
            continue
        drop |= {id(div), id(erf), id(add), id(mul)}
        layers[layers.index(half)] = Layer("gelu", half.name, [x], list(half.outputs))
    out = [l for l in layers if id(l) not in drop]
    shapes = {k: v for k, v in graph.shapes.items() if k in graph.inputs or any(k in l.outputs for l in out)}
    return dataclasses.replace(graph, layers=out, shapes=shapes)


def fuse_activations(graph: Graph) -> Graph:
    graph = fuse_gelu(graph)
    out: list = []
    for layer in graph.layers:
        x = layer.inputs[0] if layer.inputs else None
        prev = next((l for l in out if x in l.outputs), None)
        if (layer.op in UNARY and UNARY[layer.op].fusable and prev is not None and prev.op in WEIGHTED and "act" not in prev.attrs
                and x not in graph.outputs and len(graph.consumers(x)) == 1):
            attrs = dict(prev.attrs, act=layer.op, act_attrs=dict(layer.attrs))
            out[out.index(prev)] = dataclasses.replace(prev, outputs=list(layer.outputs), attrs=attrs,
                                                       name=f"{prev.name}+{layer.name}")
            continue
        out.append(layer)
    shapes = {k: v for k, v in graph.shapes.items() if k in graph.inputs or any(k in l.outputs for l in out)}
    return dataclasses.replace(graph, layers=out, shapes=shapes)
