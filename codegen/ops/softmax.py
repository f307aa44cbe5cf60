"""softmax and log_softmax over the channel axis: the classes of (F,) data, the channels of one (h, w) of
(C, H, W) data. Each fragment reduces the channel texels of its position (max, then the sum of exp).

forward    softmax_forward   X       -> Y     rows: batch   (log: Y = X - max - log(sum exp(X - max)))
backward   softmax_grad      DY, Y   -> dX    rows: batch   (softmax: Y * (dY - sum(dY * Y));
                                                             log_softmax: dY - exp(Y) * sum(dY))

A model whose output is one of them over its classes trains with cross_entropy on the logits that
enter it (Graph.loss_input): what nn.CrossEntropyLoss of those logits, or NLLLoss of the
log-probabilities, computes; predict returns what the model returns.
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div, chw

from ..kernels import Kernel, Pass
from .common import grad_target, lanes


def _consts(layer, graph):
    c, h, w = chw(graph.shapes[layer.outputs[0]])
    return dict(lanes(c), c=c, h=h, w=w, c4=ceil_div(c, 4), log=layer.op == "log_softmax")


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    k = Kernel(f"{layer.op}_forward {c['c']}x{c['h']}x{c['w']}", "softmax_forward.glsl.j2", ("X",), consts=c)
    return [Pass(k, [plan.tensor(layer.inputs[0])], [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    target = grad_target(plan, layer, 0)
    if not target:
        return []
    c = _consts(layer, graph)
    y = layer.outputs[0]
    k = Kernel(f"{layer.op}_grad {c['c']}x{c['h']}x{c['w']}", "softmax_grad.glsl.j2", ("DY", "Y"), consts=c)
    return [Pass(k, [plan.grad(y), plan.tensor(y)], [target], "batch", layer.name)]
