"""Issue 30: a GPU that cannot hold the model fails loudly.

The build plans the peak memory of a fit and a predict (codegen/memory.py: plan_memory) into report.json and
the bundle; a default --max-batch that plans more than the budget is lowered to the largest batch that fits;
createModel({ memoryBudget }) rejects a model that plans more with `out-of-memory`, naming its largest
tensor; a GL error during a fit makes it reject with the weights of the last snapshot, never resolve with
what the failed steps left (zeros, in the case of a readback buffer too large).

A GL error is forced with a real WebGL call that fails (gl.enable of an unknown capability: INVALID_ENUM)
on the model's own context, between two steps; a context loss with WEBGL_lose_context.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import assert_close, run_model
from models import blocked_cnn, mlp_45_31_7
from texelfit.build import DEFAULT_MAX_BATCH, compile_onnx
from texelfit.codegen.memory import planned_peak, role_bytes
from texelfit.prep.load import export_simplified
from texelfit.report import format_memory

BATCH = 8
STEPS = 200  # one epoch of the fit tests, unshuffled
CNN_SHAPE = (1, 12, 12)


@pytest.fixture(scope="module")
def cnn_onnx():
    torch.manual_seed(3)
    return export_simplified(blocked_cnn(), CNN_SHAPE)


def half(t):
    return t["texture"][0] * t["texture"][1] * 16


def test_the_report_plans_the_memory_of_a_fit_and_a_predict_and_it_grows_with_max_batch(cnn_onnx):
    reports = {b: compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, max_batch=b).report for b in (1, 8, 32)}
    for b, rep in reports.items():
        mem = rep["memory"]
        tex = {t["name"]: t for t in rep["textures"]}
        assert mem["max_batch"] == b and mem["max_batch_given"] and mem["reduced_from"] is None
        # the textures as the runtime allocates them: after sharing storage
        assert mem["fit"]["textures"] == mem["predict"]["textures"] == rep["texture_bytes_by_role"]["total_after"]
        assert rep["texture_bytes_by_role"]["total_after"] < rep["texture_bytes"]  # (sharing saves something here)
        # a snapshot: one half of every weight and optimizer state texture, at least 3 floats a parameter
        state = sum(half(t) for t in tex.values() if t["role"] in ("param", "state"))
        assert state >= 3 * 4 * rep["parameters"]
        assert mem["predict"]["snapshots"] == state and mem["fit"]["snapshots"] == 2 * state
        assert mem["fit"]["readback"] == state + half(tex["loss"])
        out = tex["act:" + rep["layers"][-1]["outputs"][0]]
        assert mem["predict"]["readback"] == half(out)
        for run in (mem["fit"], mem["predict"]):
            assert run["peak"] == run["textures"] + 2 * run["readback"] + run["snapshots"] + run["upload"]
        assert mem["fit_bytes"] == mem["fit"]["peak"] and mem["predict_bytes"] == mem["predict"]["peak"]
        biggest = max(rep["textures"], key=lambda t: t["bytes"])
        assert mem["largest_texture"] == {"name": biggest["name"], "bytes": biggest["bytes"]}
        assert mem["fit_bytes"] > mem["predict_bytes"]
    fits = [reports[b]["memory"]["fit_bytes"] for b in (1, 8, 32)]
    predicts = [reports[b]["memory"]["predict_bytes"] for b in (1, 8, 32)]
    assert fits[0] < fits[1] < fits[2] and predicts[0] < predicts[1] < predicts[2], (fits, predicts)


def test_a_frozen_bundle_plans_a_predict_alone(cnn_onnx):
    mem = compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, max_batch=4, trainable="none").report["memory"]
    assert mem["fit"] is None and mem["fit_bytes"] is None and planned_peak(mem) == mem["predict_bytes"] > 0


def test_a_default_max_batch_over_the_budget_is_lowered_to_the_largest_that_fits(cnn_onnx):
    peak = {b: planned_peak(compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, max_batch=b).report["memory"])
            for b in (19, 20, DEFAULT_MAX_BATCH)}
    assert peak[19] < peak[20] < peak[DEFAULT_MAX_BATCH]
    for budget, chosen in ((peak[20], 20), (peak[20] - 1, 19)):
        res = compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, memory_budget=budget)
        mem = res.report["memory"]
        assert res.report["max_batch"] == mem["max_batch"] == chosen and mem["reduced_from"] == DEFAULT_MAX_BATCH
        assert mem["fits"] and planned_peak(mem) == peak[chosen] and not mem["max_batch_given"]
        assert '"maxBatch":%d,' % chosen in res.files["m.js"]
        assert f"texelfit: --max-batch {chosen}, not the default {DEFAULT_MAX_BATCH}" in format_memory(mem)
    # within the budget the default stays; given explicitly, a batch is never changed (the report says it does not fit)
    same = compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, memory_budget=peak[DEFAULT_MAX_BATCH])
    assert same.report["max_batch"] == DEFAULT_MAX_BATCH and same.report["memory"]["reduced_from"] is None
    given = compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, max_batch=DEFAULT_MAX_BATCH, memory_budget=1000)
    assert given.report["max_batch"] == DEFAULT_MAX_BATCH and not given.report["memory"]["fits"]
    # none fits: batch 1, and the report says it does not fit
    tiny = compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, memory_budget=1000).report
    assert tiny["max_batch"] == 1 and not tiny["memory"]["fits"] and tiny["memory"]["reduced_from"] == DEFAULT_MAX_BATCH


def test_a_lowered_build_is_byte_identical_each_time(cnn_onnx):
    budget = planned_peak(compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, max_batch=20).report["memory"])
    a, b = (compile_onnx(cnn_onnx, name="m", input_shape=CNN_SHAPE, memory_budget=budget).files for _ in range(2))
    assert a == b and '"maxBatch":20,' in a["m.js"]


# ---- in the browser ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp(site):
    torch.manual_seed(21)
    module = mlp_45_31_7()
    res = compile_onnx(export_simplified(module, (45,)), name="model", input_shape=(45,), max_batch=BATCH)
    url = site.add_files("memory_mlp", res.files) + "/model.js"
    return {"url": url, "module": module, "memory": res.report["memory"]}


def test_a_memory_budget_below_the_plan_rejects_naming_the_largest_tensor(web, mlp):
    mem = mlp["memory"]
    planned = mem["fit_bytes"]
    x = torch.randn(3, 45, generator=torch.Generator().manual_seed(1))
    got = web.evaluate("""async ([url, planned, x]) => {
        const mod = await import(url);
        const attempt = async (options) => {
          try { const m = await mod.createModel(options); m.dispose(); return null; }
          catch (e) { return { code: e.code, message: e.message, name: e.name }; }
        };
        const out = {
          webgl: await attempt({ memoryBudget: planned - 1 }),
          cpu: await attempt({ backend: 'cpu', memoryBudget: planned - 1 }),
          zero: await attempt({ memoryBudget: 0 }),
          text: await attempt({ memoryBudget: '1GB' }),
          exact: await attempt({ memoryBudget: planned }),
        };
        // after the rejections, models on the same page: without a budget, and on the CPU with one that fits
        const m = await mod.createModel();
        const c = await mod.createModel({ backend: 'cpu', memoryBudget: planned });
        out.y = Array.from(await m.predict(new Float32Array(x), 3));
        out.yCpu = Array.from(await c.predict(new Float32Array(x), 3));
        m.dispose(); c.dispose();
        return out;
    }""", [mlp["url"], planned, x.reshape(-1).tolist()])
    for backend in ("webgl", "cpu"):
        e = got[backend]
        assert e is not None and e["name"] == "TexelfitError" and e["code"] == "out-of-memory", (backend, e)
        big = mem["largest_texture"]
        assert f'"{big["name"]}" ({big["bytes"]} bytes)' in e["message"], e["message"]
        assert f"plans {planned} bytes" in e["message"] and f"more than memoryBudget, {planned - 1};" in e["message"]
    assert got["zero"]["code"] == got["text"]["code"] == "bad-option"
    assert got["exact"] is None  # the plan itself fits
    ref = mlp["module"](x).detach().numpy()
    assert_close("predict after an out-of-memory rejection", got["y"], ref, atol=2e-5, rtol=2e-4)
    assert_close("predict on the cpu within the budget", got["yCpu"], ref, atol=2e-5, rtol=2e-4)


# the data, a canvas of the page's own (its context lost at will) and arr(): the start of both pages below
_PAGE_SETUP = """const x = new Float32Array(args.x), y = Int32Array.from(args.y);
const canvas = document.createElement('canvas');
document.body.appendChild(canvas);
const gl = canvas.getContext('webgl2');
const lose = gl.getExtension('WEBGL_lose_context');
const arr = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Array.from(v)]));
"""

FAIL_DURING_FIT = """
const mod = await import(args.url);
""" + _PAGE_SETUP + """const options = { batchSize: %d, epochs: 1, shuffle: false, optimizer: { type: 'adam', lr: 0.01 } };
const m = await mod.createModel({ canvas, contextRestoreTimeout: 300 });
const initial = arr(await m.getWeights());
let error = null, resolved = null, steps = 0, saved = null;
try {
  resolved = await m.fit(x, y, { ...options, onStep: ({ step }) => {
    steps++;
    if (step !== args.failAt) return;
    if (args.how === 'context-lost') return lose.loseContext();
    gl.enable(0x1234); // INVALID_ENUM on the model's context, as a failed call leaves
    // a save between two steps after the error must not swallow it (getError clears the flag it reads)
    if (args.how === 'gl-error-then-save') saved = m.save('memory-during').then(() => 'saved', (e) => e.code);
  } });
} catch (e) { error = { name: e.name, code: e.code, message: e.message }; }
saved = await saved;
if (saved) await m.deleteCheckpoint('memory-during');
const weights = arr(await m.getWeights());
const probe = x.subarray(0, 4 * 45);
const after = args.how !== 'context-lost' ? Array.from(await m.predict(probe, 4)) : null;
// the same model trained on the steps before the snapshot alone
const fresh = await mod.createModel();
await fresh.fit(x.subarray(0, args.snapshotAt * %d * 45), y.subarray(0, args.snapshotAt * %d), options);
const reference = arr(await fresh.getWeights());
const referenceY = Array.from(await fresh.predict(probe, 4));
fresh.dispose();
m.dispose();
return { error, resolved: resolved && resolved.loss.length, steps, initial, weights, reference, after, referenceY, saved };
""" % (BATCH, BATCH, BATCH)


@pytest.mark.parametrize("how", ["gl-error", "gl-error-then-save", "context-lost"])
def test_a_gpu_failure_during_fit_rejects_with_the_weights_of_the_last_snapshot(web, mlp, how):
    """The failure comes after step 80 (of 200): the block readback after step 64 found no GL error (it is
    in before step 72's loss readback starts), so the weights go back to the snapshot after step 64. A GL
    error is found by the next block readback (after step 128, awaited there) and rejects with gpu-error; a lost context
    not restored within contextRestoreTimeout rejects with context-lost. Either way getWeights gives the
    weights of a model that trained the first 64 steps alone, and after a GL error predict runs on them."""
    g = torch.Generator().manual_seed(5)
    n = STEPS * BATCH
    data = {"x": torch.randn(n, 45, generator=g).reshape(-1).tolist(),
            "y": torch.randint(0, 7, (n,), generator=g).tolist()}
    got = web.evaluate("async (args) => {" + FAIL_DURING_FIT + "}",
                       {"url": mlp["url"], **data, "how": how, "failAt": 80, "snapshotAt": 64})
    assert got["resolved"] is None, "the fit must not resolve"
    e = got["error"]
    assert e is not None and e["name"] == "TexelfitError", e
    if how != "context-lost":
        assert got["saved"] == ("saved" if how == "gl-error-then-save" else None)
        assert e["code"] == "gpu-error", e
        assert "GL_INVALID_ENUM" in e["message"] and "between steps 64 and 128 of this fit" in e["message"], e
        assert e["message"].endswith("the weights were rolled back to step 64"), e
        assert got["steps"] == 128, got["steps"]  # found by the block readback after step 128, which the loop awaits
    else:
        assert e["code"] == "context-lost" and "not restored within 300 ms" in e["message"], e
    for name, ref in got["reference"].items():
        np.testing.assert_array_equal(np.asarray(got["weights"][name], np.float32), np.asarray(ref, np.float32),
                                      err_msg=name)
        assert np.any(np.asarray(ref) != np.asarray(got["initial"][name])), f"{name}: the reference trained"
        assert np.any(np.asarray(ref) != 0)
    if how != "context-lost":
        np.testing.assert_array_equal(np.asarray(got["after"], np.float32), np.asarray(got["referenceY"], np.float32))


# ---- transfers in pieces -------------------------------------------------------------------------

PIECE = 512  # bytes: every texture of the MLP above goes up and comes back in several pieces


@pytest.fixture(scope="module")
def pieces(site):
    """The MLP built twice: with the default transfer piece (64 MiB: every transfer one piece), and with
    PIECE bytes."""
    torch.manual_seed(21)
    module = mlp_45_31_7()
    onnx_model = export_simplified(module, (45,))
    urls = {}
    for name, piece in (("whole", None), ("pieces", PIECE)):
        res = compile_onnx(onnx_model, name="model", input_shape=(45,), max_batch=BATCH, transfer_piece_bytes=piece)
        urls[name] = site.add_files(f"memory_{name}", res.files) + "/model.js"
    return urls, module


IN_PIECES = """async (args) => {
const mod = await import(args.url), whole = await import(args.wholeUrl);
""" + _PAGE_SETUP + """const options = { batchSize: %d, epochs: 1, shuffle: true, seed: 3, optimizer: { type: 'adam', lr: 0.01 } };
const proto = WebGL2RenderingContext.prototype, readPixels = proto.readPixels, texSubImage2D = proto.texSubImage2D;
const calls = { read: 0, upload: 0 };
proto.readPixels = function (...a) { calls.read++; return readPixels.apply(this, a); };
proto.texSubImage2D = function (...a) { calls.upload++; return texSubImage2D.apply(this, a); };
const count = async (fn) => { calls.read = calls.upload = 0; const r = await fn(); return [r, { ...calls }]; };
try {
  const [m, created] = await count(() => mod.createModel({ canvas, ...args.options }));
  const [ref, createdWhole] = await count(() => whole.createModel(args.options));
  const [w0, read] = await count(async () => arr(await m.getWeights()));
  const [w0Whole, readWhole] = await count(async () => arr(await ref.getWeights()));
  // a fit whose context is lost after its first block snapshot (step 64) and restored: the snapshot
  // came back in pieces, and goes up in pieces
  let restores = 0;
  canvas.addEventListener('webglcontextrestored', () => restores++);
  const fit = await m.fit(x, y, { ...options, onStep: ({ step }) => {
    if (step === 70 && !restores) { lose.loseContext(); setTimeout(() => lose.restoreContext(), 30); }
  } });
  const fitWhole = await ref.fit(x, y, options);
  const w1 = arr(await m.getWeights()), w1Whole = arr(await ref.getWeights());
  // saved and restored into another model, which trains on as the first does
  await m.save('pieces');
  const again = await mod.createModel(args.options);
  await again.restore('pieces');
  const w2 = arr(await again.getWeights());
  const more = await again.fit(x.subarray(0, 16 * 45), y.subarray(0, 16), options);
  const moreWhole = await ref.fit(x.subarray(0, 16 * 45), y.subarray(0, 16), options);
  const w3 = arr(await again.getWeights()), w3Whole = arr(await ref.getWeights());
  await again.deleteCheckpoint('pieces');
  for (const model of [m, ref, again]) model.dispose();
  return { created, createdWhole, read, readWhole, restores, w0, w0Whole, w1, w1Whole, w2, w3, w3Whole,
           loss: fit.loss, lossWhole: fitWhole.loss, more: more.loss, moreWhole: moreWhole.loss, info: m.info };
} finally {
  proto.readPixels = readPixels;
  proto.texSubImage2D = texSubImage2D;
}
}""" % BATCH


@pytest.mark.parametrize("options", [{}, {"precision": "rgba8", "maxTextureSize": 40}], ids=["float32", "rgba8_folded"])
def test_uploads_snapshots_and_restores_in_pieces_give_the_same_model(web, pieces, options):
    """With transfers of PIECE bytes each, createModel's uploads, getWeights, a fit's snapshots, a context
    lost and restored, save and restore all go in pieces (more readPixels and texSubImage2D calls than whole),
    and the model is the same, bit for bit, as the one built with whole transfers."""
    urls, module = pieces
    g = torch.Generator().manual_seed(8)
    n = 80 * BATCH
    got = web.evaluate(IN_PIECES, {"url": urls["pieces"], "wholeUrl": urls["whole"], "options": options,
                                   "x": torch.randn(n, 45, generator=g).reshape(-1).tolist(),
                                   "y": torch.randint(0, 7, (n,), generator=g).tolist()})
    if options:
        assert got["info"]["precision"] == "rgba8" and got["info"]["foldedTextures"] > 0
    assert got["read"]["read"] > got["readWhole"]["read"] == len(module.state_dict()), (got["read"], got["readWhole"])
    assert got["created"]["upload"] > got["createdWhole"]["upload"], (got["created"], got["createdWhole"])
    assert got["restores"] == 1
    state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    for k, ref in state.items():
        np.testing.assert_array_equal(np.asarray(got["w0"][k], np.float32), ref.reshape(-1), err_msg=k)
    assert got["w0"] == got["w0Whole"]
    assert len(got["loss"]) == 80 and got["loss"] == got["lossWhole"]
    assert got["w1"] == got["w1Whole"] and got["w2"] == got["w1"]
    assert got["more"] == got["moreWhole"] and got["w3"] == got["w3Whole"]
    assert got["w1"] != got["w0"]
