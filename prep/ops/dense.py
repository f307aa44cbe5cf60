"""dense: y = act(x @ W.T + b), weight [O, I] (or [I, O], `transposed`), bias [O]."""
from __future__ import annotations

from ..channel_groups import Seg
from ..packing import ceil_div, matrix_packing
from .registry import bias_and_act, register, saves_nothing


def flops(layer, graph) -> int:
    return 2 * graph.shapes[layer.inputs[0]][0] * graph.shapes[layer.outputs[0]][0] + bias_and_act(layer, graph)


def forward(m, layer, ins):
    import torch.nn.functional as F

    x = ins[0]
    w, b = m.param(layer, "weight"), m.param(layer, "bias")
    if m.graph.params[layer.params["weight"]].transposed:
        y = x @ w
        return y + b if b is not None else y
    return F.linear(x, w, b)


def new_group(layer, graph, axes, gs):
    """Prune rule of a layer whose output channels are its own: a new group, scored by its weight."""
    n = graph.shapes[layer.outputs[0]][0]
    return (Seg(gs.new(n, layer), n, 1),)


def cut(layer, graph, plan, cut_param) -> dict:
    """The weight's kept outputs and inputs, the bias's kept outputs."""
    ok, ik = plan.kept(layer.outputs[0]), plan.kept(layer.inputs[0])
    cut_param(layer.params["weight"], ok, ik)
    if "bias" in layer.params:
        cut_param(layer.params["bias"], ok)
    return layer.attrs


def weight_layout(layer, graph, p, role):
    """W[O, I]: a row an output (padded to 4), I in the texel (layout.py's docstring)."""
    o, i = p.canonical().shape
    return matrix_packing(o, i, p.transposed), ceil_div(o, 4) * 4


register("dense", flops=flops, torch=forward, prune=new_group, cut=cut, weight_layout=weight_layout,
         saves=saves_nothing, kernels="dense")
