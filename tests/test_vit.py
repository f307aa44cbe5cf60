"""A tiny ViT with a class token (issue 19): a 4x4 patch embedding conv on a 3x8x12 image (6 patches), a
trainable class token concatenated in front (nn.Parameter [1, 1, F] expanded over the batch), a trainable
position embedding [1, 7, F] added by broadcast, 2 encoder layers (nn.TransformerEncoderLayer, batch_first,
pre-norm and post-norm), and a Linear head on the class token's output (x[:, 0]).

Forward, the gradient of every parameter (the class token's: the sum over the batch of dY at its row; the
position embedding's: the sum over the batch of dY) and Adam and SGD trajectories against PyTorch on WebGL2
(float32), in the rgba8 tier and on the CPU backend, at the README's tolerances (helpers.py); and the class
token kept under its state_dict name by getWeights / setWeights.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import TRAJ_LOSS, TRAJ_W, build_module, check_op, check_training, run_model
from texelfit.prep.graph import to_ir
from texelfit.prep.load import export_simplified
from texelfit.prep.torch_ir import IRModule

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}
IMG = (3, 8, 12)


class ClassTokenViT(nn.Module):
    """Every parameter is perturbed so that none is the zeros or ones of its default init."""

    def __init__(self, d=16, norm_first=True):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.cls = nn.Parameter(0.5 * torch.randn(1, 1, d))
        self.pos = nn.Parameter(0.1 * torch.randn(1, 7, d))
        layer = nn.TransformerEncoderLayer(d, 2, 32, 0.0, batch_first=True, norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1) + self.pos
        return self.head(self.enc(t)[:, 0])


def vit_pre_norm():
    return ClassTokenViT()


def vit_post_norm():
    return ClassTokenViT(norm_first=False)


class TorchvisionStyleViT(nn.Module):
    """torchvision.models.VisionTransformer's forward written out (torchvision is not installed here): the patch
    conv reshaped to [n, hidden, patches] with n = x.shape[0] and permuted, the class token (zeros at init, as
    torchvision's) expanded and concatenated, the position embedding added inside the encoder, pre-norm blocks of
    nn.MultiheadAttention and an MLP with GELU, a final LayerNorm, the head on x[:, 0]."""

    def __init__(self, d=16, heads=2, mlp=32, layers=2, classes=5):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, d, 4, stride=4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embedding = nn.Parameter(torch.empty(1, 5, d).normal_(std=0.02))
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln_1": nn.LayerNorm(d, eps=1e-6), "self_attention": nn.MultiheadAttention(d, heads, batch_first=True),
            "ln_2": nn.LayerNorm(d, eps=1e-6),
            "mlp": nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d))}) for _ in range(layers))
        self.ln = nn.LayerNorm(d, eps=1e-6)
        self.heads = nn.Sequential(nn.Linear(d, classes))
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x)
        x = x.reshape(n, x.shape[1], -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1) + self.pos_embedding
        for b in self.blocks:
            y = b["ln_1"](x)
            x = x + b["self_attention"](y, y, y, need_weights=False)[0]
            x = x + b["mlp"](b["ln_2"](x))
        return self.heads(self.ln(x)[:, 0])


def torchvision_style_vit():
    return TorchvisionStyleViT()


TV_IMG = (3, 8, 8)


def test_the_class_token_imports_as_a_trainable_part_of_the_gather():
    """The IR run in PyTorch is the module; the class token is a parameter under its state_dict name, read by
    the gather that lays out the patches (one layer: flatten, transpose and concat composed)."""
    torch.manual_seed(0)
    for factory in (vit_pre_norm, vit_post_norm):
        m = factory().eval()
        g = to_ir(export_simplified(m, IMG), IMG)
        x = torch.randn(3, *IMG)
        assert torch.allclose(IRModule(g)(x), m(x), atol=1e-5)
        assert {"cls", "pos", "patch.weight"} <= set(g.params)
        assert g.params["cls"].array.shape == (1, 1, 16)
        first = g.layers[1]
        assert first.op == "gather" and first.params == {"part:cls": "cls"}, first
        assert [p.get("param") for p in first.attrs["parts"]] == ["part:cls", None]
        # its gradient in PyTorch's reading of the IR is the module's
        ir = IRModule(g)
        ir(x).sum().backward()
        m(x).sum().backward()
        assert torch.allclose(ir.p["cls"].grad, m.cls.grad, atol=1e-5)
    m = torchvision_style_vit().eval()
    g = to_ir(export_simplified(m, TV_IMG), TV_IMG)
    x = torch.randn(3, *TV_IMG)
    assert torch.allclose(IRModule(g)(x), m(x), atol=1e-5)
    assert g.layers[1].params == {"part:class_token": "class_token"}


def test_torchvision_style_vit_forward_and_gradients(web, site):
    check_op(web, site, "vit_tv", torchvision_style_vit, TV_IMG, "cross_entropy", batch=4, seed=2)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_class_token_vit_forward_and_gradients(web, site, backend):
    check_op(web, site, "vit_cls", vit_pre_norm, IMG, "cross_entropy", batch=5, seed=3, options=BACKENDS[backend])


@pytest.mark.parametrize("backend", ["cpu", "webgl"])
def test_post_norm_class_token_vit_forward_and_gradients(web, site, backend):
    check_op(web, site, "vit_cls_post", vit_post_norm, IMG, "mse", batch=3, seed=4, options=BACKENDS[backend])


def _named(name, **kw):
    def make():
        return ClassTokenViT(**kw)
    make.__name__ = name
    return make


@pytest.mark.parametrize("backend,opt,norm_first", [
    ("webgl", "adam", True), ("cpu", "adamw", False), ("rgba8", "adam", True),
])
def test_class_token_vit_trains_like_pytorch_with_adam(web, site, backend, opt, norm_first):
    """The attention's in-projection bias is frozen (both sides): its key third has a gradient of exactly zero
    (it adds one constant to each row of scores, which the softmax cancels), so both sides compute rounding
    noise there, which Adam scales up to steps of lr (test_sequence.py: the SGD runs train it)."""
    check_training(web, site, _named(f"vit_{opt}_{backend}", norm_first=norm_first), IMG, opt, "cross_entropy",
                   samples=9, batch_size=4, epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=5,
                   options=BACKENDS[backend], max_batch=8, frozen=("enc.layers.*.self_attn.in_proj_bias",))


@pytest.mark.parametrize("backend,opt", [("webgl", "sgd_momentum_wd"), ("cpu", "sgd_nesterov"),
                                         ("rgba8", "sgd_dampening")])
def test_class_token_vit_trains_like_pytorch_with_sgd(web, site, backend, opt):
    check_training(web, site, _named(f"vit_{opt}_{backend}"), IMG, opt, "cross_entropy", samples=9, batch_size=4,
                   epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=6, options=BACKENDS[backend], max_batch=8)


def test_get_weights_returns_the_class_token_under_its_name(web, site, tmp_path):
    """getWeights has the class token (and the position embedding) under their state_dict names; setWeights of
    new values changes predict as it changes the module; and import-weights takes them back into a state_dict
    that the module loads and predicts with as the page does."""
    import json

    from texelfit.importer import import_weights

    torch.manual_seed(7)
    m = vit_pre_norm().eval()
    url = build_module(site, "vit_cls_weights", m, IMG, max_batch=4)
    x = torch.randn(2, *IMG)
    new_cls = torch.randn(1, 1, 16)
    got = run_model(web, url, """
        const w = arr(await m.getWeights());
        await m.setWeights({ cls: new Float32Array(args.cls) });
        const back = arr(await m.getWeights());
        return { w, back, out: Array.from(await m.predict(new Float32Array(args.x), 2)) };
    """, {"x": x.reshape(-1).tolist(), "cls": new_cls.reshape(-1).tolist()})
    assert sorted(got["w"]) == sorted(n for n, _ in m.named_parameters())
    assert got["w"]["cls"] == pytest.approx(m.cls.detach().reshape(-1).tolist(), abs=0)
    assert got["w"]["pos"] == pytest.approx(m.pos.detach().reshape(-1).tolist(), abs=0)
    assert got["back"]["cls"] == pytest.approx(new_cls.reshape(-1).tolist(), abs=0)
    (tmp_path / "w.json").write_text(json.dumps(got["back"]))
    (tmp_path / "m.onnx").write_bytes(export_simplified(m, IMG).SerializeToString())
    import_weights(str(tmp_path / "w.json"), str(tmp_path / "m.onnx"), str(tmp_path / "w.pt"))
    state = torch.load(tmp_path / "w.pt")
    assert tuple(state["cls"].shape) == (1, 1, 16)
    fresh = vit_pre_norm().eval()
    fresh.load_state_dict(state)
    assert torch.equal(fresh.cls, new_cls)
    with torch.no_grad():
        ref = fresh(x).reshape(-1).tolist()
    assert got["out"] == pytest.approx(ref, abs=2e-5, rel=2e-4)


def test_a_frozen_class_token_has_no_gradient_pass():
    """--trainable without the class token: it is read as it is (a part of the gather) and has no gradient pass,
    no optimizer state; with it, the one batch-summing gradient kernel."""
    from texelfit.build import compile_onnx

    torch.manual_seed(0)
    onnx_model = export_simplified(vit_pre_norm().eval(), IMG)
    frozen = compile_onnx(onnx_model, name="m", input_shape=IMG, max_batch=4, trainable="head.*")
    assert "gather_grad param" not in frozen.files["m.js"]
    assert "cls" not in frozen.report["trainable"]
    trained = compile_onnx(onnx_model, name="m", input_shape=IMG, max_batch=4)
    assert "// texelfit kernel: gather_grad param 7x16->1x16" in trained.files["m.js"]
    assert "cls" in trained.report["trainable"]
