"""Where texelfit's MiniLM embedding of 16 sentences goes (issue 19 diagnostic, not a test).

    .venv/bin/python bench/minilm_profile.py       # writes bench/results/minilm_profile.json

Builds the head-trainable bundle as bench/minilm.py does (32 tokens), opens one page, runs
features(16) twice, times a third (wall-clock), then profiles a fourth with every draw synced
(bench/pages/common.js: profileGl): per kernel, calls and synced ms; and the same grouped by op.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import minilm as b  # noqa: E402

JS = """async (a) => {
  const { profileGl, loadI32 } = await import(a.url + '/pages/common.js');
  const mod = await import(a.url + '/bundles/head/minilm.js');
  const m = await mod.createModel();
  const ids = await loadI32(a.url + '/data/input_ids.bin'), mask = await loadI32(a.url + '/data/attention_mask.bin');
  const x = { input_ids: ids, attention_mask: mask }, n = ids.length / a.tokens;
  for (let i = 0; i < 2; i++) await m.features(x, n);
  const t0 = performance.now();
  await m.features(x, n);
  const wall = performance.now() - t0;
  const p = await profileGl(() => m.features(x, n), 1);
  m.dispose();
  return { wallMs: wall, profiledMs: p.ms, syncMs: p.syncMs,
           kernels: Object.entries(p.byKernel).sort((u, v) => v[1].ms - u[1].ms) };
}"""


def main():
    from playwright.sync_api import sync_playwright
    _, compile_onnx, export_simplified = b.common.use_texelfit(None, None)
    with tempfile.TemporaryDirectory() as site:
        b.prepare(site, compile_onnx, lambda m: export_simplified(m, [(b.TOKENS,), (b.TOKENS,)], b.NAMES, "int64"),
                  [], ["texelfit"])
        httpd, url = b.common.serve(site)
        with sync_playwright() as p:
            br = p.chromium.launch(executable_path=b.common.CHROMIUM, headless=True, args=b.common.CHROMIUM_ARGS)
            page = br.new_page()
            page.goto(url + "/pages/minilm_texelfit.html")
            page.wait_for_function("window.benchReady === true")
            r = page.evaluate(JS, {"url": url, "tokens": b.TOKENS})
            br.close()
        httpd.shutdown()
    total = sum(v["ms"] for _, v in r["kernels"])
    groups = {}
    for k, v in r["kernels"]:
        kind = re.split(r"[ (]", k, maxsplit=1)[0]
        groups[kind] = groups.get(kind, 0.0) + v["ms"]
    r["draws"] = sum(v["calls"] for _, v in r["kernels"])
    r["syncedTotalMs"] = total
    r["byGroup"] = sorted(([k, v, v / total] for k, v in groups.items()), key=lambda t: -t[1])
    with open(os.path.join(b.ROOT, "bench", "results", "minilm_profile.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    print(f"features({b.SENTENCES} x {b.TOKENS} tokens): {r['wallMs']:.0f} ms wall-clock; {r['draws']} draws, "
          f"{total:.0f} ms synced in all")
    for k, v, share in r["byGroup"]:
        print(f"  {k:32s} {v:7.0f} ms  {share:5.1%}")
    for k, v in r["kernels"][:15]:
        print(f"    {v['ms']:7.0f} ms {v['calls']:4d} calls  {k}")


if __name__ == "__main__":
    main()
