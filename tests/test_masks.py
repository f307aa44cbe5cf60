"""Multi-input models and attention masks (issue 19): a model of float tokens [N, T, F] and a mask [N, T]
(`--inputs x,mask`), masked mean pooling `(h * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1e-9)`
(an activation times an input broadcast, ReduceSum over the tokens, Div, Clip) and nn.TransformerEncoderLayer
called with `src_key_padding_mask` from the mask input; forward, every gradient and optimizer trajectories
against PyTorch on WebGL2 (float32), in the rgba8 tier and on the CPU backend, with rows padded to different
lengths (one not padded at all, one padded down to a single token). Then the checks of the inputs: the
object keyed by input name that predict, fit, features and gradients take, and what they reject.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import FWD, GRAD, TRAJ_LOSS, TRAJ_W, OPTIMIZERS, assert_close, run_cli, run_model, torch_optimizer
from texelfit.build import compile_onnx
from texelfit.prep.graph import to_ir
from texelfit.prep.load import BuildError, export_simplified
from texelfit.prep.torch_ir import IRModule, export_onnx

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}
T, FEAT = 7, 16
SHAPES = [(T, FEAT), (T,)]
NAMES = ["x", "mask"]


def masked_mean(h, m):
    return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1e-9)


class MaskedPool(nn.Module):
    """Token-wise Linear and tanh, masked mean pooling by the mask input, a Linear head."""

    def __init__(self, classes=5):
        super().__init__()
        self.lin = nn.Linear(FEAT, FEAT)
        self.head = nn.Linear(FEAT, classes)

    def forward(self, x, mask):
        return self.head(masked_mean(torch.tanh(self.lin(x)), mask))


def masked_pool():
    return MaskedPool()


class MaskedEncoder(nn.Module):
    """nn.TransformerEncoderLayer (batch_first) with src_key_padding_mask from the mask input: a bool mask
    (True where padded, `mask == 0`, which MultiheadAttention makes -inf where True), or with `additive` the
    float mask `(1 - mask) * -1e4` added as it is; then masked mean pooling and a Linear head. Every
    parameter is perturbed (none is the zeros or ones of its default init)."""

    def __init__(self, additive=False, classes=5):
        super().__init__()
        self.additive = additive
        self.enc = nn.TransformerEncoderLayer(d_model=FEAT, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(FEAT, classes)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, x, mask):
        pad = (1 - mask) * -1e4 if self.additive else mask == 0
        return self.head(masked_mean(self.enc(x, src_key_padding_mask=pad), mask))


def masked_encoder():
    return MaskedEncoder()


def additive_masked_encoder():
    return MaskedEncoder(additive=True)


def masks(batch, g):
    """Rows of 1s then 0s: row 0 not padded, row 1 one token, the others random lengths."""
    lengths = torch.randint(1, T + 1, (batch,), generator=g)
    lengths[0], lengths[1 % batch] = T, 1
    return (torch.arange(T)[None, :] < lengths[:, None]).float()


def data(batch, seed, classes):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, T, FEAT, generator=g)
    m = masks(batch, g)
    y = torch.randint(0, classes, (batch,), generator=g)
    return x, m, y


def build(site, folder, module, **options):
    onnx_model = export_simplified(module, SHAPES, NAMES)
    result = compile_onnx(onnx_model, name="model", input_shape=SHAPES, max_batch=options.pop("max_batch", 16),
                          **options)
    return f"{site.add_files(folder, result.files)}/model.js", result


OP = """
    const x = { x: new Float32Array(args.x), mask: new Float32Array(args.mask) };
    const y = Int32Array.from(args.y);
    const out = Array.from(await m.predict(x, args.batch));
    const grads = arr(await m.gradients(x, y));
    return { out, grads, info: m.info };
"""


def check_forward_and_gradients(web, site, case, factory, backend, *, batch=5, seed=0):
    torch.manual_seed(seed)
    module = factory().eval()
    classes = module.head.out_features
    x, m, y = data(batch, seed + 100, classes)
    url, _ = build(site, f"mask_op_{case}", module)
    got = run_model(web, url, OP, {"x": x.reshape(-1).tolist(), "mask": m.reshape(-1).tolist(), "y": y.tolist(),
                                   "batch": batch}, BACKENDS[backend])
    assert [i["name"] for i in got["info"]["inputs"]] == NAMES
    module.zero_grad()
    out = module(x, m)
    F.cross_entropy(out, y).backward()
    assert_close(f"{case} forward", got["out"], out.detach().numpy(), **FWD)
    named = dict(module.named_parameters())
    assert sorted(got["grads"]) == sorted(named)
    for name, p in named.items():
        assert_close(f"{case} d/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)


FIT = """
    const x = { x: new Float32Array(args.x), mask: new Float32Array(args.mask) };
    const r = await m.fit(x, Int32Array.from(args.y), { batchSize: args.batchSize, epochs: args.epochs, shuffle: false,
                                                         optimizer: args.optimizer });
    return { loss: r.loss, weights: arr(await m.getWeights()) };
"""


def check_trajectory(web, site, case, factory, backend, opt_name, *, samples=10, batch_size=4, epochs=2, seed=3,
                     trainable="*"):
    torch.manual_seed(seed)
    module = factory()
    classes = module.head.out_features
    x, m, y = data(samples, seed + 100, classes)
    url, _ = build(site, f"mask_fit_{case}_{trainable != '*'}", module, trainable=trainable)
    cfg = OPTIMIZERS[opt_name]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "mask": m.reshape(-1).tolist(), "y": y.tolist(),
                                    "batchSize": batch_size, "epochs": epochs, "optimizer": cfg}, BACKENDS[backend])
    trained = [p for n, p in module.named_parameters() if trainable == "*" or n.startswith(trainable.rstrip("*"))]
    for p in module.parameters():
        p.requires_grad_(any(p is q for q in trained))
    opt = torch_optimizer(cfg, trained)
    losses = []
    for _ in range(epochs):
        for s in range(0, samples, batch_size):
            opt.zero_grad()
            loss = F.cross_entropy(module(x[s:s + batch_size], m[s:s + batch_size]), y[s:s + batch_size])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert_close(f"{case} losses", got["loss"], losses, **TRAJ_LOSS)
    for name, ref in module.state_dict().items():
        assert_close(f"{case} {name} after {len(losses)} steps", got["weights"][name], ref.numpy(), **TRAJ_W)


def test_a_two_input_model_imports_with_its_input_names():
    torch.manual_seed(0)
    module = masked_pool().eval()
    g = to_ir(export_simplified(module, SHAPES, NAMES), SHAPES)
    assert g.inputs == ("x", "mask") and g.input == "x" and g.input_shapes == SHAPES
    x, m, _ = data(4, 1, 5)
    assert torch.allclose(IRModule(g)(x, m), module(x, m), atol=1e-6)
    for factory in (masked_encoder, additive_masked_encoder):
        module = factory().eval()
        g = to_ir(export_simplified(module, SHAPES, NAMES), SHAPES)
        assert torch.allclose(IRModule(g)(x, m), module(x, m), atol=1e-5)
        # the mask reaches the scores of every head: a broadcast add onto [h, T, T] before the softmax
        ops = [layer.op for layer in g.layers]
        assert ("select_eq" in ops) != module.additive and "softmax" in ops, ops
    with pytest.raises(BuildError, match="1 input shape"):
        to_ir(export_simplified(module, SHAPES, NAMES), (T, FEAT))
    # what import-weights writes (prep/torch_ir.py: export_onnx) keeps both inputs, in order
    module = masked_pool().eval()
    again = to_ir(export_onnx(to_ir(export_simplified(module, SHAPES, NAMES), SHAPES)))
    assert again.inputs == ("x", "mask") and again.input_shapes == SHAPES
    assert torch.allclose(IRModule(again)(x, m), module(x, m), atol=1e-6)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_masked_mean_pooling_forward_and_gradients(web, site, backend):
    check_forward_and_gradients(web, site, "pool", masked_pool, backend, batch=5, seed=1)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_masked_mean_pooling_trains_as_pytorch(web, site, backend):
    check_trajectory(web, site, "pool", masked_pool, backend, "adam")


def test_a_frozen_trunk_of_two_inputs_caches_and_gives_features(web, site):
    """--trainable head.*: the trunk's cut is the pooled vector (it read both inputs); fit caches it and trains
    the head as PyTorch does, and features() gives it for inputs keyed by name."""
    check_trajectory(web, site, "pool_head", masked_pool, "webgl", "sgd_momentum_wd", trainable="head.*")
    torch.manual_seed(4)
    module = masked_pool().eval()
    url, result = build(site, "mask_features", module, trainable="head.*")
    assert result.report["trunk"] is not None
    x, m, _ = data(3, 9, 5)
    got = run_model(web, url, """
        return Array.from(await m.features({ x: new Float32Array(args.x), mask: new Float32Array(args.mask) }, 3));
    """, {"x": x.reshape(-1).tolist(), "mask": m.reshape(-1).tolist()})
    assert_close("features", got, masked_mean(torch.tanh(module.lin(x)), m).detach().numpy(), **FWD)


def test_inputs_keyed_by_name_reject_what_does_not_fit(web, site):
    torch.manual_seed(0)
    url, _ = build(site, "mask_errors", masked_pool().eval())
    got = run_model(web, url, """
        const n = args.size, ok = () => ({ x: new Float32Array(2 * n), mask: new Float32Array(2 * args.t) });
        const codes = {};
        const attempt = async (what, fn) => {
          try { await fn(); codes[what] = 'resolved'; } catch (e) { codes[what] = `${e.code}: ${e.message.replace("texelfit: ", "")}`; }
        };
        await attempt('plain', () => m.predict(new Float32Array(2 * n), 2));
        await attempt('missing', () => m.predict({ x: new Float32Array(2 * n) }, 2));
        await attempt('extra', () => m.predict({ ...ok(), tokens: new Float32Array(2) }, 2));
        await attempt('length', () => m.predict({ ...ok(), mask: new Float32Array(2 * args.t + 1) }, 2));
        await attempt('batch', () => m.predict(ok(), 3));
        await attempt('type', () => m.predict({ ...ok(), mask: Array(2 * args.t).fill(1) }, 2));
        await attempt('fitBatch', () => m.fit({ ...ok(), mask: new Float32Array(3 * args.t) }, new Int32Array(2)));
        await attempt('gradLength', () => m.gradients({ ...ok(), x: new Float32Array(2 * n - 1) }, new Int32Array(2)));
        await attempt('good', () => m.predict(ok(), 2));
        return { codes, info: m.info.inputs, mod: mod.modelInfo.inputs };
    """, {"size": T * FEAT, "t": T})
    c = got["codes"]
    assert c["good"] == "resolved"
    assert c["plain"].startswith("bad-input: x must be an object keyed by input name (x, mask)"), c["plain"]
    assert c["missing"].startswith('bad-input: x has no input "mask"'), c["missing"]
    assert c["extra"].startswith('bad-input: x has an unknown input "tokens"'), c["extra"]
    assert c["length"].startswith("bad-input: x.mask has 15 values, expected 2 x 7"), c["length"]
    assert c["batch"].startswith("bad-input: x.x has 224 values, expected 3 x 112"), c["batch"]
    assert c["type"].startswith("bad-input: x.mask must be a Float32Array"), c["type"]
    assert c["fitBatch"].startswith("bad-input: x.mask holds 3 samples but x.x 2"), c["fitBatch"]
    assert c["gradLength"].startswith("bad-input: x.x has 223 values, not a whole number of samples of 112"), c["gradLength"]
    assert got["info"] == got["mod"] == [{"name": "x", "shape": [T, FEAT], "dtype": "float32"},
                                         {"name": "mask", "shape": [T], "dtype": "float32"}]


MODULE = """
import torch
from torch import nn


class Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 3)

    def forward(self, x, mask):
        return self.lin((x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9))


def pool():
    torch.manual_seed(0)
    return Pool()
"""


def test_the_cli_builds_a_two_input_source(tmp_path):
    (tmp_path / "twoin.py").write_text(MODULE)
    r = run_cli("build", "twoin:pool", "--inputs", "x,mask", "--input-shape", "7,16", "--input-shape", "7",
                "--out", str(tmp_path / "a"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r2 = run_cli("build", "twoin:pool", "--inputs", "x,mask", "--input-shape", "7,16;7", "--out", str(tmp_path / "b"),
                 cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    import json

    rep = json.loads((tmp_path / "a" / "report.json").read_text())
    assert rep["inputs"] == [{"name": "x", "shape": [7, 16], "size": 112, "dtype": "float32"},
                             {"name": "mask", "shape": [7], "size": 7, "dtype": "float32"}]
    assert (tmp_path / "a" / "pool.js").read_bytes() == (tmp_path / "b" / "pool.js").read_bytes()
    dts = (tmp_path / "a" / "pool.d.ts").read_text()
    assert "export interface Inputs {\n  x: Float32Array | Float64Array;\n  mask: Float32Array | Float64Array;\n}" in dts
    bad = run_cli("build", "twoin:pool", "--inputs", "x,mask", "--input-shape", "7,16", "--out", str(tmp_path / "c"),
                  cwd=tmp_path)
    assert bad.returncode == 1 and "1 input shape(s) (--input-shape) for 2 input(s) (x, mask)" in bad.stderr, bad.stderr
    bad = run_cli("build", "twoin:pool", "--input-shape", "7,16;7", "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert bad.returncode == 1 and "name the inputs with --inputs" in bad.stderr, bad.stderr
    bad = run_cli("build", "twoin:pool", "--inputs", "x,x", "--input-shape", "7,16;7", "--out", str(tmp_path / "c"),
                  cwd=tmp_path)
    assert bad.returncode == 1 and "names an input twice" in bad.stderr, bad.stderr


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_encoder_layer_with_a_key_padding_mask_forward_and_gradients(web, site, backend):
    check_forward_and_gradients(web, site, "encoder", masked_encoder, backend, batch=5, seed=2)


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_encoder_layer_with_an_additive_float_mask_forward_and_gradients(web, site, backend):
    check_forward_and_gradients(web, site, "encoder_additive", additive_masked_encoder, backend, batch=4, seed=3)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_encoder_layer_with_a_key_padding_mask_trains_as_pytorch(web, site, backend):
    """SGD with momentum, as tests/test_sequence.py trains the encoder: the key projection's bias has a
    gradient of exactly zero (the softmax cancels it), where both sides compute rounding noise that Adam
    would scale up to steps of lr."""
    check_trajectory(web, site, "encoder", masked_encoder, backend, "sgd_momentum_wd", samples=8, batch_size=4,
                     epochs=2)
