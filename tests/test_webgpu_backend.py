"""The WebGPU backend (runtime/webgpu.js, a bundle built with --webgpu): the same API and schedule as WebGL2 and the
CPU backend, its kernels the generic ones printed as WGSL compute shaders (codegen/kl_wgsl.py), run by Chromium on
SwiftShader's WebGPU adapter (--enable-unsafe-webgpu). A missing adapter fails these tests loudly: it is not a skip.

Its parity checks against PyTorch (every op's forward and gradients, trajectories) are test_backend_parity.py's, with
the CPU backend's. Here: what is WebGPU's own (convs reading column parts, the proximal term, EfficientNet and MiniLM
in their own files), and the API around the backend (info, the default choice, pause and resume, checkpoints shared
with WebGL2, a lost device, a worker, dispose, its errors), with the tolerances of test_ops.py.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from helpers import (FWD, PAUSE_PRELUDE, PAUSED_AT_STEP_7, TRAJ_LOSS, TRAJ_W, assert_close, build_module,
                     check_training, pause_data, run_model)
from models import SmallCNN, mlp_45_31_7

WEBGPU = {"backend": "webgpu"}


@pytest.fixture
def web(webgpu_web):
    return webgpu_web


def small_cnn():
    return SmallCNN(1, 10)


def test_small_cnn_trajectory_with_the_proximal_term(web, site):
    got = check_training(web, site, small_cnn, (1, 12, 12), "adam", "cross_entropy", samples=21,
                         batch_size=8, epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=WEBGPU, mu=0.5)
    assert got["info"]["backend"] == "webgpu"


# ---- the API around the backend ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_bundle(site):
    torch.manual_seed(21)
    return build_module(site, "webgpu_lifecycle", mlp_45_31_7(), (45,), max_batch=8, webgpu=True)


def test_info_pause_resume_and_checkpoints_shared_with_webgl2(web, mlp_bundle):
    """Pause and resume mid-fit give the uninterrupted run; a checkpoint saved on WebGPU restores on WebGL2 and one
    saved on WebGL2 on WebGPU, the fits after them equal within float32 rounding; dispose frees the device."""
    data = pause_data()
    got = run_model(web, mlp_bundle, PAUSE_PRELUDE + """
        const straight = await mod.createModel({ backend: 'webgpu' });
        const reference = (await straight.fit(x, y, opts({}))).loss;
        const refWeights = arr(await straight.getWeights());
        straight.dispose();

""" + PAUSED_AT_STEP_7 + """        const resumed = arr(await m.getWeights());

        // WebGPU -> WebGL2 -> WebGPU: one more epoch on each side of each checkpoint
        await m.save('webgpu-progress');
        const gl = await mod.createModel({ backend: 'webgl2' });
        await gl.restore('webgpu-progress');
        const restoredOnGl = arr(await gl.getWeights());
        await gl.fit(x, y, opts({ epochs: 1 }));
        await m.fit(x, y, opts({ epochs: 1 }));
        await gl.save('webgl2-progress');
        const back = await mod.createModel({ backend: 'webgpu' });
        await back.restore('webgl2-progress');
        const fromGl = arr(await back.getWeights());
        const afterGpu = arr(await m.getWeights()), afterGl = arr(await gl.getWeights());
        const out = Array.from(await back.predict(x.subarray(0, 45 * 11), 11)); // (more than maxBatch 8)
        const outGl = Array.from(await gl.predict(x.subarray(0, 45 * 11), 11));
        gl.dispose();
        back.dispose();
        let disposed = null;
        try { await back.predict(x.subarray(0, 45), 1); } catch (e) { disposed = e.code; }
        return { info: m.info, states, paused, later, steps, loss, reference, refWeights, resumed, restoredOnGl,
                 fromGl, afterGpu, afterGl, out, outGl, disposed };
    """, data, WEBGPU)
    info = got["info"]
    assert info["backend"] == "webgpu" and info["precision"] == "float32" and info["foldedTextures"] == 0
    assert got["states"] == ["idle", "paused", "idle"]
    assert got["paused"] == got["later"] == 8, "no step may run while paused"
    assert got["steps"] == 30
    assert got["loss"] == got["reference"] and got["resumed"] == got["refWeights"], "pause/resume changed the run"
    assert got["restoredOnGl"] == got["resumed"], "WebGL2 restored other weights than WebGPU saved"
    assert got["fromGl"] == got["afterGl"], "WebGPU restored other weights than WebGL2 saved"
    for name in got["afterGpu"]:  # one epoch from the same state on each backend
        assert_close(f"{name} after an epoch on each backend", got["afterGpu"][name], got["afterGl"][name], **TRAJ_W)
    assert_close("predict of 11 on WebGPU and WebGL2", got["out"], got["outGl"], **FWD)
    assert got["disposed"] == "disposed"


def test_bad_options_and_an_adapter_missing(web, mlp_bundle):
    got = run_model(web, mlp_bundle, """
        const codes = {};
        const attempt = async (what, options) => {
          try { await mod.createModel(options); codes[what] = null; } catch (e) { codes[what] = [e.code, e.message]; }
        };
        await attempt('precision', { backend: 'webgpu', precision: 'float16' });
        await attempt('canvas', { backend: 'webgpu', canvas: document.getElementById('c') });
        const requestAdapter = navigator.gpu.requestAdapter;
        navigator.gpu.requestAdapter = async () => null;
        await attempt('adapter', { backend: 'webgpu' });
        navigator.gpu.requestAdapter = requestAdapter;
        return codes;
    """, {}, WEBGPU)
    assert got["precision"][0] == "unsupported-precision" and "float32" in got["precision"][1]
    assert got["canvas"][0] == "bad-option" and "webgl2" in got["canvas"][1]
    assert got["adapter"][0] == "no-webgpu" and "adapter" in got["adapter"][1]


# every device the page's adapters give, kept where a test can destroy it (GPUDevice.destroy: a lost device)
KEEP_DEVICES = """
window.devices = [];
const requestDevice = GPUAdapter.prototype.requestDevice;
GPUAdapter.prototype.requestDevice = async function (...a) {
  const d = await requestDevice.apply(this, a);
  window.devices.push(d);
  return d;
};
"""


@pytest.mark.parametrize("lose_at", [[10], [5, 70, 150]], ids=["mid_block", "three_times"])
def test_a_lost_device_is_replaced_with_nothing_lost(web, mlp_bundle, lose_at):
    """device.destroy() mid-fit (once, and three times, one of them past the first block's snapshot): the model goes
    'lost', gets a new device, loads its last snapshot and replays from it; the fit ends as an uninterrupted one."""
    g = torch.Generator().manual_seed(9)
    data = {"x": torch.randn(400 * 45, generator=g).tolist(), "y": torch.randint(0, 7, (400,), generator=g).tolist(),
            "loseAt": lose_at}
    web.evaluate("(code) => { (0, eval)(code); }", KEEP_DEVICES)
    got = run_model(web, mlp_bundle, """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const opts = (extra) => ({ batchSize: 8, epochs: 4, shuffle: true, seed: 2,
                                   optimizer: { type: 'adam', lr: 0.01 }, ...extra });
        const states = [], done = new Set(), steps = [];
        const r = await m.fit(x, y, opts({ onStep: ({ step }) => {
          steps.push(step);
          if (args.loseAt.includes(step) && !done.has(step)) {
            done.add(step);
            window.devices[window.devices.length - 1].destroy();
            states.push(m.state);
            window.devices[window.devices.length - 1].lost.then(() => states.push(m.state));
          }
        } }));
        const devices = window.devices.length, weights = arr(await m.getWeights());
        const fresh = await mod.createModel({ backend: 'webgpu' });
        const reference = await fresh.fit(x, y, opts({}));
        return { states, steps, devices, loss: r.loss, reference: reference.loss, state: m.state, weights,
                 refWeights: arr(await fresh.getWeights()), backend: m.info.backend };
    """, data, WEBGPU)
    assert got["states"] == ["training", "lost"] * len(lose_at) and got["state"] == "idle" and got["backend"] == "webgpu"
    # each loss replays from the last snapshot (one every 64 steps): the steps from it to the loss (and the few the
    # loop ran ahead of onStep) are seen again
    replayed = [step for i, step in enumerate(got["steps"]) if step in got["steps"][:i]]
    assert replayed[0] == lose_at[0] // 64 * 64, replayed
    for at in lose_at:
        assert set(range(at // 64 * 64, at + 1)) <= set(replayed), (at, replayed)
    assert got["devices"] == 1 + len(lose_at), "a new device for each loss"
    assert got["loss"] == got["reference"] and got["weights"] == got["refWeights"]


def test_a_webgpu_build_is_deterministic_and_carries_wgsl_only_when_asked():
    from texelfit.build import compile_onnx
    from texelfit.prep.load import export_simplified

    torch.manual_seed(3)
    onnx_model = export_simplified(SmallCNN(1, 10), (1, 12, 12))
    build = lambda **o: compile_onnx(onnx_model, name="m", input_shape=(1, 12, 12), max_batch=8, **o).files["m.js"]  # noqa: E731
    a, b, plain = build(webgpu=True), build(webgpu=True), build()
    assert a == b, "the same inputs give a byte-identical bundle"
    assert "const WGSL = [" in a and "@compute @workgroup_size(64)" in a and "class WebGpuDevice" in a
    assert "const WGSL" not in plain and "WebGpuDevice" not in plain and "build it with --webgpu" in plain
    for js in (a, plain):
        assert "eval(" not in js and "new Function" not in js


def test_the_default_is_webgpu_where_it_runs(web, site, mlp_bundle):
    """createModel() on a bundle built with --webgpu: WebGPU where an adapter runs it (info.fallbackReason null),
    WebGL2 where none does (the reason given, nothing in the console) or where a WebGL2-only option asks for it; a
    bundle without WGSL starts from WebGL2."""
    torch.manual_seed(2)
    plain = build_module(site, "webgpu_plain", mlp_45_31_7(), (45,), max_batch=8)
    got = run_model(web, mlp_bundle, """
        const info = async (url, options) => {
          const mm = await (await import(url)).createModel(options);
          const r = { backend: mm.info.backend, precision: mm.info.precision, why: mm.info.fallbackReason };
          mm.dispose();
          return r;
        };
        const out = { first: m.info.backend, firstWhy: m.info.fallbackReason,
                      rgba8: await info(args.url, { precision: 'rgba8' }), plain: await info(args.plain, {}) };
        const requestAdapter = navigator.gpu.requestAdapter;
        navigator.gpu.requestAdapter = async () => null;
        out.noAdapter = await info(args.url, {});
        navigator.gpu.requestAdapter = requestAdapter;
        return out;
    """, {"url": mlp_bundle, "plain": plain}, {})
    assert got["first"] == "webgpu" and got["firstWhy"] is None
    assert got["rgba8"] == {"backend": "webgl2", "precision": "rgba8", "why": None}
    assert got["plain"]["backend"] == "webgl2" and got["plain"]["why"] is None
    assert got["noAdapter"]["backend"] == "webgl2" and "adapter" in got["noAdapter"]["why"], got



def test_every_array_is_sized_to_the_buffer_it_binds(web, mlp_bundle):
    """runtime/webgpu.js (#stage) declares each storage array of a dispatch's WGSL with the texels of the buffer it
    binds (a module for each sizes; on SwiftShader a runtime-sized array's length is read from memory at every load):
    no module is left with a runtime-sized array, and the sizes are the tensors' (TEXTURES) and the scratch buffers'.
    Declaring one larger than its buffer fails the bind group (an error in the console); smaller, the loads past it
    clamp and the parity tests fail. Its workgroups are sized to its invocations (workgroupOf: 64, halved while
    under 16 workgroups, 4 at least), the invocation index strided by that size (else the parity tests fail): this
    small model's dispatches all run in workgroups under 64."""
    got = run_model(web, mlp_bundle, """
        const create = GPUDevice.prototype.createShaderModule, codes = [];
        GPUDevice.prototype.createShaderModule = function (d) { codes.push(d.code); return create.call(this, d); };
        const mm = await mod.createModel({ backend: 'webgpu' });
        const x = new Float32Array(16 * 45).map((_, i) => Math.sin(i)), y = Int32Array.from({ length: 16 }, (_, i) => i % 7);
        const r = await mm.fit(x, y, { batchSize: 8, epochs: 1, shuffle: false, optimizer: { type: 'adam', lr: 0.01 } });
        GPUDevice.prototype.createShaderModule = create;
        mm.dispose();
        const text = await (await fetch(args.url)).text();
        const textures = JSON.parse(text.match(/^const TEXTURES = (.*);$/m)[1]);
        const texels = (t) => t.width * t.height;
        return { codes, loss: r.loss, texels: textures.map(texels),
                 params: textures.filter((t) => t.role === 'param').map(texels) };
    """, {"url": mlp_bundle}, {})
    assert got["codes"] and all(math.isfinite(v) for v in got["loss"])
    sizes, workgroups = set(), set()
    for code in got["codes"]:
        (size,) = re.findall(r"@workgroup_size\((\d+)\)", code)
        assert re.findall(r"_n\.x \* (\d+)u", code) in ([size], []), code[:400]  # ([]: a loss value's, one invocation)
        workgroups.add(int(size))
        assert "array<vec4<f32>>" not in code, code[:400]
        found = [int(n) for n in re.findall(r"array<vec4<f32>, (\d+)>", code)]
        assert found, code[:400]
        sizes.update(found)
    # every parameter's among them (Adam reads it, its moments and its gradient, the scratch buffer bound at its size)
    assert len(got["params"]) == 4 and set(got["params"]) <= sizes <= set(got["texels"]), (sizes, got)
    assert workgroups <= {4, 8, 16, 32} and len(workgroups) > 1, workgroups

WORKER = """
self.onmessage = async (e) => {
  const m = await (await import(e.data.url)).createModel({ backend: 'webgpu' });
  const x = new Float32Array(e.data.x), y = Int32Array.from(e.data.y);
  const r = await m.fit(x, y, { batchSize: 8, epochs: 2, shuffle: false, optimizer: { type: 'adam', lr: 0.01 } });
  const w = await m.getWeights();
  self.postMessage({ loss: r.loss, backend: m.info.backend, weights: Object.fromEntries(Object.entries(w).map(([k, v]) => [k, Array.from(v)])) });
  m.dispose();
};
"""


def test_a_fit_in_a_module_worker(web, site, mlp_bundle):
    """WebGPU needs no canvas: a module worker trains on it (navigator.gpu is the worker's), as the page does."""
    g = torch.Generator().manual_seed(4)
    data = {"x": torch.randn(24 * 45, generator=g).tolist(), "y": torch.randint(0, 7, (24,), generator=g).tolist()}
    folder = site.add_files("webgpu_worker", {"worker.js": WORKER})
    got = web.evaluate("""async (args) => {
        const w = new Worker(args.worker, { type: 'module' });
        const done = new Promise((resolve, reject) => { w.onmessage = (e) => resolve(e.data); w.onerror = (e) => reject(e.message); });
        w.postMessage({ url: args.url, x: args.x, y: args.y });
        const inWorker = await done;
        w.terminate();
        const m = await (await import(args.url)).createModel({ backend: 'webgpu' });
        const r = await m.fit(new Float32Array(args.x), Int32Array.from(args.y),
                              { batchSize: 8, epochs: 2, shuffle: false, optimizer: { type: 'adam', lr: 0.01 } });
        const w2 = await m.getWeights();
        m.dispose();
        return { inWorker, loss: r.loss, weights: Object.fromEntries(Object.entries(w2).map(([k, v]) => [k, Array.from(v)])) };
    }""", {"worker": folder + "/worker.js", "url": mlp_bundle, **data})
    assert got["inWorker"]["backend"] == "webgpu" and len(got["inWorker"]["loss"]) == 6
    assert got["inWorker"]["loss"] == got["loss"] and got["inWorker"]["weights"] == got["weights"]
