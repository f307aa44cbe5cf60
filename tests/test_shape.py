"""Shape ops (prep/shape.py, the gather layer), without a browser: the index maps against numpy doing the
same ops on arange data (each chain applied to a tensor holding its own flat indices must give what the
compiled views compute, and the inverse chain must put each output element back where it came from,
zeros elsewhere); the ONNX import's errors; composition into one pass and views sharing a texture;
pruning through shape ops (PyTorch against PyTorch: atol 1e-5 + rtol 1e-5 * |ref|). The browser
parity of the shape-op models is in test_cnn_ops.py (models.CNN_CASES) and its per-backend reruns.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close
from texelfit.build import compile_onnx
from texelfit.codegen.schedule import build_schedule
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.graph import to_ir
from texelfit.codegen.webgl2.layout import gather_is_view, plan_layout
from texelfit.prep.load import BuildError, export_simplified
from texelfit.prep.prune import plan_prune, prune
from texelfit.prep.shape import Tracker, chain_shape, inverse_ops, run_views
from texelfit.prep.torch_ir import IRModule


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
        elif kind == "flip":
            x = np.flip(x, op[1])
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
    "flip_two_axes": ((3, 5, 4), [("flip", 1), ("flip", 2)]),
    "flip_slice_step": ((7, 9, 5), [("flip", 1), ("slice", 1, 1, 9, 3), ("flip", 0), ("permute", (1, 0, 2))]),
    "pad_flip_reshape": ((4, 2, 3), [("pad", 0, 1, 2), ("flip", 0), ("reshape", (7, 6)), ("flip", 1)]),
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


# ---- ONNX import: what stays unsupported fails naming the op and the node -------------------------

class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.conv(x))


UNSUPPORTED = {
    "transpose_batch": (lambda y: y.transpose(0, 1), r"batch axis is not the first .*: Transpose node '.*' moved the batch axis"),
    "reshape_batch": (lambda y: y.reshape(-1, 5, 6), r"batch axis is not the first .*: Reshape node '.*' moved the batch axis"),
    "slice_batch": (lambda y: y[1:], r"Slice node '.*': Slice on the batch axis"),
    "concat_batch": (lambda y: torch.cat([y, y], 0), r"Concat node '.*': Concat on the batch axis"),
    "unsqueeze_batch": (lambda y: y.unsqueeze(0).sum(1), r"batch axis is not the first .*: Unsqueeze node '.*' moved the batch axis"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_shape_ops_fail_naming_op_and_node(case):
    fn, message = UNSUPPORTED[case]
    with pytest.raises(BuildError, match=message):
        to_ir(export_simplified(_Fn(fn).eval(), (3, 5, 6)), (3, 5, 6))


# ---- the IR: consecutive shape ops compose, views cost nothing ------------------------------------

def test_channel_shuffle_is_one_pass_and_squeezes_are_none():
    from models import CNN_CASES

    factory, shape, _ = CNN_CASES["shufflenet_v2_units"]
    torch.manual_seed(0)
    g = to_ir(export_simplified(factory().eval(), shape), shape)
    gathers = [l for l in g.layers if l.op == "gather"]
    # per unit one gather: the concat and the shuffle (Reshape -> Transpose -> Reshape), with the chunk's
    # first half in the stride-1 unit; and the chunk's second half, a slice into the branch
    shuffles = [l for l in gathers if all([op[0] for op in p["ops"]][-3:] == ["reshape", "permute", "reshape"]
                                          for p in l.attrs["parts"])]
    assert len(shuffles) == 2 and len(gathers) == 3
    assert [len(l.attrs["parts"]) for l in shuffles] == [2, 2]
    assert shuffles[1].attrs["parts"][0]["ops"][0] == ("slice", 0, 0, 5, 1)
    assert all(len(g.shapes[t]) <= 3 for t in g.shapes), "a rank-5 intermediate was laid out"
    plan = plan_layout(g, 4)
    assert all(not gather_is_view(l, g) for l in gathers)
    sched = build_schedule(g, plan)
    assert sum(p.kernel.name.startswith("gather ") for p in sched.forward) == 3

    factory, shape, _ = CNN_CASES["squeeze_unsqueeze"]
    g = to_ir(export_simplified(factory().eval(), shape), shape)
    views = [l for l in g.layers if gather_is_view(l, g)]
    assert len(views) >= 1  # the squeezes of (5, 1, 1)
    # the (1, 6) rows concatenated into (2, 6) tokens: one gather, the unsqueeze and the slice composed into it
    assert [l.op for l in g.layers].count("gather") == 2 and "concat" not in [l.op for l in g.layers]
    plan = plan_layout(g, 4)
    for l in views:
        assert plan.tensor(l.outputs[0]) == plan.tensor(l.inputs[0])
        assert "act:" + l.outputs[0] not in plan.textures


# ---- pruning through shape ops --------------------------------------------------------------------

class SpatialSlice(torch.nn.Module):
    """A slice of H and W (and a flip of W) keeps the channels: the pruner passes the selection through it."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 12, 3)
        self.b = torch.nn.Conv2d(12, 8, 3)
        self.fc = torch.nn.Linear(8 * 3 * 3, 5)

    def forward(self, x):
        y = torch.flip(torch.relu(self.a(x))[:, :, 1:, ::2], [3])  # (12, 10, 5)
        y = torch.cat([y, y[:, :, :2]], 2)  # (12, 12, 5): a concat on H
        return self.fc(torch.flatten(F.max_pool2d(torch.relu(self.b(y)), (3, 1))[:, :, :3], 1))


@pytest.mark.parametrize("case,shape", [("shufflenet", (3, 13, 11)), ("spatial_slice", (3, 13, 12))])
def test_pruned_graph_with_shape_ops_computes_the_zeroed_original(case, shape):
    from models import ShuffleNetTiny
    from test_prune import zero_pruned_channels

    factory = {"shufflenet": ShuffleNetTiny, "spatial_slice": SpatialSlice}[case]
    torch.manual_seed(0)
    g = fold_batchnorm(to_ir(export_simplified(factory().eval(), shape), shape))
    plan = plan_prune(g, 0.5, round_to=1)
    pruned = prune(g, 0.5, round_to=1)
    x = torch.randn((6,) + shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = IRModule(pruned)(x).numpy()
        ref = IRModule(zero_pruned_channels(g, plan))(x).numpy()
    assert_close(f"pruned {case}", got, ref, atol=1e-5, rtol=1e-5)
    groups = {tuple(gr.producers): gr for gr in plan.groups if gr.producers}
    if case == "spatial_slice":  # the selection of a's channels passes the slice and the H concat
        assert len(groups[("/a/Conv",)].kept) == 6 and pruned.parameter_count() < g.parameter_count()
    else:  # channels the shuffle, the chunk or the concats move stay whole; the branches' inner convs prune
        assert pruned.parameter_count() < g.parameter_count()
        for producers, gr in groups.items():
            if gr.reason and "moves channels" in gr.reason:
                assert len(gr.kept) == gr.channels
    compile_onnx(export_simplified(factory().eval(), shape), name="m", input_shape=shape, prune=0.5, max_batch=4)


# ---- the ONNX forms of each shape op (prep/onnx_shape.py), per-sample shape (4, 5, 6) ---------------

FORMS = {
    # op, attributes, constant inputs after the data -> chain
    "transpose_perm": ("Transpose", {"perm": [0, 2, 3, 1]}, [], [("permute", (1, 2, 0))]),
    "transpose_identity": ("Transpose", {"perm": [0, 1, 2, 3]}, [], []),
    "squeeze_attr": ("Squeeze", {"axes": [2]}, [], "bad"),  # axis 2 has size 5: not squeezable
    "unsqueeze_input": ("Unsqueeze", {}, [np.array([-1, 2])], [("reshape", (4, 1, 5, 6, 1))]),
    "slice_negative_clamped": ("Slice", {}, [np.array([-3, 1]), np.array([2 ** 62, -1]), np.array([1, 3]), None],
                               [("slice", 0, 1, 4, 1), ("slice", 2, 1, 5, 1)]),
    "slice_steps": ("Slice", {}, [np.array([0, 1]), np.array([5, 6]), np.array([-2, -1]), np.array([2, 3])],
                    [("slice", 1, 0, 5, 2), ("slice", 2, 1, 6, 3)]),
    "slice_whole_batch": ("Slice", {}, [np.array([0]), np.array([2 ** 63 - 1]), np.array([0]), None], []),
    # a negative step: the axis flipped, then sliced forwards (start clamped to d - 1, end to -1)
    "slice_negative_step": ("Slice", {}, [np.array([4]), np.array([0]), np.array([1]), np.array([-1])],
                            [("flip", 0), ("slice", 0, 0, 3, 1)]),
    "flip": ("Slice", {}, [np.array([-1, -1]), np.array([-2 ** 63, -2 ** 63]), np.array([2, 3]), np.array([-1, -1])],
             [("flip", 1), ("flip", 2)]),
    "slice_step_minus_2": ("Slice", {}, [np.array([-2]), np.array([0]), np.array([3]), np.array([-2])],
                           [("flip", 2), ("slice", 2, 1, 5, 2)]),
    "slice_step_zero": ("Slice", {}, [np.array([4]), np.array([0]), np.array([1]), np.array([0])], "bad"),
}


@pytest.mark.parametrize("case", sorted(FORMS))
def test_onnx_forms_of_view_ops(case):
    from texelfit.prep.onnx_shape import view_ops

    op, attrs, vals, want = FORMS[case]
    if want == "bad":
        with pytest.raises(BuildError, match=f"{op} node 'n'"):
            view_ops(f"{op} node 'n'", op, attrs, vals, (4, 5, 6))
        return
    assert view_ops(f"{op} node 'n'", op, attrs, vals, (4, 5, 6)) == want


@pytest.mark.parametrize("attrs,sizes,outputs,want", [
    ({"axis": 1, "split": [1, 3]}, None, 2, [[("slice", 0, 0, 1, 1)], [("slice", 0, 1, 4, 1)]]),  # opset < 13
    ({"axis": -1}, np.array([2, 4]), 2, [[("slice", 2, 0, 2, 1)], [("slice", 2, 2, 6, 1)]]),  # opset 13: input
    ({"axis": 2, "num_outputs": 2}, None, 2, [[("slice", 1, 0, 3, 1)], [("slice", 1, 3, 5, 1)]]),  # opset 18
    ({"axis": 3}, None, 3, [[("slice", 2, 0, 2, 1)], [("slice", 2, 2, 4, 1)], [("slice", 2, 4, 6, 1)]]),
])
def test_onnx_forms_of_split(attrs, sizes, outputs, want):
    from texelfit.prep.onnx_shape import split_ops

    assert split_ops("Split node 'n'", attrs, sizes, (4, 5, 6), outputs) == want


@pytest.mark.parametrize("target,allowzero,want", [
    (["N", 0, -1], False, (4, 30)), ([-1, 2, 2, 5, 6], False, (2, 2, 5, 6)), ([0, 120], False, (120,)),
    (["N", 4, 0, 6], False, (4, 5, 6)), (["N", 0, 30], True, "bad"), ([-1, 30], False, "bad"),
    (["N", "N", 30], False, "bad"),
])
def test_reshape_targets(target, allowzero, want):
    from texelfit.prep.onnx_shape import reshape_target

    if want == "bad":
        with pytest.raises(BuildError, match="Reshape node 'n'"):
            reshape_target("Reshape node 'n'", target, (4, 5, 6), allowzero, None)
        return
    assert reshape_target("Reshape node 'n'", target, (4, 5, 6), allowzero, None) == want


def test_pad_with_a_value_other_than_zero_is_refused_naming_the_node():
    """Zero padding is a view, edge and reflect a resample (test_elementwise.py: resize_and_pad); a
    constant other than zero is refused, naming the node and what is supported."""
    class Value(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.pad(x, (1, 1, 1, 1), value=0.5) * 2.0

    with pytest.raises(BuildError, match=r"Pad node .*: Pad mode 'constant' with value 0.5.*only zero padding"):
        compile_onnx(export_simplified(Value(), (3, 5, 5)), name="m", input_shape=(3, 5, 5))
