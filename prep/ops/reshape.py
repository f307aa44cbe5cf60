"""Data movement: concat (on the channel axis), flatten ((C, H, W) -> (C*H*W,) in PyTorch's order) and gather
(every other shape op on activations: prep/ir.py's docstring, prep/shape.py). Their kernels: codegen/ops/merge.py
(concat), codegen/ops/reshape.py (flatten), codegen/ops/gather.py."""
from __future__ import annotations

import numpy as np

from ..channel_groups import Seg
from ..packing import activation_packing
from .registry import moves_data, no_params, register, same_attrs, saves_nothing


def concat_forward(m, layer, ins):
    import torch

    return torch.cat(ins, dim=1)


def flatten_forward(m, layer, ins):
    import torch

    return torch.flatten(ins[0], 1)


def _view_op(t, op):
    """One view op of prep/shape.py on a batch (the per-sample axes are t's axes 1, 2, ...)."""
    import torch
    import torch.nn.functional as F

    kind = op[0]
    if kind == "reshape":
        return t.reshape((t.shape[0],) + tuple(op[1]))
    if kind == "permute":
        return t.permute(0, *[p + 1 for p in op[1]])
    if kind == "slice":
        _, a, b, e, s = op
        return t[(slice(None),) * (a + 1) + (slice(b, e, s),)]
    if kind == "flip":
        return torch.flip(t, [op[1] + 1])
    _, a, lo, hi = op  # pad with zeros
    return F.pad(t, [0, 0] * (t.dim() - a - 2) + [lo, hi])


def gather_forward(m, layer, ins):
    """The sum of the parts, each its source (an input, a constant sample repeated over the batch, or a
    parameter so repeated: a class token) through its chain; a plain concatenation (each chain one pad,
    tiling one axis in order) as torch.cat, which exports as Concat again."""
    import torch

    parts, batch = layer.attrs["parts"], m._batch

    def source(p):
        if p.get("param") is not None:
            return m.param(layer, p["param"]).reshape((1,) + tuple(p["shape"])).expand((batch,) + tuple(p["shape"]))
        if p["input"] is not None:
            return ins[p["input"]]
        return torch.from_numpy(np.array(p["const"], dtype=np.float32))[None].expand((batch,) + p["const"].shape)

    srcs = [source(p) for p in parts]
    pads = [p["ops"][0] if len(p["ops"]) == 1 and p["ops"][0][0] == "pad" else None for p in parts]
    if all(pads) and len({q[1] for q in pads}) == 1:
        a, at = pads[0][1], 0
        for q, t in zip(pads, srcs):
            at = at if q[2] == at else -1
            at += int(t.shape[a + 1])
        if at >= 0 and pads[-1][3] == 0:
            return torch.cat(srcs, dim=a + 1)
    out = None
    for p, t in zip(parts, srcs):
        for op in p["ops"]:
            t = _view_op(t, op)
        out = t if out is None else out + t
    return out


def concat_prune(layer, graph, axes, gs):
    """The inputs' groups side by side at their channel offsets."""
    return tuple(s for t in layer.inputs for s in axes[t])


def flatten_prune(layer, graph, axes, gs):
    """Channel c stretched over the columns c*H*W .. (c+1)*H*W - 1."""
    hw = int(np.prod(graph.shapes[layer.inputs[0]][1:]))
    return tuple(Seg(s.group, s.n, s.rep * hw) for s in axes[layer.inputs[0]])


def gather_prune(layer, graph, axes, gs) -> tuple[Seg, ...]:
    """The channel axis of a gather's output (prep/shape.py). One that only slices or pads H and W of
    (C, H, W) inputs keeps their channels: it passes their selection through, joining those of several
    inputs as an add does. Any other (a reshape, a permutation, a slice or concatenation of channels, a
    constant part) moves channels where a selection cannot follow: its inputs stay whole, and its output
    is a new group that stays whole."""
    parts, out = layer.attrs["parts"], graph.shapes[layer.outputs[0]]
    ins = [axes[t] for t in layer.inputs]
    spatial = len(out) == 3 and all(len(graph.shapes[t]) == 3 for t in layer.inputs) and all(
        p["input"] is not None and all(op[0] in ("slice", "pad", "flip") and op[1] != 0 for op in p["ops"]) for p in parts)
    if spatial and all(len(x) == len(ins[0]) and all((a.n, a.rep) == (b.n, b.rep) for a, b in zip(x, ins[0]))
                       for x in ins):
        for x in ins[1:]:
            for a, b in zip(ins[0], x):
                gs.union(a.group, b.group)
        return ins[0]
    why = f"shape op {layer.name!r} moves channels"
    for x in ins:
        for seg in x:
            gs.fix(seg.group, why)
    n = out[0] if out else 1
    return (Seg(gs.new(n, reason=why), n, 1),)


def gather_layout(layer, graph, p, role):
    """A parameter part (a class token): one sample of its shape."""
    shape = next(o["shape"] for o in layer.attrs["parts"] if o.get("param") == role)
    packing = activation_packing(tuple(shape), 1)
    return packing, packing.rows


register("concat", flops=moves_data, torch=concat_forward, prune=concat_prune, cut=same_attrs,
         weight_layout=no_params, saves=saves_nothing, kernels="merge")
register("flatten", flops=moves_data, torch=flatten_forward, prune=flatten_prune, cut=same_attrs,
         weight_layout=no_params, saves=saves_nothing, kernels="reshape")
register("gather", flops=moves_data, torch=gather_forward, prune=gather_prune, cut=same_attrs,
         weight_layout=gather_layout, saves=saves_nothing, kernels="gather")
