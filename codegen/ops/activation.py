"""Elementwise activations that could not be fused into a producing dense layer.

forward    activation_forward   X      -> Y     rows: batch
backward   activation_grad      DY, Y  -> dX    rows: batch   (derivative written in the output Y)
"""
from __future__ import annotations

from ..kernels import Kernel, Pass
from .common import activation, lanes


def _consts(layer, graph):
    return dict(activation(layer), **lanes(graph.shapes[layer.outputs[0]][0]))


def forward(layer, graph, plan):
    k = Kernel(f"activation_forward {layer.op}", "activation_forward.glsl.j2", ("X",), consts=_consts(layer, graph))
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    x, y = layer.inputs[0], layer.outputs[0]
    if plan.alias.get(x, x) == graph.input:
        return []
    k = Kernel(f"activation_grad {layer.op}", "activation_grad.glsl.j2", ("DY", "Y"), consts=_consts(layer, graph))
    return [Pass(k, [plan.grad(y), plan.tensor(y)], [plan.grad(x)], "batch", layer.name)]
