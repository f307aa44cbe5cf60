"""Shape ops that move or merge the batch axis, resolved at import time.

The IR has no batch axis (every op maps one sample to one sample), but exported sequence models
move it: nn.MultiheadAttention with batch_first transposes [N, T, F] to [T, N, F], merges the batch
with the heads ([T, N * h, d]) and a Linear on a 3-D tensor reshapes [N, T, F] to [N * T, F]. None
of that changes which sample an element belongs to; it only changes how the ONNX tensor names the
elements. So such a tensor is kept *lazily*, as a `Lazy`: an IR tensor `src`, a chain of per-sample
view ops `ops` (prep/shape.py) from src's IR shape to a *fine* per-sample shape, and `groups`, the
ONNX tensor's axes, each a list of factors, a factor being "N" (the batch) or a fine axis:

    [T, N * h, d]   groups [[t], [N, a], [b]]   fine (T, h, d): t = 0, a = 1, b = 2

Transpose permutes the groups, Reshape regroups the factors (splitting a fine axis where a target
dim needs part of it: a reshape of the fine shape), Squeeze and Unsqueeze drop and add groups of
size 1, Gather with a scalar index slices a fine axis. None of them is a layer. A layer is made only
when an op that computes needs the tensor (`materialise`): one gather (ops, a permute into the
groups' order, a reshape to the IR shape), or nothing where that chain is the identity. Ops that
act on rows (MatMul with a weight, LayerNorm, Softmax on the last axis) take the *rows form*
(R, F): the last ONNX axis as F, the other factors but the batch, in their order, as R; a batched
MatMul of two activations takes each with the leading axes as blocks of rows; everything else takes
the *canonical form*, the batch alone and first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import BuildError

N = "N"


@dataclass
class Lazy:
    src: str
    ops: list
    fine: tuple[int, ...]
    groups: list[list]
    origin: str = ""  # where the batch axis first moved (an ONNX node), for errors

    def sizes(self) -> list:
        """The ONNX shape, with "N" for a group holding the batch (times its other factors)."""
        out = []
        for g in self.groups:
            size = int(np.prod([self.fine[f] for f in g if f != N]))
            out.append((N, size) if N in g else size)
        return out

    def rank(self) -> int:
        return len(self.groups)


def trivial(src: str, shape) -> Lazy:
    """The view of an IR tensor as ONNX sees it: the batch, then its per-sample axes."""
    shape = tuple(int(d) for d in shape)
    return Lazy(src, [], shape, [[N]] + [[i] for i in range(len(shape))])


def is_trivial(v: Lazy, shapes) -> bool:
    return (all(op[0] == "reshape" for op in v.ops) and v.fine == tuple(shapes[v.src])
            and v.groups == [[N]] + [[i] for i in range(len(v.fine))])


def transpose(v: Lazy, perm) -> Lazy:
    return Lazy(v.src, list(v.ops), v.fine, [list(v.groups[p]) for p in perm])


def squeeze(where, v: Lazy, axes) -> Lazy:
    axes = {a % v.rank() for a in axes}
    for a in axes:
        if N in v.groups[a] or int(np.prod([v.fine[f] for f in v.groups[a]])) != 1:
            raise BuildError(f"{where}: Squeeze of axis {a}, which is not of size 1")
    groups = [list(g) for i, g in enumerate(v.groups) if i not in axes]
    leftover = [f for i in sorted(axes) for f in v.groups[i]]  # fine axes of size 1 (a Split's part): kept somewhere
    if leftover and groups:
        groups[-1] += leftover
    return Lazy(v.src, list(v.ops), v.fine, groups)


def unsqueeze(v: Lazy, axes) -> Lazy:
    groups = [list(g) for g in v.groups]
    rank = len(groups) + len(axes)
    for a in sorted(a % rank for a in axes):
        groups.insert(a, [])
    return Lazy(v.src, list(v.ops), v.fine, groups)


def select(where, v: Lazy, axis: int, index: int) -> Lazy:
    """Gather of one index on `axis` (the axis dropped)."""
    axis %= v.rank()
    g = [f for f in v.groups[axis] if f == N or v.fine[f] != 1]
    if not g and N not in v.groups[axis] and index in (0, -1):  # an axis of size 1 (an Unsqueeze's, a stack of
        groups = [list(grp) for k, grp in enumerate(v.groups) if k != axis]  # one): dropped, its size-1 fine axes
        if v.groups[axis] and groups:  # kept in some group, as below
            groups[-1] += v.groups[axis]
        return Lazy(v.src, list(v.ops), v.fine, groups)
    if len(g) != 1 or g[0] == N:
        raise BuildError(f"{where}: Gather on an axis that holds the batch or several axes")
    j = g[0]
    index %= v.fine[j]
    fine = v.fine[:j] + v.fine[j + 1:]
    ops = list(v.ops) + [("slice", j, index, index + 1, 1), ("reshape", fine)]

    def renum(f):
        return f if f == N or f < j else f - 1

    groups = [[renum(f) for f in grp] for k, grp in enumerate(v.groups) if k != axis]
    leftover = [renum(f) for f in v.groups[axis] if f != j]  # of size 1 (checked above): kept in some group
    if leftover and groups:
        groups[-1] += leftover
    return Lazy(v.src, ops, fine, groups)


def narrow(where, v: Lazy, axis: int, start: int, end: int) -> Lazy:
    """Elements start..end of `axis` (a Split's output), an axis of one fine axis but the batch."""
    axis %= v.rank()
    g = [f for f in v.groups[axis] if f == N or v.fine[f] != 1]
    if len(g) != 1 or g[0] == N:
        raise BuildError(f"{where}: a Split or Slice on an axis that holds the batch or several axes")
    j = g[0]
    fine = v.fine[:j] + (end - start,) + v.fine[j + 1:]
    return Lazy(v.src, list(v.ops) + [("slice", j, start, end, 1)], fine, [list(grp) for grp in v.groups], v.origin)


def reshape(where, v: Lazy, target, allowzero: bool) -> Lazy:
    """Regroup the factors into the dims of `target` (ONNX: 0 copies, one -1 is the rest; the batch
    dim is -1, "N", 0 copying a batch dim, or a symbolic product)."""
    fine = list(v.fine)
    seq = [f for g in v.groups for f in g]
    total = int(np.prod([fine[f] for f in seq if f != N]))
    dims: list = []  # (non-batch size or None for the rest, holds the batch)
    for i, d in enumerate(target):
        if isinstance(d, str):
            k = int(d[len(N) + 1:]) if d.startswith(N + "*") and d[len(N) + 1:].isdigit() else 1 if d == N else None
            if k is None:
                raise BuildError(f"{where}: Reshape to {target}: a symbolic dim {d!r}")
            dims.append((k, True))  # (N*4: the batch and 4 more, windows folded into it)
        elif int(d) == 0 and not allowzero:
            s = v.sizes()[i]
            dims.append((s[1], True) if isinstance(s, tuple) else (s, False))
        elif int(d) == -1:
            dims.append((None, None))
        else:
            dims.append((int(d), False))
    if sum(1 for _, b in dims if b) > 1 or sum(1 for s, _ in dims if s is None) > 1:
        raise BuildError(f"{where}: Reshape to {target}: more than one batch or unknown dim")
    has_batch = any(b for _, b in dims)
    known = int(np.prod([s for s, _ in dims if s is not None]))
    if any(s is None for s, _ in dims):
        if known == 0 or total % known:
            raise BuildError(f"{where}: Reshape of {v.sizes()} to {target}")
        dims = [(total // known, not has_batch) if s is None else (s, b) for s, b in dims]
    elif not has_batch:
        raise BuildError(f"{where}: Reshape of {v.sizes()} to {target}: no dim holds the batch")
    if int(np.prod([s for s, _ in dims])) != total:
        raise BuildError(f"{where}: Reshape of {v.sizes()} to {target} changes the size")
    ops = list(v.ops)
    groups: list[list] = []
    k = 0
    for size, batch in dims:
        grp, prod, got_n = [], 1, False
        while prod < size or (batch and not got_n):
            if k >= len(seq):
                raise BuildError(f"{where}: Reshape of {v.sizes()} to {target}")
            f = seq[k]
            if f == N:
                if not batch:
                    raise BuildError(f"{where}: Reshape of {v.sizes()} to {target} splits the batch axis")
                grp.append(N)
                got_n = True
                k += 1
                continue
            need = size // prod
            if fine[f] <= need or prod * fine[f] == size:
                if size % (prod * fine[f]):
                    raise BuildError(f"{where}: Reshape of {v.sizes()} to {target}")
                grp.append(f)
                prod *= fine[f]
                k += 1
                continue
            if fine[f] % need:  # split fine axis f into (need, rest)
                raise BuildError(f"{where}: Reshape of {v.sizes()} to {target}")
            fine = fine[:f] + [need, fine[f] // need] + fine[f + 1:]
            ops.append(("reshape", tuple(fine)))

            def renum(x):
                return x if x == N or x <= f else x + 1

            seq = [renum(x) for x in seq[:k]] + [f, f + 1] + [renum(x) for x in seq[k + 1:]]
            groups = [[renum(x) for x in g] for g in groups]
            grp = [renum(x) for x in grp]
        groups.append(grp)
    rest = seq[k:]
    if any(f == N or fine[f] != 1 for f in rest):
        raise BuildError(f"{where}: Reshape of {v.sizes()} to {target}")
    if rest:
        groups[-1] += rest
    return Lazy(v.src, ops, tuple(fine), groups)


def _chain(v: Lazy, order: list, shape: tuple[int, ...]) -> list:
    ops = list(v.ops)
    if order != list(range(len(v.fine))):
        ops.append(("permute", tuple(order)))
    ops.append(("reshape", tuple(shape)))
    return ops


def rows_form(where, v: Lazy, what: str):
    """(ops from src, (R, F)) of the rows form: the last axis as F, the other factors but the batch as R."""
    last = v.groups[-1]
    if N in last:
        raise BuildError(f"{where}: {what} over an axis that holds the batch")
    rows = [f for g in v.groups[:-1] for f in g if f != N]
    cols = list(last)
    if N not in [f for g in v.groups for f in g]:
        raise BuildError(f"{where}: {what} of a tensor without the batch axis")
    r = int(np.prod([v.fine[f] for f in rows]))
    c = int(np.prod([v.fine[f] for f in cols]))
    return _chain(v, rows + cols, (r, c)), (r, c)


def blocks_form(where, v: Lazy, what: str):
    """(ops, (G * M, K), G, lead pattern) of a batched matrix operand: the last two axes a matrix, the
    leading ones (with the batch) blocks of rows."""
    if v.rank() < 3 or N in v.groups[-1] or N in v.groups[-2]:
        raise BuildError(f"{where}: {what} needs the batch on a leading axis of a tensor of rank 3 or more")
    lead = [f for g in v.groups[:-2] for f in g if f == N or v.fine[f] != 1]
    if N not in lead:
        raise BuildError(f"{where}: {what} of a tensor without the batch axis")
    rows, m, k = [f for f in lead if f != N], list(v.groups[-2]), list(v.groups[-1])
    size = lambda fs: int(np.prod([v.fine[f] for f in fs]))  # noqa: E731
    pattern = tuple(N if f == N else v.fine[f] for f in lead)
    g = size(rows)
    return _chain(v, rows + m + k + [f for g_ in v.groups[:-2] for f in g_ if f != N and f not in rows],
                  (g * size(m), size(k))), (g * size(m), size(k)), g, pattern


def canonical_form(where, v: Lazy, what: str):
    """(ops, per-sample shape) with the batch alone and first."""
    first = [f for f in v.groups[0] if f == N or v.fine[f] != 1]
    if first != [N] or any(N in g for g in v.groups[1:]):
        raise BuildError(f"{where}: {what} of a tensor whose batch axis is not the first (ONNX shape "
                         f"{v.sizes()}): {v.origin or 'an op'} moved the batch axis, and only sequence ops "
                         "(MatMul, LayerNormalization, Softmax) and shape ops read it so")
    order = [f for g in v.groups[1:] for f in g] + [f for f in v.groups[0] if f != N]
    shape = tuple(int(np.prod([v.fine[f] for f in g])) for g in v.groups[1:]) or (1,)
    return _chain(v, order, shape), shape


def merged_batch(v: Lazy) -> bool:
    """Whether the batch is merged with windows on the first axis, batch first ([N * windows, ...]: Swin's window
    attention, MobileViT's patches), and nowhere else: an elementwise op reads it in the merged form."""
    first = [f for f in v.groups[0] if f == N or v.fine[f] != 1]
    return len(first) > 1 and first[0] == N and not any(N in g for g in v.groups[1:])


def merged_form(where, v: Lazy, what: str):
    """(ops, per-sample shape) of a merged_batch view: (windows, the other axes...), the ONNX shape but the batch."""
    if not merged_batch(v):
        raise BuildError(f"{where}: {what} of a tensor of ONNX shape {v.sizes()}: not the batch merged first")
    order = [f for f in v.groups[0] if f != N] + [f for g in v.groups[1:] for f in g]
    shape = tuple(int(np.prod([v.fine[f] for f in g if f != N])) for g in v.groups)
    return _chain(v, order, shape), shape


def merged(src: str, shape) -> Lazy:
    """The view of an IR tensor of per-sample shape (windows, ...) with the batch merged into its first axis."""
    shape = tuple(int(d) for d in shape)
    return Lazy(src, [], shape, [[N, 0]] + [[i] for i in range(1, len(shape))])


def after_rows_op(out: str, v: Lazy, out_features: int) -> Lazy:
    """The view of a row-wise op's output (R, F'): the input's groups with the last axis F'."""
    rows = [f for g in v.groups[:-1] for f in g if f != N]
    fine = tuple(v.fine[f] for f in rows) + (int(out_features),)
    idx = {f: i for i, f in enumerate(rows)}
    groups = [[N if f == N else idx[f] for f in g] for g in v.groups[:-1]] + [[len(rows)]]
    r = int(np.prod(fine[:-1]))
    return Lazy(out, [("reshape", fine)] if fine != (r, int(out_features)) else [], fine, groups)


def after_blocks_op(out: str, a: Lazy, m: int, p: int) -> Lazy:
    """The view of a batched MatMul's output (G * M, P): a's leading groups, then M, P."""
    lead = [f for g in a.groups[:-2] for f in g if f != N]
    keep = [f for f in lead if a.fine[f] != 1]
    fine = tuple(a.fine[f] for f in keep) + (int(m), int(p))
    idx = {f: i for i, f in enumerate(keep)}
    groups = [[f if f == N else idx[f] for f in g if f == N or f in idx] for g in a.groups[:-2]]
    groups += [[len(keep)], [len(keep) + 1]]
    return Lazy(out, [("reshape", fine)], fine, groups)
