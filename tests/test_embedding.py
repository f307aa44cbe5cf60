"""Integer inputs and embedding tables (issue 19): `--input-dtype int64` token ids [N, T], nn.Embedding's
Gather as the IR's embedding op (prep/graph.py, codegen/ops/embedding.py), its scatter-add gradient into
the table, padding_idx, the range checks of the ids (bad-input), and a table too big for one texture
(MiniLM's 30522 x 384) folded. Forward, every gradient and optimizer trajectories against PyTorch on
WebGL2 (float32), in the rgba8 tier and on the CPU backend, at the README's tolerances (helpers.py).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import FWD, GRAD, TRAJ_LOSS, TRAJ_W, assert_close, build_module, check_op, check_training, run_model
from texelfit.build import compile_onnx
from texelfit.prep.graph import to_ir
from texelfit.prep.load import BuildError, export_simplified
from texelfit.prep.torch_ir import IRModule

F16_FWD = dict(atol=2e-2, rtol=2e-2)  # the README's float16 tolerances (tests/test_tiers.py)
F16_GRAD = dict(atol=1e-5, rtol=0, norm=1e-2)
BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}
V, D, T = 50, 16, 7  # vocabulary, features, tokens (odd: a partial texel of ids)


class BagClassifier(nn.Module):
    """nn.Embedding, the mean over the tokens, a Linear head: the simplest text classifier."""

    def __init__(self, padding_idx=None):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=padding_idx)
        self.head = nn.Linear(D, 5)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


class TextEncoder(nn.Module):
    """Embedding + a trainable position embedding added by broadcast + one encoder layer + mean + head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.pos = nn.Parameter(0.1 * torch.randn(1, T, D))
        self.enc = nn.TransformerEncoderLayer(D, 2, 32, 0.0, batch_first=True)
        self.head = nn.Linear(D, 4)
        with torch.no_grad():
            for p in self.enc.parameters():
                p.add_(0.1 * torch.randn_like(p))

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids) + self.pos).mean(1))


def bag():
    return BagClassifier()


def bag_padded():
    return BagClassifier(padding_idx=0)


def text_encoder():
    return TextEncoder()


def test_the_ir_computes_what_the_module_does():
    torch.manual_seed(0)
    for factory in (bag, bag_padded, text_encoder):
        m = factory().eval()
        g = to_ir(export_simplified(m, (T,), input_dtype="int64"), (T,))
        assert g.input_dtype == "int64" and g.id_range(g.input) == V
        emb = next(layer for layer in g.layers if layer.op == "embedding")
        assert emb.params == {"weight": "emb.weight"}  # the state_dict name
        assert emb.attrs["padding_idx"] == (0 if factory is bag_padded else None)
        x = torch.randint(0, V, (3, T))
        assert torch.allclose(IRModule(g)(x), m(x), atol=1e-5)


def test_an_onnx_file_declares_its_input_dtype_and_a_wrong_one_is_refused(tmp_path):
    torch.manual_seed(0)
    model = export_simplified(bag(), (T,), input_dtype="int32")
    assert to_ir(model, (T,)).input_dtype == "int32"
    with pytest.raises(BuildError, match="--input-dtype float32 does not match the model's input 'input', which is int32"):
        to_ir(model, (T,), "float32")
    with pytest.raises(BuildError, match="need --input-dtype int64"):  # the float example of a float32 export
        export_simplified(bag(), (T,), input_dtype="float32")


def test_the_cli_builds_an_integer_input(tmp_path):
    from helpers import run_cli

    r = run_cli("build", "test_embedding:bag", "--input-shape", str(T), "--input-dtype", "int64", "--out",
                str(tmp_path), "--name", "bag", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    js = (tmp_path / "bag.js").read_text()
    assert '"inputDtype":"int64","idRange":50' in js and "// texelfit kernel: embedding_grad_weight" in js
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["input_dtype"] == "int64"
    assert [layer["op"] for layer in report["layers"]][0] == "embedding"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_bag_classifier_forward_and_gradients(web, site, backend):
    check_op(web, site, "emb_bag", bag, (T,), "cross_entropy", batch=5, seed=1, options=BACKENDS[backend], ids=V)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_text_encoder_forward_and_gradients(web, site, backend):
    check_op(web, site, "emb_encoder", text_encoder, (T,), "cross_entropy", batch=4, seed=2,
             options=BACKENDS[backend], ids=V)


# ids with repeats within a sample and across the batch (scatter-add collisions), the padding id 0 and the
# last row: 4 samples of 7
REPEATS = [[3, 3, 3, 0, 49, 3, 7], [7, 7, 0, 0, 1, 2, 3], [49, 49, 49, 49, 49, 49, 49], [0, 5, 3, 5, 3, 5, 9]]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_repeated_ids_add_up_and_padding_idx_gets_no_gradient(web, site, backend):
    torch.manual_seed(3)
    module = bag_padded().eval()
    url = build_module(site, "emb_repeats", module, (T,), max_batch=8, input_dtype="int64")
    x, y = torch.tensor(REPEATS), torch.tensor([0, 4, 2, 1])
    got = run_model(web, url, """
        const x = Int32Array.from(args.x), y = Int32Array.from(args.y);
        return { out: Array.from(await m.predict(x, 4)), grads: arr(await m.gradients(x, y)) };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()}, BACKENDS[backend])
    out = module(x)
    F.cross_entropy(out, y).backward()
    assert_close("forward", got["out"], out.detach(), **FWD)
    table = np.asarray(got["grads"]["emb.weight"]).reshape(V, D)
    assert np.all(table[0] == 0) and np.any(table[3] != 0)
    for name, p in module.named_parameters():
        assert_close(f"d/d{name}", got["grads"][name], p.grad, **GRAD)


@pytest.mark.parametrize("backend,opt", [("webgl", "adam"), ("cpu", "sgd_momentum_wd"), ("rgba8", "adamw")])
def test_bag_classifier_trains_like_pytorch(web, site, backend, opt):
    check_training(web, site, _named(bag, f"bag_{backend}"), (T,), opt, "cross_entropy", samples=11,
                   batch_size=4, epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=4, options=BACKENDS[backend],
                   max_batch=8, ids=V)


@pytest.mark.parametrize("backend,opt", [("webgl", "sgd_momentum_wd"), ("cpu", "sgd_nesterov"), ("rgba8", "sgd")])
def test_text_encoder_trains_like_pytorch(web, site, backend, opt):
    """SGD, as tests/test_sequence.py explains: the key bias has a gradient of exactly zero."""
    check_training(web, site, _named(text_encoder, f"text_{backend}"), (T,), opt, "cross_entropy", samples=9,
                   batch_size=4, epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, seed=5, options=BACKENDS[backend],
                   max_batch=8, ids=V)


def _named(factory, name):
    def make():
        return factory()
    make.__name__ = name
    return make


# ---- bad input -----------------------------------------------------------------------------------

BAD = """
    const before = arr(await m.getWeights());
    const errors = [];
    const y = Int32Array.from([0, 1]);
    for (const [what, x] of [
        ['fraction', Float32Array.from([1, 2, 3, 4, 5, 6, 7, 1, 2, 3.5, 4, 5, 6, 7])],
        ['negative', Int32Array.from([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, -1, 6, 7])],
        ['too big', Int32Array.from([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 50])],
        ['strings', ['1', 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7]],
        ['bytes', new Uint8Array(14)]]) {
      for (const call of [() => m.predict(x, 2), () => m.fit(x, y, { epochs: 1 }), () => m.gradients(x, y)]) {
        try { await call(); errors.push([what, 'resolved']); } catch (e) { errors.push([what, e.code, e.message]); }
      }
    }
    const ok = [Int32Array.from([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 49]), [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 49],
                Float32Array.from([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 49])];
    const outs = [];
    for (const x of ok) outs.push(Array.from(await m.predict(x, 2)));
    return { errors, before, after: arr(await m.getWeights()), outs, info: [m.info.inputDtype, m.info.idRange] };
"""


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_bad_ids_reject_with_bad_input_and_lose_nothing(web, site, backend):
    torch.manual_seed(6)
    module = bag().eval()
    url = build_module(site, "emb_bad", module, (T,), max_batch=4, input_dtype="int64")
    got = run_model(web, url, BAD, None, BACKENDS[backend])
    assert len(got["errors"]) == 15
    for what, code, *message in got["errors"]:
        assert code == "bad-input", (what, code, message)
    msgs = {what: message[0] for what, code, *message in got["errors"]}
    assert msgs["fraction"] == ('texelfit: x[9] (input "input", sample 1, token 2) is 3.5: token ids must be integers in '
                                '[0, 50) (an Int32Array)')
    assert msgs["negative"] == ('texelfit: x[11] (input "input", sample 1, token 4) is -1: out of range, token ids must be in '
                                "[0, 50) (the embedding table's rows)")
    assert "x[13] (input \"input\", sample 1, token 6) is 50: out of range" in msgs["too big"]
    assert 'x[0] (input "input", sample 0, token 0) is "1"' in msgs["strings"]
    assert 'must be an Int32Array of token ids, got a Uint8Array' in msgs["bytes"]
    assert got["after"] == got["before"]  # the rejected fits trained nothing
    assert got["info"] == ["int64", V]
    ref = module(torch.tensor([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 49]])).detach()
    for out in got["outs"]:  # Int32Array, plain Array and Float32Array of integers alike
        assert_close("forward", out, ref, **FWD)


# ---- a big frozen table, folded ------------------------------------------------------------------

class BigTable(nn.Module):
    """MiniLM's vocabulary table (30522 x 384, 47 MB of float32), frozen, under a small trainable head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30522, 384)
        self.head = nn.Linear(384, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


@pytest.fixture(scope="module")
def big_table(site):
    torch.manual_seed(7)
    module = BigTable().eval()
    return module, build_module(site, "emb_big", module, (5,), max_batch=4, input_dtype="int64",
                                trainable="head.*")


@pytest.mark.parametrize("backend", ["webgl", "cpu", "float16"])
def test_a_big_frozen_table_folds_and_gathers(web, big_table, backend):
    """Ids up to 30521 (halves near it are 16 apart: the float16 tier keeps the ids texture exact, in RGBA8),
    on a table folded at a texture limit of 8192."""
    module, url = big_table
    x = torch.tensor([[0, 30521, 17, 30521, 12345], [29999, 1, 2, 3, 30000], [5, 5, 5, 5, 5]])
    y = torch.tensor([0, 2, 1])
    got = run_model(web, url, """
        const x = Int32Array.from(args.x), y = Int32Array.from(args.y);
        return { out: Array.from(await m.predict(x, 3)), grads: arr(await m.gradients(x, y)),
                 // (the float16 tier keeps the trunk's output in half floats, and features() does not read it)
                 features: m.info.precision === 'float16' ? null : Array.from(await m.features(x, 3)), trunk: m.info.trunk,
                 folded: m.info.foldedTextures, max: m.info.maxTextureSize };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()}, {"backend": "cpu"} if backend == "cpu" else
        {"maxTextureSize": 8192, **({"precision": "float16"} if backend == "float16" else {})})
    module.zero_grad()  # (the module is the fixture's: each backend's test backpropagates once)
    out = module(x)
    F.cross_entropy(out, y).backward()
    fwd, grad = (F16_FWD, F16_GRAD) if backend == "float16" else (FWD, GRAD)
    assert_close("big table forward", got["out"], out.detach(), **fwd)
    assert got["trunk"] is not None  # the frozen table's mean over the tokens: features() gives it
    if backend != "float16":
        assert_close("big table features", got["features"], module.emb(x).mean(1).detach(), **FWD)
    assert sorted(got["grads"]) == ["head.bias", "head.weight"]
    for name in got["grads"]:
        assert_close(f"big table d/d{name}", got["grads"][name], dict(module.named_parameters())[name].grad, **grad)
    if backend != "cpu":
        assert got["max"] == 8192 and got["folded"] == 1  # the table's 30522 rows: past the texture limit


def test_a_big_table_builds_within_the_texture_limits():
    torch.manual_seed(7)
    res = compile_onnx(export_simplified(BigTable().eval(), (5,), input_dtype="int64"), name="m", input_shape=(5,), max_batch=4,
                       trainable="head.*", weights_file=True)
    spec = res.plan.textures["param:emb.weight"]
    assert (spec.width, spec.height) == (96, 30522) and not spec.double  # frozen: one texture
    assert "pgrad:emb.weight" not in res.plan.textures
    assert "embedding_grad_weight" not in res.files["m.js"]  # neither the kernel nor its CPU twin


# ---- the types -----------------------------------------------------------------------------------

IDS_USAGE = """
import { createModel, type Ids } from "./bag.js";
async function main(): Promise<void> {
  const m = await createModel({ backend: "cpu" });
  const ids: Ids = Int32Array.from([1, 2, 3, 4, 5, 6, 7]);
  await m.predict(ids, 1);
  await m.predict([1, 2, 3, 4, 5, 6, 7], 1);
  await m.fit(new Int32Array(14), Int32Array.from([0, 1]), { epochs: 1 });
  await m.gradients(ids, Int32Array.from([0]));
  await m.features(ids, 1);
  const range: number = m.info.idRange;
  WRONG
}
main();
"""


def test_the_types_take_ids(tmp_path):
    import os
    import subprocess

    from texelfit.build import write_files

    tsc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "node_modules", ".bin", "tsc")
    torch.manual_seed(0)
    write_files(str(tmp_path), compile_onnx(export_simplified(bag(), (T,), input_dtype="int64"), name="bag", input_shape=(T,),
                                            trainable="head.*").files)
    flags = ["--strict", "--noEmit", "--target", "ES2022", "--module", "ES2022", "--moduleResolution", "bundler",
             "--lib", "ES2022,DOM", "usage.ts"]
    # one run: every call type-checks but the one wrong call (strings are not ids), line 12
    (tmp_path / "usage.ts").write_text(IDS_USAGE.replace("WRONG", 'await m.predict(["1"], 1);'))
    r = subprocess.run([tsc, *flags], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stdout.splitlines() if "error TS" in line]
    assert len(errors) == 1 and errors[0].startswith("usage.ts(12,"), r.stdout + r.stderr


def test_weights_trained_in_the_page_import_back_into_an_integer_input_model(tmp_path):
    """texelfit import-weights --input-dtype int64: the state_dict and the ONNX model (int64 ids in) of it."""
    import onnx

    from texelfit.importer import import_weights

    torch.manual_seed(8)
    trained = bag_padded()
    (tmp_path / "w.json").write_text(json.dumps({k: v.reshape(-1).tolist() for k, v in trained.state_dict().items()}))
    out = str(tmp_path / "m.onnx")
    graph = import_weights(str(tmp_path / "w.json"), "test_embedding:bag_padded", out, input_shape=(T,),
                           input_dtype="int64")
    assert graph.input_dtype == "int64"
    back = to_ir(onnx.load(out), (T,))
    assert back.input_dtype == "int64" and np.array_equal(back.params["emb.weight"].array, trained.emb.weight.detach())
    x = torch.randint(0, V, (3, T))
    assert torch.allclose(IRModule(back)(x), trained(x), atol=1e-6)


class CastIds(nn.Module):
    """int32 ids cast to int64 for the table, and to float as features beside the pooled embeddings."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.head = nn.Linear(D + T, 3)

    def forward(self, ids):
        return self.head(torch.cat([self.emb(ids.long()).mean(1), ids.float() / V], 1))


def test_casts_of_the_ids_are_the_same_values():
    torch.manual_seed(9)
    m = CastIds().eval()
    g = to_ir(export_simplified(m, (T,), input_dtype="int32"), (T,))
    assert g.input_dtype == "int32" and [layer.op for layer in g.layers][0] == "embedding"
    x = torch.randint(0, V, (3, T), dtype=torch.int32)
    assert torch.allclose(IRModule(g)(x), m(x), atol=1e-5)
