"""Sequence models (issue 19): nn.TransformerEncoderLayer (batch_first, as a new user writes it) on float
token inputs [N, T, F], mean-pooled over the tokens into a Linear head; forward, the gradient of every
parameter, and optimizer trajectories against PyTorch, on WebGL2 (float32), in the rgba8 tier and on the
CPU backend, at the README's tolerances (helpers.py: FWD, GRAD, TRAJ_LOSS, TRAJ_W).

What it exercises: the batch axis the export moves and merges (prep/batch_axis.py), tokens (R, F) laid out
with the features packed, matmul with a weight (the in-projection, out-projection and feed-forward
Linears, their state_dict names kept) and of two activations (Q K^T, A V), softmax over the last axis,
LayerNorm, and the head split [N, T, F] -> [N, h, T, d] and back as gathers.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import TRAJ_LOSS, TRAJ_W, check_op, check_training
from texelfit.build import compile_onnx
from texelfit.prep.graph import to_ir
from texelfit.prep.load import export_simplified
from texelfit.prep.torch_ir import IRModule

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}
SHAPE = (7, 16)  # T = 7 tokens (odd: a partial block of rows), F = 16 features


class EncoderClassifier(nn.Module):
    """One encoder layer, the mean over the tokens, a Linear head. Every parameter is perturbed so that
    none is the zeros or ones of its default init (onnxsim would fold away an add of zeros)."""

    def __init__(self, d_model=16, nhead=2, ff=32, classes=5):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(d_model=d_model, nhead=nhead, dim_feedforward=ff, dropout=0.0,
                                              batch_first=True)
        self.head = nn.Linear(d_model, classes)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x):
        return self.head(self.enc(x).mean(1))


class CausalEncoderClassifier(EncoderClassifier):
    """The same with a causal attention mask (a constant [T, T] of 0 and -inf added to the scores)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SHAPE[0]))

    def forward(self, x):
        return self.head(self.enc(x, src_mask=self.mask).mean(1))


def encoder():
    return EncoderClassifier()


def causal_encoder():
    return CausalEncoderClassifier()


def encoder_4_heads():
    return EncoderClassifier(d_model=32, nhead=4, ff=64, classes=3)


def test_the_ir_computes_what_the_module_does():
    """The import alone (prep.graph): the IR run in PyTorch (prep/torch_ir.py) is the module."""
    torch.manual_seed(0)
    for factory in (encoder, causal_encoder, encoder_4_heads):
        m = factory().eval()
        shape = (6, 32) if factory is encoder_4_heads else SHAPE
        g = to_ir(export_simplified(m, shape), shape)
        x = torch.randn(3, *shape)
        assert torch.allclose(IRModule(g)(x), m(x), atol=1e-5)
        ops = {layer.op for layer in g.layers}
        assert {"matmul", "layernorm", "softmax", "gather"} <= ops, ops
        # the Linears keep their state_dict names
        assert {"enc.self_attn.in_proj_weight", "enc.linear1.weight", "enc.norm1.weight"} <= set(g.params)


def test_a_transformer_layer_builds_with_its_kernels():
    torch.manual_seed(0)
    js = compile_onnx(export_simplified(encoder(), SHAPE), name="m", input_shape=SHAPE, max_batch=8).files["m.js"]
    for k in ("matmul_forward", "matmul_grad_b", "layernorm_grad_input", "softmax_grad"):
        assert f"// texelfit kernel: {k}" in js, k


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_transformer_layer_forward_and_gradients(web, site, backend):
    check_op(web, site, "transformer_layer", encoder, SHAPE, "cross_entropy", batch=5, seed=1,
             options=BACKENDS[backend])


@pytest.mark.parametrize("backend", ["cpu", "webgl"])
def test_transformer_layer_with_a_causal_mask_forward_and_gradients(web, site, backend):
    check_op(web, site, "transformer_layer_causal", causal_encoder, SHAPE, "cross_entropy", batch=4, seed=5,
             options=BACKENDS[backend])


class ManualLayerNorm(nn.Module):
    """LayerNorm written out, as older exporters emit it (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
    Add): reductions over the features of tokens with keepdims, and (R, 1) and (1, F) operands broadcast."""

    def __init__(self, d=16, classes=5):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.b = nn.Parameter(0.1 * torch.randn(d))
        self.lin = nn.Linear(d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.lin(x)
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + 1e-5) * self.w + self.b
        return self.head(y.mean(1))


def manual_layernorm():
    return ManualLayerNorm()


@pytest.mark.parametrize("backend", ["cpu", "webgl"])
def test_decomposed_layernorm_on_tokens_forward_and_gradients(web, site, backend):
    check_op(web, site, "manual_layernorm", manual_layernorm, SHAPE, "cross_entropy", batch=4, seed=9,
             options=BACKENDS[backend])


def test_transformer_layer_on_folded_textures(web, site):
    """A texture limit of 128 texels folds the token textures (64 samples * 7 tokens = 448 rows): the same results."""
    check_op(web, site, "transformer_layer_folded", encoder, SHAPE, "cross_entropy", batch=5, seed=1,
             options={"maxTextureSize": 128})


def test_token_linears_of_16_tokens_are_row_blocked():
    """16 tokens of 18 and 32 features: both Linears' forward and input gradient, and the weight gradient of the one
    with 32 inputs, have the twin computing 8 rows a fragment (and its interleave) beside the one-row pass, which the
    browser tests below run and compare."""
    torch.manual_seed(0)
    js = compile_onnx(export_simplified(feed_forward_rows(), ROWS_SHAPE), name="m", input_shape=ROWS_SHAPE,
                      max_batch=8).files["m.js"]
    # (each Linear's bias is its matmul's, "+b": prep/onnx_import/elementwise.py, add_bias)
    for what in ("matmul_forward 1x16x18@18x32 +b", "matmul_forward 1x16x32@32x18 +b",
                 "matmul_grad_a 1x16x18@18x32 +b", "matmul_grad_a 1x16x32@32x18 +b",
                 "matmul_grad_weight 1x16x32@32x18 +b"):
        assert f"// texelfit kernel: {what} (" in js and f"// texelfit kernel: {what} rows (" in js, what


@pytest.mark.parametrize("backend", sorted(BACKENDS) + ["webgl_4_targets", "webgpu"])
def test_row_blocked_token_matmuls_forward_and_gradients(request, site, backend):
    """The row-blocked passes (8 tokens a fragment) on WebGL2, rgba8 and the CPU; with 4 draw buffers the one-row
    passes run instead; WebGPU runs the one-row passes printed from the twins, 8 rows in place (Kernel.wgsl_kl)."""
    options = {"maxDrawBuffers": 4} if backend == "webgl_4_targets" else {"backend": "webgpu"} \
        if backend == "webgpu" else BACKENDS[backend]
    page = request.getfixturevalue("webgpu_web" if backend == "webgpu" else "web")
    check_op(page, site, "ff_rows", feed_forward_rows, ROWS_SHAPE, "cross_entropy", batch=3, seed=6, options=options)


def test_webgpu_runs_the_row_twins_in_place():
    """A --webgpu build: the one-row kernels of the forwards, input gradients and the weight gradient are printed as
    WGSL from their twins, writing 8 rows an invocation in place into the one output, and 4 texels of each where
    they divide its width (ops/matmul.py: wgsl_cols): the first Linear's forward (32 outputs, 8 texels) and the
    second's input gradient; the others' widths are 5 texels (18 features)."""
    torch.manual_seed(0)
    js = compile_onnx(export_simplified(feed_forward_rows(), ROWS_SHAPE), name="m", input_shape=ROWS_SHAPE,
                      max_batch=8, webgpu=True).files["m.js"]
    # 2 forwards, 2 input gradients, a weight gradient (the optimizer's gradient: once for each optimizer it runs in)
    assert js.count('"scatter":8') >= 5
    assert js.count('"scatter":8') == js.count('],1,4],"scatter":8') + js.count('],1],"scatter":8') + \
        js.count('],1,2],"scatter":8')
    assert js.count('],1,4],"scatter":8') == 2
    # (and the classifier, a dense layer: its forward 2 texels of its 8 samples an invocation, dense.FORWARD_COLS)
    assert js.count('],1,2],"scatter":8') == 1
    # (the WGSL, each module once: the 4 texels' two, and the three of one texel)
    assert js.count("out0[(8 * _row + 7) * _d.width + 4 * _col + 3] = ") == 2
    assert js.count("out0[(8 * _row + 7) * _d.width + _col] = ") >= 3


def test_transformer_layer_4_heads_forward_and_gradients(web, site):
    check_op(web, site, "transformer_layer_4h", encoder_4_heads, (6, 32), "mse", batch=3, seed=2)


class FeedForwardBlock(nn.Module):
    """A pre-norm feed-forward block on tokens (LayerNorm, Linear, GELU-free ReLU, Linear, residual), mean-pooled
    into a Linear head: the token ops without attention, so without a parameter of zero gradient."""

    def __init__(self, d=16, ff=24, classes=5):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Linear(ff, d))
        self.head = nn.Linear(d, classes)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x):
        return self.head((x + self.ff(self.norm(x))).mean(1))


def feed_forward():
    return FeedForwardBlock()


ROWS_SHAPE = (16, 18)  # 16 tokens: its Linears compute 8 rows a fragment (webgl2/blocking.py: row_blocked)


def feed_forward_rows():
    """18 features (a partial texel) and 32 (the second Linear's weight gradient row-blocked too)."""
    return FeedForwardBlock(d=18, ff=32)


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt block: depthwise 7x7 conv, a permute to channels-last, LayerNorm, Linear 4x, GELU (erf), Linear,
    a layer scale, a permute back, the residual; then a global mean and a head."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1, self.act, self.pw2 = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(0.5 * torch.ones(c))
        self.head = nn.Linear(c, classes)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pw2(self.act(self.pw1(self.norm(y))))
        return self.head((x + y.permute(0, 3, 1, 2)).mean((2, 3)))


def convnext_block():
    return ConvNeXtBlock()


IMG = (8, 6, 5)


class TinyViT(nn.Module):
    """A tiny ViT: a 4x4 patch embedding conv on a 3x8x12 image (6 tokens), a trainable position embedding added
    by broadcast, 2 pre-norm encoder layers, the mean over the tokens, a head. (With a class token read by the
    head: tests/test_vit.py.)"""

    def __init__(self, d=16):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.pos = nn.Parameter(0.1 * torch.randn(1, 6, d))
        layer = nn.TransformerEncoderLayer(d, 2, 32, 0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.enc(t + self.pos).mean(1))


def tiny_vit():
    return TinyViT()


VIT_IMG = (3, 8, 12)


@pytest.mark.parametrize("backend", ["cpu", "webgl"])
def test_tiny_vit_forward_and_gradients(web, site, backend):
    check_op(web, site, "tiny_vit", tiny_vit, VIT_IMG, "cross_entropy", batch=3, seed=8, options=BACKENDS[backend])


def test_convnext_block_imports_as_token_ops_between_two_gathers():
    torch.manual_seed(0)
    m = convnext_block().eval()
    g = to_ir(export_simplified(m, IMG), IMG)
    x = torch.randn(3, *IMG)
    assert torch.allclose(IRModule(g)(x), m(x), atol=1e-5)
    assert [layer.op for layer in g.layers].count("gather") == 2  # to channels-last and back
    assert "gamma" in g.params  # the layer scale trains


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_convnext_block_forward_and_gradients(web, site, backend):
    check_op(web, site, "convnext_block", convnext_block, IMG, "cross_entropy", batch=4, seed=6,
             options=BACKENDS[backend])


@pytest.mark.parametrize("backend,opt", [("webgl", "adam"), ("cpu", "sgd_momentum_wd")])
def test_convnext_block_trains_like_pytorch(web, site, backend, opt):
    check_training(web, site, _named(convnext_block, f"convnext_{backend}"), IMG, opt, "cross_entropy", samples=9,
                   batch_size=4, epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=7, options=BACKENDS[backend],
                   max_batch=8)


@pytest.mark.parametrize("backend,opt", [("webgl", "sgd_momentum_wd"), ("cpu", "sgd_nesterov"),
                                         ("rgba8", "sgd_dampening")])
def test_transformer_layer_trains_like_pytorch(web, site, backend, opt):
    """SGD: the key projection's bias has a gradient of exactly zero (it adds one constant to each row of
    scores, which the softmax cancels), so both sides compute rounding noise there, and Adam would scale
    that noise up to steps of lr (torch's own float32 noise is above Adam's eps): Adam runs on the
    feed-forward block below."""
    check_training(web, site, _named(encoder, f"encoder_{backend}"), SHAPE, opt, "cross_entropy", samples=11,
                   batch_size=4, epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=3, options=BACKENDS[backend],
                   max_batch=8)


@pytest.mark.parametrize("backend,opt", [("webgl", "adam"), ("cpu", "adamw"), ("rgba8", "adam")])
def test_token_feed_forward_block_trains_like_pytorch_with_adam(web, site, backend, opt):
    check_training(web, site, _named(feed_forward, f"ff_{backend}"), SHAPE, opt, "cross_entropy", samples=11,
                   batch_size=4, epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=4, options=BACKENDS[backend],
                   max_batch=8)


@pytest.mark.parametrize("backend,opt", [("webgl", "adam"), ("cpu", "sgd_momentum_wd"), ("webgpu", "adam")])
def test_row_blocked_token_block_trains_like_pytorch(request, site, backend, opt):
    """The optimizers reading the row-blocked weight gradient (its parts interleaved as they read it); on WebGPU, the
    weight gradient printed from the twin, in place."""
    options = {"backend": "webgpu"} if backend == "webgpu" else BACKENDS[backend]
    page = request.getfixturevalue("webgpu_web" if backend == "webgpu" else "web")
    check_training(page, site, _named(feed_forward_rows, f"ff_rows_{backend}"), ROWS_SHAPE, opt, "cross_entropy",
                   samples=11, batch_size=4, epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=8,
                   options=options, max_batch=8)


def _named(factory, name):
    def make():
        return factory()
    make.__name__ = name
    return make


# ---- pure: the token layout and the batch-axis views ---------------------------------------------

def test_tokens_pack_the_features_a_row_a_token():
    import numpy as np

    from texelfit.prep.packing import activation_packing, chw, pack, unpack

    from texelfit.codegen.webgl2.layout import storage_ops
    from texelfit.prep.shape import chain_shape

    x = np.arange(3 * 5 * 6, dtype=np.float32).reshape(3, 5, 6)  # [N, T, F]
    p = activation_packing((5, 6), 3)
    t = pack(x, p)
    assert t.shape == (15, 2, 4) and chw((5, 6)) == (6, 5, 1)
    assert list(t[7, 0]) == list(x[1, 2, :4]) and list(t[7, 1]) == list(x[1, 2, 4:]) + [0.0, 0.0]
    assert np.array_equal(unpack(t, p), x.reshape(-1))
    assert chain_shape(chw((5, 6)), storage_ops((5, 6))) == (5, 6)


@pytest.mark.parametrize("target,groups,fine", [
    ([7, -1, 8], [[0], ["N", 1], [2]], (7, 2, 8)),     # [T, N, 16] -> [T, N * 2, 8]: the batch merged with the heads
    ([-1, 16], [[0, "N"], [1]], (7, 16)),              # [T, N, 16] -> [T * N, 16]
    ([0, 0, 2, 8], [[0], ["N"], [1], [2]], (7, 2, 8)),  # 0 copies, the 16 split
])
def test_a_reshape_regroups_the_factors_of_the_batch_and_the_axes(target, groups, fine):
    from texelfit.prep import batch_axis as ba

    v = ba.transpose(ba.trivial("x", (7, 16)), [1, 0, 2])  # [N, T, F] -> [T, N, F]
    assert v.groups == [[0], ["N"], [1]]
    r = ba.reshape("here", v, target, False)
    assert r.groups == groups and r.fine == fine


def test_a_reshape_that_splits_the_batch_fails():
    from texelfit.prep import batch_axis as ba
    from texelfit.prep.load import BuildError

    v = ba.transpose(ba.trivial("x", (7, 16)), [1, 0, 2])
    with pytest.raises(BuildError, match="splits the batch"):
        ba.reshape("here", v, [7, 2, -1, 8], False)  # the 2 would come before the batch


def test_a_frozen_encoder_trains_its_head_alone(web, site):
    """--trainable head.*: the encoder is a frozen trunk (no backward through it), the head's gradients are
    PyTorch's and predict is unchanged."""
    import torch.nn.functional as F

    from helpers import FWD, GRAD, assert_close, build_module, run_model

    torch.manual_seed(11)
    module = encoder().eval()
    url = build_module(site, "encoder_frozen", module, SHAPE, max_batch=8, trainable="head.*")
    x, y = torch.randn(6, *SHAPE), torch.randint(0, 5, (6,))
    got = run_model(web, url, """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        return { out: Array.from(await m.predict(x, 6)), grads: arr(await m.gradients(x, y)) };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()})
    out = module(x)
    assert_close("frozen encoder forward", got["out"], out.detach().numpy(), **FWD)
    F.cross_entropy(out, y).backward()
    assert sorted(got["grads"]) == ["head.bias", "head.weight"]
    for name in got["grads"]:
        assert_close(f"frozen encoder d/d{name}", got["grads"][name], dict(module.named_parameters())[name].grad, **GRAD)


def test_a_token_graph_round_trips_through_onnx():
    """prep.torch_ir.export_onnx (import-weights --out .onnx, the prune fine-tune) on a token graph: its
    LayerNorm takes its normalised size from the weight, a constant of the traced export."""
    from texelfit.prep.torch_ir import export_onnx

    torch.manual_seed(0)
    m = encoder().eval()
    g = to_ir(export_simplified(m, SHAPE), SHAPE)
    again = to_ir(export_onnx(g), SHAPE)
    x = torch.randn(3, *SHAPE)
    assert torch.allclose(IRModule(again)(x), m(x), atol=1e-5)
