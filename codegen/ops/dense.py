"""dense: Y = act(X @ W.T + b). W is laid out [ceil4(O) rows, ceil(I/4) texels] (layout.py).

forward        dense_forward      X, W, B        -> Y        rows: batch
backward       dense_grad_weight  DY, Y, X       -> dW       rows: full
               dense_grad_bias    DY, Y          -> db       rows: full
               dense_grad_input   DY, Y, W       -> dX       rows: batch   (not for the model input)
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div

from ..kernels import Kernel, Pass
from .common import activation, lanes


def _consts(layer, graph):
    i, o = graph.shapes[layer.inputs[0]][0], graph.shapes[layer.outputs[0]][0]
    return dict(activation(layer), **lanes(o), in_features=i, out_features=o, in4=ceil_div(i, 4),
                out4=ceil_div(o, 4), has_bias="bias" in layer.params)


def _title(layer, graph, what):
    c = _consts(layer, graph)
    act = "" if c["act"] == "none" else f" {c['act']}"
    return f"{what} {c['in_features']}->{c['out_features']}{act}"


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    inputs = ["X", "W"] + (["B"] if c["has_bias"] else [])
    textures = [plan.tensor(layer.inputs[0]), "param:" + layer.params["weight"]]
    if c["has_bias"]:
        textures.append("param:" + layer.params["bias"])
    k = Kernel(_title(layer, graph, "dense_forward"), "dense_forward.glsl.j2", tuple(inputs), consts=c)
    return [Pass(k, textures, [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    c = _consts(layer, graph)
    x, y = layer.inputs[0], layer.outputs[0]
    dy, ty, tx = plan.grad(y), plan.tensor(y), plan.tensor(x)
    w = layer.params["weight"]
    passes = [Pass(Kernel(_title(layer, graph, "dense_grad_weight"), "dense_grad_weight.glsl.j2",
                          ("DY", "Y", "X"), uniforms=("u_batch",), consts=c),
                   [dy, ty, tx], ["pgrad:" + w], "full", layer.name)]
    if c["has_bias"]:
        passes.append(Pass(Kernel(_title(layer, graph, "dense_grad_bias"), "dense_grad_bias.glsl.j2",
                                  ("DY", "Y"), uniforms=("u_batch",), consts=c),
                           [dy, ty], ["pgrad:" + layer.params["bias"]], "full", layer.name))
    if plan.alias.get(x, x) != graph.input:
        passes.append(Pass(Kernel(_title(layer, graph, "dense_grad_input"), "dense_grad_input.glsl.j2",
                                  ("DY", "Y", "W"), consts=c),
                           [dy, ty, "param:" + w], [plan.grad(x)], "batch", layer.name))
    return passes
