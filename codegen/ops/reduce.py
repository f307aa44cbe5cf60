"""reduce: the mean, sum or max of a tensor over any of its per-sample axes (ReduceMean, ReduceSum,
ReduceMax; the mean over H and W of (C, H, W) is global_avgpool, ops/pool.py).

forward    reduce_forward   X          -> Y (, T: how many inputs equal the max)   rows: batch
backward   reduce_grad      DY (, X, Y, T)  -> dX                                 rows: batch
           (mean: dY / R; sum: dY; max: dY / T where X is the max, shared among ties as torch.amax)

Index arithmetic over the layout, computed here: an output element e (row-major over the output's
shape, which is the input's with the reduced axes 1) sits at base(e) = sum over the kept axes of
((e / kstride) % dim) * instride in the input, and reduced element r (row-major over the reduced
axes) at base(e) + sum over the reduced axes of ((r / rstride) % dim) * instride. A flat input index
is a position of the channel-packed layout through chw (codegen/webgl2/layout.py). Written in the kernel language
(codegen/kl.py): each lane of an output texel is a channel of its own, computed by a loop over the lanes.
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.packing import ceil_div, chw

from texelfit.codegen.webgl2.layout import storage_strides

from .. import kl
from ..kernels import Kernel, Pass, glsl_float
from ..kl import COL, ROW, lane, load, maximum, select, splat, to_float
from .common import grad_target


def _strides(dims) -> list[int]:
    return [int(np.prod(dims[i + 1:])) for i in range(len(dims))]


def _consts(layer, graph):
    shape = list(graph.shapes[layer.inputs[0]])
    axes = layer.attrs["axes"]
    keep = [1 if i in axes else d for i, d in enumerate(shape)]
    red = [shape[i] for i in axes]
    # the flat indices the kernel walks are those of the stored order (layout.storage_strides: tokens (R, F)
    # are stored (F, R, 1)): an output element e's kept axes, and the input's axes, by their stored strides
    out_shape = graph.shapes[layer.outputs[0]]
    ins, rs = storage_strides(tuple(shape)), _strides(red)
    out_strides = storage_strides(tuple(out_shape))
    kept_axes = [i for i in range(len(shape)) if i not in axes]
    if layer.attrs["keepdims"]:
        ks = out_strides
    else:
        ks = [0] * len(shape)
        for j, i in enumerate(kept_axes):
            ks[i] = out_strides[j] if j < len(out_strides) else 1
    ic, ih, iw = chw(tuple(shape))
    oc, oh, ow = chw(graph.shapes[layer.outputs[0]])
    count = int(np.prod(red))
    return dict(kind=layer.attrs["kind"], count=count, count_float=glsl_float(count),
                kept=[{"stride": ks[i], "dim": d, "instride": ins[i]} for i, d in enumerate(shape) if i not in axes],
                reduced=[{"stride": rs[j], "dim": shape[i], "instride": ins[i]} for j, i in enumerate(axes)],
                ic=ic, ih=ih, iw=iw, ic4=ceil_div(ic, 4), oc=oc, oh=oh, ow=ow, oc4=ceil_div(oc, 4))


_LOWEST = -3.4028234663852886e38


def _unravel(flat, terms) -> kl.X:
    """sum over terms (stride, dim, step) of ((flat / stride) % dim) * step: one index, re-strided."""
    out = kl.lift(0)
    for stride, dim, step in terms:
        out = out + (flat // stride) % dim * step
    return out


def _forward_kl(c: dict) -> kl.KernelDef:
    k = kl.KernelDef()
    n = k.let("n", ROW // c["oh"])
    oh = k.let("oh", ROW - n * c["oh"])
    ow = k.let("ow", COL // c["oc4"])
    oc4 = k.let("oc4", COL - ow * c["oc4"])
    v, t = k.let("v", splat(0.0)), k.let("t", splat(0.0))
    with k.loop("j", 4) as j:
        oc = k.let("oc", oc4 * 4 + j)
        with k.when(oc < c["oc"]):
            e = k.let("e", (oc * c["oh"] + oh) * c["ow"] + ow)
            base = k.let("base", _unravel(e, [(a["stride"], a["dim"], a["instride"]) for a in c["kept"]]))
            acc = k.let("acc", _LOWEST if c["kind"] == "max" else 0.0)
            ties = k.let("ties", 0.0)
            with k.loop("r", c["count"]) as r:
                ei = k.let("ei", base + _unravel(r, [(a["stride"], a["dim"], a["instride"]) for a in c["reduced"]]))
                ch = k.let("ch", ei // (c["ih"] * c["iw"]))
                x = k.let("x", lane(load("X", n * c["ih"] + (ei // c["iw"]) % c["ih"], ei % c["iw"] * c["ic4"] + ch // 4),
                                    ch % 4))
                if c["kind"] == "max":
                    k.set(ties, select(x > acc, 1.0, select(x.eq(acc), ties + 1.0, ties)))
                    k.set(acc, maximum(acc, x))
                else:
                    k.set(acc, acc + x)
            k.set_lane(v, j, acc / float(c["count"]) if c["kind"] == "mean" else acc)
            k.set_lane(t, j, ties)
    k.out(v, 0)
    if c["kind"] == "max":
        k.out(t, 1)
    return k


def _grad_kl(c: dict) -> kl.KernelDef:
    """mean: dY / count; sum: dY; max: dY / T where X is the max (shared among ties, as torch.amax)."""
    k = kl.KernelDef()
    n = k.let("n", ROW // c["ih"])
    ih = k.let("ih", ROW - n * c["ih"])
    iw = k.let("iw", COL // c["ic4"])
    ic4 = k.let("ic4", COL - iw * c["ic4"])
    v = k.let("v", splat(0.0))
    if c["kind"] == "max":
        x = k.let("x", load("X", ROW, COL))
    with k.loop("j", 4) as j:
        ch = k.let("ch", ic4 * 4 + j)
        with k.when(ch < c["ic"]):
            ei = k.let("ei", (ch * c["ih"] + ih) * c["iw"] + iw)
            e = k.let("e", _unravel(ei, [(a["instride"], a["dim"], a["stride"]) for a in c["kept"]]))
            oc = k.let("oc", e // (c["oh"] * c["ow"]))
            row = k.let("yr", n * c["oh"] + (e // c["ow"]) % c["oh"])
            col = k.let("yc", e % c["ow"] * c["oc4"] + oc // 4)
            dy = k.let("dy", lane(load("DY", row, col), oc % 4))
            if c["kind"] == "max":
                g = select(lane(x, j).eq(lane(load("Y", row, col), oc % 4)), dy / lane(load("T", row, col), oc % 4), 0.0)
            else:
                g = dy / float(c["count"]) if c["kind"] == "mean" else dy
            k.set_lane(v, j, g)
    k.out(v)
    return k


def ties_texture(layer) -> str:
    return "ties:" + layer.outputs[0]


def _title(layer, c, what):
    return f"{what} {c['kind']} {c['ic']}x{c['ih']}x{c['iw']}->{c['oc']}x{c['oh']}x{c['ow']}"


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    outs = [plan.tensor(layer.outputs[0])] + ([ties_texture(layer)] if c["kind"] == "max" else [])
    k = Kernel(_title(layer, c, "reduce_forward"), "kl", ("X",), outputs=len(outs), kl=_forward_kl(c))
    return [Pass(k, [plan.tensor(layer.inputs[0])], outs, "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    c = _consts(layer, graph)
    y = layer.outputs[0]
    names, textures = ("DY",), [plan.grad(y)]
    if c["kind"] == "max":
        names += ("X", "Y", "T")
        textures += [plan.tensor(layer.inputs[0]), plan.tensor(y), ties_texture(layer)]
    k = Kernel(_title(layer, c, "reduce_grad"), "kl", names, kl=_grad_kl(c))
    return [Pass(k, textures, [target], "batch", layer.name)]
