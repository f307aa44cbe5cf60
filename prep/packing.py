"""The Packing rule: where each element of a tensor sits in its RGBA texture (codegen/webgl2/layout.py's docstring
describes the layouts; this is the rule they are all instances of), and the packings of activations and
weights. Apart from codegen/webgl2/layout.py so that the op definitions (prep/ops/) can lay out their weights without
importing the texture plan that dispatches to them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Packing:
    rows: int
    r2: int
    blocks: int
    chans: int
    s_r1: int
    s_r2: int
    s_b: int
    s_c: int

    @property
    def c4(self) -> int:
        return ceil_div(self.chans, 4)

    @property
    def width(self) -> int:
        return self.blocks * self.c4

    @property
    def size(self) -> int:
        return self.rows * self.blocks * self.chans

    def to_json(self) -> list[int]:
        return [self.rows, self.r2, self.blocks, self.chans, self.s_r1, self.s_r2, self.s_b, self.s_c]


def chw(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of a per-sample shape: (C, H, W) itself; tokens (R, F) as F x R x 1 (the last axis in
    the texel, a texture row a token); any other is flat data: (F,) as F x 1 x 1."""
    if len(shape) == 2:
        return (int(shape[1]), int(shape[0]), 1)
    return tuple(shape) if len(shape) == 3 else (int(np.prod(shape)), 1, 1)


def activation_packing(shape: tuple[int, ...], batch: int) -> Packing:
    """NCHW with `batch` samples (shapes other than CHW as flat data, see chw); tokens (R, F) from their
    row-major [N, R, F]."""
    if len(shape) == 2:
        r, f = (int(d) for d in shape)
        return Packing(batch * r, r, 1, f, r * f, f, 0, 1)
    c, h, w = chw(shape)
    return Packing(batch * h, h, w, c, c * h * w, w, 1, h * w)


def samples_last_packing(shape: tuple[int, ...], batch: int) -> Packing:
    """A per-sample tensor with the samples as channels: rows (c, h), blocks w, channels n."""
    c, h, w = chw(shape)
    return Packing(c * h, h, w, batch, h * w, w, 1, c * h * w)


def matrix_packing(rows: int, cols: int, transposed: bool = False) -> Packing:
    """M[rows, cols] stored row-major, or stored as its transpose [cols, rows]."""
    return Packing(rows, 1, 1, cols, 1 if transposed else cols, 0, 0, rows if transposed else 1)


def conv_weight_shape(w: np.ndarray) -> tuple[int, int, int, int]:
    """[OC, ICg, KH, KW] of a conv weight; a Conv1d's [OC, ICg, K] is [OC, ICg, 1, K] (prep/graph.py)."""
    return tuple(w.shape) if w.ndim == 4 else (w.shape[0], w.shape[1], 1, w.shape[2])


def conv_weight_packing(oc: int, icg: int, kh: int, kw: int) -> Packing:
    """W[OC, ICg, KH, KW]: texel (kw * ceil(OC/4) + o4, kh * ICg + j) holds W[4*o4 .. 4*o4+3, j, kh, kw]."""
    return Packing(kh * icg, icg, kw, oc, kw, kh * kw, 1, icg * kh * kw)


def _source_index(p: Packing) -> np.ndarray:
    r = np.arange(p.rows)[:, None, None]
    b = np.arange(p.blocks)[None, :, None]
    c = np.arange(p.chans)[None, None, :]
    return (r // p.r2) * p.s_r1 + (r % p.r2) * p.s_r2 + b * p.s_b + c * p.s_c


def pack(source: np.ndarray, p: Packing, height: int | None = None) -> np.ndarray:
    """Source array (any shape, row-major) -> texel data of shape (height, width, 4)."""
    src = np.asarray(source, dtype=np.float32).reshape(-1)
    out = np.zeros((height or p.rows, p.blocks, p.c4 * 4), dtype=np.float32)
    out[: p.rows, :, : p.chans] = src[_source_index(p)]
    return out.reshape(height or p.rows, p.width, 4)


def unpack(texels: np.ndarray, p: Packing) -> np.ndarray:
    """Texel data -> the flat source array."""
    t = np.asarray(texels, dtype=np.float32).reshape(-1, p.blocks, p.c4 * 4)
    out = np.zeros(p.size, dtype=np.float32)
    out[_source_index(p)] = t[: p.rows, :, : p.chans]
    return out
