"""gather: every shape op on activations, one pass of index arithmetic (prep/shape.py).

forward    gather   X0, X1, ...  -> Y     rows: batch   (the parts of the layer: inputs, constants and
                                                      parameters, a class token: one sample read by all)
backward   gather   DY           -> dX_i  rows: batch   (one pass per input part: the inverse chain)
                    DY           -> dP    rows: full    (a parameter's part: the inverse chain summed over
                                                      the batch; the optimizer includes this kernel)

A gather that keeps its input's texels (layout.gather_is_view) has no pass: layout.py shares the
texture, and the gradient. The kernel's constants are the views of each source, computed in Python
(layout.gather_part_views); kernels/gather.glsl.j2 and its CPU twin only walk them.
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.layout import ceil_div, gather_is_view, gather_part_views
from texelfit.prep.shape import part_shape, render_views

from ..kernels import Kernel, Pass, glsl_float
from .common import chw, grad_target


def _dims(shape) -> str:
    return "x".join(str(d) for d in shape) or "1"


def _out_consts(shape) -> dict:
    c, h, w = chw(shape)
    return {"c": c, "h": h, "w": w, "c4": ceil_div(c, 4)}


def _source(name, shape, views, batched=True) -> dict:
    """A texture the kernel reads through `views`: at the output texel's sample, or (not `batched`: a
    parameter) at its one sample."""
    c, h, w = chw(shape)
    s = {"name": name, "views": render_views(views), "h": h, "w": w, "hw": h * w, "c4": ceil_div(c, 4), "data": None}
    return s if batched else dict(s, param=True)  # (only where it is one: the kernels' consts ship as JSON)


def _kernel(title, inputs, out_shape, sources, batch_sum=False):
    """batch_sum: the output is one sample, the sum over the batch of what each sample's sources give (a
    parameter's gradient, scaled back by u_loss_scale)."""
    consts = dict(_out_consts(out_shape), sources=sources, **({"batch_sum": True} if batch_sum else {}))
    return Kernel(title, "gather.glsl.j2", tuple(inputs), uniforms=("u_batch", "u_loss_scale") if batch_sum else (),
                  consts=consts)


def forward(layer, graph, plan):
    if gather_is_view(layer, graph):
        return []
    sources, names, textures = [], [], []
    for part in layer.attrs["parts"]:
        views = gather_part_views(layer, graph, part)
        if views is None:  # covers nothing
            continue
        if part["input"] is None and part.get("param") is None:
            values = np.asarray(part["const"], dtype=np.float32).reshape(-1)
            s = _source(None, (values.size,), views)
            s.update(data=[glsl_float(v) for v in values.tolist()], size=int(values.size), const=f"K{len(sources)}")
            sources.append(s)
            continue
        name = f"X{len(names)}"
        if part.get("param") is not None:
            sources.append(_source(name, part["shape"], views, batched=False))
            textures.append("param:" + layer.params[part["param"]])
        else:
            t = layer.inputs[part["input"]]
            sources.append(_source(name, graph.shapes[t], views))
            textures.append(plan.tensor(t))
        names.append(name)
    shapes = "+".join(("p" if p.get("param") is not None else "") +
                      _dims(part_shape(p, [graph.shapes[t] for t in layer.inputs])) for p in layer.attrs["parts"])
    title = f"gather {shapes}->{_dims(graph.shapes[layer.outputs[0]])}"
    return [Pass(_kernel(title, names, graph.shapes[layer.outputs[0]], sources), textures,
                 [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    if gather_is_view(layer, graph):
        return []
    passes = []
    out = graph.shapes[layer.outputs[0]]
    for part in layer.attrs["parts"]:
        if part.get("param") is not None:
            passes += _param_grad(layer, graph, plan, part)
            continue
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


def _param_grad(layer, graph, plan, part) -> list[Pass]:
    """The gradient of a parameter's part (a class token): the inverse chain of dY, summed over the batch."""
    name = layer.params[part["param"]]
    if not graph.is_trainable(name):
        return []  # frozen (build --trainable)
    views = gather_part_views(layer, graph, part, backward=True)
    out, x = graph.shapes[layer.outputs[0]], tuple(part["shape"])
    sources = [] if views is None else [_source("DY", out, views)]
    k = _kernel(f"gather_grad param {_dims(out)}->{_dims(x)}", ["DY"] if sources else [], x, sources, batch_sum=True)
    return [Pass(k, [plan.grad(layer.outputs[0])] if sources else [], ["pgrad:" + name], "full", layer.name)]
