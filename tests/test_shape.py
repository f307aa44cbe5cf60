"""prep/shape.py: the index maps of shape ops against numpy doing the same ops on arange data.

Table-driven and pure Python: each chain of view ops, applied with numpy to a tensor holding its own
flat indices, must give what the compiled views compute; and the inverse chain must put each output
element back where it came from (zeros elsewhere).
"""
from __future__ import annotations

import numpy as np
import pytest

from texelfit.prep.shape import Tracker, chain_shape, inverse_ops, run_views


def numpy_chain(x, ops):
    for op in ops:
        kind = op[0]
        if kind == "reshape":
            x = x.reshape(op[1])
        elif kind == "permute":
            x = x.transpose(op[1])
        elif kind == "slice":
            _, a, b, e, s = op
            sl = [slice(None)] * x.ndim
            sl[a] = slice(b, e, s)
            x = x[tuple(sl)]
        else:
            _, a, lo, hi = op
            widths = [(0, 0)] * x.ndim
            widths[a] = (max(lo, 0), max(hi, 0))
            x = np.pad(x, widths)
            sl = [slice(None)] * x.ndim
            sl[a] = slice(-min(lo, 0), x.shape[a] + min(hi, 0))
            x = x[tuple(sl)]
    return x


CHAINS = {
    "shuffle": ((12, 5, 3), [("reshape", (3, 4, 5, 3)), ("permute", (1, 0, 2, 3)), ("reshape", (12, 5, 3))]),
    "permute_flatten": ((5, 4, 3), [("permute", (1, 2, 0)), ("reshape", (60,))]),
    "flatten2_transpose": ((5, 4, 3), [("reshape", (5, 12)), ("permute", (1, 0))]),
    "slice_steps": ((7, 9, 5), [("slice", 0, 1, 7, 2), ("slice", 1, 0, 9, 3), ("slice", 2, 2, 5, 1)]),
    "unsqueeze_squeeze": ((5, 1, 3), [("reshape", (5, 3)), ("reshape", (1, 5, 3, 1))]),
    "pad_for_concat": ((3, 4, 2), [("pad", 0, 2, 5)]),
    "pad_then_shuffle": ((4, 2, 3), [("pad", 0, 4, 0), ("reshape", (2, 4, 2, 3)), ("permute", (1, 0, 2, 3)),
                                     ("reshape", (8, 2, 3))]),
    "slice_permute_slice": ((6, 5, 4), [("slice", 2, 1, 4, 2), ("permute", (2, 0, 1)), ("slice", 1, 1, 6, 3)]),
}


@pytest.mark.parametrize("case", sorted(CHAINS))
def test_views_and_their_inverse_match_numpy(case):
    shape, ops = CHAINS[case]
    size = int(np.prod(shape))
    ref = numpy_chain(np.arange(size).reshape(shape), ops)
    assert ref.shape == chain_shape(shape, ops)
    t = Tracker(shape)
    for op in ops:
        t.apply(op)
    views = t.simplified()
    got = run_views(views, np.arange(ref.size))
    if any(op[0] == "pad" for op in ops):  # padded places read nothing
        ref = np.where(numpy_chain(np.ones(shape, np.int64), ops) > 0, ref, -1)
    np.testing.assert_array_equal(got, ref.reshape(-1))

    # the backward: output element j (value j + 1) back at its source, zeros elsewhere
    out = (np.arange(ref.size) + 1) * (ref.reshape(-1) >= 0)
    back = np.zeros(size, np.int64)
    back[ref.reshape(-1)[ref.reshape(-1) >= 0]] = out[ref.reshape(-1) >= 0]
    inv = inverse_ops(shape, ops)
    assert chain_shape(ref.shape, inv) == tuple(shape)
    ti = Tracker(ref.shape)
    for op in inv:
        ti.apply(op)
    idx = run_views(ti.simplified(), np.arange(size))
    np.testing.assert_array_equal(np.where(idx >= 0, out[np.maximum(idx, 0)], 0), back)


def test_shuffle_is_one_view_and_a_view_of_the_same_layout_is_none():
    t = Tracker((12, 5, 3))
    for op in CHAINS["shuffle"][1]:
        t.apply(op)
    views = t.simplified()
    assert len(views) == 1 and views[0].shape == [4, 3, 15]  # (C/g, g, H*W)
    t = Tracker((5, 1, 3)).apply(("reshape", (5, 3))).apply(("reshape", (5, 3, 1)))
    assert t.simplified() == []
