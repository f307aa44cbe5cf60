"""Quantised weight shipping (prep/quantize.py, runtime/weights.js): error bounds, blob sizes,
exact decoding in the page, the checksum, and quantised bundles that run and train like PyTorch
from the decoded weights.

Bounds, per value w and its shipped w':
  fp16   |w' - w| <= 2^-11 |w| + 2^-25            (half's rounding to nearest; subnormals below 2^-14)
  int8   |w' - w| <= scale_c / 2 * (1 + 2^-22)    scale_c = max |w| of output channel c / 127
The page must decode exactly what Python computes (bit for bit), so parity with PyTorch is
checked against the decoded weights at the usual tolerances (helpers.FWD, TRAJ_W, TRAJ_LOSS).
"""
from __future__ import annotations

import base64
import re
import struct
import zlib

import numpy as np
import pytest
import torch

from helpers import FIT, FWD, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, run_model, torch_fit
from models import MatMulAdd, PRUNABLE_SHAPE, PrunableNet
from texelfit.build import compile_onnx
from texelfit.examples import digits_cnn
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.graph import to_ir
from texelfit.prep.load import BuildError, export_simplified
from texelfit.prep.quantize import ENTRY, HEADER, TRAILER, decode, quantize
from texelfit.prep.torch_ir import IRModule, name as param_name

CASES = {"digits_cnn": (digits_cnn, (1, 8, 8)), "prunable": (PrunableNet, PRUNABLE_SHAPE),
         "matmul_add": (MatMulAdd, (45,))}  # MatMulAdd's weight is stored [in, out]


def ir(case, seed=0):
    factory, shape = CASES[case]
    torch.manual_seed(seed)
    return fold_batchnorm(to_ir(export_simplified(factory().eval(), shape), shape))


def weights_of(graph):
    """Names of the conv/dense weights (quantised); the rest (biases) ship as float32."""
    return {l.params["weight"] for l in graph.layers if "weight" in l.params}


def channel_index(p):
    """Output channel of every value of a weight, in its stored order."""
    if p.transposed:
        return np.broadcast_to(np.arange(p.array.shape[1])[None, :], p.array.shape).reshape(-1)
    return np.repeat(np.arange(p.array.shape[0]), p.array.size // p.array.shape[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp16_error_bound(case):
    g = ir(case)
    q = quantize(g, "fp16")
    for n, p in g.params.items():
        w, back = p.array.astype(np.float64), q.graph.params[n].array.astype(np.float64)
        if n in weights_of(g):
            assert np.all(np.abs(back - w) <= 2.0 ** -11 * np.abs(w) + 2.0 ** -25), n
            assert np.array_equal(back, w.astype(np.float16).astype(np.float64)), "round to nearest even"
        else:
            assert np.array_equal(back, w), f"{n} ships as float32"


@pytest.mark.parametrize("case", sorted(CASES))
def test_int8_error_bound(case):
    g = ir(case)
    q = quantize(g, "int8")
    for n, p in g.params.items():
        w, back = p.array.reshape(-1).astype(np.float64), q.graph.params[n].array.reshape(-1).astype(np.float64)
        if n not in weights_of(g):
            assert np.array_equal(back, w), f"{n} ships as float32"
            continue
        ch = channel_index(p)
        amax = np.zeros(ch.max() + 1)
        np.maximum.at(amax, ch, np.abs(w))
        scale = amax / 127
        assert np.all(np.abs(back - w) <= scale[ch] / 2 * (1 + 2.0 ** -22)), n
        # per channel: the largest value survives (up to float32 rounding), and at most 255 levels are used
        for c in range(len(amax)):
            vals = back[ch == c]
            assert abs(np.max(np.abs(vals)) - amax[c]) <= 1e-6 * amax[c]
            assert len(np.unique(vals)) <= 255


def test_special_values_and_zero_channels():
    g = ir("matmul_add")
    w = g.params["w"].array.copy()  # [45, 7] stored [in, out]: channel = column
    w[:, 2] = 0  # a channel of zeros: scale 0, every value 0
    w[0, :] = [65504, -65504, 0, 2.0 ** -24, -(2.0 ** -20), 6.1e-5, -0.0]
    g.params["w"].array = w
    fp16 = quantize(g, "fp16").graph.params["w"].array
    assert fp16[0].tolist() == [65504, -65504, 0, 2.0 ** -24, -(2.0 ** -20), np.float32(np.float16(6.1e-5)), 0]
    int8 = quantize(g, "int8").graph.params["w"].array
    assert not int8[:, 2].any()
    assert abs(int8[0, 0] - 65504) <= 65504 * 1e-6 and abs(int8[0, 1] + 65504) <= 65504 * 1e-6
    w[3, 4] = 70000
    with pytest.raises(BuildError, match=r"weight 'w' has a value of magnitude 70000, beyond float16's range"):
        quantize(g, "fp16")
    w[3, 4] = np.nan
    with pytest.raises(BuildError, match="weight 'w' has non-finite values"):
        quantize(g, "int8")


def blob_size(graph, mode):
    """The blob's size by the format's arithmetic (prep/quantize.py): header, table, data padded to 4, CRC."""
    size = HEADER + TRAILER
    for n, p in graph.params.items():
        quantised = mode != "none" and n in weights_of(graph)
        channels = (p.array.shape[1] if p.transposed else p.array.shape[0]) if quantised else 0
        data = (2 * p.array.size if mode == "fp16" else 4 * channels + p.array.size) if quantised else 4 * p.array.size
        size += ENTRY + data + (-data % 4)
    return size


@pytest.mark.parametrize("case", sorted(CASES))
def test_shipped_bytes_shrink_by_the_expected_factors(case):
    g = ir(case)
    sizes = {mode: len(quantize(g, mode).blob) for mode in ("none", "fp16", "int8")}
    for mode, size in sizes.items():
        assert size == blob_size(g, mode), mode
    n_weights = sum(g.params[n].array.size for n in weights_of(g))
    n_total = g.parameter_count()
    # float32 -> half saves 2 bytes a weight value, -> int8 3 bytes (less 4 per channel for its scale)
    assert sizes["none"] - sizes["fp16"] >= 2 * n_weights - 3 * len(g.params)
    assert sizes["none"] - sizes["int8"] >= 3 * n_weights - 4 * sum(
        g.params[n].array.shape[1 if g.params[n].transposed else 0] for n in weights_of(g)) - 3 * len(g.params)
    if case == "digits_cnn":  # 19,178 parameters, 18,992 of them weights
        assert n_total == 19178 and sizes["none"] == 4 * n_total + 16 + 16 * len(g.params)
        assert sizes["fp16"] / sizes["none"] < 0.51 and sizes["int8"] / sizes["none"] < 0.27


@pytest.mark.parametrize("mode", ["none", "fp16", "int8"])
def test_python_decoder_reads_the_blob_exactly(mode):
    g = ir("prunable")
    q = quantize(g, mode)
    for arr, p in zip(decode(q.blob), q.graph.params.values()):
        assert np.array_equal(arr, p.array.reshape(-1))
    bad = bytearray(q.blob)
    bad[len(bad) // 2] ^= 0x10
    with pytest.raises(ValueError, match="checksum"):
        decode(bytes(bad))
    assert struct.unpack("<I", q.blob[-4:])[0] == zlib.crc32(q.blob[:-4])


@pytest.mark.parametrize("mode", ["fp16", "int8"])
def test_quantised_builds_are_deterministic(mode):
    model = export_simplified(PrunableNet().eval(), PRUNABLE_SHAPE)
    a = compile_onnx(model, name="m", quantize=mode, prune=0.5).files
    b = compile_onnx(model, name="m", quantize=mode, prune=0.5).files
    assert a == b


def test_unknown_mode_is_refused():
    with pytest.raises(BuildError, match="--quantize must be one of none, fp16, int8, got 'int4'"):
        quantize(ir("matmul_add"), "int4")


# ---- the browser ----------------------------------------------------------------------------------

def bundle(site, folder, case, mode, max_batch=64):
    factory, shape = CASES[case]
    torch.manual_seed(0)
    model = export_simplified(factory().eval(), shape)
    result = compile_onnx(model, name="model", input_shape=shape, quantize=mode, max_batch=max_batch)
    return f"{site.add_files(folder, result.files)}/model.js", result


@pytest.mark.parametrize("mode", ["none", "fp16", "int8"])
@pytest.mark.parametrize("case", ["prunable", "matmul_add"])
def test_page_decodes_exactly_what_python_ships(web, site, case, mode):
    url, result = bundle(site, f"q_{case}_{mode}", case, mode)
    got = run_model(web, url, "return arr(await m.getWeights());")
    shipped = result.weights.graph.params
    assert sorted(got) == sorted(shipped)
    for n, p in shipped.items():
        ref = p.array.reshape(-1)
        back = np.asarray(got[n], dtype=np.float32)
        assert np.array_equal(back.view(np.uint32), ref.view(np.uint32)), f"{n}: not bit-exact"
    original = ir(case).params
    changed = [n for n in shipped if not np.array_equal(shipped[n].array, original[n].array)]
    assert sorted(changed) == (sorted(weights_of(result.weights.graph)) if mode != "none" else []), changed


def test_page_decodes_half_exactly_with_special_values(web, site):
    # every finite half bit pattern, through one weight of a dense layer (4096 x 16 would be too big: 60 x 1024)
    halves = np.arange(0, 65536, dtype=np.uint16).view(np.float16)
    finite = halves[np.isfinite(halves)].astype(np.float32)  # 63,490 values, zeros and subnormals included
    w = np.zeros((1024, 62), np.float32)
    w.reshape(-1)[: finite.size] = finite
    lin = torch.nn.Linear(62, 1024, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
    result = compile_onnx(export_simplified(lin, (62,)), name="model", input_shape=(62,), quantize="fp16",
                          max_batch=1)
    url = site.add_files("q_halves", result.files) + "/model.js"
    got = np.asarray(run_model(web, url, "return Array.from((await m.getWeights())['weight']);"), np.float32)
    assert np.array_equal(got.view(np.uint32), w.reshape(-1).view(np.uint32)), \
        "decoded halves differ from float16 -> float32 (signed zeros, subnormals and the largest values included)"


CORRUPTIONS = {
    # what is done to the base64 text of WEIGHTS, and what the message must say
    "one_character": (lambda b: b[:40] + ("A" if b[40] != "A" else "B") + b[41:], "checksum mismatch"),
    "one_bit_of_a_weight": (None, "checksum mismatch"),
    "truncated": (lambda b: b[: len(b) // 2 // 4 * 4], "checksum mismatch"),
    "invalid_base64": (lambda b: b[:10] + "*" + b[11:], "base64"),
    "empty": (lambda b: "", "too short"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupted_weights_fail_at_create_model(web, site, case):
    url, result = bundle(site, "q_good", "matmul_add", "int8")
    js = result.files["model.js"]
    b64 = re.search(r'const WEIGHTS = "([^"]*)";', js).group(1)
    edit, words = CORRUPTIONS[case]
    if edit is None:  # flip one bit in the middle of the data, re-encode
        raw = bytearray(base64.b64decode(b64))
        raw[len(raw) // 2] ^= 0x04
        bad = base64.b64encode(bytes(raw)).decode()
    else:
        bad = edit(b64)
    assert bad != b64
    broken = js.replace(f'const WEIGHTS = "{b64}";', f'const WEIGHTS = "{bad}";')
    url = site.add_files(f"q_corrupt_{case}", {"model.js": broken}) + "/model.js"
    err = web.evaluate("""async (url) => {
        const mod = await import(url);
        try { await mod.createModel(); return null; }
        catch (e) { return { code: e.code, name: e.name, message: e.message }; }
    }""", url)
    assert err is not None, "createModel accepted corrupted weights"
    assert err["name"] == "TexelfitError" and err["code"] == "corrupt-weights", err
    assert "the weights in this bundle are corrupted" in err["message"] and words in err["message"], err


@pytest.mark.parametrize("mode", ["fp16", "int8"])
def test_quantised_bundle_predicts_and_trains_like_pytorch_from_the_shipped_weights(web, site, mode):
    url, result = bundle(site, f"q_train_{mode}", "prunable", mode, max_batch=8)
    module = IRModule(result.weights.graph)  # the decoded weights, unfused: what PyTorch starts from
    torch.manual_seed(6)
    x = torch.randn((21,) + PRUNABLE_SHAPE)
    y = torch.randint(0, 7, (21,))
    pred = run_model(web, url, "return Array.from(await m.predict(new Float32Array(args), 8));",
                     x[:8].reshape(-1).tolist())
    assert_close(f"{mode} forward", pred, module(x[:8]).detach().numpy(), **FWD)
    cfg = OPTIMIZERS["adam"]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "loss": "cross_entropy",
                                    "optimizer": cfg, "batchSize": 8, "epochs": 2})
    ref = torch_fit(module, x, y, "cross_entropy", cfg, 8, 2)
    assert_close(f"{mode} losses", got["loss"], ref, **TRAJ_LOSS)
    for k, p in module.named_parameters():
        n = param_name(k[len("p."):])
        assert_close(f"{mode} {n} after 6 steps", got["weights"][n], p.detach().numpy(), **TRAJ_W)
