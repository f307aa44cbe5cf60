"""resample: Resize/Upsample (nearest, bilinear) and Pad (edge, reflect) as taps per output row and
column (prep/resample.py), one kernel for both directions.

forward    resample   X    -> Y     rows: batch   (the layer's taps)
backward   resample   DY   -> dX    rows: batch   (the taps transposed: each input reads the outputs that read it)
"""
from __future__ import annotations

from texelfit.prep import resample as rs
from texelfit.prep.layout import ceil_div

from ..kernels import Kernel, Pass
from .common import grad_target


def _consts(rows, cols, n_in: tuple[int, int], c: int) -> dict:
    """The kernel's constants for taps `rows` and `cols` reading an input of n_in = (H, W)."""
    kr, kc = rs.width(rows), rs.width(cols)

    def flat(taps, k):
        pad = [list(t) + [(0, 0.0)] * (k - len(t)) for t in taps]
        return [i for t in pad for i, _ in t], [float(w) for t in pad for _, w in t]

    r_src, r_w = flat(rows, kr)
    c_src, c_w = flat(cols, kc)
    return dict(c4=ceil_div(c, 4), ih=n_in[0], iw=n_in[1], oh=len(rows), ow=len(cols), kr=kr, kc=kc,
                rs=r_src, rw=r_w, cs=c_src, cw=c_w)


def _name(what, c):
    return f"resample {what} {c['ih']}x{c['iw']}->{c['oh']}x{c['ow']} taps {c['kr']}x{c['kc']}"


def forward(layer, graph, plan):
    ch, ih, iw = graph.shapes[layer.inputs[0]]
    c = _consts(layer.attrs["rows"], layer.attrs["cols"], (ih, iw), ch)
    k = Kernel(_name(layer.attrs["kind"], c), "resample.glsl.j2", ("X",), consts=c)
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    ch, ih, iw = graph.shapes[layer.inputs[0]]
    _, oh, ow = graph.shapes[layer.outputs[0]]
    c = _consts(rs.transpose(layer.attrs["rows"], ih), rs.transpose(layer.attrs["cols"], iw), (oh, ow), ch)
    k = Kernel(_name(layer.attrs["kind"] + " grad", c), "resample.glsl.j2", ("X",), consts=c)
    return [Pass(k, [plan.grad(layer.outputs[0])], [target], "batch", layer.name)]
