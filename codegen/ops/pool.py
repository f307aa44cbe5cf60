"""Pooling over H and W, with PyTorch's window rules (ceil_mode, count_include_pad), written in the kernel
language (codegen/kl.py): the GLSL and the CPU backend's functions are printed from these declarations.

maxpool         maxpool_forward        X        -> Y, I (where each max came from)   rows: batch
                maxpool_grad           DY, I    -> dX  (to the arg-max, as PyTorch)  rows: batch
avgpool         avgpool_forward        X        -> Y                                 rows: batch
                avgpool_grad           DY       -> dX                                rows: batch
global_avgpool  global_avgpool_forward X        -> Y (C,) or (C, 1, 1)               rows: batch
                global_avgpool_grad    DY       -> dX                                rows: batch

An image (C, H, W) is stored with row n * H + h of sample n and texel w * C4 + c / 4 (codegen/webgl2/layout.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from texelfit.prep.packing import ceil_div

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, load, maximum, minimum, select, splat, to_float
from .common import grad_target

_LOWEST = -3.0e38


@dataclass(frozen=True)
class _Pool:
    c: int
    ih: int
    iw: int
    oh: int = 1
    ow: int = 1
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    pt: int = 0
    pl: int = 0
    pb: int = 0
    pr: int = 0
    count_include_pad: bool = False

    @property
    def c4(self) -> int:
        return ceil_div(self.c, 4)


class _Syms:
    """A _Pool's sizes as the kernel's shape constants (kl.KernelDef.sym): what the kernels compute with."""

    def __init__(self, k: kl.KernelDef, p: _Pool):
        for name in ("c", "ih", "iw", "oh", "ow", "kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr", "c4"):
            setattr(self, name, k.sym(name, getattr(p, name)))
        self.count_include_pad = p.count_include_pad


def _pool(layer, graph) -> _Pool:
    c, ih, iw = graph.shapes[layer.inputs[0]]
    if layer.op == "global_avgpool":
        return _Pool(c, ih, iw)
    a, out = layer.attrs, graph.shapes[layer.outputs[0]]
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = a["kernel"], a["strides"], a["pads"]
    return _Pool(c, ih, iw, out[1], out[2], kh, kw, sh, sw, pt, pl, pb, pr, bool(a.get("count_include_pad", False)))


def _at(k: kl.KernelDef, p: _Syms, h, what: str):
    """(n, y, x, texel of the channels) of the output texel in an image of height h: y, x named what + h/w."""
    n = k.let("n", ROW // h)
    y = k.let(what + "h", ROW - n * h)
    x = k.let(what + "w", COL // p.c4)
    return n, y, x, k.let("cc", COL - x * p.c4)


def _maxpool_forward(p: _Pool) -> kl.KernelDef:
    """Y = the max over the window (padding ignored); out1 = where it came from (ih * iw + iw), the first in scan
    order as in PyTorch."""
    k = kl.KernelDef()
    p = _Syms(k, p)
    n, oh, ow, cc = _at(k, p, p.oh, "o")
    best, where = k.let("best", splat(_LOWEST)), k.let("where", splat(-1.0))
    with k.loop("kh", p.kh) as kh:
        ih = k.let("ih", oh * p.sh - p.pt + kh)
        with k.when((ih >= 0) & (ih < p.ih)), k.loop("kw", p.kw) as kw:
            iw = k.let("iw", ow * p.sw - p.pl + kw)
            with k.when((iw >= 0) & (iw < p.iw)):
                x = k.let("x", load("X", n * p.ih + ih, iw * p.c4 + cc))
                more = k.let("more", x > best)
                k.set(best, select(more, x, best))
                k.set(where, select(more, splat(to_float(ih * p.iw + iw)), where))
    k.out(best, 0)
    k.out(where, 1)
    return k


def _maxpool_grad(p: _Pool) -> kl.KernelDef:
    """dX = the sum of dY over the windows whose maximum came from here: the windows holding (ih, iw) are a range
    of oh and of ow, computed rather than searched for."""
    k = kl.KernelDef()
    p = _Syms(k, p)
    n, ih, iw, cc = _at(k, p, p.ih, "i")
    oh0 = k.let("oh0", (maximum(ih + (p.pt - p.kh + 1), 0) + (p.sh - 1)) // p.sh)
    oh1 = k.let("oh1", minimum((ih + p.pt) // p.sh, p.oh - 1))
    ow0 = k.let("ow0", (maximum(iw + (p.pl - p.kw + 1), 0) + (p.sw - 1)) // p.sw)
    ow1 = k.let("ow1", minimum((iw + p.pl) // p.sw, p.ow - 1))
    here = k.let("here", splat(to_float(ih * p.iw + iw)))
    acc = k.let("acc", splat(0.0))
    with k.loop("oh", oh1 + 1, oh0) as oh, k.loop("ow", ow1 + 1, ow0) as ow:
        row, col = n * p.oh + oh, ow * p.c4 + cc
        k.set(acc, acc + select(load("I", row, col).eq(here), load("DY", row, col), 0.0))
    k.out(acc)
    return k


def _window(p: _Syms, oh, ow):
    """(h0, w0, h1, w1) of output (oh, ow)'s window, clipped to the input and its padding, and its divisor, as
    PyTorch's avg_pool2d: the window may reach into the padding (which counts with count_include_pad), not past."""
    h0, w0 = oh * p.sh - p.pt, ow * p.sw - p.pl
    h1, w1 = minimum(h0 + p.kh, p.ih + p.pb), minimum(w0 + p.kw, p.iw + p.pr)
    if p.count_include_pad:
        return h0, w0, h1, w1, to_float((h1 - h0) * (w1 - w0))
    return h0, w0, h1, w1, to_float((minimum(h1, p.ih) - maximum(h0, 0)) * (minimum(w1, p.iw) - maximum(w0, 0)))


def _avgpool_forward(p: _Pool) -> kl.KernelDef:
    k = kl.KernelDef()
    p = _Syms(k, p)
    n, oh, ow, cc = _at(k, p, p.oh, "o")
    h0, w0, h1, w1, divisor = (k.let(name, v) for name, v in zip(("h0", "w0", "h1", "w1", "divisor"),
                                                                  _window(p, oh, ow)))
    acc = k.let("acc", splat(0.0))
    with k.loop("ih", minimum(h1, p.ih), maximum(h0, 0)) as ih, \
            k.loop("iw", minimum(w1, p.iw), maximum(w0, 0)) as iw:
        k.set(acc, acc + load("X", n * p.ih + ih, iw * p.c4 + cc))
    k.out(acc / divisor)
    return k


def _avgpool_grad(p: _Pool) -> kl.KernelDef:
    """dX = the sum over the windows that contain (ih, iw) of dY / their divisor."""
    k = kl.KernelDef()
    p = _Syms(k, p)
    n, ih, iw, cc = _at(k, p, p.ih, "i")
    acc = k.let("acc", splat(0.0))
    with k.loop("kh", p.kh) as kh:
        th = k.let("th", ih + p.pt - kh)
        oh = k.let("oh", maximum(th, 0) // p.sh)
        with k.when((th >= 0) & (oh * p.sh).eq(th) & (oh < p.oh)), k.loop("kw", p.kw) as kw:
            tw = k.let("tw", iw + p.pl - kw)
            ow = k.let("ow", maximum(tw, 0) // p.sw)
            with k.when((tw >= 0) & (ow * p.sw).eq(tw) & (ow < p.ow)):
                _, _, h1, w1, divisor = _window(p, oh, ow)
                with k.when((ih < h1) & (iw < w1)):
                    k.set(acc, acc + load("DY", n * p.oh + oh, ow * p.c4 + cc) / divisor)
    k.out(acc)
    return k


def _global_avgpool_forward(p: _Pool) -> kl.KernelDef:
    """Y[n, c] = the mean of X[n, c] over H and W."""
    k = kl.KernelDef()
    p = _Syms(k, p)
    acc = k.let("acc", splat(0.0))
    with k.loop("h", p.ih) as h, k.loop("w", p.iw) as w:
        k.set(acc, acc + load("X", ROW * p.ih + h, w * p.c4 + COL))
    k.out(acc / to_float(p.ih * p.iw))
    return k


def _global_avgpool_grad(p: _Pool) -> kl.KernelDef:
    k = kl.KernelDef()
    p = _Syms(k, p)
    k.out(load("DY", ROW // p.ih, COL % p.c4) / to_float(p.ih * p.iw))
    return k


KERNELS = {"maxpool": (_maxpool_forward, _maxpool_grad), "avgpool": (_avgpool_forward, _avgpool_grad),
           "global_avgpool": (_global_avgpool_forward, _global_avgpool_grad)}


def _title(layer, p: _Pool, what):
    if layer.op == "global_avgpool":
        return f"{what} {p.c}x{p.ih}x{p.iw}"
    return (f"{what} {p.c}x{p.ih}x{p.iw}->{p.oh}x{p.ow} k{p.kh}x{p.kw} s{p.sh}x{p.sw}"
            f" p{p.pt},{p.pl},{p.pb},{p.pr}")


def argmax_texture(layer) -> str:
    return "argmax:" + layer.outputs[0]


def forward(layer, graph, plan):
    p = _pool(layer, graph)
    x, y = plan.tensor(layer.inputs[0]), plan.tensor(layer.outputs[0])
    outs = [y, argmax_texture(layer)] if layer.op == "maxpool" else [y]
    k = Kernel(_title(layer, p, f"{layer.op}_forward"), "kl", ("X",), outputs=len(outs),
               kl=KERNELS[layer.op][0](p))
    return [Pass(k, [x], outs, "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    p = _pool(layer, graph)
    dy = plan.grad(layer.outputs[0])
    ins = ("DY", "I") if layer.op == "maxpool" else ("DY",)
    k = Kernel(_title(layer, p, f"{layer.op}_grad"), "kl", ins, kl=KERNELS[layer.op][1](p))
    return [Pass(k, [dy, argmax_texture(layer)][:len(ins)], [target], "batch", layer.name)]
