"""gather: every shape op on activations, one pass of index arithmetic (prep/shape.py).

forward    gather   X0, X1, ...  -> Y     rows: batch   (the parts of the layer: inputs, constants and
                                                      parameters, a class token: one sample read by all)
backward   gather   DY           -> dX_i  rows: batch   (one pass per input part: the inverse chain)
                    DY           -> dP    rows: full    (a parameter's part: the inverse chain summed over
                                                      the batch; the optimizer includes this kernel)

A gather that keeps its input's texels (layout.gather_is_view) has no pass: layout.py shares the
texture, and the gradient. The views of each source are computed in Python (layout.gather_part_views); the kernel,
written in the kernel language (codegen/kl.py), walks them, unrolled: each view's sizes, strides and ranges are
literals of its source (a constant part's values a constant array).
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.packing import ceil_div

from texelfit.codegen.webgl2.layout import gather_is_view, gather_part_views
from texelfit.prep.shape import part_shape, render_views

from contextlib import nullcontext

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import ROW, lane, lift, load, select, uniform
from .common import channel_lanes, chw, grad_target, param_grad


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


def _index(k: kl.KernelDef, at: str, flat, views):
    """(f, ok) of flat index `flat` taken through `views` (prep/shape.py: render_views), top first: each unravels it
    over its axes (innermost first), ok false where an axis index is outside its [lo, hi) (None: never), else sums
    index * stride + offset into the flat index of the view below (0 once ok is false: an index in range)."""
    f, ok = flat, None
    for vi, view in enumerate(views):
        r, fe = k.let(f"r{at}_{vi}", f), lift(view["offset"])
        for ai, ax in enumerate(view["axes"]):
            i = k.let(f"i{at}_{vi}_{ai}", r % ax["size"])
            if ai + 1 < len(view["axes"]):
                r = k.let(f"q{at}_{vi}_{ai}", r // ax["size"])
            if ax["masked"]:
                inside = (i >= ax["lo"]) & (i < ax["hi"])
                ok = inside if ok is None else ok & inside
            fe = fe + i * ax["stride"]
        if ok is not None:
            ok = k.let(f"ok{at}_{vi}", ok)
            fe = select(ok, fe, 0)
        f = k.let(f"f{at}_{vi}", fe)
    return f, ok


def _kl(out_shape, sources, batch_sum: bool) -> kl.KernelDef:
    """Y[n] = the sum of the parts (input textures X*, constants), each read through its views: lane (ch, h, w) of
    Y is flat index (ch * H + h) * W + w, taken to the (ch, h, w) of a source's lane, or to an element of a constant;
    padding lanes zero. A parameter's texture (a class token) is read at its one sample; with batch_sum, Y is one
    sample, the sum over the batch (a parameter's gradient, which the optimizer includes)."""
    k = kl.KernelDef()
    c, h, w, c4 = k.syms(**_out_consts(out_shape))
    n = k.let("n", ROW // h)
    y = k.let("y", ROW - n * h)
    with channel_lanes(k, c4, c) as (x, ch, j, v):
        index = k.let("index", (ch * h + y) * w + x)
        for si, s in enumerate(sources):
            f, ok = _index(k, str(si), index, s["views"])
            with k.when(ok) if ok is not None else nullcontext():
                if s["data"] is not None:
                    k.set_lane(v, j, lane(v, j) + k.table(s["const"], s["data"])[f])
                else:
                    _read(k, si, s, f, v, j, n, batch_sum)
    # a parameter's gradient came scaled (kernels.py: u_loss_scale)
    k.out(v / uniform("u_loss_scale", "float") if batch_sum else v)
    return k


def _read(k: kl.KernelDef, si: int, s: dict, f, v, j, n, batch_sum: bool) -> None:
    """Lane j of v += the element at flat index f of texture source s: at sample n, at the one sample of a
    parameter, or (batch_sum) summed over the batch."""
    sc = k.let(f"sc{si}", f // s["hw"])
    sq = k.let(f"sq{si}", f - sc * s["hw"])
    sh = k.let(f"sh{si}", sq // s["w"])
    col = k.let(f"col{si}", (sq - sh * s["w"]) * s["c4"] + sc // 4)
    if batch_sum:
        with k.loop(f"b{si}", uniform("u_batch", "int")) as b:
            k.set_lane(v, j, lane(v, j) + lane(load(s["name"], b * s["h"] + sh, col), sc % 4))
    else:
        row = sh if s.get("param") else n * s["h"] + sh
        k.set_lane(v, j, lane(v, j) + lane(load(s["name"], row, col), sc % 4))


def _kernel(title, inputs, out_shape, sources, batch_sum=False):
    """batch_sum: the output is one sample, the sum over the batch of what each sample's sources give (a
    parameter's gradient, scaled back by u_loss_scale)."""
    return Kernel(title, "kl", tuple(inputs), uniforms=("u_batch", "u_loss_scale") if batch_sum else (),
                  kl=_kl(out_shape, sources, batch_sum))


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
            s.update(data=values.tolist(), const=f"K{len(sources)}")
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
    return [Pass(k, [plan.grad(layer.outputs[0])] if sources else [], [param_grad(plan, layer, part["param"])], "full",
                 layer.name)]
