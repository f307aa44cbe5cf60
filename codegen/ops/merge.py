"""concat, and the sum of gradient contributions (add is elementwise: ops/elementwise.py).

concat     concat_forward  X0, X1, ... -> Y          rows: batch   (channel axis)
           concat_grad     DY          -> dX_i       rows: batch   (one slice per input)
           (written in the kernel language, codegen/kl.py: a lane of an output texel is a channel of its own,
           read from the part that holds it; padding lanes stay zero)
grad_sum   grad_sum        G0, G1, ... -> dT         rows: batch   (a tensor with several consumers; also
                                                                    rows: full, the gradient of a tied parameter,
                                                                    which the optimizer includes: ops/optim.py)
           (written in the kernel language too)
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div
from texelfit.codegen.webgl2.blocking import GRAD_SUM_GROUP, PARAM_SUM_LAST, sum_groups

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, lane, load, splat
from .common import channel_lanes, chw, grad_target


def _forward_kl(channels: list[int]) -> kl.KernelDef:
    """Channel ch of Y is channel ch - start of the part whose [start, end) holds it (the ranges are disjoint:
    one when a part, at most one taken a lane)."""
    k = kl.KernelDef()
    c4 = k.sym("c4", ceil_div(sum(channels), 4))
    b = k.let("b", COL // c4)
    cc = k.let("cc", COL - b * c4)
    v = k.let("v", splat(0.0))
    with k.loop("j", 4) as j:
        ch = k.let("ch", cc * 4 + j)
        start = 0
        for i, n in enumerate(channels):
            s, e, p4 = k.syms(**{f"start{i}": start, f"end{i}": start + n, f"c4_{i}": ceil_div(n, 4)})
            with k.when(ch < e if i == 0 else (ch >= s) & (ch < e)):
                q = k.let(f"q{i}", ch - s)
                k.set_lane(v, j, lane(load(f"X{i}", ROW, b * p4 + q // 4), q % 4))
            start += n
    k.out(v)
    return k


def _grad_kl(start: int, channels: int, total: int) -> kl.KernelDef:
    """dX = dY[:, start:start + channels]."""
    k = kl.KernelDef()
    start, channels, c4, y_c4 = k.syms(start=start, channels=channels, c4=ceil_div(channels, 4),
                                       y_c4=ceil_div(total, 4))
    with channel_lanes(k, c4, channels) as (b, i, j, v):
        ch = k.let("cy", i + start)
        k.set_lane(v, j, lane(load("DY", ROW, b * y_c4 + ch // 4), ch % 4))
    k.out(v)
    return k


def forward(layer, graph, plan):
    y = plan.tensor(layer.outputs[0])
    parts, start = [], 0
    for i, t in enumerate(layer.inputs):
        ch = chw(graph.shapes[t])[0]
        parts.append({"name": f"X{i}", "start": start, "end": start + ch, "channels": ch, "c4": ceil_div(ch, 4)})
        start += ch
    k = Kernel(f"concat_forward {'+'.join(str(p['channels']) for p in parts)}", "kl",
               tuple(p["name"] for p in parts), kl=_forward_kl([p["channels"] for p in parts]))
    return [Pass(k, [plan.tensor(t) for t in layer.inputs], [y], "batch", layer.name)]


def backward(layer, graph, plan):
    passes, start = [], 0
    total = chw(graph.shapes[layer.outputs[0]])[0]
    for slot, t in enumerate(layer.inputs):
        ch = chw(graph.shapes[t])[0]
        target = grad_target(plan, layer, slot)
        if target:
            k = Kernel(f"concat_grad {start}:{start + ch} of {total}", "kl", ("DY",), kl=_grad_kl(start, ch, total))
            passes.append(Pass(k, [plan.grad(layer.outputs[0])], [target], "batch", layer.name))
        start += ch
    return passes


def _grad_sum_kl(terms: int) -> kl.KernelDef:
    """dT = G0 + G1 + ...: the texel at the same place of each contribution."""
    k = kl.KernelDef()
    total = load("G0", ROW, COL)
    for j in range(1, terms):
        total = total + load(f"G{j}", ROW, COL)
    k.out(total)
    return k


def _grad_sum_kernel(terms: int) -> Kernel:
    return Kernel(f"grad_sum x{terms}", "kl", tuple(f"G{i}" for i in range(terms)), kl=_grad_sum_kl(terms))


def _summed(terms: list[str], partial: str, out: str, rows: str, what: str, last: int = GRAD_SUM_GROUP) -> list[Pass]:
    """`out` = the sum of the textures `terms`; with more than its pass reads (`last`: webgl2/blocking.py: sum_groups),
    groups of them into f"{partial}{k}:" + what first, then those."""
    groups = sum_groups(len(terms), last)
    parts = [f"{partial}{k}:{what}" for k in range(len(groups))] or list(terms)
    first = [Pass(_grad_sum_kernel(len(g)), [terms[j] for j in g], [part], rows, f"partial sum of gradients of {what}")
             for g, part in zip(groups, parts)]
    return first + [Pass(_grad_sum_kernel(len(parts)), parts, [out], rows, f"sum of gradients of {what}")]


def param_grad_sum(param: str, readers: int) -> list[Pass]:
    """pgrad:P = pgrad0:P + pgrad1:P + ...: the gradient of a parameter several layers read (schedule.py), in groups
    into pgradsum{k}:P first where there are more readers than a pass reads."""
    return _summed([f"pgrad{j}:{param}" for j in range(readers)], "pgradsum", "pgrad:" + param, "full", param,
                   PARAM_SUM_LAST)  # (its optimizer's pass computes the last sum, beside the state it reads)


def grad_sum(tensor, contributions, plan) -> list[Pass]:
    """grad:T, the sum of the gradients of T's consumers, in groups into gradsum{k}:T first where there are more than
    a pass reads (the steps of an unrolled recurrent layer reading its input projection)."""
    return _summed(list(contributions), "gradsum", "grad:" + tensor, "batch", tensor)
