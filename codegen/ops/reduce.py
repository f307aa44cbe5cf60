"""reduce: the mean, sum or max of a tensor over any of its per-sample axes (ReduceMean, ReduceSum,
ReduceMax; the mean over H and W of (C, H, W) is global_avgpool, ops/pool.py).

forward    reduce_forward   X          -> Y (, T: how many inputs equal the max)   rows: batch
backward   reduce_grad      DY (, X, Y, T)  -> dX                                 rows: batch
           (mean: dY / R; sum: dY; max: dY / T where X is the max, shared among ties as torch.amax)

Index arithmetic over the layout, computed here: an output element e (row-major over the output's
shape, which is the input's with the reduced axes 1) sits at base(e) = sum over the kept axes of
((e / kstride) % dim) * instride in the input, and reduced element r (row-major over the reduced
axes) at base(e) + sum over the reduced axes of ((r / rstride) % dim) * instride. A flat input index
is a position of the channel-packed layout through chw (prep/layout.py).
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.layout import ceil_div, chw, storage_strides

from ..kernels import Kernel, Pass, glsl_float
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


def ties_texture(layer) -> str:
    return "ties:" + layer.outputs[0]


def _title(layer, c, what):
    return f"{what} {c['kind']} {c['ic']}x{c['ih']}x{c['iw']}->{c['oc']}x{c['oh']}x{c['ow']}"


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    outs = [plan.tensor(layer.outputs[0])] + ([ties_texture(layer)] if c["kind"] == "max" else [])
    k = Kernel(_title(layer, c, "reduce_forward"), "reduce_forward.glsl.j2", ("X",), outputs=len(outs), consts=c)
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
    k = Kernel(_title(layer, c, "reduce_grad"), "reduce_grad.glsl.j2", names, consts=c)
    return [Pass(k, textures, [target], "batch", layer.name)]
