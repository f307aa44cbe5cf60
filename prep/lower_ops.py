"""The LOWERINGS entries (prep/lower.py) of Einsum, DepthToSpace, SpaceToDepth, CumSum, GlobalMaxPool and ReduceMin.

Einsum      the equations of batched matmuls, transposes and reductions (attention's `bhqd,bhkd->bhqk`,
            `bhqk,bhkd->bhqd`, `bij->bji`, `bij->bi`, `...` too): ReduceSum of the indices only one operand
            has, Transpose, Reshape to [batch..., M, K] and [batch..., K, P] where several indices merge (the
            batch index, the one of size N, first: a 0 in the Reshape's target), MatMul, Reshape and Transpose
            into the output's order. A parameter operand (`bik,jk->bij`) must
            be 2-D with one summed index: MatMul by it, or Gemm with transB where it is [out, in], so that
            it stays the initializer itself and trains under its state_dict name.
DepthToSpace, SpaceToDepth
            ONNX's own definition: Reshape -> Transpose -> Reshape (nn.PixelShuffle; nn.PixelUnshuffle
            exports as those three already).
CumSum      a scan of log2(T) steps (Hillis-Steele): y += y shifted by 1, 2, 4, ... along the axis, each
            shift a Slice and a Pad (one gather pass) and an Add. Why not a MatMul by a constant triangular
            matrix: the IR takes a MatMul's constant operand as a weight (a parameter, T*T floats, only for
            the last axis), and not a sum of T shifted gather parts: T unrolled reads a texel. The scan
            works on any per-sample axis in 2 log2(T) passes; its gradient is the reverse scan (the
            gathers' inverse chains and the Adds), the reverse cumsum.
GlobalMaxPool
            (nn.AdaptiveMaxPool2d(1), nn.AdaptiveMaxPool1d(1)) ReduceMax over every axis after the channels,
            keepdims: the reduce op's max, whose gradient is shared among ties (one per sample and channel).
ReduceMin   (torch.amin) Neg, ReduceMax, Neg: the gradient shared among ties, as torch.amin's (and amax's).
Gelu        (opset 20: torch's exporters at their default opset; nn.GELU) what torch exports at opset 17:
            x * (1 + erf(x / sqrt 2)) * 0.5, or with approximate="tanh" x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
            * 0.5, elementwise ops the build has.
"""
from __future__ import annotations

import string

import numpy as np

from .errors import BuildError
from .lower import LOWERINGS, N, LowerCtx, attrs_of, where_of

_ELLIPSIS_DIMS = "0123456789"  # stand-ins for the dims of `...` (no einsum index is a digit)


def _einsum_terms(node, eq: str, ranks: list[int]):
    """(operand terms, output term) with `...` replaced by digit indices, right-aligned across operands."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise BuildError(f"{where_of(node)}: Einsum equation {eq!r} has {len(terms)} operand terms for "
                         f"{len(ranks)} inputs")
    if len(terms) > 2:
        raise BuildError(f"{where_of(node)}: Einsum equation {eq!r} of {len(terms)} operands: only one or two "
                         "(a batched matmul, a transpose, a reduction) are supported")
    width = 0
    for i, (t, r) in enumerate(zip(terms, ranks)):
        letters = t.replace("...", "")
        if any(c not in string.ascii_letters for c in letters) or t.count("...") > 1:
            raise BuildError(f"{where_of(node)}: Einsum equation {eq!r}: operand term {t!r} is not understood")
        if "..." in t:
            width = max(width, r - len(letters))
        elif len(t) != r:
            raise BuildError(f"{where_of(node)}: Einsum equation {eq!r}: term {t!r} for an operand of rank {r}")
    ell = _ELLIPSIS_DIMS[:width]
    expanded = [t.replace("...", ell[width - (r - len(t.replace("...", ""))):]) for t, r in zip(terms, ranks)]
    if arrow:
        out = rhs.replace("...", ell)
    else:  # implicit output: `...`, then the indices seen once, in alphabetical order
        seen = "".join(expanded)
        out = ell + "".join(sorted(c for c in set(seen) if c not in ell and seen.count(c) == 1))
    for t in expanded + [out]:
        if len(set(t)) != len(t):
            raise BuildError(f"{where_of(node)}: Einsum equation {eq!r}: an index repeated in one term (a "
                             "diagonal or trace) is not supported")
    if any(c not in "".join(expanded) for c in out):
        raise BuildError(f"{where_of(node)}: Einsum equation {eq!r}: output index not in any operand")
    return expanded, out


def _perm(src: str, dst: str) -> list[int]:
    return [src.index(c) for c in dst]


def _einsum(node, ctx: LowerCtx) -> list:
    eq = attrs_of(node).get("equation", "")
    ins = list(node.input)
    shapes = [ctx.shape(t, node) for t in ins]
    terms, out = _einsum_terms(node, eq, [len(s) for s in shapes])
    consts = [ctx.const(t) is not None for t in ins]
    size: dict[str, object] = {}
    for t, s in zip(terms, shapes):
        for c, d in zip(t, s):
            if size.setdefault(c, d) != d:
                raise BuildError(f"{where_of(node)}: Einsum equation {eq!r}: index {c!r} has sizes {size[c]} and "
                                 f"{d} (broadcasting is not supported)")
    batch = [next((c for c, d in zip(t, s) if d == N), "?") for t, s, k in zip(terms, shapes, consts) if not k]
    if not batch:
        raise BuildError(f"{where_of(node)}: Einsum equation {eq!r} of parameters or constants alone: not supported "
                         "(compute the product in the module's forward from activations, or fold it)")
    if len(set(batch)) != 1 or batch[0] not in out:
        raise BuildError(f"{where_of(node)}: Einsum equation {eq!r} sums over or pairs across the batch axis "
                         f"(index {batch[0]!r}): only per-sample contractions are supported")
    nodes: list = []

    def emit(n):
        nodes.append(n)
        return n.output[0]

    # indices only one operand has and the output lacks: summed away first
    xs = []
    for k, (x, t) in enumerate(zip(ins, terms)):
        others = "".join(terms[:k] + terms[k + 1:]) + out
        gone = [i for i, c in enumerate(t) if c not in others]
        if gone:
            if consts[k]:
                raise BuildError(f"{where_of(node)}: Einsum equation {eq!r} sums a parameter operand's own "
                                 "index: not supported")
            x = emit(ctx.reduce_sum(node, x, gone))
            t = "".join(c for c in t if c in others)
        xs.append((x, t))
    final = node.output[0]
    if len(xs) == 1:
        (x, t), = xs
        if t == out:
            return nodes + [ctx.node(node, "Identity", [x], final)]
        return nodes + [ctx.transpose(node, x, _perm(t, out), final)]

    if consts[0]:  # the activation first (the output's order is restored at the end)
        xs = xs[::-1]
        consts = consts[::-1]
    (a, ta), (b, tb) = xs
    shared = [c for c in ta if c in tb]
    bat = sorted((c for c in shared if c in out), key=lambda c: c != batch[0])  # the batch first: 0 in a Reshape
    con = [c for c in shared if c not in out]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    res = "".join(bat + fa + fb)  # the order the product comes out in

    def finish(x):
        return nodes + ([ctx.transpose(node, x, _perm(res, out), final)] if res != out else
                        [ctx.node(node, "Identity", [x], final)])

    if consts[1]:  # a parameter (or constant) operand: x[..., k] @ W, W the initializer as it is
        if bat or len(con) != 1 or len(fb) != 1:
            raise BuildError(f"{where_of(node)}: Einsum equation {eq!r} with a parameter operand: only a "
                             "2-D one with one summed index (x @ W, as a Linear) is supported")
        a = emit(ctx.transpose(node, a, _perm(ta, fa + con))) if ta != "".join(fa + con) else a
        if tb == con[0] + fb[0]:  # [in, out]
            x = emit(ctx.node(node, "MatMul", [a, b], final if res == out else None))
        elif len(fa) == 1:  # [out, in] on [N, in]
            x = emit(ctx.node(node, "Gemm", [a, b], final if res == out else None, transB=1))
        else:  # [out, in] on [N, ..., in]: the rows of tokens, as a Linear on 3-D input exports
            rows = emit(ctx.reshape(node, a, [-1, size[con[0]]]))
            x = emit(ctx.node(node, "Gemm", [rows, b], transB=1))
            x = emit(ctx.reshape(node, x, [-1] + [size[c] for c in fa[1:]] + [size[fb[0]]],
                                 final if res == out else None))
        return nodes if res == out else finish(x)

    # two activations: [bat..., M, K] @ [bat..., K, P], the batch index first in both
    def dims(cs):
        return [0 if size[c] == N else size[c] for c in cs]

    def prod(cs):
        return int(np.prod([size[c] for c in cs])) if cs else 1

    a = emit(ctx.transpose(node, a, _perm(ta, bat + fa + con))) if ta != "".join(bat + fa + con) else a
    b = emit(ctx.transpose(node, b, _perm(tb, bat + con + fb))) if tb != "".join(bat + con + fb) else b
    merged = len(fa) != 1 or len(con) != 1 or len(fb) != 1
    if merged:
        a = emit(ctx.reshape(node, a, dims(bat) + [prod(fa), prod(con)]))
        b = emit(ctx.reshape(node, b, dims(bat) + [prod(con), prod(fb)]))
    done = res == out and not merged
    x = emit(ctx.node(node, "MatMul", [a, b], final if done else None))
    if merged:
        x = emit(ctx.reshape(node, x, dims(bat + fa + fb), final if res == out else None))
    return nodes if res == out else finish(x)


LOWERINGS["Einsum"] = _einsum


def _blocks(node, ctx: LowerCtx, to_depth: bool) -> list:
    a = attrs_of(node)
    b = int(a.get("blocksize", 0))
    shape = ctx.shape(node.input[0], node)
    if len(shape) != 4 or b < 1:
        raise BuildError(f"{where_of(node)}: needs a 4-D (N, C, H, W) input and a blocksize >= 1 (got "
                         f"{list(shape)}, blocksize {b})")
    _, c, h, w = shape
    if to_depth:
        if h % b or w % b:
            raise BuildError(f"{where_of(node)}: H and W ({h}, {w}) are not multiples of blocksize {b}")
        steps = ([0, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4], [0, c * b * b, h // b, w // b])
    else:
        mode = a.get("mode", "DCR")
        if c % (b * b) or mode not in ("DCR", "CRD"):
            raise BuildError(f"{where_of(node)}: {c} channels, blocksize {b}, mode {mode!r}: the channels must be "
                             "a multiple of blocksize^2, the mode DCR or CRD")
        steps = ([0, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2]) if mode == "DCR" else \
            ([0, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3])
        steps += ([0, c // (b * b), h * b, w * b],)
    first = ctx.reshape(node, node.input[0], steps[0])
    moved = ctx.transpose(node, first.output[0], steps[1])
    return [first, moved, ctx.reshape(node, moved.output[0], steps[2], node.output[0])]


LOWERINGS["DepthToSpace"] = lambda node, ctx: _blocks(node, ctx, False)
LOWERINGS["SpaceToDepth"] = lambda node, ctx: _blocks(node, ctx, True)


def _cumsum(node, ctx: LowerCtx) -> list:
    a = attrs_of(node)
    shape = ctx.shape(node.input[0], node)
    axis = ctx.const(node.input[1]) if len(node.input) > 1 else None
    if axis is None or np.size(axis) != 1:
        raise BuildError(f"{where_of(node)}: CumSum's axis must be a constant")
    axis = int(np.asarray(axis).reshape(-1)[0])
    ax = axis + len(shape) if axis < 0 else axis
    if not 0 <= ax < len(shape):
        raise BuildError(f"{where_of(node)}: CumSum axis {axis} of a tensor of rank {len(shape)}")
    if ax == 0:
        raise BuildError(f"{where_of(node)}: CumSum over the batch axis is not supported (only over a "
                         "per-sample axis)")
    t, reverse, rank = int(shape[ax]), bool(a.get("reverse", 0)), len(shape)
    nodes: list = []

    def shift(x, k, out=None):
        """x moved k places along the axis (towards the end; the start when reverse), zeros shifted in."""
        lo, hi = (k, t) if reverse else (0, t - k)
        cut = ctx.node(node, "Slice", [x, ctx.ints(node, "starts", [lo]), ctx.ints(node, "ends", [hi]),
                                       ctx.ints(node, "axes", [ax])])
        pads = [0] * (2 * rank)
        pads[ax + (rank if reverse else 0)] = k
        nodes.extend([cut, ctx.node(node, "Pad", [cut.output[0], ctx.ints(node, "pads", pads)], out)])
        return nodes[-1].output[0]

    exclusive = bool(a.get("exclusive", 0))
    y, k = node.input[0], 1
    while k < t:
        last = 2 * k >= t and not exclusive
        nodes.append(ctx.node(node, "Add", [y, shift(y, k)], node.output[0] if last else None))
        y, k = nodes[-1].output[0], 2 * k
    if exclusive:
        if t == 1:
            nodes.append(ctx.node(node, "Sub", [y, y], node.output[0]))
        else:
            shift(y, 1, node.output[0])
    elif t == 1:
        nodes.append(ctx.node(node, "Identity", [y], node.output[0]))
    return nodes


LOWERINGS["CumSum"] = _cumsum


def _global_max_pool(node, ctx: LowerCtx) -> list:
    rank = len(ctx.shape(node.input[0], node))
    if rank < 3:
        raise BuildError(f"{where_of(node)}: GlobalMaxPool needs an input [N, C, ...] of rank 3 or more")
    axes = list(range(2, rank))
    if ctx.opset >= 18:
        return [ctx.node(node, "ReduceMax", [node.input[0], ctx.ints(node, "axes", axes)], node.output[0], keepdims=1)]
    return [ctx.node(node, "ReduceMax", [node.input[0]], node.output[0], axes=axes, keepdims=1)]


def _reduce_min(node, ctx: LowerCtx) -> list:
    """min(x) = -max(-x), over the same axes (an attribute, or an input from opset 18) with the same keepdims."""
    neg = ctx.node(node, "Neg", [node.input[0]])
    top = ctx.node(node, "ReduceMax", [neg.output[0], *node.input[1:]], None, **attrs_of(node))
    return [neg, top, ctx.node(node, "Neg", [top.output[0]], node.output[0])]


LOWERINGS["GlobalMaxPool"] = _global_max_pool
LOWERINGS["ReduceMin"] = _reduce_min


def _gelu(node, ctx: LowerCtx) -> list:
    x, how = node.input[0], attrs_of(node).get("approximate", "none")
    const = lambda hint, v: ctx.initializer(f"{node.name or 'Gelu'}/{hint}", np.float32(v))  # noqa: E731
    if how == "tanh":
        cube = ctx.node(node, "Mul", [x, x])
        cube3 = ctx.node(node, "Mul", [cube.output[0], x])
        scaled = ctx.node(node, "Mul", [cube3.output[0], const("c", 0.044715)])
        inner = ctx.node(node, "Add", [x, scaled.output[0]])
        arg = ctx.node(node, "Mul", [inner.output[0], const("k", np.sqrt(2.0 / np.pi))])
        curve = [cube, cube3, scaled, inner, arg, ctx.node(node, "Tanh", [arg.output[0]])]
    elif how == "none":
        arg = ctx.node(node, "Div", [x, const("sqrt2", np.sqrt(2.0))])
        curve = [arg, ctx.node(node, "Erf", [arg.output[0]])]
    else:
        raise BuildError(f"Gelu node '{node.name}': approximate={how!r} is not 'none' or 'tanh'")
    one = ctx.node(node, "Add", [curve[-1].output[0], const("one", 1.0)])
    times = ctx.node(node, "Mul", [x, one.output[0]])
    return [*curve, one, times, ctx.node(node, "Mul", [times.output[0], const("half", 0.5)], node.output[0])]


LOWERINGS["Gelu"] = _gelu
