"""dense: Y = act(X @ W.T + b). W is laid out [ceil4(O) rows, ceil(I/4) texels] (layout.py).

forward        dense_forward      X, W, B        -> Y        rows: batch
backward       dense_grad_weight  DY, Y, X       -> dW       rows: full
               dense_grad_bias    DY, Y          -> db       rows: full
               dense_grad_input   DY, Y, W       -> dX       rows: batch   (when X needs a gradient)
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div

from ..kernels import Kernel, Pass
from .common import activation, grad_target, lanes


def _consts(layer, graph):
    i, o = graph.shapes[layer.inputs[0]][0], graph.shapes[layer.outputs[0]][0]
    return dict(activation(layer), **lanes(o), in_features=i, out_features=o, in4=ceil_div(i, 4),
                out4=ceil_div(o, 4), has_bias="bias" in layer.params)


def _title(c, what):
    act = "" if c["act"] == "none" else f" {c['act']}"
    return f"{what} {c['in_features']}->{c['out_features']}{act}"


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    inputs = ["X", "W"] + (["B"] if c["has_bias"] else [])
    textures = [plan.tensor(layer.inputs[0]), "param:" + layer.params["weight"]]
    if c["has_bias"]:
        textures.append("param:" + layer.params["bias"])
    k = Kernel(_title(c, "dense_forward"), "dense_forward.glsl.j2", tuple(inputs), consts=c)
    return [Pass(k, textures, [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    c = _consts(layer, graph)
    x, y = layer.inputs[0], layer.outputs[0]
    dy, ty, tx = plan.grad(y), plan.tensor(y), plan.tensor(x)
    w = layer.params["weight"]
    passes = [Pass(Kernel(_title(c, "dense_grad_weight"), "dense_grad_weight.glsl.j2",
                          ("DY", "Y", "X"), uniforms=("u_batch",), consts=c),
                   [dy, ty, tx], ["pgrad:" + w], "full", layer.name)]
    if c["has_bias"]:
        passes.append(Pass(Kernel(_title(c, "dense_grad_bias"), "dense_grad_bias.glsl.j2",
                                  ("DY", "Y"), uniforms=("u_batch",), consts=c),
                           [dy, ty], ["pgrad:" + layer.params["bias"]], "full", layer.name))
    target = grad_target(plan, layer, 0)
    if target:
        passes.append(Pass(Kernel(_title(c, "dense_grad_input"), "dense_grad_input.glsl.j2",
                                  ("DY", "Y", "W"), consts=c),
                           [dy, ty, "param:" + w], [target], "batch", layer.name))
    return passes
