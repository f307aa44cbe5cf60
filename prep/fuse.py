"""Fuse an activation into the conv or dense layer that feeds it, where that removes a pass.

Only an activation whose derivative reads its output alone (`Elementwise.fusable`: relu, sigmoid,
clip, ...) fuses: the backward then has the layer's output Y and no longer its input. HardSwish,
SiLU, softplus and the like keep a pass of their own.

The producer's output must have no other consumer and must not be the model's
output; the fused layer then writes the activation's output tensor. Takes and
returns the IR.
"""
from __future__ import annotations

import dataclasses

from .elementwise import UNARY
from .ir import WEIGHTED, Graph


def fuse_activations(graph: Graph) -> Graph:
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
