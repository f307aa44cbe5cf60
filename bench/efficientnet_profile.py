"""Where texelfit's `predict` of one EfficientNet-Lite0 image goes (issue 17 diagnostic, not a test).

    .venv/bin/python bench/efficientnet_profile.py       # writes bench/results/efficientnet_predict_profile.json
    .venv/bin/python bench/efficientnet_profile.py --features   # features(x, 8) instead: ..._features_profile.json

Builds the head-trainable bundle as bench/efficientnet.py does, opens one page, runs predict(x, 1)
three times, times a fourth (wall-clock), then profiles a fifth with every draw issued 4 times
between two synchronous 1-texel readbacks (bench/pages/common.js: profileGl): per kernel, calls and
synced ms; and the same grouped by kind (pointwise 1x1 / depthwise / other) and input size.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import efficientnet as e  # noqa: E402

JS = """async (a) => {
  const { profileGl, loadF32 } = await import(a.url + '/pages/common.js');
  const mod = await import(a.url + '/bundles/head/lite0.js');
  const m = await mod.createModel();
  const x = (await loadF32(a.url + '/data/x_nchw.bin')).subarray(0, a.batch * 3 * 224 * 224);
  const run = () => a.features ? m.features(x, a.batch) : m.predict(x, a.batch);
  for (let i = 0; i < 3; i++) await run();
  const t0 = performance.now();
  await run();
  const wall = performance.now() - t0;
  const p = await profileGl(run, 4);
  m.dispose();
  return { wallMs: wall, profiledMs: p.ms, syncMs: p.syncMs, repeat: p.repeat,
           kernels: Object.entries(p.byKernel).sort((u, v) => v[1].ms - u[1].ms) };
}"""


def main():
    features = "--features" in sys.argv[1:]
    from playwright.sync_api import sync_playwright
    _, compile_onnx, export_simplified = e.common.use_texelfit(None, None)
    with tempfile.TemporaryDirectory() as site:
        e.prepare(site, compile_onnx, export_simplified)
        httpd, url = e.common.serve(site)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=e.common.CHROMIUM, headless=True, args=e.common.CHROMIUM_ARGS)
            page = b.new_page()
            page.goto(url + "/pages/effnet_texelfit.html")
            page.wait_for_function("window.benchReady === true")
            r = page.evaluate(JS, {"url": url, "features": features, "batch": 8 if features else 1})
            b.close()
        httpd.shutdown()
    total = sum(v["ms"] for _, v in r["kernels"])
    groups = {}
    for k, v in r["kernels"]:
        m = re.search(r"(\d+)x(\d+)x(\d+)->", k)
        kind = "pointwise 1x1" if "k1x1" in k else "depthwise" if re.search(r" g(\d+) ", k + " ") and " g1 " not in k + " " \
            else "other"
        key = f"{kind}, input {m.group(2)}x{m.group(3)}" if m else kind
        groups[key] = groups.get(key, 0.0) + v["ms"]
    r["draws"] = sum(v["calls"] for _, v in r["kernels"])
    r["syncedTotalMs"] = total
    r["byGroup"] = sorted(([k, v, v / total] for k, v in groups.items()), key=lambda t: -t[1])
    out = os.path.join(e.ROOT, "bench", "results", "efficientnet_features_profile.json" if features else "efficientnet_predict_profile.json")
    with open(out, "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    print(f"{'features(x, 8)' if features else 'predict(x, 1)'}: {r['wallMs']:.0f} ms wall-clock; {r['draws']} draws, {total:.0f} ms synced in all")
    for k, v, share in r["byGroup"]:
        print(f"  {k:32s} {v:7.0f} ms  {share:5.1%}")


if __name__ == "__main__":
    main()
