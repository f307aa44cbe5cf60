"""Bad input is rejected with an Error that names the problem, and loses nothing trained."""
from __future__ import annotations

import pytest
import torch

from helpers import build_module, run_model
from models import mlp_45_31_7

# Each case: what the page calls with (x, y) of a good batch in scope, and words the message must hold.
BAD_CALLS = {
    "predict_wrong_length": ("await m.predict(x.subarray(0, 44), 1)", ["44 values", "45"], "bad-input-shape"),
    "predict_batch_zero": ("await m.predict(new Float32Array(0), 0)", ["batch is 0", "positive integer"], "bad-batch"),
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
    # unknown and misspelt options (issue 18, item 5): named, with the nearest valid key
    "fit_epoch_typo": ("await m.fit(x, y, { epoch: 3 })", ['"epoch"', 'did you mean "epochs"'], "bad-option"),
    "fit_batch_size_snake": ("await m.fit(x, y, { batch_size: 2 })", ['"batch_size"', '"batchSize"'], "bad-option"),
    "fit_top_level_lr": ("await m.fit(x, y, { lr: 0.5 })", ['fit options has no option "lr"'], "bad-option"),
    "fit_optimizer_learning_rate": ("await m.fit(x, y, { optimizer: { type: 'sgd', learningRate: 0.5 } })",
                                    ['"learningRate"', "lr, momentum"], "bad-option"),
    "fit_adam_momentum": ("await m.fit(x, y, { optimizer: { type: 'adam', momentum: 0.9 } })",
                          ['optimizer (adam) has no option "momentum"'], "bad-option"),
    "fit_trainable_outside": ("await m.fit(x, y, { trainable: ['nope.*'] })", ['"nope.*" names no parameter'],
                              "bad-option"),
    "fit_trainable_string": ("await m.fit(x, y, { trainable: '0.weight' })", ["trainable must be a non-empty array"],
                             "bad-option"),
    "gradients_typo": ("await m.gradients(x, y, { los: 'mse' })", ['"los"', 'did you mean "loss"'], "bad-option"),
    "create_model_precison": ("await mod.createModel({ precison: 'float32' })", ['"precison"', 'did you mean "precision"'],
                              "bad-option"),
    # types are checked, never coerced (item 6)
    "fit_optimizer_string": ("await m.fit(x, y, { optimizer: 'sgd' })", ["optimizer must be an object", '"sgd"'], "bad-option"),
    "fit_nesterov_string": ("await m.fit(x, y, { optimizer: { type: 'sgd', lr: 0.1, momentum: 0.9, nesterov: 'no' } })",
                            ["nesterov must be a boolean", '"no"'], "bad-option"),
    "fit_shuffle_string": ("await m.fit(x, y, { shuffle: 'false' })", ["shuffle must be a boolean", '"false"'], "bad-option"),
    "fit_epochs_float": ("await m.fit(x, y, { epochs: 1.5 })", ["epochs must be a positive integer", "1.5"], "bad-option"),
    "fit_on_step_number": ("await m.fit(x, y, { onStep: 5 })", ["onStep must be a function", "5"], "bad-option"),
    "create_model_timeout_string": ("await mod.createModel({ contextRestoreTimeout: 'soon' })",
                                    ["contextRestoreTimeout must be a finite number", '"soon"'], "bad-option"),
    "predict_batch_string": ("await m.predict(x.subarray(0, 45), '1')", ['batch is "1"', "positive integer"], "bad-batch"),
    # wrong array types (item 7)
    "predict_uint8": ("await m.predict(new Uint8Array(45).fill(200), 1)", ["Uint8Array", "Float32Array"], "bad-input"),
    "predict_uint8_clamped": ("await m.predict(new Uint8ClampedArray(45), 1)", ["Uint8ClampedArray", "Float32Array"], "bad-input"),
    "predict_int32": ("await m.predict(new Int32Array(45), 1)", ["Int32Array", "Float32Array"], "bad-input"),
    "predict_plain_array": ("await m.predict(Array.from(x.subarray(0, 45)), 1)", ["plain Array", "Float32Array"], "bad-input"),
    "predict_numeric_string": ("await m.predict('1,2,3', 1)", ["a string", "Float32Array"], "bad-input"),
    "fit_plain_labels": ("await m.fit(x, Array.from(y))", ["Int32Array", "plain Array"], "bad-labels"),
    "set_weights_uint8": ("await m.setWeights({ '0.bias': new Uint8Array(31) })", ["Uint8Array", "Float32Array"], "bad-input"),
    # TexelfitErrors, never plain TypeErrors (item 8)
    "fit_null_options": ("await m.fit(x, y, null)", ["fit options must be an object", "null"], "bad-option"),
    "gradients_null_options": ("await m.gradients(x, y, null)", ["gradients options must be an object"], "bad-option"),
    "create_model_null": ("await mod.createModel(null)", ["createModel options must be an object", "null"], "bad-option"),
    "create_model_div_canvas": ("await mod.createModel({ canvas: document.createElement('div') })",
                                ["canvas must be an HTMLCanvasElement or an OffscreenCanvas", "HTMLDivElement"], "bad-option"),
    "create_model_2d_canvas": ("const c = document.createElement('canvas'); c.getContext('2d'); await mod.createModel({ canvas: c })",
                               ["canvas given to createModel gives no WebGL2 context", "another context"], "no-webgl2"),
    "set_weights_null": ("await m.setWeights(null)", ["setWeights needs an object"], "bad-weights"),
    "save_number_key": ("await m.save(5)", ["save(key) needs a non-empty string key", "5"], "bad-key"),
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


# The same fault gives the same code whichever call meets it (item 8).
FAULTS = {
    "wrong_length": ("x.subarray(0, 100)", "bad-input-shape"),
    "uint8": ("new Uint8Array(4 * 45)", "bad-input"),
    "non_finite": ("(() => { const z = x.slice(); z[7] = NaN; return z; })()", "non-finite-input"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_fault_one_code_in_predict_fit_and_gradients(web, bundle_url, fault):
    expr, code = FAULTS[fault]
    torch.manual_seed(2)
    got = run_model(web, bundle_url, """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const code = async (f) => { try { await f(); return null; } catch (e) { return [e.name, e.code]; } };
        return { predict: await code(() => m.predict(%s, 4)), fit: await code(() => m.fit(%s, y)),
                 gradients: await code(() => m.gradients(%s, y)) };
    """ % (expr, expr, expr), {"x": torch.randn(4 * 45).tolist(), "y": torch.randint(0, 7, (4,)).tolist()})
    assert got == {k: ["TexelfitError", code] for k in ("predict", "fit", "gradients")}, got


def test_float64_input_is_converted(web, bundle_url):
    torch.manual_seed(3)
    got = run_model(web, bundle_url, """
        const x32 = new Float32Array(args), x64 = Float64Array.from(x32);
        return { a: Array.from(await m.predict(x32, 3)), b: Array.from(await m.predict(x64, 3)) };
    """, torch.randn(3 * 45).tolist())
    assert got["a"] == got["b"]


def test_one_error_class_across_two_bundles(web, bundle_url, site):
    torch.manual_seed(4)
    other = build_module(site, "errors_other", torch.nn.Sequential(torch.nn.Linear(45, 3)), (45,), max_batch=8)
    got = web.evaluate("""async ([a, b]) => {
        const A = await import(a), B = await import(b);
        const m = await B.createModel();
        let e = null;
        try { await m.predict(new Float32Array(3), 1); } catch (err) { e = err; }
        m.dispose();
        return { same: A.TexelfitError === B.TexelfitError, a: e instanceof A.TexelfitError, b: e instanceof B.TexelfitError,
                 code: e && e.code };
    }""", [bundle_url, other])
    assert got == {"same": True, "a": True, "b": True, "code": "bad-input-shape"}, got


class _Recurrent(torch.nn.Module):
    """A batch-first GRU or LSTM over [N, T, F] tokens, its last step into a head, as a new user writes it."""

    def __init__(self, kind):
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(8, 6, batch_first=True)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("kind, case, message", [
    ("GRU", "builds", None),
    ("LSTM", "steps", r"LSTM node '/rnn/LSTM': the sequence length of its input '/rnn/Transpose_output_0' is not fixed "
                      r"in the file \(shape \[None, None, 8\]\): export with a fixed sequence length"),
    ("GRU", "clip", r"GRU node '/rnn/GRU': clip=0.5 is not supported"),
    ("LSTM", "builds", None),
])
def test_a_recurrent_node_of_an_onnx_file_the_build_cannot_take_is_named(kind, case, message, tmp_path):
    """An ONNX file's GRU or LSTM node builds as its steps (prep/recurrent_onnx.py; numbers: tests/test_recurrent.py);
    one whose sequence length the file leaves free, or with an attribute PyTorch does not export (clip), fails the
    build naming the node and what it cannot take, before the graph is built."""
    import io

    import onnx
    from onnx import helper

    from texelfit.prep.graph import to_ir
    from texelfit.prep.load import BuildError, load_onnx

    buf = io.BytesIO()
    torch.onnx.export(_Recurrent(kind).eval(), (torch.randn(2, 5, 8),), buf, dynamo=False, input_names=["input"],
                      dynamic_axes={"input": {0: "batch", 1: "steps"} if case == "steps" else {0: "batch"}})
    model = onnx.load_from_string(buf.getvalue())
    node = next(n for n in model.graph.node if n.op_type == kind)
    if case == "clip":
        node.attribute.append(helper.make_attribute("clip", 0.5))
    path = tmp_path / "rnn.onnx"
    onnx.save(model, str(path))
    if message is None:
        graph = to_ir(load_onnx(str(path)), (5, 8))
        assert f"rnn.weight_hh_l0" in graph.params and "rnn.weight_ih_l0" in graph.params
        return
    with pytest.raises(BuildError, match=message):
        load_onnx(str(path))


class _Windows(torch.nn.Module):
    """Windows folded into the batch by a computed shape (x.view(n * 4, ...)), as Swin and MobileViT do; with
    `square`, by the batch size squared, which no model means."""

    def __init__(self, square=False):
        super().__init__()
        self.fc, self.square = torch.nn.Linear(4, 4), square

    def forward(self, x):
        n = x.shape[0]
        return self.fc(x.reshape(n * n if self.square else n * 4, -1)).reshape(n, -1)


def test_a_batch_folded_with_windows_builds_and_other_batch_arithmetic_is_named():
    """Issue 32: the shape arithmetic on the batch size gave numpy's "The 'out' kwarg is necessary when using the
    string multiply ufunc", then a build error; N * 4 is now the batch and 4 windows (the IR computes the module),
    and the batch size times itself fails naming the node and what it computes."""
    from texelfit.prep.graph import to_ir
    from texelfit.prep.load import BuildError, export_simplified
    from texelfit.prep.torch_ir import IRModule

    m = _Windows().eval()
    x = torch.randn(3, 16)
    torch.testing.assert_close(IRModule(to_ir(export_simplified(m, (16,)), (16,)))(x), m(x))
    with pytest.raises(BuildError) as e:
        to_ir(export_simplified(_Windows(square=True).eval(), (8,)), (8,))
    msg = str(e.value)
    assert "Mul node '/Mul': Mul of the shape values 'N' and 'N': only the batch size N times or divided by a " \
           "number" in msg, msg
    assert "ufunc" not in msg
