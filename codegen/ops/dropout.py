"""dropout: in a training step (u_dropout = 1, set by fit), Y = X * mask / (1 - p), the mask drawn per
step and element (prep/dropout.py); elsewhere (predict, features, gradients) Y = X.

forward    dropout   X    -> Y     rows: batch
backward   dropout   DY   -> dX    rows: batch   (the same kernel: the same mask, the same scale)

Written in the kernel language (codegen/kl.py), the hash on its uints: the masks are prep/dropout.py's, bit for bit,
in GLSL, JavaScript and WGSL.
"""
from __future__ import annotations

import numpy as np

from texelfit.prep import dropout as dp
from texelfit.prep.packing import ceil_div, chw

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, lane, load, select, to_float, to_uint, uniform
from .common import grad_target


def _lowbias32(k: kl.KernelDef, name: str, x) -> kl.X:
    """prep/dropout.py: lowbias32 of the uint x, into variable `name`."""
    h = k.let(name, x)
    k.set(h, h ^ (h >> 16))
    k.set(h, h * 0x7FEB352D)
    k.set(h, h ^ (h >> 15))
    k.set(h, h * 0x846CA68B)
    k.set(h, h ^ (h >> 16))
    return h


def _kl(c: int, h: int, w: int, p: float, scale: float, salt: int) -> kl.KernelDef:
    """Y = X * mask * scale where u_dropout is set, else X: the mask of element index i of the batch (its row-major
    index in [N, C, H, W]) is lowbias32(u_dropseed ^ lowbias32(i + salt)) >> 8 >= p * 2^24 (prep/dropout.py). p and
    the scale are float32 values, as the GPU holds them; a dropped element is x * 0, as the GPU computes it."""
    k = kl.KernelDef()
    c, h, w, c4, salt = k.syms(c=c, h=h, w=w, c4=ceil_div(c, 4), salt=salt)
    p, scale = k.syms(p=p, scale=scale)
    x = k.let("x", load("X", ROW, COL))
    y = k.let("y", x)
    with k.when(uniform("u_dropout", "float").ne(0.0)):
        n = k.let("n", ROW // h)
        hh = k.let("hh", ROW - n * h)
        ww = k.let("ww", COL // c4)
        first = k.let("first", n * c + (COL - ww * c4) * 4)
        with k.loop("j", 4) as j:
            index = to_uint(((first + j) * h + hh) * w + ww)
            inner = _lowbias32(k, "inner", index + to_uint(salt))
            hash_ = _lowbias32(k, "hash", to_uint(uniform("u_dropseed", "int")) ^ inner)
            kept = to_float(hash_ >> 8) * (1.0 / 16777216.0) >= p
            k.set_lane(y, j, lane(x, j) * select(kept, scale, 0.0))
    k.out(y)
    return k


def _kernel(layer, graph, what):
    c, h, w = chw(graph.shapes[layer.inputs[0]])
    p = layer.attrs["ratio"]
    k = _kl(c, h, w, float(np.float32(p)), float(dp.scale(p)), dp.salt(layer.name))
    return Kernel(f"dropout {what} p{p:g} {c}x{h}x{w}", "kl", ("X",), uniforms=("u_dropout", "u_dropseed"), kl=k)


def forward(layer, graph, plan):
    return [Pass(_kernel(layer, graph, "forward"), [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])],
                 "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    return [Pass(_kernel(layer, graph, "grad"), [plan.grad(layer.outputs[0])], [target], "batch", layer.name)]
