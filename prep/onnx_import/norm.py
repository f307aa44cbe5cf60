"""Import rules of LayerNormalization and of Softmax / LogSoftmax: over the last axis of tokens (attention's
scores) on their rows form, or over the channel (class) axis of (C,) or (C, H, W) data."""
from __future__ import annotations

from ..errors import BuildError
from ..ir import Layer
from .common import unsupported_attr, where
from .registry import imports


@imports("LayerNormalization")
def layernorm(cx, s) -> bool:
    node, op, a, ins, out, params = s.node, s.op, s.a, s.ins, s.out, cx.params
    v = cx.lz(ins[0])
    axis = int(a.get("axis", -1)) % v.rank()
    if axis != v.rank() - 1:
        unsupported_attr(node, "axis", a.get("axis"), "only over the last axis")
    x = cx.materialise(ins[0], "rows", op, where(node))[0]
    f = cx.shapes[x][1]
    layer = Layer("layernorm", node.name, [x], [cx.rows_out(out, v, f)], {"eps": float(a.get("epsilon", 1e-5))})
    for role, i in (("weight", 1), ("bias", 2)):
        if len(ins) > i and ins[i]:
            w = cx.param(node, i)
            if params[w].array.size != f:
                raise BuildError(f"{where(node)}: {role} {w!r} of shape {params[w].array.shape} is not per "
                                 "feature")
            params[w].array = params[w].array.reshape(-1)
            layer.params[role] = w
    if "weight" not in layer.params:
        raise BuildError(f"{where(node)}: LayerNormalization without a scale is not supported")
    cx.layers.append(layer)
    return True


@imports("Softmax", "LogSoftmax")
def softmax_of_tokens(cx, s) -> bool:
    """Over the last axis of tokens (attention's scores): the rows form, the last axis packed."""
    op, a, ins = s.op, s.a, s.ins
    if not ((v := cx.lz(ins[0])).rank() >= 3 and int(a.get("axis", -1)) % v.rank() == v.rank() - 1 and not (
            cx.alias.get(ins[0], ins[0]) not in cx.lazy and len(cx.shapes[cx.act(ins[0])]) == 3 and v.rank() == 4
            and int(a.get("axis", -1)) % 4 == 1)):
        return False
    x = cx.materialise(ins[0], "rows", op, where(s.node))[0]
    cx.layers.append(Layer("softmax" if op == "Softmax" else "log_softmax", s.node.name, [x],
                           [cx.rows_out(s.out, v, cx.shapes[x][1])]))
    return True


@imports("Softmax", "LogSoftmax")
def softmax(cx, s) -> bool:
    """Over the channel (class) axis."""
    node, op, shapes = s.node, s.op, cx.shapes
    x = cx.act(s.ins[0])
    rank = len(shapes[x]) + 1
    axis = s.a.get("axis", -1)
    if rank not in (2, 4) or axis % rank != 1:
        raise BuildError(f"{where(node)}: {op} over axis {axis} of a tensor of per-sample shape "
                         f"{shapes[x]}: only over the channel (class) axis of (C,) or (C, H, W) data")
    cx.layers.append(Layer("softmax" if op == "Softmax" else "log_softmax", node.name, [x], [s.out]))
    shapes[s.out] = shapes[x]
    return True
