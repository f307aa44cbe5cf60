"""gather: every shape op on activations, one pass of index arithmetic (prep/shape.py).

forward    gather   X0, X1, ...  -> Y     rows: batch   (the parts of the layer: inputs and constants)
backward   gather   DY           -> dX_i  rows: batch   (one pass per input part: the inverse chain)

A gather that keeps its input's texels (layout.gather_is_view) has no pass: layout.py shares the
texture, and the gradient. The kernel's constants are the views of each source, computed in Python
(layout.gather_part_views); kernels/gather.glsl.j2 and its CPU twin only walk them.
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.layout import ceil_div, gather_is_view, gather_part_views
from texelfit.prep.shape import render_views

from ..kernels import Kernel, Pass, glsl_float
from .common import chw, grad_target


def _dims(shape) -> str:
    return "x".join(str(d) for d in shape) or "1"


def _out_consts(shape) -> dict:
    c, h, w = chw(shape)
    return {"c": c, "h": h, "w": w, "c4": ceil_div(c, 4)}


def _source(name, shape, views) -> dict:
    c, h, w = chw(shape)
    return {"name": name, "views": render_views(views), "h": h, "w": w, "hw": h * w, "c4": ceil_div(c, 4),
            "data": None}


def _kernel(title, inputs, out_shape, sources):
    return Kernel(title, "gather.glsl.j2", tuple(inputs), consts=dict(_out_consts(out_shape), sources=sources))


def forward(layer, graph, plan):
    if gather_is_view(layer, graph):
        return []
    sources, names, textures = [], [], []
    for part in layer.attrs["parts"]:
        views = gather_part_views(layer, graph, part)
        if views is None:  # covers nothing
            continue
        if part["input"] is None:
            values = np.asarray(part["const"], dtype=np.float32).reshape(-1)
            s = _source(None, (values.size,), views)
            s.update(data=[glsl_float(v) for v in values.tolist()], size=int(values.size), const=f"K{len(sources)}")
            sources.append(s)
            continue
        name = f"X{len(names)}"
        t = layer.inputs[part["input"]]
        sources.append(_source(name, graph.shapes[t], views))
        names.append(name)
        textures.append(plan.tensor(t))
    shapes = "+".join(_dims(graph.shapes[layer.inputs[p["input"]]] if p["input"] is not None else p["const"].shape)
                      for p in layer.attrs["parts"])
    title = f"gather {shapes}->{_dims(graph.shapes[layer.outputs[0]])}"
    return [Pass(_kernel(title, names, graph.shapes[layer.outputs[0]], sources), textures,
                 [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    if gather_is_view(layer, graph):
        return []
    passes = []
    out = graph.shapes[layer.outputs[0]]
    for part in layer.attrs["parts"]:
        if part["input"] is None:
            continue  # a constant: no gradient
        target = grad_target(plan, layer, part["input"])
        if not target:
            continue
        x = graph.shapes[layer.inputs[part["input"]]]
        views = gather_part_views(layer, graph, part, backward=True)
        sources = [] if views is None else [_source("DY", out, views)]
        k = _kernel(f"gather_grad {_dims(out)}->{_dims(x)}", ["DY"] if sources else [], x, sources)
        passes.append(Pass(k, [plan.grad(layer.outputs[0])] if sources else [], [target], "batch", layer.name))
    return passes
