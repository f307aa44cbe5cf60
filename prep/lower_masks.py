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
from .lower import LOWERINGS, N, LowerCtx, attrs_of, where_of


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


def _shape(ctx: LowerCtx, name: str, node=None) -> tuple:
    """ctx.shape, or where inference lost a dim through a Reshape of the batch to [N, -1] (GPT-2's attention mask,
    reshaped by its own batch size; through a Cast): the per-sample size of what it reshapes."""
    n, t = ctx.producer(name), name
    while n is not None and n.op_type in ("Cast", "Identity"):
        t, n = n.input[0], ctx.producer(n.input[0])
    try:
        return ctx.shape(name, node)
    except BuildError:
        target = ctx.producer(n.input[1]) if n is not None and n.op_type == "Reshape" else None
        if target is None or target.op_type != "Concat" or len(target.input) != 2:
            raise
        batch, rest = target.input
        head = ctx.producer(batch)
        if head is None or head.op_type != "Unsqueeze" or not _is_batch(ctx, head.input[0]) or \
                ctx.const(rest) is None or np.asarray(ctx.const(rest)).reshape(-1).tolist() != [-1]:
            raise
        return (N, int(np.prod(ctx.shape(n.input[0], node)[1:], dtype=np.int64)))


def _static(ctx: LowerCtx, name: str):
    """The value of `name`: a constant, or a static dim read from a shape (Gather(Shape(x), k), k > 0)."""
    value = ctx.const(name)
    n = ctx.producer(name)
    if value is not None or n is None or n.op_type != "Gather" or ctx.const(n.input[1]) is None:
        return value
    shape_node = ctx.producer(n.input[0])
    k = np.asarray(ctx.const(n.input[1])).reshape(-1)
    if shape_node is None or shape_node.op_type != "Shape" or k.size != 1 or k[0] <= 0 or \
            attrs_of(shape_node).get("start", 0) != 0:
        return None
    try:
        return np.asarray(_shape(ctx, shape_node.input[0])[int(k[0])], dtype=np.int64)
    except (BuildError, IndexError, TypeError, ValueError):
        return None


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
    stride = _static(ctx, next((i for i in mul.input if i != x), "")) if mul is not None else None
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
        shape = _shape(ctx, src, flat)
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


def _argmax_pick(node, ctx: LowerCtx) -> list:
    """ArgMax over the last axis of an [N, T] tensor, read as the row each sample picks of an [N, T, C] tensor
    (GPT-2's classifier: the logits of the last token that is not padding, logits[arange(N), (arange(T) *
    not_pad).argmax(-1)], exported as a Gather of the flattened logits at Range(0, N) * T + ArgMax). The pick is a
    one-hot of the first maximum (the maximum's places, those with none before them: an exclusive CumSum) times the
    rows, a batched MatMul [N, 1, T] x [N, T, C]: the gradient reaches the picked rows, as PyTorch's. Every other
    read of an ArgMax fails the build naming the node."""
    from .lower_ops import _cumsum

    what = (f"{where_of(node)}: ArgMax is supported as the index of the row each sample picks "
            "(x[arange(N), v.argmax(-1)], as GPT-2's classifier picks its last token)")
    a = attrs_of(node)
    shape = _shape(ctx, node.input[0], node)
    if len(shape) != 2 or int(a.get("axis", 0)) % 2 != 1 or a.get("keepdims", 1) or a.get("select_last_index", 0):
        raise BuildError(f"{what}; this one is of a tensor of shape {list(shape)}, axis {a.get('axis', 0)}, "
                         f"keepdims {a.get('keepdims', 1)}")
    t = int(shape[1])
    add = _only_user(ctx, node.output[0], "Add")
    offsets = next((i for i in add.input if i != node.output[0]), "") if add is not None else ""
    mul = ctx.producer(offsets)
    rng = next((ctx.producer(i) for i in mul.input), None) if mul is not None and mul.op_type == "Mul" else None
    chain = [mul]
    if rng is not None and rng.op_type == "Unsqueeze":
        chain.append(rng)
        rng = ctx.producer(rng.input[0])
    stride = next((_static(ctx, i) for i in mul.input if _static(ctx, i) is not None), None) if chain[0] else None
    gathers = ctx.users(add.output[0]) if add is not None else []
    if rng is None or rng.op_type != "Range" or not _is_batch(ctx, rng.input[1]) or stride is None or \
            int(np.asarray(stride).reshape(-1)[0]) != t or not gathers or \
            any(g is None or g.op_type != "Gather" or attrs_of(g).get("axis", 0) != 0 or g.input[1] != add.output[0]
                or ctx.producer(g.input[0]) is None or ctx.producer(g.input[0]).op_type != "Flatten" for g in gathers):
        raise BuildError(f"{what}; this one is read otherwise")
    for n in [rng] + chain + [add]:
        ctx.replace(n, [])
    nodes = [ctx.node(node, "Cast", [node.input[0]], to=1)]
    v = nodes[-1].output[0]
    nodes.append(ctx.node(node, "ReduceMax", [v], axes=[1], keepdims=1) if ctx.opset < 18 else
                 ctx.node(node, "ReduceMax", [v, ctx.ints(node, "axes", [1])], keepdims=1))
    nodes.append(ctx.node(node, "Sub", [v, nodes[-1].output[0]]))

    def is_zero(x):  # 1 where x == 0, else 0 (select_eq)
        zero, one = (ctx.initializer(f"{node.name}/{k}", np.asarray(k, dtype=np.float32)) for k in (0.0, 1.0))
        nodes.append(ctx.node(node, "Equal", [x, zero]))
        nodes.append(ctx.node(node, "Where", [nodes[-1].output[0], one, zero]))
        return nodes[-1].output[0]

    first = is_zero(nodes[-1].output[0])  # the places of the maximum
    before = ctx.fresh(f"{node.name}/before")  # how many of them come before each place
    cum = ctx.node(node, "CumSum", [first, ctx.ints(node, "axis", [1])], before, exclusive=1)
    ctx.declare(first, (N, t))
    nodes.extend(_cumsum(cum, ctx))
    nodes.append(ctx.node(node, "Mul", [first, is_zero(before)]))  # the first place of the maximum: one-hot
    nodes.append(ctx.node(node, "Unsqueeze", [nodes[-1].output[0], ctx.ints(node, "unsqueeze", [1])]))
    one_hot = nodes[-1].output[0]
    for g in gathers:
        flat = ctx.producer(g.input[0])
        rows = _shape(ctx, flat.input[0], flat)
        if len(rows) != 3 or int(rows[1]) != t or int(attrs_of(flat).get("axis", 1)) != 2:
            raise BuildError(f"{what}; {where_of(g)} reads a tensor of shape {list(rows)} flattened at axis "
                             f"{attrs_of(flat).get('axis', 1)}, not [N, {t}, C] at axis 2")
        ctx.replace(flat, [])
        picked = ctx.node(g, "MatMul", [one_hot, flat.input[0]])  # [N, 1, C]
        ctx.replace(g, [picked, ctx.reshape(g, picked.output[0], [-1, int(rows[2])], g.output[0])])
    return nodes


LOWERINGS["ArgMax"] = _argmax_pick
