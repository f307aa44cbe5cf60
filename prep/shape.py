"""Shape ops as index arithmetic: the `gather` layer's map, from output element to input element.

A `gather` layer (prep/ir.py) holds *parts*; each reads one input tensor (or a constant, or a trainable
parameter that is one sample repeated over the batch: a class token) through a chain of per-sample view
ops, and the output is the sum of the parts, each of which is zero outside the region it covers (so a
concatenation is parts padded to their place on the concat axis):

    op                      output shape of an input of shape S
    ("reshape", shape)      shape (same size)
    ("permute", perm)       S[perm[0]], S[perm[1]], ...        (torch.permute of the per-sample axes)
    ("slice", a, b, e, s)   S with axis a of len(range(b, e, s)); 0 <= b < e <= S[a], s >= 1
    ("pad", a, lo, hi)      S with axis a of S[a] + lo + hi, zeros outside [lo, lo + S[a])
    ("flip", a)             S, axis a in reverse order (torch.flip; a Slice with a negative step is a
                            flip and a slice)

Batch is never an axis here: every op maps one sample to one sample.

A chain compiles into a stack of strided *views* (tinygrad's ShapeTracker is the model). A view is
(shape, strides, offset, mask) and maps a flat index, read row-major over its shape, to the flat
index of the view below it (the bottom one: into the source), or to nothing where an axis index
falls outside its mask [lo, hi):

    flat --unravel over shape--> (i0, i1, ...) --masks, sum i_k * stride_k + offset--> flat below

A reshape pushes a fresh contiguous view; permute, slice, pad and flip rewrite the strides, offset and
mask of the top one (a flip negates its axis' stride and moves the offset to the axis' last element). Views that map flat to flat unchanged are dropped, and adjacent axes that step
together are merged, so ShuffleNet's Reshape -> Transpose -> Reshape becomes one view of 3 axes.

The map runs over the *storage* of both ends, not their logical shapes: `storage_ops` (from the
texture layout, codegen/webgl2/layout.py) takes a tensor's stored dims (C, H, W) to its logical shape, so the
kernel (codegen/ops/gather.py, in the kernel language) starts from the (c, h, w) of an output texel lane
and ends at the (c, h, w) of the source lane. A tensor packed differently (token tensors [T, F],
issue 19) changes `storage_ops`, not this module.

The backward of a part is the gather of the output gradient through the inverse chain: reshape back,
the inverse permutation, a flip again, a slice's gradient placed into zeros (a pad; with a step, the gradient
spread out by the step first), a pad's gradient sliced out. Every map here is injective (no element
is read twice), so that gather is the whole gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# A constant part's values are baked into its kernel's source (a constant array of the kernel language, codegen/ops/gather.py):
# enough for coordinate channels or padding channels of small images, not for a constant image.
MAX_CONSTANT_FLOATS = 4096


class Constant:
    """A constant part of a gather: one sample's values, the same for every sample. Compares by value
    (layer attrs are compared whole)."""

    __hash__ = None

    def __init__(self, array):
        self.array = np.array(array, dtype=np.float32)
        self.array.setflags(write=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    def __eq__(self, other):
        return isinstance(other, Constant) and self.shape == other.shape and np.array_equal(self.array, other.array)

    def __repr__(self):
        return f"Constant{self.shape}"


def part_shape(part: dict, input_shapes) -> tuple[int, ...]:
    """The per-sample shape of a gather part's source: its input's (`input_shapes[slot]`), a constant's, or
    a parameter's (a class token: one sample of it, the same in every sample)."""
    if part.get("param") is not None:
        return tuple(part["shape"])
    if part["input"] is not None:
        return tuple(input_shapes[part["input"]])
    return tuple(part["const"].shape)


def shape_after(shape: tuple[int, ...], op) -> tuple[int, ...]:
    kind = op[0]
    if kind == "reshape":
        assert int(np.prod(op[1])) == int(np.prod(shape)), (shape, op)
        return tuple(int(d) for d in op[1])
    if kind == "permute":
        return tuple(shape[p] for p in op[1])
    if kind == "slice":
        _, a, b, e, s = op
        assert 0 <= b < e <= shape[a] and s >= 1, (shape, op)
        return shape[:a] + (len(range(b, e, s)),) + shape[a + 1:]
    if kind == "pad":
        _, a, lo, hi = op
        return shape[:a] + (shape[a] + lo + hi,) + shape[a + 1:]
    if kind == "flip":
        return shape
    raise AssertionError(f"unknown view op {op!r}")


def chain_shape(shape, ops) -> tuple[int, ...]:
    shape = tuple(shape)
    for op in ops:
        shape = shape_after(shape, op)
    return shape


def inverse_ops(shape, ops) -> list:
    """The chain taking the gradient of `ops` applied to a tensor of `shape` back to `shape`
    (zeros where the input was not read)."""
    out = []
    shapes = [tuple(shape)]
    for op in ops:
        shapes.append(shape_after(shapes[-1], op))
    for op, before in zip(reversed(ops), reversed(shapes[:-1])):
        kind = op[0]
        if kind == "reshape":
            out.append(("reshape", before))
        elif kind == "permute":
            out.append(("permute", tuple(int(i) for i in np.argsort(op[1]))))
        elif kind == "pad":
            _, a, lo, _hi = op
            out.append(("slice", a, lo, lo + before[a], 1))
        elif kind == "flip":
            out.append(op)
        else:  # slice: element j of the output was element b + j * s of the input
            _, a, b, e, s = op
            n = len(range(b, e, s))
            cur = before[:a] + (n,) + before[a + 1:]
            if s > 1:  # spread: (n,) -> (n, 1) -> pad to (n, s) -> (n * s,): element j at j * s
                out.append(("reshape", cur[:a] + (n, 1) + cur[a + 1:]))
                out.append(("pad", a + 1, 0, s - 1))
                out.append(("reshape", cur[:a] + (n * s,) + cur[a + 1:]))
            # place at b; crop what the spread put past the end (a negative pad)
            out.append(("pad", a, b, before[a] - b - n * s))
    return out


@dataclass
class View:
    shape: list[int]
    strides: list[int]
    offset: int
    mask: list[tuple[int, int]]  # valid [lo, hi) per axis

    @staticmethod
    def contiguous(shape) -> View:
        shape = [int(d) for d in shape]
        strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
        return View(shape, strides, 0, [(0, d) for d in shape])


class Tracker:
    """A stack of views, bottom (into the source) first; ops rewrite the top one."""

    def __init__(self, shape):
        self.views = [View.contiguous(shape)]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.views[-1].shape)

    def apply(self, op) -> Tracker:
        v = self.views[-1]
        kind = op[0]
        if kind == "reshape":
            self.views.append(View.contiguous(op[1]))
        elif kind == "permute":
            p = op[1]
            self.views[-1] = View([v.shape[i] for i in p], [v.strides[i] for i in p], v.offset, [v.mask[i] for i in p])
        elif kind == "slice":
            _, a, b, e, s = op
            n = len(range(b, e, s))
            lo, hi = v.mask[a]
            v.offset += b * v.strides[a]
            v.strides[a] *= s
            v.shape[a] = n
            v.mask[a] = (min(max(-(-(lo - b) // s), 0), n), min(max(-(-(hi - b) // s), 0), n))
        elif kind == "pad":  # lo, hi may be negative (a crop)
            _, a, lo, hi = op
            m0, m1 = v.mask[a]
            size = v.shape[a] + lo + hi
            v.offset -= lo * v.strides[a]
            v.shape[a] = size
            v.mask[a] = (min(max(m0 + lo, 0), size), min(max(m1 + lo, 0), size))
        elif kind == "flip":  # index i of the axis reads d - 1 - i
            _, a = op
            d, (lo, hi) = v.shape[a], v.mask[a]
            v.offset += (d - 1) * v.strides[a]
            v.strides[a] = -v.strides[a]
            v.mask[a] = (d - hi, d - lo)
        else:
            raise AssertionError(f"unknown view op {op!r}")
        return self

    def simplified(self) -> list[View] | None:
        """The views top first (the order the kernel applies them), each with size-1 axes dropped and
        adjacent axes merged, identities left out; None when no element is read at all."""
        out = []
        for v in reversed(self.views):
            if any(lo >= hi for lo, hi in v.mask):
                return None
            axes = [(d, st, m) for d, st, m in zip(v.shape, v.strides, v.mask) if d != 1]
            merged: list[list] = []
            for d, st, m in axes:  # outer to inner
                full = m == (0, d)
                if merged:
                    pd, pst, pm = merged[-1]
                    if full and pm == (0, pd) and pst == st * d:
                        merged[-1] = [pd * d, st, (0, pd * d)]
                        continue
                merged.append([d, st, m])
            if v.offset == 0 and all(m == (0, d) for d, _, m in merged) and (
                    not merged or (len(merged) == 1 and merged[0][1] == 1)):
                continue  # flat -> flat unchanged
            out.append(View([a[0] for a in merged], [a[1] for a in merged], v.offset, [tuple(a[2]) for a in merged]))
        return out


def run_views(views: list[View], flat: np.ndarray) -> np.ndarray:
    """The views applied to flat indices (numpy): the source flat index, or -1 where masked out.
    The reference the kernels are tested against."""
    f = np.asarray(flat, dtype=np.int64).copy()
    ok = np.ones(f.shape, bool)
    for v in views:
        rest, f = f, np.full(f.shape, v.offset, np.int64)
        for d, st, (lo, hi) in reversed(list(zip(v.shape, v.strides, v.mask))):  # innermost first
            i = rest % d
            rest = rest // d
            ok &= (i >= lo) & (i < hi)
            f += i * st
        f = np.where(ok, f, 0)
    return np.where(ok, f, -1)


def part_views(src_storage, to_logical, ops, to_storage) -> list[View] | None:
    """The views of one part: from the output's storage dims, through the chain, to the source's."""
    t = Tracker(src_storage)
    for op in list(to_logical) + list(ops) + list(to_storage):
        t.apply(op)
    return t.simplified()


def render_views(views: list[View]) -> list[dict]:
    """The views as kernel constants (codegen/ops/gather.py: the kernel, written once in the kernel language):
    top first, each axis innermost first with its size, stride and, where it does not cover the
    whole axis, its valid range."""
    out = []
    for v in views:
        axes = [{"size": d, "stride": st, "lo": lo, "hi": hi, "masked": (lo, hi) != (0, d)}
                for d, st, (lo, hi) in zip(v.shape, v.strides, v.mask)]
        out.append({"offset": v.offset, "axes": axes[::-1]})
    return out
