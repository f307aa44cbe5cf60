"""Transfer-learning benchmark (issue 16): head-only training with the cached trunk, head-only without
the cache, and a full fine-tune, on one model, in one headless Chromium run. Not a test.

    .venv/bin/python bench/transfer.py [--size 224] [--width 0.25] [--epochs 3]

The model is MobileNet-v1-shaped (depthwise-separable convs with batch-norm folded, global average
pool, a two-layer head), with ReLU where MobileNet has ReLU6 (Clip does not build yet). For each
variant: ms per step and ms per epoch of 64 examples (batch 16, so 4 steps an epoch; the first epoch
of a cached fit includes computing the trunk's output of the 64 examples), timed by whole fits
(each ends with a readback, so its time is the GPU's): the first epoch is a 1-epoch fit, an epoch
after it (T(E epochs) - T(1 epoch)) / (E - 1); ms per step is that over 4. And the texture bytes
(report.json: before and after sharing). Writes bench/results/transfer.json and prints a table.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import socketserver
import sys
import tempfile
import threading

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run"]


def mobilenet_like(width=0.25, classes=10):
    def c(ch):
        return max(8, int(ch * width) // 4 * 4)

    def dw_sep(i, o, s):
        return [nn.Conv2d(i, i, 3, s, 1, groups=i, bias=False), nn.BatchNorm2d(i), nn.ReLU(),
                nn.Conv2d(i, o, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]

    cfg = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    layers, ch = [nn.Conv2d(3, c(32), 3, 2, 1, bias=False), nn.BatchNorm2d(c(32)), nn.ReLU()], c(32)
    for o, s in cfg:
        layers += dw_sep(ch, c(o), s)
        ch = c(o)
    model = nn.Sequential(nn.Sequential(*layers), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Sequential(nn.Linear(ch, 64), nn.ReLU(), nn.Linear(64, classes)))
    return model.eval()


PAGE = """async (args) => {
  // Each fit ends reading its losses and weights back, so its time is the GPU's; onStep only marks when
  // a step was queued. So: a warm-up fit (compiles the programs), then fits of 1 and of `epochs` epochs:
  // an epoch after the first takes (T(epochs) - T(1)) / (epochs - 1); the first, T(1).
  const mod = await import(args.url);
  const m = await mod.createModel();
  const x = new Float32Array(args.n * args.inputSize);
  let s = 1;
  for (let i = 0; i < x.length; i++) { s = (s * 16807) % 2147483647; x[i] = s / 2147483647 - 0.5; }
  const y = Int32Array.from({ length: args.n }, (_, i) => i % 10);
  const fit = async (epochs) => {
    const t0 = performance.now();
    await m.fit(x, y, { batchSize: args.batch, epochs, shuffle: true, seed: 1, cacheTrunk: args.cache,
                        optimizer: { type: 'adam', lr: 1e-3 } });
    return performance.now() - t0;
  };
  await fit(1);
  const one = await fit(1);
  const many = await fit(args.epochs);
  const trunk = m.info.trunk;
  m.dispose();
  return { one, many, trunk };
}"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of the long fit (>= 2)")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from texelfit.build import compile_onnx
    from texelfit.prep.load import export_simplified

    torch.manual_seed(0)
    model = mobilenet_like(args.width)
    shape = (3, args.size, args.size)
    onnx_model = export_simplified(model, shape)
    head = "3.*"
    variants = [("head-only, cached trunk", head, True), ("head-only, no cache", head, False),
                ("full fine-tune", "*", True)]
    root = tempfile.mkdtemp()
    built = {}
    for trainable in (head, "*"):
        r = compile_onnx(onnx_model, name="m", input_shape=shape, max_batch=args.batch, trainable=trainable)
        folder = os.path.join(root, "head" if trainable == head else "full")
        os.makedirs(folder)
        for name, text in r.files.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        built[trainable] = (os.path.basename(folder), r.report)
    with open(os.path.join(root, "index.html"), "w") as f:
        f.write("<!doctype html><html><body></body></html>")

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    httpd = Server(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    n, steps_per_epoch = 64, -(-64 // args.batch)
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        for label, trainable, cache in variants:
            page = browser.new_page()
            page.goto(base + "/index.html")
            folder, rep = built[trainable]
            got = page.evaluate(PAGE, {"url": f"{base}/{folder}/m.js", "n": n, "inputSize": 3 * args.size ** 2,
                                       "batch": args.batch, "epochs": args.epochs, "cache": cache})
            page.close()
            first = got["one"]
            later = (got["many"] - got["one"]) / (args.epochs - 1)
            roles = rep["texture_bytes_by_role"]
            rows.append({"variant": label, "trainable": trainable, "cache": cache, "trunk": got["trunk"],
                         "first_epoch_ms": first, "later_epoch_ms": later, "ms_per_step": later / steps_per_epoch,
                         "fit_1_epoch_ms": got["one"], f"fit_{args.epochs}_epochs_ms": got["many"],
                         "texture_bytes_before": roles["total_before"], "texture_bytes_after": roles["total_after"],
                         "bytes_by_role": roles})
            print(f"{label}: {rows[-1]['ms_per_step']:.1f} ms/step, epoch {first:.0f} ms first, "
                  f"{rows[-1]['later_epoch_ms']:.0f} ms later", file=sys.stderr)
        browser.close()
    httpd.shutdown()
    full = rows[2]["later_epoch_ms"]
    out = {"model": f"MobileNet-v1-like, width {args.width}, input {shape}, {rep['parameters']} parameters",
           "batch": args.batch, "examples": n, "epochs": args.epochs, "rows": rows,
           "ratio_cached_head_to_full_later_epoch": rows[0]["later_epoch_ms"] / full,
           "ratio_uncached_head_to_full_later_epoch": rows[1]["later_epoch_ms"] / full}
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "transfer.json"), "w") as f:
        json.dump(out, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{out['model']}, batch {args.batch}, {n} examples")
    print(f"{'variant':<26} {'ms/step':>9} {'epoch 1 ms':>11} {'epoch 2+ ms':>12} {'textures (planned -> shared)':>30}")
    for r in rows:
        print(f"{r['variant']:<26} {r['ms_per_step']:>9.1f} {r['first_epoch_ms']:>11.0f} {r['later_epoch_ms']:>12.0f} "
              f"{r['texture_bytes_before'] / 2**20:>13.1f} MiB -> {r['texture_bytes_after'] / 2**20:.1f} MiB")
    print(f"head-only cached / full, per epoch after the first: {out['ratio_cached_head_to_full_later_epoch']:.3f}; "
          f"uncached / full: {out['ratio_uncached_head_to_full_later_epoch']:.3f}")


if __name__ == "__main__":
    main()
