"""flatten: (C, H, W) -> (C*H*W,) in PyTorch's order; a relayout from channel-packed texels, written in the kernel
language (codegen/kl.py): the GLSL and the CPU backend's functions are printed from these declarations.
(A flatten in place, of (C, 1, 1) or of any other shape, needs no pass: layout.py shares the
texture, and the gradient.)

forward    flatten_forward   X    -> Y     rows: batch   Y[n, f] = X[n, c, h, w], f = (c * H + h) * W + w
backward   flatten_grad      DY   -> dX    rows: batch   dX[n, c, h, w] = dY[n, (c * H + h) * W + w]

Each lane of an output texel is a value of its own, read from its own texel: a loop over the 4 lanes; padding
lanes stay zero.
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div

from texelfit.codegen.webgl2.layout import flattens_in_place

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, lane, load, splat
from .common import channel_lanes, chw, grad_target


def _syms(k: kl.KernelDef, c: int, h: int, w: int):
    return k.syms(c=c, h=h, w=w, c4=ceil_div(c, 4))


def _forward_kl(c: int, h: int, w: int) -> kl.KernelDef:
    """Lane j of texel COL of sample ROW is feature f = 4 COL + j: channel f / (H W), row, column of the rest."""
    k = kl.KernelDef()
    c, h, w, c4 = _syms(k, c, h, w)
    v = k.let("v", splat(0.0))
    with k.loop("j", 4) as j:
        f = k.let("f", COL * 4 + j)
        with k.when(f < c * h * w):
            ch = k.let("ch", f // (h * w))
            rest = k.let("rest", f - ch * (h * w))
            y = k.let("y", rest // w)
            k.set_lane(v, j, lane(load("X", ROW * h + y, (rest - y * w) * c4 + ch // 4), ch % 4))
    k.out(v)
    return k


def _grad_kl(c: int, h: int, w: int) -> kl.KernelDef:
    k = kl.KernelDef()
    c, h, w, c4 = _syms(k, c, h, w)
    n = k.let("n", ROW // h)
    y = k.let("y", ROW - n * h)
    with channel_lanes(k, c4, c) as (x, ch, j, v):
        f = k.let("f", (ch * h + y) * w + x)
        k.set_lane(v, j, lane(load("DY", n, f // 4), f % 4))
    k.out(v)
    return k


def forward(layer, graph, plan):
    if flattens_in_place(layer, graph):
        return []
    c, h, w = chw(graph.shapes[layer.inputs[0]])
    k = Kernel(f"flatten_forward {c}x{h}x{w}", "kl", ("X",), kl=_forward_kl(c, h, w))
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    target = None if flattens_in_place(layer, graph) else grad_target(plan, layer, 0)
    if not target:
        return []
    c, h, w = chw(graph.shapes[layer.inputs[0]])
    k = Kernel(f"flatten_grad {c}x{h}x{w}", "kl", ("DY",), kl=_grad_kl(c, h, w))
    return [Pass(k, [plan.grad(layer.outputs[0])], [target], "batch", layer.name)]
