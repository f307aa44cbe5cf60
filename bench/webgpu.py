"""texelfit on WebGPU beside texelfit on WebGL2 and TensorFlow.js 4.22 on WebGPU and WebGL (issue 33), in one run of
headless Chromium with --enable-unsafe-webgpu (here: SwiftShader, a software GPU, behind both APIs).

    npm install && .venv/bin/python bench/webgpu.py          # from the repository root (~5 min on 2 cores)

Writes bench/results/webgpu.json and bench/results/webgpu.md. The cases, models, initial weights, batches and the
timing method are bench/run.py's (its pages, its `prepare`, one bundle a model built with --webgpu, so that both
texelfit rows run the same file): each (case, framework) in a fresh page of a fresh context, each round a fresh
browser with the frameworks' order rotated, ms/step the median over a page's timed windows, the tables min / median /
max over the rounds. Not a test (nothing here is collected by pytest).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: the cases, pages, data and timing)

FRAMEWORKS = ["texelfit-webgpu", "texelfit-webgl2", "tfjs-webgpu", "tfjs-webgl"]
CASES = ["A_mlp_b64_sgd", "A_mlp_b64_adam", "B_cnn_b32_adam", "C_mlp_b1_adam", "D_predict_mlp_b1"]


def page_args(case, fw, url, built, args):
    if fw.startswith("texelfit"):
        return dict(run.page_args(case, "texelfit", url, built, args), backend=fw.split("-")[1])
    return run.page_args(case, fw, url, built, args)


def browser_round(url, built, args, r, retries):
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=run.CHROMIUM, headless=True,
                                    args=run.CHROMIUM_ARGS + ["--enable-unsafe-webgpu"])
        version = browser.version
        order = FRAMEWORKS[r % len(FRAMEWORKS):] + FRAMEWORKS[:r % len(FRAMEWORKS)]
        for case in run.CASES:
            if case["id"] not in args.cases:
                continue
            fn = "predict" if case["optimizer"] is None else "train"
            for fw in order:
                a = page_args(case, fw, url, built, args)
                page = "texelfit" if fw.startswith("texelfit") else "tfjs"
                res = retries.run(f"round {r + 1} {case['id']} {fw}", lambda: run.call_in_page(
                    browser, url, page, lambda pg: pg.evaluate(f"(a) => window.bench.{fn}(a)", a)))
                out.setdefault(case["id"], {})[fw] = res
                msg = res.get("error") or f"{res['perStep']:.3f} ms/step, cold {res['coldMs']:.0f} ms"
                if fw.startswith("texelfit") and "info" in res:
                    msg += f" ({res['info']['backend']})"
                print(f"  round {r + 1} {case['id']:18s} {fw:16s} {msg}", flush=True)
        browser.close()
    return out, version


def summarize(rounds):
    summary = {}
    for cid in CASES:
        s = {}
        for fw in FRAMEWORKS:
            res = [r[cid][fw] for r in rounds if fw in r.get(cid, {})]
            ok = [x for x in res if "error" not in x]
            s[fw] = {"steady_ms": run.mmm([x["perStep"] for x in ok]), "cold_ms": run.mmm([x["coldMs"] for x in ok]),
                     "errors": sorted({x["error"] for x in res if "error" in x}),
                     "backend": next((x["info"]["backend"] for x in ok if "info" in x), None)}
        med = lambda fw: (s[fw]["steady_ms"] or {}).get("median")  # noqa: E731
        g = med("texelfit-webgpu")
        s["ratios"] = {f"texelfit-webgpu/{o}": (g / med(o) if g and med(o) else None)
                       for o in ("texelfit-webgl2", "tfjs-webgpu", "tfjs-webgl")}
        summary[cid] = s
    return summary


def markdown(result):
    s, meta = result["summary"], result["meta"]
    label = {c["id"]: c["label"] for c in run.CASES}
    L = ["# texelfit on WebGPU: benchmark results", "",
         f"{meta['date']}, Chromium {meta['chromium']} headless with --enable-unsafe-webgpu (SwiftShader behind WebGPU "
         f"and WebGL), {meta['rounds']} rounds, {meta['steps']} steps a window, {meta['windows']} windows; "
         f"{meta['machine']}. ms/step: **median** (min–max over the rounds); a ratio below 1: texelfit on WebGPU "
         "is faster.", "",
         "| case | texelfit WebGPU | texelfit WebGL2 | TF.js WebGPU | TF.js WebGL | WebGPU / texelfit WebGL2 | "
         "/ TF.js WebGPU | / TF.js WebGL |", "|---|---|---|---|---|---|---|---|"]
    for cid in CASES:
        c = s[cid]
        cell = lambda fw: run.fmt_mmm(c[fw]["steady_ms"]) if not c[fw]["errors"] else "error"  # noqa: E731
        r = c["ratios"]
        L.append(f"| {label[cid]} | {cell('texelfit-webgpu')} | {cell('texelfit-webgl2')} | {cell('tfjs-webgpu')} | "
                 f"{cell('tfjs-webgl')} | {run.fmt(r['texelfit-webgpu/texelfit-webgl2'])} | "
                 f"{run.fmt(r['texelfit-webgpu/tfjs-webgpu'])} | {run.fmt(r['texelfit-webgpu/tfjs-webgl'])} |")
    errs = [(cid, fw, e) for cid in CASES for fw in FRAMEWORKS for e in s[cid][fw]["errors"]]
    if errs:
        L += ["", "Errors:", ""] + [f"- {cid} {fw}: {e}" for cid, fw, e in errs]
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--slow-windows", type=int, default=1)
    ap.add_argument("--cases", nargs="*", default=CASES, choices=CASES)
    ap.add_argument("--max-foreign-load", type=float, default=0.25)
    ap.add_argument("--out", default=os.path.join(run.ROOT, "bench", "results"))
    args = ap.parse_args(argv)
    from texelfit.build import compile_onnx
    from texelfit.prep.load import export_simplified

    tmp = tempfile.mkdtemp(prefix="texelfit-bench-webgpu-")
    site = os.path.join(tmp, "site")
    os.makedirs(site)
    httpd, url = run.serve(site)
    try:
        built, _ = run.prepare(site, args, functools.partial(compile_onnx, webgpu=True), export_simplified)
        retries = run.Retries(args.max_foreign_load, 12, 120)
        rounds, version = [], None
        for r in range(args.rounds):
            out, version = browser_round(url, built, args, r, retries)
            rounds.append(out)
    finally:
        httpd.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "chromium": version,
                       "rounds": args.rounds, "steps": args.steps, "windows": args.windows,
                       "machine": f"{platform.machine()}, {os.cpu_count()} cores"},
              "summary": summarize(rounds), "retries": retries.log, "raw": rounds}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "webgpu.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    md = markdown(result)
    with open(os.path.join(args.out, "webgpu.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
