"""dropout: in a training step (u_dropout = 1, set by fit), Y = X * mask / (1 - p), the mask drawn per
step and element (prep/dropout.py); elsewhere (predict, features, gradients) Y = X.

forward    dropout   X    -> Y     rows: batch
backward   dropout   DY   -> dX    rows: batch   (the same kernel: the same mask, the same scale)
"""
from __future__ import annotations

from texelfit.prep import dropout as dp
from texelfit.prep.layout import ceil_div, chw

from ..kernels import Kernel, Pass
from .common import grad_target


def _kernel(layer, graph, what):
    c, h, w = chw(graph.shapes[layer.inputs[0]])
    p = layer.attrs["ratio"]
    consts = dict(c=c, h=h, w=w, c4=ceil_div(c, 4), p=float(p), scale=float(dp.scale(p)), salt=dp.salt(layer.name))
    return Kernel(f"dropout {what} p{p:g} {c}x{h}x{w}", "dropout.glsl.j2", ("X",), uniforms=("u_dropout", "u_dropseed"),
                  consts=consts)


def forward(layer, graph, plan):
    return [Pass(_kernel(layer, graph, "forward"), [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])],
                 "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    return [Pass(_kernel(layer, graph, "grad"), [plan.grad(layer.outputs[0])], [target], "batch", layer.name)]
