"""softmax and log_softmax over the channel axis: the classes of (F,) data, the channels of one (h, w) of
(C, H, W) data. Each fragment reduces the channel texels of its position (max, then the sum of exp). Written in
the kernel language (codegen/kl.py): the GLSL and the CPU backend's function are printed from these.

forward    softmax_forward   X       -> Y     rows: batch   (log: Y = X - max - log(sum exp(X - max)))
backward   softmax_grad      DY, Y   -> dX    rows: batch   (softmax: Y * (dY - sum(dY * Y));
                                                             log_softmax: dY - exp(Y) * sum(dY))

A model whose output is one of them over its classes trains with cross_entropy on the logits that
enter it (Graph.loss_input): what nn.CrossEntropyLoss of those logits, or NLLLoss of the
log-probabilities, computes; predict returns what the model returns.
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div, chw

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, exp, hmax, hsum, is_valid, load, log, maximum, select
from .common import grad_target

_LOWEST = -3.4028234663852886e38


def _forward_kl(c: int, is_log: bool) -> kl.KernelDef:
    """Y = softmax(X) (log_softmax) over the c channels of a position: its texels base .. base + c4 - 1."""
    k = kl.KernelDef()
    c, c4 = k.syms(c=c, c4=ceil_div(c, 4))
    base = k.let("base", COL // c4 * c4)
    m = k.let("m", _LOWEST)
    with k.loop("j", c4) as j:
        k.set(m, maximum(m, hmax(select(is_valid(c, j), load("X", ROW, base + j), _LOWEST))))
    s = k.let("s", 0.0)
    with k.loop("i", c4) as i:
        k.set(s, s + hsum(select(is_valid(c, i), exp(load("X", ROW, base + i) - m), 0.0)))
    x = k.let("x", load("X", ROW, COL))
    k.out(select(is_valid(c, COL - base), x - m - log(s) if is_log else exp(x - m) / s, 0.0))
    return k


def _grad_kl(c: int, is_log: bool) -> kl.KernelDef:
    """dX = Y * (dY - sum(dY * Y)); log_softmax: dY - exp(Y) * sum(dY)."""
    k = kl.KernelDef()
    c, c4 = k.syms(c=c, c4=ceil_div(c, 4))
    base = k.let("base", COL // c4 * c4)
    s = k.let("s", 0.0)
    with k.loop("j", c4) as j:
        dy = load("DY", ROW, base + j)
        k.set(s, s + hsum(select(is_valid(c, j), dy if is_log else dy * load("Y", ROW, base + j), 0.0)))
    dy, y = k.let("dy", load("DY", ROW, COL)), k.let("y", load("Y", ROW, COL))
    k.out(select(is_valid(c, COL - base), dy - exp(y) * s if is_log else y * (dy - s), 0.0))
    return k


def _shape(layer, graph) -> tuple[int, int, int]:
    return chw(graph.shapes[layer.outputs[0]])


def forward(layer, graph, plan):
    c, h, w = _shape(layer, graph)
    k = Kernel(f"{layer.op}_forward {c}x{h}x{w}", "kl", ("X",), kl=_forward_kl(c, layer.op == "log_softmax"))
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    c, h, w = _shape(layer, graph)
    y = layer.outputs[0]
    k = Kernel(f"{layer.op}_grad {c}x{h}x{w}", "kl", ("DY", "Y"), kl=_grad_kl(c, layer.op == "log_softmax"))
    return [Pass(k, [plan.grad(y), plan.tensor(y)], [target], "batch", layer.name)]
