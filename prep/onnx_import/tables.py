"""Import rules of parameter tables read by index: nn.Embedding (a Gather of token ids), a position table read
at constant rows, and a table read at constant indices of two axes (T5's relative-position bias), which is
followed as a view until an Add puts it on attention's scores."""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import batch_axis as ba
from ..elementwise import BY_ONNX
from ..errors import BuildError
from ..shape import Constant
from .common import same_rows_each_sample, where
from .layers import elementwise_of, embedding
from .registry import ANY, imports


@imports("Gather")
def table_gather(cx, s) -> bool:
    """A parameter table read at constant indices [T1, T2] (T5's relative-position bias: buckets of the
    query-key distances), the same for every sample: an embedding of the T1 * T2 ids, (T1*T2, F) a sample,
    seen as the ONNX tensor [T1, T2, F] without a batch axis until an Add puts it on attention's scores."""
    node, a, ins, out, shapes = s.node, s.a, s.ins, s.out, cx.shapes
    if not (ins[0] in cx.trainable_names and (cx.trains is None or cx.trains(ins[0])) and
            same_rows_each_sample(a, cx.consts.get(ins[1]), rank=2)):
        return False
    idx = cx.consts[ins[1]]
    ids = f"{out}:ids"
    cx.gather(node, ids, [{"input": None, "const": Constant(idx.reshape(-1)), "ops": []}], [], name=f"{node.name}:ids")
    cx.integer.add(ids)
    emb = embedding(node, a, ids, cx.param(node, 0), cx.params, shapes, cx.padding_idx)
    src = f"{out}:embedded"  # (not `out`: that is [T1, T2, F] without a batch axis, no activation)
    shapes[src] = shapes.pop(out)
    cx.layers.append(dataclasses.replace(emb, outputs=[src]))
    cx.table_views[out] = (src, [("reshape", tuple(idx.shape) + (shapes[src][1],))],
                           tuple(idx.shape) + (shapes[src][1],), False, emb.params["weight"])
    return True


@imports("Transpose", "Unsqueeze")
def table_view_shape(cx, s) -> bool:
    """A Transpose, or an Unsqueeze of the batch axis, of a table view: still one. Falls through otherwise."""
    a, ins, out = s.a, s.ins, s.out
    if ins[0] not in cx.table_views:
        return False
    src, ops, shape, batched, table = cx.table_views[ins[0]]
    if s.op == "Transpose":
        perm = list(a.get("perm", reversed(range(len(shape)))))
        cx.table_views[out] = (src, ops + [("permute", tuple(perm))], tuple(shape[p] for p in perm), batched, table)
        return True
    axes = np.asarray(cx.consts.get(ins[1]) if len(ins) > 1 else a.get("axes")).reshape(-1).tolist()
    if axes == [0] and not batched:  # the batch axis, of size 1: broadcast over the batch
        cx.table_views[out] = (src, ops, shape, True, table)
        return True
    return False


@imports(*BY_ONNX)
def table_added(cx, s) -> bool:
    """A table view added to (or combined with) attention's scores: on their rows form."""
    node, op, a, ins, out = s.node, s.op, s.a, s.ins, s.out
    if not (len(ins) == 2 and any(i in cx.table_views for i in ins)):
        return False
    k = next(j for j, i in enumerate(ins) if i not in cx.table_views)
    src, ops, shape, batched, table = cx.table_views[ins[1 - k]]
    if ins[k] in cx.merged_consts:
        return _added_to_windows(cx, s, k)
    v = cx.lz(ins[k])
    if not batched or ins[k] in cx.table_views or [d for d in v.sizes()[1:]] != list(shape):
        raise BuildError(f"{where(node)}: parameter {table!r} read at constant indices (ONNX shape "
                         f"{list(shape)}) is supported added to a tensor of ONNX shape "
                         f"[N, {', '.join(map(str, shape))}] (attention's scores), not to one of shape "
                         f"{v.sizes()}")
    x = cx.materialise(ins[k], "rows", op, where(node))[0]
    rows, cols = cx.shapes[x]
    bias = f"{out}:table"
    windows = rows * cols // int(np.prod(shape))  # (the batch merged with windows: one bias for every window)
    if windows > 1:  # (A, R / A, F) with a bias of (1, R / A, F), broadcast over the windows
        cx.view(node, x, [("reshape", (windows, rows // windows, cols))], out=f"{x}:windows")
        x, rows = f"{x}:windows", rows // windows
    cx.view(node, src, ops + [("reshape", (1, rows, cols) if windows > 1 else (rows, cols))], out=bias,
            name=f"{node.name}:table")
    t = f"{out}:rows" if windows == 1 else f"{out}:per_window"
    cx.layers.append(elementwise_of(cx, node, t, a, [x, bias] if k == 0 else [bias, x]))
    w = ba.after_rows_op(t, v, cols)
    cx.set_lazy(out, ba.Lazy(t, [("reshape", w.fine)], w.fine, w.groups) if windows > 1 else w)
    return True


def _added_to_windows(cx, s, k) -> bool:
    """A table view (the relative-position bias, [1, h, n, n]) plus a constant of every window (Swin's shifted-window
    mask, [N * windows, 1, n, n]): kept as the pair (cx.window_biases), which the Add to the scores takes as two
    (elementwise.py: on_merged_batch), the table view broadcast over the windows as table_added adds it."""
    node, ins = s.node, s.ins
    if s.op != "Add":
        raise BuildError(f"{where(node)}: {s.op} of a table view and a constant of every window: only Add")
    cx.window_biases[s.out] = (ins[1 - k], ins[k])
    return True


@imports(ANY)
def table_guard(cx, s) -> bool:
    """Any other op reading a table view: an error that says what it is and what takes it."""
    if any(i in cx.table_views for i in s.ins):
        cx.act(next(i for i in s.ins if i in cx.table_views))  # (raises: what it is, and what takes it)
        raise AssertionError("act() of a table view")
    return False


@imports("Gather")
def position_gather(cx, s) -> bool:
    """A parameter table read at constant rows, the same for every sample ([T] or [1, T] positions: a position
    table): an embedding of constant ids, so that the table trains (prep.load never lets onnxsim fold it, and
    this does not either)."""
    node, a, ins, out = s.node, s.a, s.ins, s.out
    idx = cx.consts.get(ins[1])
    if ins[1] in cx.batch_consts:  # (ids repeated over the batch: BERT's token types, all 0, when none are given)
        idx = cx.batch_consts[ins[1]]
        idx = idx.astype(np.int64) if np.array_equal(idx, np.round(idx)) else None
    if not (ins[0] in cx.trainable_names and same_rows_each_sample(a, idx)):
        return False
    ids = f"{out}:ids"
    cx.gather(node, ids, [{"input": None, "const": Constant(np.asarray(idx).reshape(-1)), "ops": []}],
              [], name=f"{node.name}:ids")
    cx.integer.add(ids)
    cx.layers.append(embedding(node, a, ids, cx.param(node, 0), cx.params, cx.shapes, cx.padding_idx))
    return True


@imports("Gather")
def token_embedding(cx, s) -> bool:
    """Gather(table, ids) of integer ids: nn.Embedding."""
    ins = s.ins
    if not (ins[0] in cx.initializer_names and len(ins) > 1 and cx.alias.get(ins[1], ins[1]) in cx.integer):
        return False
    cx.layers.append(embedding(s.node, s.a, cx.act(ins[1]), cx.param(s.node, 0), cx.params, cx.shapes,
                               cx.padding_idx))
    return True
