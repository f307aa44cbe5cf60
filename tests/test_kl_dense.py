"""The dense layer's generic kernels (codegen/ops/dense.py, the kernel language) and interleave (ops/common.py).

Here, without a browser: each kernel printed as the CPU backend's JavaScript, run by node over random textures
against numpy, on shapes whose feature counts leave padding lanes and a batch short of the texture (rows past it
hold garbage that must not be read). tests/test_kl_dense_backends.py runs them on the CPU backend against the WebGL2
routines (the hand templates) and PyTorch, tests/test_kl_wgsl.py their WGSL print.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from codegen.ops.common import interleave_kl
from codegen.ops.dense import forward_kl, grad_input_kl, grad_weight_kl, reduce_kl
from test_kl import _run_js

ROWS, BATCH = 7, 5  # texture rows (max batch), the batch drawn
ACTS = {"none": (lambda z: z, None), "tanh": (np.tanh, lambda y: 1 - y * y),
        "elu": (lambda z: np.where(z > 0, z, 0.7 * (np.exp(z) - 1)), lambda y: np.where(y > 0, 1, y + 0.7))}


def _features(rows: int, f: int, rng, garbage_from: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(texture [rows, ceil(f/4), 4], zero padding lanes, the values [rows, f]); rows from `garbage_from` on hold
    large values (an earlier batch's) in every lane."""
    f4 = -(-f // 4)
    x = rng.standard_normal((rows, f)) * 2
    t = np.zeros((rows, f4 * 4))
    t[:, :f] = x
    if garbage_from is not None:
        t[garbage_from:] = 1e6
    return t.reshape(rows, f4, 4).astype(np.float32), x.astype(np.float32).astype(np.float64)


def _weight(o: int, i: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """W [o, i] laid out [ceil4(o) rows, ceil(i/4) texels], padding zero (layout.py)."""
    t, w = _features(-(-o // 4) * 4, i, rng)
    t[o:] = 0
    return t, w[:o]


def _consts(i: int, o: int, has_bias=True, **more) -> dict:
    return dict(in_features=i, out_features=o, in4=-(-i // 4), out4=-(-o // 4), has_bias=has_bias, **more)


def _padded(v: np.ndarray, rows: int) -> np.ndarray:
    """[n, f] values as a texture [rows, ceil(f/4), 4], zeros around."""
    f4 = -(-v.shape[1] // 4)
    t = np.zeros((rows, f4 * 4))
    t[:v.shape[0], :v.shape[1]] = v
    return t.reshape(rows, f4, 4)


@pytest.mark.parametrize("i, o", [(9, 6), (13, 3), (4, 8)])
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("has_bias", [True, False])
def test_forward(i, o, act, has_bias):
    rng = np.random.default_rng(i * o)
    xt, x = _features(ROWS, i, rng, BATCH)
    wt, w = _weight(o, i, rng)
    bt, b = _features(1, o, rng)
    attrs = {"alpha": 0.7} if act == "elu" else {}
    got = _run_js(forward_kl(_consts(i, o, has_bias), act, attrs), {"X": xt, "W": wt, "B": bt}, -(-o // 4), BATCH)
    ref = ACTS[act][0](x[:BATCH] @ w.T + (b if has_bias else 0))
    np.testing.assert_allclose(got, _padded(ref, BATCH), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("i, o, split, chunk", [(70, 5, 4, 5), (61, 8, 3, 6)])
@pytest.mark.parametrize("act", ["none", "tanh"])
def test_split_forward_and_reduce(i, o, split, chunk, act):
    """The split-K forward's partial sums (row split*n + s: input texels [chunk*s, chunk*s + chunk), the last part
    short) and dense_reduce's sum of them, with the bias and activation: the plain forward."""
    rng = np.random.default_rng(i)
    xt, x = _features(ROWS, i, rng, BATCH)
    wt, w = _weight(o, i, rng)
    bt, b = _features(1, o, rng)
    c = _consts(i, o, split=split, chunk=chunk)
    parts = _run_js(forward_kl(c, act), {"X": xt, "W": wt}, -(-o // 4), split * BATCH)
    xp = np.zeros((ROWS, c["in4"] * 4))
    xp[:, :i] = x
    wp = np.zeros((o, c["in4"] * 4))
    wp[:, :i] = w
    for s in range(split):
        cut = slice(4 * chunk * s, 4 * chunk * (s + 1))
        ref = xp[:BATCH, cut] @ wp[:, cut].T
        np.testing.assert_allclose(got_part := parts[s::split], _padded(ref, BATCH), rtol=1e-5, atol=1e-4,
                                   err_msg=f"part {s}")
        assert got_part.shape[0] == BATCH
    got = _run_js(reduce_kl(c, act), {"P": parts.astype(np.float32), "B": bt}, -(-o // 4), BATCH)
    ref = ACTS[act][0](x[:BATCH] @ w.T + b)
    np.testing.assert_allclose(got, _padded(ref, BATCH), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("i, o", [(9, 6), (5, 11)])
@pytest.mark.parametrize("dact", [None, "tanh", "elu"])
def test_grad_input(i, o, dact):
    """dX = dZ W (over the padded rows of W too, whose dZ lanes are zero); with a fused activation of the layer
    before (layout.py act_grad_fused) times its derivative in that layer's output Y."""
    rng = np.random.default_rng(i + o)
    dzt, dz = _features(ROWS, o, rng, BATCH)
    wt, w = _weight(o, i, rng)
    inputs = {"DZ": dzt, "W": wt}
    ref = dz[:BATCH] @ w
    if dact:
        yt, y = _features(ROWS, i, rng)
        y = np.tanh(y) if dact == "tanh" else y  # (an elu's output: any value above -alpha)
        yt = _padded(y, ROWS).astype(np.float32)
        inputs["Y"] = yt
        ref = ref * ACTS[dact][1](y.astype(np.float32).astype(np.float64)[:BATCH])
    k = grad_input_kl(_consts(i, o), (dact, {"alpha": 0.7} if dact == "elu" else {}) if dact else None)
    got = _run_js(k, inputs, -(-i // 4), BATCH)
    np.testing.assert_allclose(got, _padded(ref, BATCH), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("i, o", [(9, 6), (6, 13)])
@pytest.mark.parametrize("transposed", [False, True])
def test_grad_weight(i, o, transposed):
    """dW = dZ^T X / u_loss_scale over the u_batch samples, every row of dW (the padded ones zero); dZ as it is, or
    with the samples as channels (samples_last: lane n % 4 of texel (o, n / 4), zero past u_batch)."""
    rng = np.random.default_rng(i * 7 + o)
    xt, x = _features(ROWS, i, rng, BATCH)
    dzt, dz = _features(ROWS, o, rng, BATCH)
    o4 = -(-o // 4) * 4
    if transposed:
        nb4 = -(-ROWS // 4)
        t = np.zeros((o4, nb4 * 4))
        t[:o, :BATCH] = dz[:BATCH].T
        dzt = t.reshape(o4, nb4, 4).astype(np.float32)
    got = _run_js(grad_weight_kl(transposed), {"DZT" if transposed else "DZ": dzt, "X": xt}, -(-i // 4), o4,
                  {"u_batch": BATCH, "u_loss_scale": 4.0})
    ref = np.zeros((o4, i))
    ref[:o] = dz[:BATCH].T @ x[:BATCH] / 4.0
    np.testing.assert_allclose(got, _padded(ref, o4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3])
def test_interleave(rows):
    """Sample (row, with u_rows = 1) n of the output: sample n / 8 of part n % 8, u_rows rows a sample."""
    rng = np.random.default_rng(rows)
    block, blocks, width = 8, 2, 3
    parts = [rng.standard_normal((blocks * rows, width, 4)).astype(np.float32) for _ in range(block)]
    n = 13  # samples drawn: the second block short
    got = _run_js(interleave_kl(block), {f"T{t}": p for t, p in enumerate(parts)}, width, n * rows,
                  {"u_rows": rows})
    for s in range(n):
        np.testing.assert_array_equal(got[s * rows:(s + 1) * rows],
                                      parts[s % block][(s // block) * rows:(s // block + 1) * rows])
    assert math.isfinite(float(got.sum()))
