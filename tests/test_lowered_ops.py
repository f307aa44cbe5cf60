"""Ops lowered at import into ops the IR has (prep/lower.py: LOWERINGS): Einsum, Slice with a negative step
(torch.flip; prep/shape.py's flip view), DepthToSpace (nn.PixelShuffle; DCR and CRD), SpaceToDepth and
nn.PixelUnshuffle, CumSum (inclusive, exclusive, reverse), GlobalMaxPool and ReduceMin (torch.amin).

Without a browser: the IR run in PyTorch (prep/torch_ir.py) computes each module's output and input
gradient; the errors name the op, the node and what is unsupported. In Chromium, on WebGL2 (float32), the
rgba8 tier and the CPU backend: forward and every gradient against PyTorch (helpers.check_op, the README's
tolerances), and optimizer trajectories (helpers.check_training) of an einsum attention block, whose
`bik,jk->bij` weight trains under its state_dict name, and of a PixelShuffle super-resolution net.
ONNX forms torch does not export (CumSum's exclusive and reverse, DepthToSpace DCR, SpaceToDepth, GlobalMaxPool) are the
export of the same function rewritten into them (`transform`).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper
from torch import nn

from helpers import TRAJ_LOSS, TRAJ_W, check_op, check_training
from texelfit.prep.graph import MODULE_HINTS, SUPPORTED_OPS, to_ir
from texelfit.prep.load import BuildError, export_simplified
from texelfit.prep.lower import LOWERINGS, lower
from texelfit.prep.torch_ir import IRModule, export_onnx

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}
T, F_, H = 5, 8, 2  # tokens, features, heads (of 4)


class EinsumAttention(nn.Module):
    """Self-attention written with torch.einsum: the query projection a parameter operand (`btf,gf->btg`),
    scores and weighted values of two activations (`...` in one), the heads merged by a transpose and
    the tokens summed by einsum reductions."""

    def __init__(self, classes=3):
        super().__init__()
        self.wq = nn.Parameter(torch.randn(F_, F_) / F_ ** 0.5)
        self.k = nn.Linear(F_, F_)
        self.v = nn.Linear(F_, F_)
        self.head = nn.Linear(F_, classes)

    def forward(self, x):
        d = F_ // H
        q = torch.einsum("btf,gf->btg", x, self.wq).reshape(-1, T, H, d).transpose(1, 2)
        k = self.k(x).reshape(-1, T, H, d).transpose(1, 2)
        v = self.v(x).reshape(-1, T, H, d).transpose(1, 2)
        a = (torch.einsum("bhqd,bhkd->bhqk", q, k) * d ** -0.5).softmax(-1)
        o = torch.einsum("...qk,...kd->...qd", a, v)
        o = torch.einsum("bhtd->bthd", o).reshape(-1, T, F_)
        return self.head(torch.einsum("btf->bf", o) / T)


class Flips(nn.Module):
    """torch.flip of images (W; H and W) or of tokens (T; T and F) between layers."""

    def __init__(self, images: bool, classes=4):
        super().__init__()
        self.images = images
        if images:
            self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 5, 3, stride=2)
            self.head = nn.Linear(5 * 2 * 3, classes)
        else:
            self.a, self.b = nn.Linear(F_, 6), nn.Linear(6, 7)
            self.head = nn.Linear(7, classes)

    def forward(self, x):
        if self.images:
            y = self.b(torch.flip(torch.tanh(self.a(x)), [3]))
            return self.head(torch.flip(y, [2, 3]).flatten(1))
        y = self.b(torch.flip(torch.tanh(self.a(x)), [1]))
        return self.head(torch.flip(y, [1, 2])[:, 1])


class SuperRes(nn.Module):
    """conv -> PixelShuffle(2) -> conv: 3x5x7 -> 3x10x14."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 12, 3, padding=1)
        self.b = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return self.b(F.pixel_shuffle(torch.tanh(self.a(x)), 2))


class Unshuffle(nn.Module):
    """conv -> PixelUnshuffle(2) -> 1x1 conv -> Linear (the export: Reshape, Transpose, Reshape)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(16, 5, 1)
        self.head = nn.Linear(5 * 3 * 5, 4)

    def forward(self, x):
        return self.head(self.b(F.pixel_unshuffle(self.a(x), 2)).flatten(1))


class Blocks(nn.Module):
    """The DCR depth-to-space and the space-to-depth written out; `transform` makes them the ONNX ops."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(2, 5, 3)
        self.head = nn.Linear(20 * 3 * 5, 4)

    def forward(self, x):  # (3, 6, 10)
        y = self.a(x)  # DepthToSpace DCR, blocksize 2: (8, 6, 10) -> (2, 12, 20)
        y = y.reshape(-1, 2, 2, 2, 6, 10).permute(0, 3, 4, 1, 5, 2).reshape(-1, 2, 12, 20)
        y = self.b(y)  # (5, 10, 18); SpaceToDepth, blocksize 2: -> (20, 5, 9)
        y = y.reshape(-1, 5, 5, 2, 9, 2).permute(0, 3, 5, 1, 2, 4).reshape(-1, 20, 5, 9)
        return self.head(y[:, :, :3, :5].flatten(1))


class Cumsums(nn.Module):
    """cumsum over tokens (inclusive), over the features in reverse (flip, cumsum, flip) and exclusive
    (cumsum - x); `transform` makes the last two CumSum's reverse and exclusive forms."""

    def __init__(self, classes=3):
        super().__init__()
        self.a = nn.Linear(F_, 7)
        self.head = nn.Linear(7, classes)

    def forward(self, x):
        y = torch.tanh(self.a(x))
        y = torch.cumsum(y, 1) * 0.3
        y = torch.flip(torch.cumsum(torch.flip(y, [2]), 2), [2])
        y = torch.cumsum(y, 1) - y
        return self.head(y.mean(1))


def _producer(model, name):
    return next(n for n in model.graph.node if name in n.output)


def _blocks_as_onnx_ops(model):
    """Each Reshape -> Transpose -> Reshape of Blocks as the DepthToSpace (DCR) or SpaceToDepth it computes."""
    g = model.graph
    nodes = list(g.node)
    for tr in [n for n in nodes if n.op_type == "Transpose" and len(helper.get_attribute_value(n.attribute[0])) == 6]:
        first = _producer(model, tr.input[0])
        last = next(n for n in nodes if tr.output[0] in n.input)
        perm = list(helper.get_attribute_value(tr.attribute[0]))
        new = helper.make_node("DepthToSpace", [first.input[0]], [last.output[0]], name=f"{tr.name}/d2s", blocksize=2,
                               mode="DCR") if perm == [0, 3, 4, 1, 5, 2] else \
            helper.make_node("SpaceToDepth", [first.input[0]], [last.output[0]], name=f"{tr.name}/s2d", blocksize=2)
        nodes = [new if n is tr else n for n in nodes if n is not first and n is not last]
    del g.node[:]
    g.node.extend(nodes)
    return model


def _cumsum_forms(model):
    """Cumsums' Slice -> CumSum -> Slice (flips) as CumSum(reverse=1), and its CumSum -> Sub as CumSum(exclusive=1)."""
    g = model.graph
    nodes = list(g.node)
    sums = [n for n in nodes if n.op_type == "CumSum"]
    rev, exc = sums[1], sums[2]
    before = _producer(model, rev.input[0])
    after = next(n for n in nodes if rev.output[0] in n.input)
    sub = next(n for n in nodes if exc.output[0] in n.input)
    rev.input[0] = before.input[0]
    rev.output[0] = after.output[0]
    rev.attribute.append(helper.make_attribute("reverse", 1))
    exc.output[0] = sub.output[0]
    exc.attribute.append(helper.make_attribute("exclusive", 1))
    nodes = [n for n in nodes if n is not before and n is not after and n is not sub]
    del g.node[:]
    g.node.extend(nodes)
    return model


class MaxMinPools(nn.Module):
    """nn.AdaptiveMaxPool2d(1) (GlobalMaxPool: _global_max_pool_form) and torch.amin over H and W (ReduceMin) of the
    same features."""

    def __init__(self):
        super().__init__()
        self.conv, self.pool, self.head = nn.Conv2d(3, 6, 3), nn.AdaptiveMaxPool2d(1), nn.Linear(12, 4)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        return self.head(torch.cat([self.pool(y).flatten(1), torch.amin(y, dim=(2, 3))], 1))


def _global_max_pool_form(model):
    """torch exports AdaptiveMaxPool2d(1) as a MaxPool of the whole map; other exporters (tf2onnx, a Keras
    GlobalMaxPooling2D) write GlobalMaxPool, which the same function is rewritten into."""
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    pool.op_type = "GlobalMaxPool"
    del pool.attribute[:]
    return model


# case -> (factory, per-sample shape, loss, transform, the ONNX ops the export must hold)
CASES = {
    "einsum_attention": (EinsumAttention, (T, F_), "cross_entropy", None, {"Einsum"}),
    "flip_images": (lambda: Flips(True), (3, 5, 7), "cross_entropy", None, {"Slice"}),
    "flip_tokens": (lambda: Flips(False), (T, F_), "cross_entropy", None, {"Slice"}),
    "pixel_shuffle": (SuperRes, (3, 5, 7), "mse", None, {"DepthToSpace"}),
    "pixel_unshuffle": (Unshuffle, (3, 6, 10), "cross_entropy", None, {"Transpose"}),
    "depth_space_blocks": (Blocks, (3, 6, 10), "cross_entropy", _blocks_as_onnx_ops, {"DepthToSpace", "SpaceToDepth"}),
    "cumsum": (Cumsums, (T, F_), "cross_entropy", _cumsum_forms, {"CumSum"}),
    "global_max_and_min": (MaxMinPools, (3, 5, 7), "cross_entropy", _global_max_pool_form, {"GlobalMaxPool", "ReduceMin"}),
}


def _export(case):
    factory, shape, _, transform, _ = CASES[case]
    torch.manual_seed(0)
    m = factory().eval()
    model = export_simplified(m, shape)
    return m, shape, transform(model) if transform else model


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_ir_computes_the_module_and_its_input_gradient(case):
    m, shape, model = _export(case)
    assert CASES[case][4] <= {n.op_type for n in model.graph.node}
    g = to_ir(model, shape)
    x = torch.randn((3,) + shape, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    got, ref = IRModule(g)(x), m(xr)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    (got * torch.linspace(-1, 1, got.numel()).reshape(got.shape)).sum().backward()
    (ref * torch.linspace(-1, 1, ref.numel()).reshape(ref.shape)).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-5, rtol=1e-5)
    assert set(g.params) == set(dict(m.named_parameters()))  # every parameter under its state_dict name
    back = to_ir(export_onnx(g), shape)  # import-weights --out .onnx: the IR's own export (a flip: a Slice of step -1)
    torch.testing.assert_close(IRModule(back)(x.detach()), got.detach(), atol=1e-6, rtol=1e-6)


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.lin(x))


UNSUPPORTED = {  # per-sample shape (4, 4)
    "einsum_diagonal": (lambda y: torch.einsum("bii->bi", y), r"Einsum node '/Einsum': Einsum equation 'bii->bi'"
                        r": an index repeated in one term \(a diagonal or trace\) is not supported"),
    "einsum_three_operands": (lambda y: torch.einsum("bij,bjk,bkl->bil", y, y, y),
                              r"Einsum node '/Einsum': Einsum equation 'bij,bjk,bkl->bil' of 3 operands"),
    "einsum_over_the_batch": (lambda y: torch.einsum("bij,bik->jk", y, y).reshape(1, 16),
                              r"Einsum node '/Einsum': Einsum equation 'bij,bik->jk' sums over or pairs across the "
                              r"batch axis \(index 'b'\)"),
    "cumsum_over_the_batch": (lambda y: torch.cumsum(y, 0), r"CumSum node '/CumSum': CumSum over the batch axis"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_what_does_not_lower_fails_naming_the_op_the_node_and_why(case):
    fn, pattern = UNSUPPORTED[case]
    with pytest.raises(BuildError, match=pattern):
        to_ir(export_simplified(_Fn(fn).eval(), (4, 4)), (4, 4))


def test_einsum_with_a_parameter_operand_it_cannot_keep_whole_fails():
    class P(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4, 3))

        def forward(self, x):
            return torch.einsum("bij,ijk->bk", x, self.w)

    with pytest.raises(BuildError, match=r"Einsum node '/Einsum': Einsum equation 'bij,ijk->bk' with a parameter "
                                         r"operand: only a 2-D one with one summed index"):
        to_ir(export_simplified(P().eval(), (4, 4)), (4, 4))

    class Q(P):  # a product of two parameters
        def forward(self, x):
            return x.flatten(1)[:, :3] @ torch.einsum("ijk,ijl->kl", self.w, self.w)

    with pytest.raises(BuildError, match=r"Einsum node '/Einsum': Einsum equation 'ijk,ijl->kl' of parameters or "
                                         r"constants alone"):
        to_ir(export_simplified(Q().eval(), (4, 4)), (4, 4))


@pytest.mark.parametrize("eq,shapes", [
    ("bij,bjk->bik", [(3, 4), (4, 5)]), ("bij->bji", [(3, 4)]), ("bij->bi", [(3, 4)]), ("bi,bj->bij", [(3,), (4,)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]), ("bhij,bhjk->bki", [(2, 3, 4), (2, 4, 5)]),
    ("bijk,bkjl->bil", [(2, 3, 4), (4, 3, 2)]), ("bij,bjk->b", [(3, 4), (4, 5)]), ("bi,bi->b", [(3,), (3,)]),
])
def test_einsum_equations_lower_to_what_torch_computes(eq, shapes):
    """Hand-made ONNX Einsum nodes of two activation inputs (implicit output too), the IR run in PyTorch."""
    inputs = [helper.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, ["N", *s]) for i, s in enumerate(shapes)]
    names = [i.name for i in inputs]
    node = helper.make_node("Einsum", names, ["y"], name="e", equation=eq)
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([node], "g", inputs, [out]),
                              opset_imports=[helper.make_opsetid("", 17)])
    g = to_ir(model, shapes)
    xs = [torch.randn((2,) + s) for s in shapes]
    got = IRModule(g)(*xs) if len(xs) > 1 else IRModule(g)(xs[0])
    ref = torch.einsum(eq, *xs)
    assert got.shape == ref.shape or (ref.dim() == 1 and got.shape == (2, 1))  # (a sample of one value: (1,))
    torch.testing.assert_close(got.reshape(ref.shape), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("eq", ["tbf,tbg->bfg", "tbf->btf", "tbf,tbf->bt"])
def test_einsum_of_operands_whose_batch_axis_the_export_moved(eq):
    """[T, N, F] operands (x.transpose(0, 1), as nn.MultiheadAttention's export has them): the batch index is
    the one of size N, moved first for the product (prep/batch_axis.py follows the transposes)."""
    class Moved(nn.Module):
        def forward(self, x):
            t = x.transpose(0, 1)
            return torch.einsum(eq, *((t, 2 * t) if "," in eq else (t,))) + 1

    m = Moved().eval()
    g = to_ir(export_simplified(m, (3, 4)), (3, 4))
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(IRModule(g)(x), m(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("axis,exclusive,reverse,shape", [
    (1, 0, 0, (4, 6)), (2, 1, 0, (4, 6)), (-1, 0, 1, (4, 6)), (1, 1, 1, (5, 3)), (2, 1, 1, (3, 1)), (2, 0, 0, (3, 1)),
    (3, 1, 0, (2, 3, 9)),
])
def test_cumsum_forms_lower_to_what_numpy_computes(axis, exclusive, reverse, shape):
    """Hand-made ONNX CumSum nodes, every flag, an axis of 1 and of 9 (not a power of 2): the IR run in PyTorch."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", *shape])
    ax = onnx.numpy_helper.from_array(np.array(axis, dtype=np.int32), "axis")
    node = helper.make_node("CumSum", ["x", "axis"], ["s"], name="c", exclusive=exclusive, reverse=reverse)
    twice = helper.make_node("Add", ["s", "s"], ["y"], name="twice")  # (an output that is the input builds nothing)
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([node, twice], "g", [x], [out], [ax]),
                              opset_imports=[helper.make_opsetid("", 17)])
    xs = np.random.default_rng(0).standard_normal((2,) + shape).astype(np.float32)
    v = np.flip(xs, axis) if reverse else xs
    ref = np.cumsum(v, axis) - (v if exclusive else 0)
    ref = 2 * (np.flip(ref, axis) if reverse else ref)
    got = IRModule(to_ir(model, shape))(torch.from_numpy(xs)).detach().numpy()
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_unsupported_ops_are_listed_before_any_lowering_runs():
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.GRU(4, 4, batch_first=True)
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return torch.einsum("bij,bij->bij", self.rnn(x)[0], x).sum(1)

    import io

    import onnx

    buf = io.BytesIO()  # (an ONNX file's GRU: from the module, export_simplified unrolls it)
    torch.onnx.export(Both().eval(), (torch.randn(2, 4, 4),), buf, dynamo=False, input_names=["input"],
                      dynamic_axes={"input": {0: "batch"}})
    with pytest.raises(BuildError, match=r"unsupported ONNX op GRU \(from nn.GRU\)"):
        to_ir(onnx.load_from_string(buf.getvalue()), (4, 4))


def test_lowered_ops_are_supported_ops_and_lowering_is_deterministic():
    assert {"Einsum", "DepthToSpace", "SpaceToDepth", "CumSum"} <= set(LOWERINGS) <= set(SUPPORTED_OPS)
    assert not set(LOWERINGS) & set(MODULE_HINTS)
    _, shape, model = _export("einsum_attention")
    before = model.SerializeToString()
    once, twice = lower(model, [shape]), lower(model, [shape])
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert once.SerializeToString() == twice.SerializeToString()
    assert not {n.op_type for n in once.graph.node} & set(LOWERINGS)


# ---- in Chromium: WebGL2 (float32), the rgba8 tier, the CPU backend ---------------------------------

@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_gradients(web, site, case, backend):
    factory, shape, loss, transform, _ = CASES[case]
    check_op(web, site, f"{case}_{backend}", factory, shape, loss, batch=5, seed=3, options=BACKENDS[backend],
             transform=transform)


@pytest.mark.parametrize("factory,shape,loss,backend,opt", [
    (SuperRes, (3, 5, 7), "mse", "webgl", "sgd"),
    (SuperRes, (3, 5, 7), "mse", "webgl", "adam"),
    (SuperRes, (3, 5, 7), "mse", "cpu", "adam"),
    (EinsumAttention, (T, F_), "cross_entropy", "webgl", "adam"),
    (EinsumAttention, (T, F_), "cross_entropy", "rgba8", "sgd_momentum_wd"),
    (MaxMinPools, (3, 5, 7), "cross_entropy", "webgl", "adam"),  # (ReduceMin; the pool as torch exports it)
])
def test_training_trajectories(web, site, factory, shape, loss, backend, opt):
    """Every named parameter (EinsumAttention's `wq`, read by `btf,gf->btg`, included) after 6 steps."""
    check_training(web, site, factory, shape, opt, loss, samples=12, batch_size=4, epochs=2, tol_w=TRAJ_W,
                   tol_loss=TRAJ_LOSS, options=BACKENDS[backend])


class _Gelus(nn.Module):
    def __init__(self, approximate):
        super().__init__()
        self.conv, self.fc, self.approximate = nn.Conv2d(3, 4, 3), nn.Linear(4, 5), approximate

    def forward(self, x):
        return self.fc(F.gelu(self.conv(x), approximate=self.approximate).mean((2, 3)))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_an_onnx_gelu_lowers_to_what_torch_computes(approximate, tmp_path):
    """A user's file with ONNX's own Gelu (opset 20, torch's exporters' default; opset 17 writes it out): the
    build lowers it to what opset 17 exports, and the IR computes the module and its input gradient."""
    from texelfit.prep.load import load_onnx

    torch.manual_seed(4)
    m = _Gelus(approximate).eval()
    path = str(tmp_path / "gelu.onnx")
    torch.onnx.export(m, torch.randn(1, 3, 6, 6), path, dynamo=False, opset_version=20, input_names=["x"],
                      dynamic_axes={"x": {0: "n"}})
    assert "Gelu" in {n.op_type for n in onnx.load(path).graph.node}
    g = to_ir(load_onnx(path), (3, 6, 6))
    x = torch.randn(3, 3, 6, 6, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    got, ref = IRModule(g)(x), m(xr)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-5, rtol=1e-5)
    assert set(g.params) == set(dict(m.named_parameters()))
