"""The bundle in a strict page: no network requests of its own, no CSP violation under
`script-src 'self'` (on WebGL2, and on WebGPU from a bundle built with --webgpu), and bounded GL resources (nothing
created per step; dispose frees all)."""
from __future__ import annotations

import json
import time

import pytest
import torch

from helpers import build_module
from models import mlp_45_31_7

APP = """
const violations = [];
document.addEventListener('securitypolicyviolation', (e) => violations.push(e.violatedDirective + ' ' + e.blockedURI));
const { createModel } = await import('./model.js');
const m = await createModel(OPTIONS);
const n = 20;
const x = new Float32Array(n * 45).map((_, i) => Math.sin(i));
const y = Int32Array.from({ length: n }, (_, i) => i % 7);
const before = await m.predict(x.subarray(0, 45 * 4), 4);
const r = await m.fit(x, y, { batchSize: 8, epochs: 3, optimizer: { type: 'adam', lr: 0.01 } });
const after = await m.predict(x.subarray(0, 45 * 4), 4);
await m.getWeights();
document.body.dataset.result = JSON.stringify({ violations, losses: r.loss.length, changed: before[0] !== after[0],
                                                backend: m.info.backend });
"""

HTML = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<script type="module" src="app.js"></script></head><body></body></html>
"""


@pytest.mark.parametrize("weights_file", [False, True], ids=["embedded", "weights-file"])
def test_strict_csp_and_no_network_requests(page, site, weights_file):
    """No request of the bundle's own; with --weights-file exactly one, same origin: model.weights.bin."""
    _strict_page(page, site, "csp", weights_file, "webgl2")


@pytest.mark.fresh_page
def test_strict_csp_and_one_request_on_webgpu(webgpu_web, site):
    """The same on WebGPU (its WGSL modules made from strings the bundle holds: no eval), weights in a file."""
    _strict_page(webgpu_web, site, "csp_webgpu", True, "webgpu")


def _strict_page(page, site, folder: str, weights_file: bool, backend: str) -> None:
    """The bundle trained and read in a page served with `script-src 'self'` on `backend`: no CSP violation, no
    console error, and no request but the page's, its script's, the bundle's and, with `weights_file`, the weights'."""
    torch.manual_seed(0)
    build_module(site, folder, mlp_45_31_7(), (45,), name="model", weights_file=weights_file,
                 webgpu=backend == "webgpu")
    options = json.dumps({"backend": backend}) if backend == "webgpu" else ""
    for name, text in (("index.html", HTML), ("app.js", APP.replace("OPTIONS", options))):
        with open(site.path(folder, name), "w") as f:
            f.write(text)
    site.headers_for[f"/{folder}/"] = {"Content-Security-Policy": "script-src 'self'"}
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{site.url}/{folder}/index.html")
    # (Playwright's wait_for_selector injects a script that this CSP blocks: poll instead)
    deadline = time.monotonic() + 60
    while not (result := page.evaluate("document.body.dataset.result || null")):
        assert time.monotonic() < deadline, f"the page did not finish; its errors: {errors}"
        page.wait_for_timeout(100)
    result = json.loads(result)
    assert result == {"violations": [], "losses": 9, "changed": True, "backend": backend}
    assert not errors, errors
    base = f"{site.url}/{folder}/"
    expected = [base + "index.html", base + "app.js", base + "model.js"] + ([base + "model.weights.bin"] if weights_file else [])
    assert sorted(requests) == sorted(expected), requests


COUNTER = """
(() => {
  const live = new Map();  // kind -> Set of live objects
  window.__gl = { created: {}, deleted: {}, live };
  const proto = WebGL2RenderingContext.prototype;
  for (const kind of ['Texture', 'Framebuffer', 'Buffer', 'Program', 'Shader', 'VertexArray', 'Renderbuffer',
                      'Query', 'Sampler', 'TransformFeedback']) {
    const create = proto['create' + kind], del = proto['delete' + kind];
    live.set(kind, new Set());
    proto['create' + kind] = function (...a) {
      const o = create.apply(this, a);
      window.__gl.created[kind] = (window.__gl.created[kind] || 0) + 1;
      live.get(kind).add(o);
      return o;
    };
    proto['delete' + kind] = function (o) {
      if (o && live.get(kind).delete(o)) window.__gl.deleted[kind] = (window.__gl.deleted[kind] || 0) + 1;
      return del.call(this, o);
    };
  }
})();
"""


def test_no_gl_objects_created_per_step_and_dispose_frees_everything(page, site):
    torch.manual_seed(0)
    url = build_module(site, "resources", mlp_45_31_7(), (45,), max_batch=8)
    page.add_init_script(COUNTER)
    page.goto(f"{site.url}/index.html")
    got = page.evaluate("""async (url) => {
        const m = await (await import(url)).createModel();
        const x = new Float32Array(64 * 45).map((_, i) => Math.cos(i * 0.37));
        const y = Int32Array.from({ length: 64 }, (_, i) => (i * 5) % 7);
        const opt = { type: 'adam', lr: 1e-3 };
        // warm-up: every kind of call once
        await m.fit(x, y, { batchSize: 8, epochs: 1, optimizer: opt });
        await m.predict(x.subarray(0, 45 * 3), 3);
        await m.getWeights();
        const snapshot = () => JSON.stringify(window.__gl.created);
        const warm = snapshot();
        let steps = 0;
        for (const batchSize of [1, 3, 8, 5, 2, 7, 4, 6]) {
          while (steps < 2000 * (([1, 3, 8, 5, 2, 7, 4, 6].indexOf(batchSize) + 1) / 8)) {
            const r = await m.fit(x, y, { batchSize, epochs: 1, optimizer: opt });
            steps += r.loss.length;
            await m.predict(x.subarray(0, 45 * batchSize), batchSize);
          }
        }
        const trained = snapshot();
        m.dispose();
        const live = {};
        for (const [kind, set] of window.__gl.live) if (set.size) live[kind] = set.size;
        return { warm, trained, steps, live, created: window.__gl.created, deleted: window.__gl.deleted };
    }""", url)
    assert got["steps"] >= 2000
    assert got["trained"] == got["warm"], "GL objects were created after warm-up"
    assert got["live"] == {}, f"dispose() left GL objects alive: {got['live']}"
    assert got["created"] == got["deleted"]
