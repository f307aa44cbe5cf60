"""The kernel language (codegen/kl.py) and its printers (codegen/kl_print.py).

The GLSL a kernel prints runs in every browser test of the ops written in it (softmax, log_softmax: test_sequence,
test_elementwise, test_vit on WebGL2 and rgba8); the JavaScript on the CPU backend there too. Here, without a
browser: the type rules, and the printed JavaScript run by node over random textures against numpy, on shapes
whose channel count leaves padding lanes.
"""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

from codegen import kl
from codegen.kl import COL, ROW, load, select
from codegen.kl_print import glsl, js
from codegen.ops.softmax import _forward_kl, _grad_kl


def test_type_rules():
    with pytest.raises(TypeError, match="integer division"):
        ROW / 2
    with pytest.raises(TypeError, match="int and float|float and int"):
        ROW + 1.5
    with pytest.raises(TypeError, match="integers only"):
        load("X", ROW, COL) // 2
    k = kl.KernelDef()
    with pytest.raises(TypeError, match="one vec4"):
        k.out(1.0)
    k.let("a", 1)
    with pytest.raises(ValueError, match="taken"):
        k.let("a", 2)
    with pytest.raises(TypeError, match="cannot set"):
        k.set(kl.var("a", "int"), 1.0)
    for name in ("t4", "v1", "f12", "var", "l"):  # the JavaScript printer's temporaries, a reserved word
        with pytest.raises(ValueError, match="taken"):
            k.let(name, 1)


def _run_js(k, inputs: dict[str, np.ndarray], out_width: int, rows: int, u: dict | None = None, outputs: int = 1):
    """Runs the printed function in node: textures are [rows, width, 4] float32 arrays; `u` the uniforms. With
    `outputs` > 1, a list of that many."""
    fn = js(k, list(inputs), outputs)
    tex = {n: {"width": a.shape[1], "data": a.reshape(-1).tolist()} for n, a in inputs.items()}
    script = f"""
const fn = {fn};
const t = {json.dumps(tex)};
const ins = {json.dumps(list(inputs))}.map((n) => ({{ width: t[n].width, data: Float32Array.from(t[n].data) }}));
const outs = Array.from({{ length: {outputs} }}, () => ({{ width: {out_width}, data: new Float32Array({rows * out_width * 4}) }}));
fn({json.dumps(k.symbols)}, ins, outs, {json.dumps(u or {})}, {rows});
console.log(JSON.stringify(outs.map((o) => Array.from(o.data))));
"""
    got = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout
    arrays = [np.array(o, dtype=np.float64).reshape(rows, out_width, 4) for o in json.loads(got)]
    return arrays[0] if outputs == 1 else arrays


def _packed(rows: int, positions: int, c: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(texture [rows, positions * c4, 4] with zero padding lanes, the logical values [rows, positions, c])."""
    c4 = -(-c // 4)
    x = rng.standard_normal((rows, positions, c)) * 3
    t = np.zeros((rows, positions, c4 * 4))
    t[:, :, :c] = x
    return t.reshape(rows, positions * c4, 4).astype(np.float32), x


@pytest.mark.parametrize("c", [1, 4, 6, 9])
@pytest.mark.parametrize("is_log", [False, True])
def test_softmax_printed_as_javascript(c, is_log):
    rng = np.random.default_rng(c)
    rows, positions, c4 = 3, 2, -(-c // 4)
    tex, x = _packed(rows, positions, c, rng)
    got = _run_js(_forward_kl(c, is_log), {"X": tex}, positions * c4, rows).reshape(rows, positions, c4 * 4)
    e = np.exp(x - x.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    ref = np.log(ref) if is_log else ref
    np.testing.assert_allclose(got[:, :, :c], ref, rtol=1e-5, atol=1e-6)
    assert not got[:, :, c:].any(), "padding lanes stay zero"
    dy_tex, dy = _packed(rows, positions, c, rng)
    y_tex = np.zeros_like(dy_tex).reshape(rows, positions, c4 * 4)
    y_tex[:, :, :c] = ref
    got = _run_js(_grad_kl(c, is_log), {"DY": dy_tex, "Y": y_tex.reshape(dy_tex.shape).astype(np.float32)},
                  positions * c4, rows).reshape(rows, positions, c4 * 4)
    if is_log:
        ref_dx = dy - np.exp(ref) * dy.sum(-1, keepdims=True)
    else:
        ref_dx = ref * (dy - (dy * ref).sum(-1, keepdims=True))
    np.testing.assert_allclose(got[:, :, :c], ref_dx, rtol=1e-4, atol=1e-5)
    assert not got[:, :, c:].any()


def test_integer_arithmetic_and_cross_lane_ops():
    """GLSL's int division truncates and % of non-negatives; lane(), dot(), hmax() and a vec4 set that reads the
    old lanes of the value it replaces."""
    k = kl.KernelDef()
    q = k.let("q", COL // 3)
    r = k.let("r", COL % 3)
    v = k.let("v", load("X", ROW, COL))
    k.set(v, v - kl.lane(v, 0) + kl.hmax(v) * 0.0)
    k.out(select(q > r, v, kl.splat(kl.dot(v, v))) + kl.splat(1.0) * 0.0)
    tex = np.arange(2 * 7 * 4, dtype=np.float32).reshape(2, 7, 4)
    got = _run_js(k, {"X": tex}, 7, 2)
    for row in range(2):
        for col in range(7):
            v = tex[row, col] - tex[row, col, 0]
            ref = v if col // 3 > col % 3 else np.full(4, v @ v)
            np.testing.assert_allclose(got[row, col], ref)
    src = glsl(k)
    assert "int q = (_p.x / 3);" in src and "((q > r) ? v : vec4(dot(v, v)))" in src and "_hmax(v)" in src


def test_to_int_truncates_a_float_toward_zero():
    """to_int: an id stored as a float read as an int (GLSL int(), JavaScript Math.trunc), here used as a row."""
    k = kl.KernelDef()
    i = k.let("i", kl.to_int(kl.lane(load("X", ROW, COL), 0)))
    k.out(kl.splat(kl.to_float(i)))
    with pytest.raises(TypeError, match="to_int of a int"):
        kl.to_int(ROW)
    tex = np.array([[[2.0, 0, 0, 0], [2.75, 0, 0, 0], [-1.5, 0, 0, 0]]], dtype=np.float32)
    got = _run_js(k, {"X": tex}, 3, 1)
    np.testing.assert_array_equal(got[0, :, 0], [2.0, 2.0, -1.0])
    assert "int i = int(getX(_p.y, _p.x)[0]);" in glsl(k)


def test_tables_and_the_value_function():
    """k.table: a constant array, baked into the GLSL, read from the constants in JavaScript; glsl(value=True): the
    kernel as the function valueAt an optimizer includes (ops/optim.py)."""
    k = kl.KernelDef()
    ids, weights = k.table("ids", [2, 0, 1]), k.table("weights", [0.5, -1.0, 4.0])
    k.out(load("X", ROW, ids[COL]) * weights[COL])
    tex = np.arange(3 * 4, dtype=np.float32).reshape(1, 3, 4)
    got = _run_js(k, {"X": tex}, 3, 1)
    np.testing.assert_array_equal(got[0], tex[0, [2, 0, 1]] * np.array([[0.5], [-1.0], [4.0]]))
    src = glsl(k)
    assert "const int _tids[3] = int[3](2, 0, 1);" in src and "const float _tweights[3] = float[3](0.5, -1.0, 4.0);" in src
    value = glsl(k, value=True)
    assert "vec4 valueAt(ivec2 _p) {" in value and "return _value;" in value and "out0" not in value
    with pytest.raises(TypeError):
        ids[1.0]


def test_uint_hash_is_prep_dropouts_bit_for_bit():
    """The uints of the language (+ and * wrapping, ^, >>) print as GLSL's uint arithmetic and JavaScript's >>> 0:
    the dropout kernel's masks (ops/dropout.py) are prep/dropout.py's, exactly, on a shape with padding lanes."""
    from texelfit.codegen.ops.dropout import _kl as dropout_kl
    from texelfit.prep import dropout as dp

    c, h, w, n, p, seed, step = 6, 2, 3, 2, 0.3, 11, 5
    k = dropout_kl(c, h, w, float(np.float32(p)), float(dp.scale(p)), dp.salt("drop"))
    c4 = -(-c // 4)
    x = np.random.default_rng(0).standard_normal((n, c, h, w)).astype(np.float32)
    tex = np.zeros((n, h, w, c4 * 4), dtype=np.float32)
    tex[..., :c] = x.transpose(0, 2, 3, 1)
    tex = tex.reshape(n * h, w * c4, 4)
    u = {"u_dropout": 1, "u_dropseed": dp.step_seed(seed, step)}
    got = _run_js(k, {"X": tex}, w * c4, n * h, u).reshape(n, h, w, c4 * 4)[..., :c].transpose(0, 3, 1, 2)
    ref = x * dp.mask(seed, step, "drop", p, x.shape)
    np.testing.assert_array_equal(got.astype(np.float32), ref)
    assert 0 < (ref == 0).mean() < 1, "some dropped, some kept"
    got = _run_js(k, {"X": tex}, w * c4, n * h, {"u_dropout": 0, "u_dropseed": 3})
    np.testing.assert_array_equal(got, tex)
    src = glsl(k)
    assert "uint hash = (uint(u_dropseed) ^ inner);" in src and "(hash * 2221713035u)" in src
    with pytest.raises(TypeError, match="uints"):
        kl.to_uint(ROW) + ROW
def test_vec4_of_and_the_value_at_form():
    """vec4_of builds a vec4 of 4 floats (here lanes of two loads, reversed and summed); a kernel that writes out0
    last prints as the function valueAt an optimizer includes (ops/optim.py), `return` in place of out0."""
    k = kl.KernelDef()
    a = k.let("a", load("X", ROW, COL))
    k.out(kl.vec4_of(*(kl.lane(a, 3 - j) + kl.lane(load("X", ROW, 0), j) for j in range(4))))
    with pytest.raises(TypeError, match="vec4_of"):
        kl.vec4_of(1.0, 2.0, 3.0, ROW)
    tex = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    got = _run_js(k, {"X": tex}, 3, 2)
    np.testing.assert_allclose(got, tex[:, :, ::-1].astype(np.float64) + tex[:, :1, :], rtol=1e-6)
    assert "out0 = vec4(" in glsl(k)
    src = glsl(k, value=True)
    assert "vec4 valueAt(ivec2 _p) {" in src and "return _value;" in src and "out0" not in src


def _tokens(x: np.ndarray) -> np.ndarray:
    """Tokens (R, F) as their texture: a row a token, F packed 4 a texel, zero padding lanes."""
    f4 = -(-x.shape[1] // 4)
    t = np.zeros((x.shape[0], f4 * 4), np.float32)
    t[:, :x.shape[1]] = x
    return t.reshape(x.shape[0], f4, 4)


@pytest.mark.parametrize("k", [3, 4, 6, 9])
def test_matmul_kernels_printed_as_javascript(k):
    """The token matmuls (ops/matmul.py) against numpy: blocks of activations (2 samples of 2 groups), and a weight
    with a bias; k of every remainder mod 4 (the forward's tail), p = 5 (a padding lane)."""
    from codegen.ops.matmul import _forward_kl, _grad_a_kl, _grad_b_kl, _grad_weight_kl

    rng = np.random.default_rng(k)
    n, g, m, p = 2, 2, 3, 5
    c = dict(groups=g, m=m, k=k, p=p, p4=2, rows_a=g * m, rows_b=g * k, weight=False, has_bias=False)
    a, b, dy = rng.standard_normal((n, g, m, k)), rng.standard_normal((n, g, k, p)), rng.standard_normal((n, g, m, p))
    A, B, DY = (_tokens(x.reshape(-1, x.shape[-1])) for x in (a, b, dy))
    got = _run_js(_forward_kl(c), {"A": A, "B": B}, 2, n * g * m)
    np.testing.assert_allclose(got.reshape(n * g * m, 8)[:, :p], (a @ b).reshape(-1, p), rtol=1e-5, atol=1e-5)
    assert not got.reshape(-1, 8)[:, p:].any()
    got = _run_js(_grad_a_kl(c), {"DY": DY, "B": B}, -(-k // 4), n * g * m).reshape(n * g * m, -1)
    np.testing.assert_allclose(got[:, :k], (dy @ b.transpose(0, 1, 3, 2)).reshape(-1, k), rtol=1e-5, atol=1e-5)
    assert not got[:, k:].any()
    got = _run_js(_grad_b_kl(c), {"A": A, "DY": DY}, 2, n * g * k).reshape(n * g * k, 8)
    np.testing.assert_allclose(got[:, :p], (a.transpose(0, 1, 3, 2) @ dy).reshape(-1, p), rtol=1e-5, atol=1e-5)
    # a weight [k, p] with a bias; its gradient summed over the batch's rows, divided by the loss scale
    w, bias = rng.standard_normal((k, p)), rng.standard_normal((1, p))
    cw = dict(c, groups=1, m=g * m, rows_b=0, weight=True, has_bias=True)
    got = _run_js(_forward_kl(cw), {"A": A, "B": _tokens(w), "BIAS": _tokens(bias)}, 2, n * g * m)
    np.testing.assert_allclose(got.reshape(-1, 8)[:, :p], a.reshape(-1, k) @ w + bias, rtol=1e-5, atol=1e-5)
    got = _run_js(_grad_weight_kl(cw), {"A": A, "DY": DY}, 2, k, {"u_batch": n, "u_loss_scale": 2.0})
    np.testing.assert_allclose(got.reshape(k, 8)[:, :p], a.reshape(-1, k).T @ dy.reshape(-1, p) / 2, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("k,p", [(6, 5), (9, 3), (8, 6), (16, 5)])
def test_row_blocked_matmul_kernels_equal_the_one_row_kernels(k, p):
    """The row-blocked twins (8 rows a fragment into 8 outputs, row 8r + t in row r of output t: ops/matmul.py
    _rows_twins) against the one-row kernels on the same inputs: 2 samples of 8 tokens, a weight [k, p] with a bias;
    the weight gradient's where k is a multiple of 8 (blocking.weight_grad_blocked)."""
    from codegen.ops.matmul import (_forward_kl, _forward_rows_kl, _grad_a_kl, _grad_a_rows_kl, _grad_weight_kl,
                                    _grad_weight_rows_kl)

    rng = np.random.default_rng(k * p)
    n, rows, p4, k4 = 2, 8, -(-p // 4), -(-k // 4)
    c = dict(groups=1, m=rows, k=k, p=p, p4=p4, rows_a=rows, rows_b=0, weight=True, has_bias=True)
    a, w, bias, dy = (rng.standard_normal(s) for s in ((n * rows, k), (k, p), (1, p), (n * rows, p)))
    ins = {"A": _tokens(a), "B": _tokens(w), "BIAS": _tokens(bias)}

    def blocked(parts):  # row 8r + t of the tensor from row r of part t
        return np.stack(parts, 1).reshape(-1, *parts[0].shape[1:])

    one = _run_js(_forward_kl(c), ins, p4, n * rows)
    np.testing.assert_allclose(one.reshape(n * rows, -1)[:, :p], a @ w + bias, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(blocked(_run_js(_forward_rows_kl(c, 8), ins, p4, n * rows // 8, outputs=8)), one)
    ins = {"DY": _tokens(dy), "B": _tokens(w)}
    one = _run_js(_grad_a_kl(c), ins, k4, n * rows)
    np.testing.assert_array_equal(blocked(_run_js(_grad_a_rows_kl(c, 8), ins, k4, n * rows // 8, outputs=8)), one)
    if k % 8 == 0:
        ins, u = {"A": _tokens(a), "DY": _tokens(dy)}, {"u_batch": n, "u_loss_scale": 2.0}
        one = _run_js(_grad_weight_kl(c), ins, p4, k, u)
        np.testing.assert_allclose(one.reshape(k, -1)[:, :p], a.T @ dy / 2, rtol=1e-5, atol=1e-5)
        parts = _run_js(_grad_weight_rows_kl(c, 8), ins, p4, k // 8, u, outputs=8)
        np.testing.assert_array_equal(blocked(parts), one)


@pytest.mark.parametrize("f", [4, 6])
def test_layernorm_kernels_printed_as_javascript(f):
    """The layernorm kernels (ops/layernorm.py) against numpy: the statistics and gradient sums a row, the forward
    and gradients reading them; padding lanes left zero."""
    from codegen.ops.layernorm import _forward_kl, _grad_input_kl, _grad_sums_kl, _grad_weight_kl, _stats_kl

    rng = np.random.default_rng(f)
    rows, n, eps = 3, 2, 1e-5
    c = dict(rows=rows, f=f, eps=eps, has_bias=True)
    x, dy = rng.standard_normal((n * rows, f)) * 2 + 1, rng.standard_normal((n * rows, f))
    w, b = rng.standard_normal((1, f)), rng.standard_normal((1, f))
    f4 = -(-f // 4)
    rstd = 1 / np.sqrt(x.var(1, keepdims=True) + eps)
    xhat = (x - x.mean(1, keepdims=True)) * rstd
    stats = _run_js(_stats_kl(c), {"X": _tokens(x)}, 1, n * rows)
    np.testing.assert_allclose(stats[:, 0, :2], np.hstack([x.mean(1, keepdims=True), rstd]), rtol=1e-5, atol=1e-6)
    assert not stats[:, 0, 2:].any()
    S = stats.astype(np.float32)
    got = _run_js(_forward_kl(c), {"X": _tokens(x), "S": S, "W": _tokens(w), "B": _tokens(b)}, f4, n * rows)
    np.testing.assert_allclose(got.reshape(n * rows, -1)[:, :f], xhat * w + b, rtol=1e-4, atol=1e-5)
    assert not got.reshape(n * rows, -1)[:, f:].any()
    g = dy * w
    sums = _run_js(_grad_sums_kl(c), {"DY": _tokens(dy), "X": _tokens(x), "S": S, "W": _tokens(w)}, 1, n * rows)
    np.testing.assert_allclose(sums[:, 0, :2], np.hstack([g.sum(1, keepdims=True), (g * xhat).sum(1, keepdims=True)]),
                               rtol=1e-4, atol=1e-5)
    ref = rstd * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
    got = _run_js(_grad_input_kl(c), {"DY": _tokens(dy), "X": _tokens(x), "S": S, "W": _tokens(w),
                                      "G": sums.astype(np.float32)}, f4, n * rows)
    np.testing.assert_allclose(got.reshape(n * rows, -1)[:, :f], ref, rtol=1e-4, atol=1e-5)
    got = _run_js(_grad_weight_kl(c), {"DY": _tokens(dy), "X": _tokens(x), "S": S}, f4, 1,
                  {"u_batch": n, "u_loss_scale": 2.0})
    np.testing.assert_allclose(got.reshape(1, -1)[:, :f], (dy * xhat).sum(0, keepdims=True) / 2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("classes", [3, 8, 33])
@pytest.mark.parametrize("stats", [False, True])
def test_cross_entropy_kernels_printed_as_javascript(classes, stats):
    """cross_entropy's passes (ops/loss.py) against PyTorch: a batch of 3 in textures of 5 rows (the rows past the
    batch hold other values, which the value must not read), padding lanes; its statistics pass (whose output the
    others read, `stats`) or their own loop over the classes; the value into texel u_ring of the ring alone."""
    import torch

    from codegen.ops.loss import cross_entropy_grad_kl, cross_entropy_stats_kl, cross_entropy_value_kl

    rng = np.random.default_rng(classes)
    rows, batch, c4, ring = 5, 3, -(-classes // 4), 5
    z, _ = _packed(rows, 1, classes, rng)
    labels = np.zeros((rows, 1, 4), np.float32)
    labels[:, 0, 0] = rng.integers(0, classes, rows)
    u = {"u_batch": batch, "u_loss_scale": 4.0, "u_loss_weight": 0.5, "u_ring": ring}  # (an output's weight: fit's lossWeights)
    inputs = {"Z": z, "LABELS": labels}
    if stats:
        s = _run_js(cross_entropy_stats_kl(classes, c4), {"Z": z}, 1, rows)
        logits = torch.tensor(z.reshape(rows, -1)[:, :classes], dtype=torch.float64)
        np.testing.assert_allclose(s[:, 0, 0], logits.max(1).values.numpy(), rtol=1e-6)
        np.testing.assert_allclose(s[:, 0, 1], torch.exp(logits - logits.max(1, keepdim=True).values).sum(1),
                                   rtol=1e-5)
        assert not s[:, 0, 2:].any()
        inputs["S"] = s.astype(np.float32)
    logits = torch.tensor(z.reshape(rows, -1)[:batch, :classes], dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels[:batch, 0, 0], dtype=torch.int64))
    loss.backward()
    got = _run_js(cross_entropy_grad_kl(classes, c4, stats), inputs, c4, batch, u).reshape(batch, -1)
    np.testing.assert_allclose(got[:, :classes], logits.grad.numpy() * 4.0 * 0.5, rtol=1e-5, atol=1e-7)
    assert not got[:, classes:].any(), "padding lanes stay zero"
    got = _run_js(cross_entropy_value_kl(classes, c4, stats), inputs, 8, 1, u)
    np.testing.assert_allclose(got[0, ring, 0], loss.item(), rtol=1e-5)
    got[0, ring, 0] = 0
    assert not got.any(), "the value pass writes (loss, 0, 0, 0) into texel u_ring alone"


@pytest.mark.parametrize("sample_rows, f", [(1, 6), (2, 5)])
def test_mse_kernels_printed_as_javascript(sample_rows, f):
    """mse's passes (ops/loss.py) against PyTorch: samples of `sample_rows` rows of f values (padding lanes zero in
    the output and the targets alike, as the layout keeps them), a batch of 3 in textures of 5 samples."""
    import torch

    from codegen.ops.loss import mse_grad_kl, mse_value_kl

    rng = np.random.default_rng(f)
    samples, batch, f4, ring = 5, 3, -(-f // 4), 2
    y, yv = _packed(samples * sample_rows, 1, f, rng)
    t, tv = _packed(samples * sample_rows, 1, f, rng)
    u = {"u_batch": batch, "u_loss_scale": 2.0, "u_loss_weight": 3.0, "u_ring": ring}
    features = sample_rows * f
    out = torch.tensor(yv[:batch * sample_rows].reshape(batch, -1), requires_grad=True)
    loss = torch.nn.functional.mse_loss(out, torch.tensor(tv[:batch * sample_rows].reshape(batch, -1)))
    loss.backward()
    got = _run_js(mse_grad_kl(features), {"Y": y, "T": t}, f4, batch * sample_rows, u).reshape(batch * sample_rows, -1)
    np.testing.assert_allclose(got[:, :f], out.grad.numpy().reshape(-1, f) * 2.0 * 3.0, rtol=1e-5, atol=1e-7)
    assert not got[:, f:].any()
    got = _run_js(mse_value_kl(features, sample_rows, f4), {"Y": y, "T": t}, 8, 1, u)
    np.testing.assert_allclose(got[0, ring, 0], loss.item(), rtol=1e-5)
    got[0, ring, 0] = 0
    assert not got.any()


@pytest.mark.parametrize("c, h, w", [(6, 3, 2), (5, 1, 1)])
def test_samples_last_printed_as_javascript(c, h, w):
    """samples_last (ops/common.py) against numpy: A (c, h, w) a sample, 6 samples in a texture of 8, a batch of 5
    (zero past it), the samples as channels: texel (w*nb4 + n4, c*h + h), lane n % 4, holds A[n, c, h, w]; a
    dense tensor (w = 1) reads channel texels as a w of 0."""
    from codegen.ops.common import samples_last_kl

    rng = np.random.default_rng(c)
    samples, batch, nb4, c4 = 8, 5, 2, -(-c // 4)
    a = rng.standard_normal((samples, c, h, w))
    tex = np.zeros((samples, h, w, c4 * 4), np.float32)
    tex[..., :c] = a.transpose(0, 2, 3, 1)
    tex = tex.reshape(samples * h, w * c4, 4)
    got = _run_js(samples_last_kl(c4 if w > 1 else 0, h, nb4), {"A": tex}, w * nb4, c * h, {"u_batch": batch})
    ref = np.zeros((c, h, w, nb4 * 4))
    ref[..., :batch] = a[:batch].transpose(1, 2, 3, 0)
    np.testing.assert_array_equal(got, ref.reshape(c * h, w * nb4, 4).astype(np.float32))


@pytest.mark.parametrize("op, attrs, ref", [
    ("erf", {}, lambda a, b: np.vectorize(math.erf)(a)),
    ("tanh", {}, lambda a, b: np.tanh(a)),
    ("pow", {"exponent": 3.0}, lambda a, b: a ** 3),
    ("pow", {"exponent": 0.5}, lambda a, b: np.abs(a) ** 0.5),
    ("hardswish", {}, lambda a, b: a * np.clip(a + 3, 0, 6) / 6),
    ("prelu", {}, lambda a, b: np.where(a > 0, a, a * b)),
    ("div", {}, lambda a, b: a / b),
])
def test_elementwise_expressions_in_the_language(op, attrs, ref):
    """codegen/expr.py to_kl: an op's declared expression (prep/elementwise.py) over kernel-language values, printed as
    JavaScript, against numpy; the second operand one channel broadcast over the lanes (a splat of its lane 0),
    as the elementwise kernels read it (ops/elementwise.py)."""
    from codegen.expr import to_kl
    from texelfit.prep.elementwise import forward_of

    rng = np.random.default_rng(3)
    a = (rng.standard_normal((2, 3, 4)) * 2).astype(np.float32)
    if op == "pow" and attrs["exponent"] == 0.5:
        a = np.abs(a)
    b = (rng.standard_normal((2, 1, 4)) + 3).astype(np.float32)  # away from 0: a divisor
    k = kl.KernelDef()
    x0 = k.let("x0", load("A", ROW, COL))
    x1 = k.let("x1", kl.splat(kl.lane(load("B", ROW, 0), 0)))
    y = to_kl(forward_of(op, attrs), [x0, x1][:2 if op in ("prelu", "div") else 1])
    k.out(y if y.type == "vec4" else kl.splat(y))
    got = _run_js(k, {"A": a, "B": b}, 3, 2)
    want = ref(a.astype(np.float64), b[:, :, :1].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-7)  # erf: Abramowitz and Stegun, |error| <= 1.5e-7
    src = glsl(k)
    assert "x1 = vec4(getB(_p.y, 0)[0]);" in src, src
    if op == "erf":
        assert "erf" not in src and "sign(x0)" in src  # the expansion (expr.py: KL_REWRITES)


# ---- optimizers (ops/optim.py): the printed update against torch.optim, two steps (the first with its momentum) ----

def _run_update(k, inputs: dict[str, np.ndarray], outputs: int, u: dict) -> list[np.ndarray]:
    """The printed update run in node over [rows, width, 4] float32 textures: its gradient comes in as input G."""
    fn = js(k, list(inputs), outputs)
    tex = {n: a.reshape(-1).tolist() for n, a in inputs.items()}
    rows, width = next(iter(inputs.values())).shape[:2]
    script = f"""
const fn = {fn};
const t = {json.dumps(tex)};
const ins = Object.keys(t).map((n) => ({{ width: {width}, data: Float32Array.from(t[n]) }}));
const outs = Array.from({{ length: {outputs} }}, () => ({{ width: {width}, data: new Float32Array({rows * width * 4}) }}));
fn({{}}, ins, outs, {json.dumps(u)}, {rows});
console.log(JSON.stringify(outs.map((o) => Array.from(o.data))));
"""
    got = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout
    return [np.array(o, dtype=np.float64).reshape(rows, width, 4) for o in json.loads(got)]


_SGD_CASES = {"plain": dict(lr=0.1), "weight_decay": dict(lr=0.1, weight_decay=0.05),
              "momentum": dict(lr=0.05, momentum=0.9), "dampening": dict(lr=0.05, momentum=0.9, dampening=0.3),
              "nesterov": dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-2)}
_ADAM_CASES = {"adam": ("Adam", dict(lr=1e-2, weight_decay=1e-2)),
               "adam_betas": ("Adam", dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6)),
               "adamw": ("AdamW", dict(lr=1e-2, weight_decay=0.1))}


def _torch_steps(make, p0: np.ndarray, grads: list[np.ndarray], mu: float) -> tuple[list[np.ndarray], object]:
    """The parameter after each step of torch optimizer make([w]) from p0, the gradient of step i grads[i] plus
    the proximal term's mu * (w - p0) (fit's `proximal`: mu / 2 * ||w - w_start||^2 added to the loss)."""
    import torch

    w = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float64))
    opt, anchor, out = make([w]), torch.tensor(p0, dtype=torch.float64), []
    for g in grads:
        w.grad = torch.tensor(g, dtype=torch.float64) + mu * (w.detach() - anchor)
        opt.step()
        out.append(w.detach().numpy().copy())
    return out, opt.state[w]


@pytest.mark.parametrize("mu", [0.0, 0.7])
@pytest.mark.parametrize("case", sorted(_SGD_CASES))
def test_sgd_printed_as_javascript(case, mu):
    import torch

    from codegen.ops.optim import sgd_kl

    cfg = _SGD_CASES[case]
    rng = np.random.default_rng(len(case))
    shape = (3, 5, 4)  # rows, texels, lanes
    p0 = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    ref, state = _torch_steps(lambda ps: torch.optim.SGD(ps, **cfg), p0, grads, mu)
    momentum = cfg.get("momentum", 0.0)
    k = sgd_kl(stateless=momentum == 0)
    u = {"u_lr": cfg["lr"], "u_wd": cfg.get("weight_decay", 0.0), "u_mu": mu, "u_momentum": momentum,
         "u_dampening": cfg.get("dampening", 0.0), "u_nesterov": 1.0 if cfg.get("nesterov") else 0.0}
    p, m = p0, np.zeros(shape, np.float32)
    for i, g in enumerate(grads):
        ins = {"G": g, "P0": p0, "P": p} | ({} if momentum == 0 else {"M": m})
        outs = _run_update(k, ins, 1 if momentum == 0 else 2, u | {"u_first": 1.0 if i == 0 else 0.0})
        np.testing.assert_allclose(outs[0], ref[i], rtol=1e-5, atol=1e-6, err_msg=f"step {i}")
        p = outs[0].astype(np.float32)
        if momentum:
            m = outs[1].astype(np.float32)
    if momentum:
        np.testing.assert_allclose(m, state["momentum_buffer"].numpy(), rtol=1e-5, atol=1e-6)
    else:
        assert "momentum_buffer" not in state or state["momentum_buffer"] is None


@pytest.mark.parametrize("mu", [0.0, 0.7])
@pytest.mark.parametrize("case", sorted(_ADAM_CASES))
def test_adam_printed_as_javascript(case, mu):
    import torch

    from codegen.ops.optim import adam_kl

    name, cfg = _ADAM_CASES[case]
    cls = getattr(torch.optim, name)
    rng = np.random.default_rng(len(case) + 7)
    shape = (2, 3, 4)
    p0 = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    ref, state = _torch_steps(lambda ps: cls(ps, **cfg), p0, grads, mu)
    b1, b2 = cfg.get("betas", (0.9, 0.999))
    wd = cfg.get("weight_decay", 1e-2 if cls is torch.optim.AdamW else 0.0)
    p, m, v = p0, np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    for t, g in enumerate(grads, 1):  # (runtime/optimizer.js: the step's uniforms)
        u = {"u_lr": cfg["lr"], "u_wd": wd, "u_mu": mu, "u_decoupled": 1.0 if cls is torch.optim.AdamW else 0.0,
             "u_beta1": b1, "u_beta2": b2, "u_eps": cfg.get("eps", 1e-8), "u_step_size": cfg["lr"] / (1 - b1 ** t),
             "u_bc2_sqrt": math.sqrt(1 - b2 ** t)}
        p, m, v = (o.astype(np.float32) for o in _run_update(adam_kl(), {"G": g, "P0": p0, "P": p, "M": m, "V": v}, 3, u))
        np.testing.assert_allclose(p, ref[t - 1], rtol=1e-5, atol=1e-6, err_msg=f"step {t}")
    np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-8)


def test_optimizer_glsl_reads_the_gradient_function_and_p0_only_in_the_proximal_variant():
    """WebGL2: the gradient is valueAt(_p), the included gradient kernel's function (one pass, no texture of the
    gradient), and P0 is read only under #ifdef PROXIMAL (the plain program leaves it unread)."""
    from codegen.ops.optim import adam_kl, sgd_kl

    for k in (sgd_kl(True), sgd_kl(False), adam_kl()):
        src = glsl(k)
        assert "valueAt(_p)" in src and "getG" not in src
        head, rest = src.split("#ifdef PROXIMAL\n")
        variant, tail = rest.split("#endif\n")
        assert "getP0" not in head + tail and "getP0" in variant and "u_mu" not in head + tail
        assert "?" not in src and "if (" not in src, "u_first, u_nesterov, u_decoupled choose without a branch"
