"""Where a texelfit training step goes on WebGPU (issue 33 diagnostic, not a test): bench/run.py's model of a case,
built with --webgpu as bench/webgpu.py builds it, trained on WebGPU; a few steps are then profiled with every
dispatch submitted on its own and timed from one queue.onSubmittedWorkDone to the next (the page wraps the
compute pass encoder: each dispatch its own command buffer), per kernel (named from the bundle's KERNELS).

    .venv/bin/python bench/webgpu_profile.py [--case B_cnn_b32_adam] [--steps 3]
    .venv/bin/python bench/webgpu_profile.py --lite0 --steps 1      # EfficientNet-Lite0's fine-tune step

Prints per kernel: dispatches a step, ms a step, and the sum beside a step's wall-clock (unprofiled). --webgl2: the
same bundle on WebGL2, every draw synced (bench/pages/common.js: profileGl), for the side by side.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

# Wraps the WebGPU API before the bundle loads: a compute pass's dispatches are each encoded, submitted and timed
# on their own (the pass the bundle ends and submits is left empty).
PROFILER = """
(() => {
  const codes = new Map(), byPipeline = new WeakMap();
  const log = (globalThis.__wgProfile = { on: false, records: [], pending: [] });
  const cm = GPUDevice.prototype.createShaderModule;
  GPUDevice.prototype.createShaderModule = function (d) {  // (named by the bundle's WGSL: arrays unsized, workgroups of 64)
    const m = cm.call(this, d), code = d.code.replace(/array<vec4<f32>, \\d+>/g, 'array<vec4<f32>>');
    codes.set(m, code.replace(/@workgroup_size\\(\\d+\\)/, '@workgroup_size(64)').replace(/_n\\.x \\* \\d+u/, '_n.x * 64u'));
    return m;
  };
  const cp = GPUDevice.prototype.createComputePipeline;
  GPUDevice.prototype.createComputePipeline = function (d) {
    const p = cp.call(this, d); byPipeline.set(p, codes.get(d.compute.module)); return p;
  };
  const bp = GPUCommandEncoder.prototype.beginComputePass;
  GPUCommandEncoder.prototype.beginComputePass = function (d) {
    const real = bp.call(this, d);
    if (!log.on) return real;
    const device = log.device;
    let pipeline = null, group = null;
    return {
      setPipeline(p) { pipeline = p; },
      setBindGroup(i, g) { group = g; },
      dispatchWorkgroups(x, y) {
        const enc = device.createCommandEncoder(), pass = bp.call(enc);
        pass.setPipeline(pipeline); pass.setBindGroup(0, group); pass.dispatchWorkgroups(x, y ?? 1); pass.end();
        device.queue.submit([enc.finish()]);
        const rec = { code: byPipeline.get(pipeline), groups: x * (y ?? 1), end: 0 };
        log.records.push(rec);
        log.pending.push(device.queue.onSubmittedWorkDone().then(() => { rec.end = performance.now(); }));
      },
      end() { real.end(); },
    };
  };
  const rd = GPUAdapter.prototype.requestDevice;
  GPUAdapter.prototype.requestDevice = async function (d) { const dev = await rd.call(this, d); log.device = dev; return dev; };
})();
"""

JS = """async (a) => {
  const mod = await import(a.url + '/bundles/' + a.model + '/' + a.model + '.js');
  const m = await mod.createModel({ backend: a.backend });
  const n = a.batch * a.steps, size = a.features;
  const x = new Float32Array(n * size).map((_, i) => Math.sin(i * 12.9898) * 0.5);
  const y = new Int32Array(n).map((_, i) => i % 10);
  const opts = { batchSize: a.batch, epochs: 1, shuffle: false, optimizer: a.optimizer };
  await m.fit(x, y, opts); await m.fit(x, y, opts);
  let t0 = performance.now();
  await m.fit(x, y, opts);
  const wall = (performance.now() - t0) / a.steps;
  if (a.backend === 'webgl2') {  // (every draw synced: bench/pages/common.js)
    const { profileGl } = await import(a.url + '/pages/common.js');
    const p = await profileGl(() => m.fit(x, y, opts), 1);
    m.dispose();
    return { wall, records: Object.entries(p.byKernel).map(([name, e]) => [name, e.calls, e.ms]), gl: true };
  }
  const log = globalThis.__wgProfile;
  log.on = true;
  t0 = performance.now();
  await m.fit(x, y, opts);
  await Promise.all(log.pending);
  log.on = false;
  let last = t0;
  const out = log.records.map((r) => { const ms = r.end - last; last = r.end; return [r.code, r.groups, ms]; });
  m.dispose();
  return { wall, records: out };
}"""


def names_by_code(js: str) -> dict[str, str]:
    """Each WGSL module of the bundle -> the names of the kernels (and optimizer gradients) that run it."""
    wgsl = json.loads(re.search(r"^const WGSL = (.*);$", js, re.M).group(1))
    kernels = json.loads(re.search(r"^const KERNELS = (.*);$", js, re.M).group(1))
    out: dict[str, str] = {}
    for k in kernels:
        for key, what in (("wgsl", ""), ("deal", " (deal)"), ("colin", " (colin)")):
            if key in k:
                out.setdefault(wgsl[k[key][0]], k["name"] + what)
        if "gradient" in k and "wgsl" in k["gradient"]:
            out.setdefault(wgsl[k["gradient"]["wgsl"][0]], k["name"] + " (its gradient)")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="B_cnn_b32_adam", choices=[c["id"] for c in run.CASES if c["optimizer"]])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--webgl2", action="store_true", help="the same bundle on WebGL2, every draw synced (profileGl)")
    ap.add_argument("--lite0", action="store_true",
                    help="in place of the case: EfficientNet-Lite0 (bench/efficientnet.py's, every weight trainable), "
                         "Adam at batch 8 (use --steps 1: a step takes seconds)")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright
    from texelfit.build import compile_onnx
    from texelfit.prep.load import export_simplified

    case = next(c for c in run.CASES if c["id"] == args.case)
    spec = run.MODELS[case["model"]]
    if args.lite0:
        import efficientnet
        case = {"id": "lite0_b8_adam", "model": "lite0", "batch": efficientnet.BATCH, "optimizer": efficientnet.ADAM}
        spec = {"factory": efficientnet.lite0, "shape": (3, 224, 224)}
    tmp = tempfile.mkdtemp(prefix="texelfit-webgpu-profile-")
    site = os.path.join(tmp, "site")
    os.makedirs(os.path.join(site, "bundles", case["model"]))
    os.symlink(run.PAGES, os.path.join(site, "pages"))
    httpd, url = run.serve(site)
    try:
        import torch
        torch.manual_seed(run.SEED)
        result = compile_onnx(export_simplified(spec["factory"](), spec["shape"]), name=case["model"],
                              input_shape=spec["shape"], max_batch=case["batch"] if args.lite0 else 64, webgpu=True)
        for fname, data in result.files.items():  # (a weights file beside the bundle: bytes)
            with open(os.path.join(site, "bundles", case["model"], fname), "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        names = names_by_code(result.files[f"{case['model']}.js"])
        with open(os.path.join(site, "index.html"), "w") as f:
            f.write("<!doctype html><title>profile</title>")
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=run.CHROMIUM, headless=True,
                                  args=run.CHROMIUM_ARGS + ["--enable-unsafe-webgpu"])
            page = b.new_page()
            page.add_init_script(PROFILER)
            page.goto(url + "/index.html")
            features = 1
            for d in spec["shape"]:
                features *= d
            got = page.evaluate(JS, {"url": url, "model": case["model"], "batch": case["batch"], "steps": args.steps,
                                     "features": features, "optimizer": case["optimizer"],
                                     "backend": "webgl2" if args.webgl2 else "webgpu"})
            b.close()
    finally:
        httpd.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    per: dict[str, list] = {}
    for code, groups, ms in got["records"]:
        name = code if got.get("gl") else names.get(code, "?")
        e = per.setdefault(name, [0, 0.0, groups])
        e[0] += 1
        e[1] += ms
    total = sum(e[1] for e in per.values()) / args.steps
    print(f"{case['id']}: a step {got['wall']:.1f} ms unprofiled; the profiled dispatches sum to {total:.1f} ms a step")
    for name, (count, ms, groups) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{ms / args.steps:8.2f} ms {count / args.steps:5.1f}x {groups:6d} wg  {name}")


if __name__ == "__main__":
    main()
