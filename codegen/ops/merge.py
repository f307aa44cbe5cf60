"""concat, and the sum of gradient contributions (add is elementwise: ops/elementwise.py).

concat     concat_forward  X0, X1, ... -> Y          rows: batch   (channel axis)
           concat_grad     DY          -> dX_i       rows: batch   (one slice per input)
grad_sum   grad_sum        G0, G1, ... -> dT         rows: batch   (a tensor with several consumers)
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div

from ..kernels import Kernel, Pass
from .common import chw, grad_target


def forward(layer, graph, plan):
    y = plan.tensor(layer.outputs[0])
    parts, start = [], 0
    for i, t in enumerate(layer.inputs):
        ch = chw(graph.shapes[t])[0]
        parts.append({"name": f"X{i}", "start": start, "end": start + ch, "channels": ch, "c4": ceil_div(ch, 4)})
        start += ch
    k = Kernel(f"concat_forward {'+'.join(str(p['channels']) for p in parts)}", "concat_forward.glsl.j2",
               tuple(p["name"] for p in parts), consts={"parts": parts, "channels": start, "c4": ceil_div(start, 4)})
    return [Pass(k, [plan.tensor(t) for t in layer.inputs], [y], "batch", layer.name)]


def backward(layer, graph, plan):
    passes, start = [], 0
    total = chw(graph.shapes[layer.outputs[0]])[0]
    for slot, t in enumerate(layer.inputs):
        ch = chw(graph.shapes[t])[0]
        target = grad_target(plan, layer, slot)
        if target:
            k = Kernel(f"concat_grad {start}:{start + ch} of {total}", "concat_grad.glsl.j2", ("DY",),
                       consts={"start": start, "channels": ch, "c4": ceil_div(ch, 4), "y_c4": ceil_div(total, 4)})
            passes.append(Pass(k, [plan.grad(layer.outputs[0])], [target], "batch", layer.name))
        start += ch
    return passes


def param_grad_sum(param: str, readers: int):
    """pgrad:P = pgrad0:P + pgrad1:P + ...: the gradient of a parameter several layers read (schedule.py)."""
    names = tuple(f"G{i}" for i in range(readers))
    k = Kernel(f"grad_sum x{readers}", "grad_sum.glsl.j2", names, consts={"terms": readers})
    return Pass(k, [f"pgrad{j}:{param}" for j in range(readers)], ["pgrad:" + param], "full",
                f"sum of gradients of {param}")


def grad_sum(tensor, contributions, plan):
    names = tuple(f"G{i}" for i in range(len(contributions)))
    k = Kernel(f"grad_sum x{len(names)}", "grad_sum.glsl.j2", names, consts={"terms": len(names)})
    return Pass(k, list(contributions), ["grad:" + tensor], "batch", f"sum of gradients of {tensor}")
