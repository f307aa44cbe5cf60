"""Two texelfit revisions side by side on one of bench/run.py's training cases, in one page (a diagnostic, not a test).

On this project's machine whole pages swing by up to 1.5x from one minute to the next, more than a change of 10-20%
moves them; timed in turns in one page, both bundles see the same swings. Builds the case's model (bench/run.py's
seed and model, `--webgpu`) from a `git archive` of --base and from --head (default: the working tree), each in a
process of its own, creates both models in one page on --backend, warms them up, then times a fit of --steps steps
of each in turns, --turns times, and prints each side's median ms a step with every turn's, and its createModel and
first fit (the shaders made).

    .venv/bin/python bench/ab.py --base HEAD~1 --case B_cnn_b32_adam --backend webgpu
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

JS = """async (a) => {
  const models = {}, create = {}, first = {}, turns = {};
  const n = a.batch * a.steps, x = new Float32Array(n * a.features).map((_, i) => Math.sin(i * 12.9898) * 0.5);
  const y = new Int32Array(n).map((_, i) => i % 10);
  const opts = { batchSize: a.batch, epochs: 1, shuffle: false, optimizer: a.optimizer };
  for (const side of a.sides) {
    const mod = await import(a.url + '/' + side + '.js');
    let t0 = performance.now();
    models[side] = await mod.createModel({ backend: a.backend });
    create[side] = performance.now() - t0;
    t0 = performance.now();
    await models[side].fit(x, y, opts);
    first[side] = performance.now() - t0;
    turns[side] = [];
  }
  for (let t = 0; t < a.turns; t++) {
    for (const side of a.sides) {
      const t0 = performance.now();
      await models[side].fit(x, y, opts);
      turns[side].push((performance.now() - t0) / a.steps);
    }
  }
  for (const side of a.sides) models[side].dispose();
  return { create, first, turns };
}"""


def build(rev: str | None, case: dict, out: str) -> None:
    """The case's bundle (bench/run.py's model and seed, --webgpu) from texelfit at `rev` (None: the working tree)."""
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        _, compile_onnx, export_simplified = run.use_texelfit(rev, tmp)
        spec = run.MODELS[case["model"]]
        torch.manual_seed(run.SEED + list(run.MODELS).index(case["model"]))
        result = compile_onnx(export_simplified(spec["factory"](), spec["shape"]), name=case["model"],
                              input_shape=spec["shape"], max_batch=64, webgpu=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(result.files[f"{case['model']}.js"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the revision to compare with (git)")
    ap.add_argument("--head", help="the other revision (default: the working tree)")
    ap.add_argument("--case", default="A_mlp_b64_sgd", choices=[c["id"] for c in run.CASES if c["optimizer"]])
    ap.add_argument("--backend", default="webgpu", choices=["webgpu", "webgl2", "cpu"])
    ap.add_argument("--turns", type=int, default=9)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--build", nargs=2, metavar=("REV", "OUT"), help=argparse.SUPPRESS)  # (the child process)
    args = ap.parse_args(argv)
    case = next(c for c in run.CASES if c["id"] == args.case)
    if args.build:
        build(args.build[0] or None, case, args.build[1])
        return
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as site:
        sides = {"base": args.base, "head": args.head or ""}
        for side, rev in sides.items():
            subprocess.run([sys.executable, os.path.abspath(__file__), "--case", args.case, "--base", args.base,
                            "--build", rev, os.path.join(site, f"{side}.js")], check=True)
        with open(os.path.join(site, "index.html"), "w") as f:
            f.write("<!doctype html><title>a/b</title>")
        httpd, url = run.serve(site)
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=run.CHROMIUM, headless=True,
                                      args=run.CHROMIUM_ARGS + ["--enable-unsafe-webgpu"])
                page = b.new_page()
                page.goto(url + "/index.html")
                features = 1
                for d in run.MODELS[case["model"]]["shape"]:
                    features *= d
                got = page.evaluate(JS, {"url": url, "sides": list(sides), "backend": args.backend,
                                         "batch": case["batch"], "steps": args.steps, "turns": args.turns,
                                         "features": features, "optimizer": case["optimizer"]})
                b.close()
        finally:
            httpd.shutdown()
    print(f"{args.case} on {args.backend}, {args.turns} turns of {args.steps} steps, ms a step:")
    for side, rev in sides.items():
        turns = sorted(got["turns"][side])
        print(f"  {side} ({rev or 'working tree'}): median {turns[len(turns) // 2]:.2f}  "
              f"[{', '.join(f'{t:.2f}' for t in got['turns'][side])}]  createModel {got['create'][side]:.0f} ms, "
              f"first fit {got['first'][side]:.0f} ms")


if __name__ == "__main__":
    main()
