"""Where texelfit's MiniLM embedding of 16 sentences goes (issue 19 diagnostic, not a test), and with --head where
a head step on cached embeddings goes (issue 35: the fixed cost of a step).

    .venv/bin/python bench/minilm_profile.py          # writes bench/results/minilm_profile.json
    .venv/bin/python bench/minilm_profile.py --head   # writes bench/results/minilm_head_profile.json
    .venv/bin/python bench/minilm_profile.py --last   # writes bench/results/minilm_last_profile.json
    .venv/bin/python bench/minilm_profile.py --webgpu [--last]   # the same on WebGPU (issue 33): ..._webgpu.json

Builds the head-trainable bundle as bench/minilm.py does (32 tokens), opens one page, runs
features(16) twice, times a third (wall-clock), then profiles a fourth with every draw synced
(bench/pages/common.js: profileGl): per kernel, calls and synced ms; and the same grouped by op.
--last: the same for one fine-tune step of bench/minilm.py's 'last' bundle (batch 8, Adam, dropout off).
--webgpu: the bundle built with --webgpu, on WebGPU, profiled as bench/webgpu_profile.py profiles (each dispatch
submitted on its own, timed from one queue.onSubmittedWorkDone to the next), per kernel.
--head: bench/minilm.py's head row (fit on the 16 cached embeddings, cacheTrunk, Adam, batch 8, 20 epochs), timed
and profiled from its first step on (each fit caches the encoder's output before it): per kernel and per upload
(texSubImage2D) and readback, calls and ms a step, and the wall-clock a step beside the synced draws' sum.
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


HEAD_JS = """async (a) => {
  const { profileGl, loadI32 } = await import(a.url + '/pages/common.js');
  const mod = await import(a.url + '/bundles/head/minilm.js');
  const m = await mod.createModel();
  const ids = await loadI32(a.url + '/data/input_ids.bin'), mask = await loadI32(a.url + '/data/attention_mask.bin');
  const y = await loadI32(a.url + '/data/y.bin');
  const x = { input_ids: ids, attention_mask: mask }, n = ids.length / a.tokens;
  // one fit; from the first onStep (step 0 issued, the encoder's output cached) to the end: the steps alone
  const fit = async (live) => {
    let first = null;
    await m.fit(x, y.subarray(0, n), {
      batchSize: a.batch, epochs: a.epochs, shuffle: true, seed: 1, cacheTrunk: true, optimizer: a.optimizer,
      onStep: () => { if (first === null) first = { t: performance.now(), kernels: structuredClone(live?.byKernel ?? {}) }; },
    });
    return { ms: performance.now() - first.t, before: first.kernels };
  };
  await fit(null);  // (compiles every kernel the steps use)
  const wall = await fit(null);
  const live = {};
  let profiled = null;
  const p = await profileGl(async () => { profiled = await fit(live); }, 1, live);
  m.dispose();
  const steps = Math.ceil(n / a.batch) * a.epochs - 1;  // (after the first onStep)
  const perStep = Object.entries(p.byKernel).map(([k, v]) => {
    const b = profiled.before[k] ?? { calls: 0, ms: 0 };
    return [k, (v.calls - b.calls) / steps, (v.ms - b.ms) / steps];
  }).filter(([, calls, ms]) => calls > 0 || ms > 0.005).sort((u, v) => v[2] - u[2]);
  return { steps, wallMsPerStep: wall.ms / steps, profiledMsPerStep: profiled.ms / steps, syncMs: p.syncMs, perStep };
}"""


LAST_JS = """async (a) => {
  const { profileGl, loadI32 } = await import(a.url + '/pages/common.js');
  const mod = await import(a.url + '/bundles/last/minilm.js');
  const m = await mod.createModel();
  const ids = await loadI32(a.url + '/data/input_ids.bin'), mask = await loadI32(a.url + '/data/attention_mask.bin');
  const y = await loadI32(a.url + '/data/y.bin'), k = a.batch * a.tokens;
  const x = { input_ids: ids.subarray(0, k), attention_mask: mask.subarray(0, k) };
  const step = () => m.fit(x, y.subarray(0, a.batch), { batchSize: a.batch, epochs: 1, shuffle: false,
                                                         optimizer: a.optimizer, dropout: false });
  for (let i = 0; i < 2; i++) await step();
  const t0 = performance.now();
  await step();
  const wall = performance.now() - t0;
  const p = await profileGl(step, 1);
  m.dispose();
  return { wallMs: wall, profiledMs: p.ms, syncMs: p.syncMs,
           kernels: Object.entries(p.byKernel).sort((u, v) => v[1].ms - u[1].ms) };
}"""


# features(16) or a fine-tune step on WebGPU, the dispatches of the fourth call timed (webgpu_profile.PROFILER)
WEBGPU_JS = """async (a) => {
  const { loadI32 } = await import(a.url + '/pages/common.js');
  const mod = await import(a.url + '/bundles/' + a.part + '/minilm.js');
  const m = await mod.createModel({ backend: 'webgpu' });
  const ids = await loadI32(a.url + '/data/input_ids.bin'), mask = await loadI32(a.url + '/data/attention_mask.bin');
  const y = await loadI32(a.url + '/data/y.bin'), n = ids.length / a.tokens, k = a.batch * a.tokens;
  const run = a.part === 'head' ? () => m.features({ input_ids: ids, attention_mask: mask }, n)
    : () => m.fit({ input_ids: ids.subarray(0, k), attention_mask: mask.subarray(0, k) }, y.subarray(0, a.batch),
                  { batchSize: a.batch, epochs: 1, shuffle: false, optimizer: a.optimizer, dropout: false });
  for (let i = 0; i < 2; i++) await run();
  let t0 = performance.now();
  await run();
  const wall = performance.now() - t0;
  const log = globalThis.__wgProfile;
  log.on = true;
  t0 = performance.now();
  await run();
  await Promise.all(log.pending);
  log.on = false;
  let last = t0;
  const records = log.records.map((r) => { const ms = r.end - last; last = r.end; return [r.code, r.groups, ms]; });
  m.dispose();
  return { wallMs: wall, records };
}"""


def webgpu_kernels(r, js) -> list:
    """The profiled dispatches of a WebGPU run by kernel (named from the bundle's KERNELS), as profileGl's byKernel."""
    from webgpu_profile import names_by_code

    names, per = names_by_code(js), {}
    for code, _groups, ms in r.pop("records"):
        e = per.setdefault(names.get(code, "?"), {"calls": 0, "ms": 0.0})
        e["calls"] += 1
        e["ms"] += ms
    return sorted(per.items(), key=lambda kv: -kv[1]["ms"])


def head(r) -> dict:
    draws = [row for row in r["perStep"] if not row[0].startswith("(")]
    return dict(r, drawsPerStep=sum(row[1] for row in draws), drawMsPerStep=sum(row[2] for row in draws))


def evaluate(sync_playwright, js, args, webgpu=False):
    """`js` run in the texelfit MiniLM page, the head-trainable bundle built as bench/minilm.py builds it; `webgpu`:
    built with --webgpu, in a Chromium with WebGPU, the profiler wrapping its API (webgpu_profile.PROFILER), the
    profiled kernels named in r["kernels"]."""
    _, compile_onnx, export_simplified = b.common.use_texelfit(None, None)
    with tempfile.TemporaryDirectory() as site:
        b.prepare(site, compile_onnx, lambda m: export_simplified(m, [(b.TOKENS,), (b.TOKENS,)], b.NAMES, "int64"),
                  [], ["texelfit-webgpu" if webgpu else "texelfit"])
        httpd, url = b.common.serve(site)
        with sync_playwright() as p:
            br = p.chromium.launch(executable_path=b.common.CHROMIUM, headless=True,
                                   args=b.common.CHROMIUM_ARGS + (["--enable-unsafe-webgpu"] if webgpu else []))
            page = br.new_page()
            if webgpu:
                from webgpu_profile import PROFILER
                page.add_init_script(PROFILER)
            page.goto(url + "/pages/minilm_texelfit.html")
            page.wait_for_function("window.benchReady === true")
            r = page.evaluate(js, dict(args, url=url))
            br.close()
        httpd.shutdown()
        if webgpu:
            with open(os.path.join(site, "bundles", args["part"], "minilm.js")) as f:
                r["kernels"] = webgpu_kernels(r, f.read())
    return r



def save(name, r):
    with open(os.path.join(b.ROOT, "bench", "results", name), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")

def main():
    from playwright.sync_api import sync_playwright

    if "--head" in sys.argv[1:]:  # (--head EPOCHS: another number of epochs than 20)
        i = sys.argv.index("--head")
        return main_head(sync_playwright, *[int(v) for v in sys.argv[i + 1:i + 2] if v.isdigit()])
    last = "--last" in sys.argv[1:]  # the fine-tune step (last layer + head, batch 8, Adam) where not features(16)
    webgpu = "--webgpu" in sys.argv[1:]
    args = {"tokens": b.TOKENS, "batch": b.BATCH, "optimizer": b.e.ADAM, "part": "last" if last else "head"}
    r = evaluate(sync_playwright, WEBGPU_JS if webgpu else LAST_JS if last else JS, args, webgpu)
    total = sum(v["ms"] for _, v in r["kernels"])
    groups = {}
    for k, v in r["kernels"]:
        kind = re.split(r"[ (]", k, maxsplit=1)[0]
        groups[kind] = groups.get(kind, 0.0) + v["ms"]
    r["draws"] = sum(v["calls"] for _, v in r["kernels"])
    r["syncedTotalMs"] = total
    r["byGroup"] = sorted(([k, v, v / total] for k, v in groups.items()), key=lambda t: -t[1])
    save(("minilm_last_profile" if last else "minilm_profile") + ("_webgpu" if webgpu else "") + ".json", r)
    what = f"fine-tune step (batch {b.BATCH})" if last else f"features({b.SENTENCES} x {b.TOKENS} tokens)"
    print(f"{what}{' on WebGPU' if webgpu else ''}: {r['wallMs']:.0f} ms wall-clock; {r['draws']} "
          f"{'dispatches' if webgpu else 'draws'}, {total:.0f} ms {'profiled' if webgpu else 'synced'} in all")
    for k, v, share in r["byGroup"]:
        print(f"  {k:32s} {v:7.0f} ms  {share:5.1%}")
    for k, v in r["kernels"][:15]:
        print(f"    {v['ms']:7.0f} ms {v['calls']:4d} calls  {k}")


def main_head(sync_playwright, epochs=20):
    r = head(evaluate(sync_playwright, HEAD_JS, {"tokens": b.TOKENS, "batch": b.BATCH, "epochs": epochs,
                                                 "optimizer": b.e.ADAM}))
    save("minilm_head_profile.json", r)
    print(f"head step (batch {b.BATCH}, Adam, cached embeddings; {r['steps']} steps): {r['wallMsPerStep']:.1f} ms "
          f"wall-clock, {r['drawsPerStep']:.1f} draws {r['drawMsPerStep']:.1f} ms synced (sync {r['syncMs']:.2f} ms)")
    for k, calls, ms in r["perStep"]:
        print(f"  {ms:7.2f} ms {calls:5.1f} calls  {k}")


if __name__ == "__main__":
    main()
