"""Elementwise activations that could not be fused into a producing dense or conv layer.

forward    activation_forward   X      -> Y     rows: batch
backward   activation_grad      DY, Y  -> dX    rows: batch   (derivative written in the output Y)
"""
from __future__ import annotations

from ..kernels import Kernel, Pass
from .common import activation, chw, grad_target, lanes


def _consts(layer, graph):
    c, _, _ = chw(graph.shapes[layer.outputs[0]])
    return dict(activation(layer), **lanes(c))


def forward(layer, graph, plan):
    k = Kernel(f"activation_forward {layer.op}", "activation_forward.glsl.j2", ("X",), consts=_consts(layer, graph))
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    y = layer.outputs[0]
    k = Kernel(f"activation_grad {layer.op}", "activation_grad.glsl.j2", ("DY", "Y"), consts=_consts(layer, graph))
    return [Pass(k, [plan.grad(y), plan.tensor(y)], [target], "batch", layer.name)]

