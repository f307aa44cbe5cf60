"""Dropout's masks: which elements a training step keeps, the same in GLSL, JavaScript and here.

`fit` applies each `dropout` layer as PyTorch's `model.train()` does (inverted scaling: a kept element
is multiplied by 1 / (1 - p)); `predict`, `features` and `gradients` do not. The masks come from a
counter-based hash, so that the forward and backward of a step, the GPU and the CPU backend, and a
step replayed after a lost context all draw the same one, and so that a test can reproduce them in
PyTorch:

    step seed   s = lowbias32(fit seed + step * 0x9E3779B9) & 0x7fffffff       (runtime: dropout.js)
    element     h = lowbias32(s ^ lowbias32(index + salt))                       (codegen/ops/dropout.py)
    kept        (h >> 8) / 2^24 >= p

`step` counts the fit's steps from 0, `index` is the element's row-major index in the batch
([N, C, H, W] of the samples of the step, in batch order), `salt` is the layer's (CRC-32 of its name),
so two layers of one shape draw different masks. All arithmetic is on unsigned 32-bit integers.
"""
from __future__ import annotations

import zlib

import numpy as np

GOLDEN = 0x9E3779B9


def lowbias32(x):
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        x = x ^ (x >> np.uint32(16))
    return x


def salt(layer_name: str) -> int:
    return zlib.crc32(layer_name.encode()) & 0x7FFFFFFF


def step_seed(seed: int, step: int) -> int:
    return int(lowbias32((seed + step * GOLDEN) % 2 ** 32)) & 0x7FFFFFFF


def scale(p: float) -> np.float32:
    """What a kept element is multiplied by (as PyTorch computes it in float32)."""
    return np.float32(1.0) / np.float32(1.0 - p)


def mask(seed: int, step: int, layer_name: str, p: float, shape: tuple[int, ...]) -> np.ndarray:
    """The step's mask of the layer over a batch of `shape` ([N, ...]), times the scale: float32."""
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = lowbias32(np.uint32(step_seed(seed, step)) ^ lowbias32((index + salt(layer_name)) % 2 ** 32))
    kept = (h >> np.uint32(8)).astype(np.float32) / np.float32(2 ** 24) >= np.float32(p)
    return (kept.astype(np.float32) * scale(p)).reshape(shape)
