"""Bad input is rejected with an Error that names the problem, and loses nothing trained."""
from __future__ import annotations

import pytest
import torch

from helpers import build_module, run_model
from models import mlp_45_31_7

# Each case: what the page calls with (x, y) of a good batch in scope, and words the message must hold.
BAD_CALLS = {
    "predict_wrong_length": ("await m.predict(x.subarray(0, 44), 1)", ["44 values", "45"], "bad-input-shape"),
    "predict_batch_over_max": ("await m.predict(new Float32Array(45 * 9), 9)", ["batch", "maxBatch = 8"], "bad-batch"),
    "predict_non_finite": ("const z = x.slice(); z[50] = NaN; await m.predict(z, 4)", ["x[50]", "NaN", "finite"], "non-finite-input"),
    "fit_label_out_of_range": ("const yy = y.slice(); yy[2] = 7; await m.fit(x, yy, { optimizer: { type: 'sgd', lr: 0.1 } })",
                               ["y[2] = 7", "[0, 7)"], "label-out-of-range"),
    "fit_negative_label": ("const yy = y.slice(); yy[0] = -1; await m.fit(x, yy)", ["y[0] = -1"], "label-out-of-range"),
    "fit_non_finite": ("const z = x.slice(); z[3] = Infinity; await m.fit(z, y)", ["x[3]", "Infinity"], "non-finite-input"),
    "fit_wrong_length": ("await m.fit(x.subarray(0, 100), y)", ["100 values", "45"], "bad-input-shape"),
    "fit_label_count": ("await m.fit(x, y.subarray(0, 3))", ["3 labels", "4"], "bad-labels"),
    "fit_batch_over_max": ("await m.fit(x, y, { batchSize: 9 })", ["batchSize is 9", "maxBatch = 8"], "bad-batch"),
    "fit_bad_optimizer": ("await m.fit(x, y, { optimizer: { type: 'rmsprop' } })", ["rmsprop"], "bad-option"),
    "fit_bad_loss": ("await m.fit(x, y, { loss: 'hinge' })", ["hinge"], "bad-option"),
    "fit_mse_targets_shape": ("await m.fit(x, new Float32Array(5), { loss: 'mse' })", ["5 values", "7"], "bad-targets"),
    "set_weights_unknown": ("await m.setWeights({ nope: new Float32Array(3) })", ["nope", "0.weight"], "unknown-weight"),
    "set_weights_shape": ("await m.setWeights({ '0.bias': new Float32Array(3) })", ["0.bias", "31"], "bad-weight-shape"),
}

BODY = """
const x = new Float32Array(args.x);
const y = Int32Array.from(args.y);
// train a little first: what was trained must survive the bad call
await m.fit(x, y, { batchSize: 4, epochs: 2, shuffle: false, optimizer: { type: 'adam', lr: 0.01 } });
const before = arr(await m.getWeights());
let error = null;
try {
  %s;
} catch (e) {
  error = { name: e.name, message: e.message, code: e.code, isError: e instanceof Error };
}
const after = arr(await m.getWeights());
return { error, same: JSON.stringify(before) === JSON.stringify(after) };
"""


@pytest.fixture(scope="module")
def bundle_url(site):
    torch.manual_seed(1)
    return build_module(site, "errors_mlp", mlp_45_31_7(), (45,), max_batch=8)


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_call_rejects_and_keeps_weights(web, bundle_url, case):
    call, words, code = BAD_CALLS[case]
    torch.manual_seed(2)
    got = run_model(web, bundle_url, BODY % call,
                    {"x": torch.randn(4 * 45).tolist(), "y": torch.randint(0, 7, (4,)).tolist()})
    err = got["error"]
    assert err is not None, f"{case}: the call did not reject"
    assert err["isError"] and err["name"] == "TexelfitError" and err["code"] == code, err
    for w in words:
        assert w in err["message"], f"{case}: {w!r} not in {err['message']!r}"
    assert got["same"], f"{case}: the weights changed"


def test_texture_limit_is_checked_at_create_model(web, bundle_url):
    # act:input (12x8 texels) folds into 10x10; the first weight (12x32 = 384 texels) cannot
    msg = web.evaluate("""async (url) => {
        const mod = await import(url);
        try { await mod.createModel({ maxTextureSize: 10 }); return null; } catch (e) { return e.message; }
    }""", bundle_url)
    assert msg == ('texelfit: texture "param:0.weight" (12x32 texels) cannot be laid out within the '
                   'texture size limit of 10'), msg


def test_weights_round_trip_and_disposed_model(web, bundle_url):
    got = web.evaluate("""async (url) => {
        const mod = await import(url);
        const m = await mod.createModel({ canvas: document.getElementById('c') });
        const w = await m.getWeights();
        w['0.bias'] = w['0.bias'].map((v, i) => i * 0.5);
        await m.setWeights({ '0.bias': w['0.bias'] });
        const back = await m.getWeights();
        m.dispose();
        let err = null;
        try { await m.predict(new Float32Array(45), 1); } catch (e) { err = e.code; }
        return { bias: Array.from(back['0.bias']), err, info: m.info };
    }""", bundle_url)
    assert got["bias"] == [i * 0.5 for i in range(31)]
    assert got["err"] == "disposed"
    info = got["info"]
    assert info["inputShape"] == [45] and info["outputShape"] == [7] and info["maxBatch"] == 8
    assert info["backend"] == "webgl2" and info["precision"] == "float32" and info["parameters"] == 45 * 31 + 31 + 31 * 7 + 7
