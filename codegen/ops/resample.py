"""resample: Resize/Upsample (nearest, bilinear) and Pad (edge, reflect) as taps per output row and
column (prep/resample.py), one kernel for both directions.

forward    resample   X    -> Y     rows: batch   (the layer's taps)
backward   resample   DY   -> dX    rows: batch   (the taps transposed: each input reads the outputs that read it)

Written in the kernel language (codegen/kl.py): the taps are its constant arrays (KernelDef.table).
"""
from __future__ import annotations

from texelfit.prep import resample as rs
from texelfit.prep.packing import ceil_div

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, load, splat
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


def _kl(c: dict) -> kl.KernelDef:
    """Y[n, ch, y, x] = sum over i < kr, j < kc of rw[y kr + i] * cw[x kc + j] * X[n, ch, rs[y kr + i], cs[x kc + j]]:
    the taps of each output row and column (a weight 0 pads a row's taps to kr, a column's to kc: skipped)."""
    k = kl.KernelDef()
    c4, ih, oh, kr, kc = (k.sym(n, c[n]) for n in ("c4", "ih", "oh", "kr", "kc"))
    rs, rw, cs, cw = (k.table(n, c[n]) for n in ("rs", "rw", "cs", "cw"))
    n = k.let("n", ROW // oh)
    y = k.let("y", ROW - n * oh)
    x = k.let("x", COL // c4)
    cc = k.let("cc", COL - x * c4)
    acc = k.let("acc", splat(0.0))
    with k.loop("i", kr) as i:
        a = k.let("a", rw[y * kr + i])
        with k.when(a.ne(0.0)):
            r = k.let("r", n * ih + rs[y * kr + i])
            s = k.let("s", splat(0.0))
            with k.loop("j", kc) as j:
                b = k.let("b", cw[x * kc + j])
                with k.when(b.ne(0.0)):
                    k.set(s, s + b * load("X", r, cs[x * kc + j] * c4 + cc))
            k.set(acc, acc + a * s)
    k.out(acc)
    return k


def _kernel(what, c) -> Kernel:
    return Kernel(_name(what, c), "kl", ("X",), kl=_kl(c))


def _name(what, c):
    return f"resample {what} {c['ih']}x{c['iw']}->{c['oh']}x{c['ow']} taps {c['kr']}x{c['kc']}"


def forward(layer, graph, plan):
    ch, ih, iw = graph.shapes[layer.inputs[0]]
    c = _consts(layer.attrs["rows"], layer.attrs["cols"], (ih, iw), ch)
    k = _kernel(layer.attrs["kind"], c)
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    ch, ih, iw = graph.shapes[layer.inputs[0]]
    _, oh, ow = graph.shapes[layer.outputs[0]]
    c = _consts(rs.transpose(layer.attrs["rows"], ih), rs.transpose(layer.attrs["cols"], iw), (oh, ow), ch)
    k = _kernel(layer.attrs["kind"] + " grad", c)
    return [Pass(k, [plan.grad(layer.outputs[0])], [target], "batch", layer.name)]
