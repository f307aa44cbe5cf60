"""reduce (mean, sum, max over per-sample axes), and softmax, log_softmax over the channel axis (the features of
tokens). Their kernels: codegen/ops/reduce.py, codegen/ops/softmax.py."""
from __future__ import annotations

from ..channel_groups import Seg, channels_of
from .registry import no_params, out_size, passes_channels, register, same_attrs, saves_nothing


def reduce_flops(layer, graph) -> int:
    """Every input element once."""
    n = 1
    for d in graph.shapes[layer.inputs[0]]:
        n *= d
    return n


def softmax_flops(layer, graph) -> int:
    """Max, exp, sum, divide (or subtract)."""
    return 4 * out_size(layer, graph)


def reduce_forward(m, layer, ins):
    import torch

    x, a = ins[0], layer.attrs
    dims = [d + 1 for d in a["axes"]]
    y = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax}[a["kind"]](x, dim=dims, keepdim=True)
    return y.reshape((x.shape[0],) + tuple(m.graph.shapes[layer.outputs[0]]))


def _dim(x) -> int:
    return -1 if x.dim() == 3 else 1  # tokens (R, F): over the features; else the channels (classes)


def softmax_forward(m, layer, ins):
    import torch

    return torch.softmax(ins[0], dim=_dim(ins[0]))


def log_softmax_forward(m, layer, ins):
    import torch

    return torch.log_softmax(ins[0], dim=_dim(ins[0]))


def reduce_prune(layer, graph, axes, gs):
    """One over the channels mixes them, and one of data other than (C, H, W) is not followed: its input stays
    whole, its output is a new group that does; one over H and W alone passes the selection."""
    x, out = axes[layer.inputs[0]], graph.shapes[layer.outputs[0]]
    if 0 in layer.attrs["axes"]:
        for s in x:
            gs.fix(s.group, f"reduce {layer.name!r} is over the channels")
        return (Seg(gs.new(channels_of(out), reason="a reduction over the channels"), channels_of(out), 1),)
    if len(graph.shapes[layer.inputs[0]]) != 3:
        for s in x:
            gs.fix(s.group, f"reduce {layer.name!r} is not over (C, H, W) data")
        return (Seg(gs.new(channels_of(out), reason="a reduction"), channels_of(out), 1),)
    return x


def reduce_saves(layer, graph) -> tuple[str, ...]:
    """A max: how many inputs equal each maximum, for the backward (codegen/ops/reduce.py)."""
    return ("ties:",) if layer.attrs["kind"] == "max" else ()


register("reduce", flops=reduce_flops, torch=reduce_forward, prune=reduce_prune, cut=same_attrs,
         weight_layout=no_params, saves=reduce_saves, kernels="reduce")
register("softmax", flops=softmax_flops, torch=softmax_forward, prune=passes_channels, cut=same_attrs,
         weight_layout=no_params, saves=saves_nothing, kernels="softmax")
register("log_softmax", flops=softmax_flops, torch=log_softmax_forward, prune=passes_channels, cut=same_attrs,
         weight_layout=no_params, saves=saves_nothing, kernels="softmax")
