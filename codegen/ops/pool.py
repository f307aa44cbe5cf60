"""Pooling over H and W, with PyTorch's window rules (ceil_mode, count_include_pad).

maxpool         maxpool_forward        X        -> Y, I (where each max came from)   rows: batch
                maxpool_grad           DY, I    -> dX  (to the arg-max, as PyTorch)  rows: batch
avgpool         avgpool_forward        X        -> Y                                 rows: batch
                avgpool_grad           DY       -> dX                                rows: batch
global_avgpool  global_avgpool_forward X        -> Y (C,) or (C, 1, 1)               rows: batch
                global_avgpool_grad    DY       -> dX                                rows: batch
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div

from ..kernels import Kernel, Pass, glsl_float
from .common import grad_target


def _consts(layer, graph):
    c, ih, iw = graph.shapes[layer.inputs[0]]
    out = graph.shapes[layer.outputs[0]]
    d = dict(c=c, c4=ceil_div(c, 4), ih=ih, iw=iw, area=ih * iw, area_float=glsl_float(ih * iw))
    if layer.op != "global_avgpool":
        a = layer.attrs
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = a["kernel"], a["strides"], a["pads"]
        d.update(oh=out[1], ow=out[2], kh=kh, kw=kw, sh=sh, sw=sw, pt=pt, pl=pl, pb=pb, pr=pr,
                 count_include_pad=a.get("count_include_pad", False))
    return d


def _title(layer, c, what):
    if layer.op == "global_avgpool":
        return f"{what} {c['c']}x{c['ih']}x{c['iw']}"
    return (f"{what} {c['c']}x{c['ih']}x{c['iw']}->{c['oh']}x{c['ow']} k{c['kh']}x{c['kw']} s{c['sh']}x{c['sw']}"
            f" p{c['pt']},{c['pl']},{c['pb']},{c['pr']}")


def argmax_texture(layer) -> str:
    return "argmax:" + layer.outputs[0]


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    x, y = plan.tensor(layer.inputs[0]), plan.tensor(layer.outputs[0])
    if layer.op == "maxpool":
        k = Kernel(_title(layer, c, "maxpool_forward"), "maxpool_forward.glsl.j2", ("X",), outputs=2, consts=c)
        return [Pass(k, [x], [y, argmax_texture(layer)], "batch", layer.name)]
    k = Kernel(_title(layer, c, f"{layer.op}_forward"), f"{layer.op}_forward.glsl.j2", ("X",), consts=c)
    return [Pass(k, [x], [y], "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    c = _consts(layer, graph)
    dy = plan.grad(layer.outputs[0])
    if layer.op == "maxpool":
        k = Kernel(_title(layer, c, "maxpool_grad"), "maxpool_grad.glsl.j2", ("DY", "I"), consts=c)
        return [Pass(k, [dy, argmax_texture(layer)], [target], "batch", layer.name)]
    k = Kernel(_title(layer, c, f"{layer.op}_grad"), f"{layer.op}_grad.glsl.j2", ("DY",), consts=c)
    return [Pass(k, [dy], [target], "batch", layer.name)]
