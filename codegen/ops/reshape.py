"""flatten: (C, H, W) -> (C*H*W,) in PyTorch's order; a relayout from channel-packed texels.
(A flatten in place, of (C, 1, 1) or of any other shape, needs no pass: layout.py shares the
texture, and the gradient.)

forward    flatten_forward   X    -> Y     rows: batch
backward   flatten_grad      DY   -> dX    rows: batch
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div, flattens_in_place

from ..kernels import Kernel, Pass
from .common import chw, grad_target


def _consts(layer, graph):
    c, h, w = chw(graph.shapes[layer.inputs[0]])
    return {"c": c, "h": h, "w": w, "c4": ceil_div(c, 4), "size": c * h * w}


def forward(layer, graph, plan):
    if flattens_in_place(layer, graph):
        return []
    c = _consts(layer, graph)
    k = Kernel(f"flatten_forward {c['c']}x{c['h']}x{c['w']}", "flatten_forward.glsl.j2", ("X",), consts=c)
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    target = None if flattens_in_place(layer, graph) else grad_target(plan, layer, 0)
    if not target:
        return []
    c = _consts(layer, graph)
    k = Kernel(f"flatten_grad {c['c']}x{c['h']}x{c['w']}", "flatten_grad.glsl.j2", ("DY",), consts=c)
    return [Pass(k, [plan.grad(layer.outputs[0])], [target], "batch", layer.name)]
