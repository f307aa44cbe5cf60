"""Every elementwise op of prep/elementwise.py (UNARY, BINARY, NORMS), registered in a loop: one rule each for all
of them, reading the op's declaration and its layer's operands (prep/ir.py: operands)."""
from __future__ import annotations

from ..channel_groups import channels
from ..elementwise import OPS as DECLARED
from ..ir import operands
from ..packing import activation_packing
from .registry import per_output, register, saves_nothing


def forward(m, layer, ins):
    """The operands as tensors that broadcast like the ONNX op's, through the op."""
    import torch

    from .torch_expr import apply

    args = []
    for o in operands(layer, m.graph):
        if o["kind"] == "act":
            args.append(ins[o["input"]])
        elif o["kind"] == "param":
            args.append(m.param(layer, o["role"]).reshape((1,) + tuple(o["shape"])))
        else:
            args.append(torch.tensor(o["values"], dtype=torch.float32).reshape((1,) + tuple(o["shape"])))
    return apply(layer.op, args, layer.attrs)


def prune(layer, graph, axes, gs):
    """A per-channel constant or parameter keeps its inputs' channels whole; two activations combined are
    pruned together (their groups joined) where they are concatenated alike; otherwise the selection passes."""
    x = axes[layer.inputs[0]]
    if any(o["kind"] != "act" and o["shape"] and o["shape"][0] > 1 for o in operands(layer, graph)):
        why = f"{layer.op} {layer.name!r} has a per-channel constant or parameter"
        for t in layer.inputs:
            for s in axes[t]:
                gs.fix(s.group, why)
        return x
    if len(layer.inputs) == 2:
        y = axes[layer.inputs[1]]
        if len(x) == len(y) and all((a.n, a.rep) == (b.n, b.rep) for a, b in zip(x, y)):
            for a, b in zip(x, y):
                gs.union(a.group, b.group)
        else:
            for s in x + y:
                gs.fix(s.group, f"{layer.op} {layer.name!r} joins differently concatenated tensors")
        return x if channels(x) >= channels(y) else y
    return x


def cut(layer, graph, plan, cut_param) -> dict:
    """The activation operands' channels as kept."""
    attrs = layer.attrs
    if "operands" not in attrs:
        return attrs
    return dict(attrs, operands=[dict(o, shape=[len(plan.kept(layer.inputs[o["input"]]))] + o["shape"][1:])
                                 if o["kind"] == "act" else o for o in attrs["operands"]])


def weight_layout(layer, graph, p, role):
    """An operand (a PRelu slope, a layer scale): one sample of its shape."""
    shape = next(o["shape"] for o in operands(layer, graph) if o.get("role") == role)
    packing = activation_packing(tuple(shape), 1)
    return packing, packing.rows


for _name in DECLARED:
    register(_name, flops=per_output, torch=forward, prune=prune, cut=cut, weight_layout=weight_layout,
             saves=saves_nothing, kernels="elementwise")
