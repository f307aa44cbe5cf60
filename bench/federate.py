"""Federated-learning benchmark (issue 34): the bytes a client sends a round, and the time a round takes
with 3 clients, for the photos demo's model (EfficientNet-Lite0, frozen backbone, the 1280 x 10 head
trains and travels). Not a test.

    .venv/bin/python bench/federate.py [--images 8] [--rounds 2]

Builds the demo's bundle as `texelfit demo` does (fp16 weights, --trainable '_fc.*', imagenet
normalisation; without the demo's tier measurement), opens 3 browser contexts of one headless
Chromium on the bridge, each with its own crops of scikit-learn's sample photos (IMAGES each, labels
0..2), and runs two federations of ROUNDS rounds of FedAvg (1 local epoch, batch 8, SGD) on the same
pages: with float32 updates, then with `--quantize-updates int8`. A round's time is from the end of the
previous round (Flower's evaluate_fn) to its own end: the three fits (each computes its images' trunk
features, then trains the head), the updates and Flower's aggregation. Writes bench/results/federate.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run"]
INDEX = '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"></head><body></body></html>'

START = """async ([pixels, h, w, labels]) => {
  const { createModel } = await import('/lite0.js');
  const m = await createModel();
  const rgba = new Uint8ClampedArray(pixels.length / 3 * 4);
  window.m = m;
  window.images = [];
  const n = pixels.length / (h * w * 3);
  for (let i = 0; i < n; i++) {
    const data = new Uint8ClampedArray(h * w * 4);
    for (let p = 0; p < h * w; p++) {
      for (let c = 0; c < 3; c++) data[4 * p + c] = pixels[(i * h * w + p) * 3 + c];
      data[4 * p + 3] = 255;
    }
    window.images.push(new ImageData(data, w, h));
  }
  window.x = await m.fromImages(window.images);
  window.y = Int32Array.from(labels);
  return m.info.backend + '/' + m.info.precision;
}"""

FEDERATE = """() => { window.rounds = []; window.result = window.m.federate(location.origin, { x: window.x, y: window.y,
    onRound: (r) => window.rounds.push(r) }).then(() => 'done', (e) => e.code + ': ' + e.message); }"""


def build(out: str):
    from texelfit.build import compile_onnx, write_files
    from texelfit.photos_demo import INPUT_SHAPE, MAX_BATCH, MAX_CLASSES, NAME, TRAINABLE, lite0
    from texelfit.prep.load import export_simplified

    result = compile_onnx(export_simplified(lite0(MAX_CLASSES), INPUT_SHAPE), name=NAME, input_shape=INPUT_SHAPE,
                          max_batch=MAX_BATCH, quantize="fp16", trainable=TRAINABLE, input_normalize="imagenet",
                          weights_file=True)
    files = dict(result.files)
    files["index.html"] = INDEX
    write_files(out, files)


def client_images(n: int):
    import numpy as np
    from PIL import Image

    from texelfit.photos_demo import photo_crops, sample_photos

    photos = sample_photos()
    side = 160
    out = []
    for i in range(3):
        crops = photo_crops(photos[i % len(photos)], n, seed=10 + i)
        arr = [np.asarray(Image.fromarray(c).resize((side, side)), np.uint8) for c in crops]
        out.append((np.stack(arr), side, side, [(i + k) % 3 for k in range(n)]))
    return out


def federation(bundle, pages, port, rounds, quantize):
    from texelfit.bridge import Bridge
    from texelfit.federate import Federation, Settings

    marks = []
    settings = Settings(rounds=rounds, min_clients=3, local_epochs=1, batch_size=8, lr=0.01,
                        quantize_updates=quantize, round_timeout=600, heartbeat=5.0)
    fed = Federation(bundle, settings, report=lambda e: marks.append((e["round"], time.monotonic())),
                     log=lambda _: None)
    bridge = Bridge(fed, port=port).start()
    try:
        for page in pages:
            page.evaluate(FEDERATE)
        while fed.joined < len(pages):
            time.sleep(0.05)
        fed.start()
        fed.wait(1800)
        results = [p.evaluate("() => window.result") for p in pages]
        sent = [r["sent"] for p in pages for r in p.evaluate("() => window.rounds")]
    finally:
        bridge.close()
    assert results == ["done"] * len(pages), results
    times = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
    return {"sent_bytes_per_round": sorted(set(sent)), "round_seconds": [round(t, 2) for t in times],
            "round_seconds_median": round(statistics.median(times), 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=8, help="photos a client (default 8)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    from texelfit.federate import Bundle

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        build(tmp)
        bundle = Bundle.load(tmp)
        values = sum(math.prod(bundle.shapes[n]) for n in bundle.trainable)
        print(f"built the photos demo's bundle in {time.monotonic() - t0:.0f} s; trainable: {bundle.trainable} "
              f"({values} values)", flush=True)
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        from texelfit.bridge import Bridge
        from texelfit.federate import Federation, Settings

        data = client_images(args.images)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            holder = Bridge(Federation(bundle, Settings(), log=lambda _: None), port=port).start()  # serves the pages
            pages = []
            try:
                for pixels, h, w, labels in data:
                    page = browser.new_context().new_page()
                    page.goto(f"{holder.url}/index.html")
                    pages.append(page)
                t1 = time.monotonic()
                backends = [pg.evaluate(START, [d[0].reshape(-1).tolist(), d[1], d[2], d[3]])
                            for pg, d in zip(pages, data)]
                print(f"3 pages loaded the model ({backends[0]}) and their images in {time.monotonic() - t1:.0f} s",
                      flush=True)
            finally:
                holder.close()
            out = {"model": "EfficientNet-Lite0 224x224, frozen backbone, head _fc (1280 x 10)", "clients": 3,
                   "images_per_client": args.images, "trainable_values": values, "backend": backends[0]}
            for quantize in ("float32", "int8"):
                r = federation(bundle, pages, port, args.rounds, quantize)
                out[quantize] = r
                print(f"{quantize}: {r['sent_bytes_per_round']} bytes a client a round; rounds of 3 clients "
                      f"{r['round_seconds']} s (median {r['round_seconds_median']} s)", flush=True)
            browser.close()
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "federate.json"), "w") as f:
        json.dump(out, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.join(HERE, 'results', 'federate.json')}")


if __name__ == "__main__":
    main()
