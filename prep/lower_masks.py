"""Lowerings of the ops transformers 5 exports for its attention masks (issue 32): boolean logic, and the batch
index of a vmapped mask function.

Hugging Face models build the padding mask by vmapping a function of (batch, head, query, key) indices over the
batch; exported, the batch index is a Range(0, N) and the mask is read from the flattened 2-D attention mask at
n * T + key:

    attention_mask [N, T] -> Cast(bool) -> Flatten(axis 2) [N * T, 1] --.
    Range(0, N, 1) -> Unsqueeze [N, 1, 1, 1] -> Mul(T) -> Add(key [1, 1, 1, T]) -> Gather(axis 0) -> [N, 1, 1, T, 1]

That is the mask itself, per sample, at the keys: Reshape(mask, [-1, 1, 1, T, 1]) (or, for other constant
indices, a Gather of them along the sample's axis), which the build supports; the batch never moves. Then
And/Not combine booleans, which are 1 or 0 here (prep/onnx_import/constants.py: cast_bool): And(a, b) = a * b,
Or(a, b) = a + b - a * b, Not(a) = 1 - a; a Where of the result between 0 and float32's lowest is the additive
mask eager attention adds (where_boolean). A Where that masks an activation so, into the scores (sdpa's attn_mask of
T5's position bias), is that activation plus the additive mask (_where_masked).
"""
from __future__ import annotations

import numpy as np

from .errors import BuildError
from .lower import LOWERINGS, LowerCtx, attrs_of, where_of


def _and(node, ctx: LowerCtx) -> list:
    return [ctx.node(node, "Mul", list(node.input), node.output[0])]


def _or(node, ctx: LowerCtx) -> list:
    a, b = node.input
    both = ctx.node(node, "Mul", [a, b])
    total = ctx.node(node, "Add", [a, b])
    return [both, total, ctx.node(node, "Sub", [total.output[0], both.output[0]], node.output[0])]


def _not(node, ctx: LowerCtx) -> list:
    one = ctx.initializer(f"{node.name or 'Not'}/one", np.float32(1.0))
    return [ctx.node(node, "Sub", [one, node.input[0]], node.output[0])]


LOWERINGS["And"] = _and
LOWERINGS["Or"] = _or
LOWERINGS["Not"] = _not


def _is_batch(ctx: LowerCtx, name: str) -> bool:
    """Whether tensor `name` is the batch size: Gather(Shape(x), 0) (or a Squeeze or Cast of it)."""
    n = ctx.producer(name)
    while n is not None and n.op_type in ("Squeeze", "Cast", "Reshape") and n.input:
        n = ctx.producer(n.input[0])
    if n is None or n.op_type not in ("Gather", "Slice"):
        return False
    shape = ctx.producer(n.input[0])
    first = ctx.const(n.input[1])
    return shape is not None and shape.op_type == "Shape" and first is not None and \
        np.asarray(first).reshape(-1).tolist() == [0] and attrs_of(shape).get("start", 0) == 0 and \
        attrs_of(n).get("axis", 0) == 0


def _only_user(ctx: LowerCtx, name: str, op: str):
    users = ctx.users(name)
    return users[0] if len(users) == 1 and users[0] is not None and users[0].op_type == op else None


def _range(node, ctx: LowerCtx) -> list:
    """Range to the batch size: the batch index of a vmapped function (see the module's docstring). Any other
    Range stays for the importer, which evaluates it where its bounds are known at build time."""
    start, limit, delta = node.input
    if not _is_batch(ctx, limit):
        return [node]
    what = (f"{where_of(node)}: Range over the batch is supported as the batch index of a vmapped mask "
            "(Range(0, N) * T + key, reading a flattened [N, T] tensor at axis 0)")
    if [np.asarray(ctx.const(t)).reshape(-1).tolist() if ctx.const(t) is not None else None
            for t in (start, delta)] != [[0], [1]]:
        raise BuildError(f"{what}; this one starts at {start!r} or steps by {delta!r}")
    chain, x = [], node.output[0]
    unsq = _only_user(ctx, x, "Unsqueeze")
    if unsq is not None:
        chain.append(unsq)
        x = unsq.output[0]
    mul = _only_user(ctx, x, "Mul")
    stride = ctx.const(next((i for i in mul.input if i != x), "")) if mul is not None else None
    add = _only_user(ctx, mul.output[0], "Add") if mul is not None else None
    key = ctx.const(next((i for i in add.input if i != mul.output[0]), "")) if add is not None else None
    gathers = ctx.users(add.output[0]) if add is not None else []
    if stride is None or key is None or not gathers or \
            any(g is None or g.op_type != "Gather" or g.input[1] != add.output[0] or attrs_of(g).get("axis", 0) != 0
                for g in gathers):
        raise BuildError(f"{what}; this one is read otherwise")
    stride = int(np.asarray(stride).reshape(-1)[0])
    key = np.asarray(key)
    chain += [mul, add]
    for g in gathers:
        flat = ctx.producer(g.input[0])
        if flat is None or flat.op_type != "Flatten" or any(u is not g for u in ctx.users(flat.output[0])):
            raise BuildError(f"{what}; {where_of(g)} reads {g.input[0]!r}, not a Flatten of a per-sample tensor")
        src = flat.input[0]
        shape = ctx.shape(src, flat)
        k = int(attrs_of(flat).get("axis", 1)) % (len(shape) + 1)
        per_row = int(np.prod(shape[1:k], dtype=np.int64))
        rest = int(np.prod(shape[k:], dtype=np.int64))
        if k < 1 or per_row != stride or key.shape[:1] not in ((), (1,)) or key.min() < 0 or key.max() >= stride:
            raise BuildError(f"{what}; {where_of(g)} reads rows n * {stride} + key of a tensor of shape "
                             f"{list(shape)} flattened at axis {k} (keys {key.min()}..{key.max()})")
        sample_key = key.reshape(key.shape[1:] if key.ndim else ())
        ctx.replace(flat, [])
        if np.array_equal(sample_key.reshape(-1), np.arange(stride)):  # every key, in order: the tensor itself
            ctx.replace(g, [ctx.reshape(g, src, [-1, *sample_key.shape, rest], g.output[0])])
        else:
            rows = ctx.reshape(g, src, [-1, stride, rest])
            idx = ctx.initializer(f"{g.name or 'Gather'}/keys", sample_key.astype(np.int64))
            ctx.replace(g, [rows, ctx.node(g, "Gather", [rows.output[0], idx], g.output[0], axis=1)])
    for n in chain:
        ctx.replace(n, [])
    return []


LOWERINGS["Range"] = _range


def _where_masked(node, ctx: LowerCtx) -> list:
    """Where(c, x, k) of an activation x and a constant k of float32's lowest or -inf, read only by Adds of scores into
    a Softmax: each Add(s, Where(c, x, k)) becomes (s + x) + Where(c, 0, k). torch's scaled_dot_product_attention
    takes T5's relative-position bias masked so (its attn_mask); as a sum, the bias is added to the scores, which the
    build takes (a table view added to attention's scores), and the mask after. The same values (where c is false
    both are k), and the same gradients: there the softmax's probability is 0, so the gradient reaching x is 0
    either way."""
    c, x, k = node.input
    low = ctx.const(k)
    if ctx.const(x) is not None or ctx.const(c) is not None or low is None or np.size(low) != 1 or \
            not float(np.asarray(low).reshape(-1)[0]) <= -3.4e38:
        return [node]
    adds = ctx.users(node.output[0])
    if not adds or any(a is None or a.op_type != "Add" or not ctx.users(a.output[0]) or
                       any(u is None or u.op_type != "Softmax" for u in ctx.users(a.output[0])) for a in adds):
        return [node]
    zero = ctx.initializer(f"{node.name or 'Where'}/zero", np.zeros((), np.asarray(low).dtype))
    mask = ctx.node(node, "Where", [c, zero, k])
    for a in adds:
        scores = next(t for t in a.input if t != node.output[0])
        biased = ctx.node(a, "Add", [scores, x])
        ctx.replace(a, [biased, ctx.node(a, "Add", [biased.output[0], mask.output[0]], a.output[0])])
    return [mask]


LOWERINGS["Where"] = _where_masked
