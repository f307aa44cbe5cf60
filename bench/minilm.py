"""MiniLM benchmark (issue 19): texelfit (WebGL2, and WebGPU: texelfit-webgpu, the bundles built with --webgpu) against
onnxruntime-web (WASM, WebGPU where the browser gives an
adapter) and TensorFlow.js 4.22 (WebGL, WASM; the encoder written with tf ops, tf.layers having no
attention layer), the same all-MiniLM-L6-v2 with the same weights, in headless Chromium. Not a test.

    npm install && .venv/bin/python bench/minilm.py [--rounds 1] [--repeats 3]

Rows (sequences of TOKENS tokens, ids from the Hugging Face tokenizer): the sentence embedding of one
sentence and of a batch of 16; head training (384 -> CLASSES Linear, Adam, batch 8) on the cached
embeddings of the 16, ms a step; one fine-tune step of the last encoder layer and the head at batch 8.
onnxruntime-web does the inference rows. Every page's embeddings are checked against PyTorch's before
anything is timed. Also the bundle and weights-file sizes, load time and embedding agreement with
float32 of the `--quantize fp16` and `int8` builds (weights beside the code). Writes
bench/results/minilm.json and bench/results/minilm.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import efficientnet as e  # noqa: E402  (pages, summary and tables of the Lite0 bench)
import run as common  # noqa: E402

ROOT = common.ROOT
TOKENS = 32           # the "one 32-token sentence"; the bundles are built for it
SENTENCES = 16        # the batch row, and the head-training set
BATCH = 8             # head training and fine-tune batch; the bundles' max_batch is SENTENCES
CLASSES = 4
NAMES = ["input_ids", "attention_mask"]
HEAD = "head.*"
LAST = "encoder.bert.encoder.layer.5.*,head.*"
CHECK_REL_L2 = 1e-4
FRAMEWORKS = ["texelfit", "texelfit-webgpu", "tfjs-webgl", "tfjs-webgpu", "tfjs-wasm", "ort-wasm", "ort-webgpu"]
ROWS = ["embed_1", "embed_16", "head_step", "finetune_step"]
ROW_LABELS = {"embed_1": f"embedding, 1 sentence of {TOKENS} tokens", "embed_16": f"embeddings, {SENTENCES} sentences",
              "head_step": f"head training on cached embeddings, batch {BATCH} (ms/step)",
              "finetune_step": f"fine-tune step, last layer + head, batch {BATCH}"}
PAGES = [("texelfit", "head"), ("texelfit", "last"), ("texelfit-webgpu", "head"), ("texelfit-webgpu", "last"),
         ("tfjs-webgl", "all"), ("tfjs-webgpu", "all"), ("tfjs-wasm", "all"),
         ("ort-wasm", "infer"), ("ort-webgpu", "infer")]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Training happens in the browser, on the user's own GPU.",
         "Nothing leaves the device.", "WebGL2 renders into float textures; the kernels are fragment shaders.",
         "A sentence encoder maps text to a unit vector.", "Paris is the capital of France.",
         "I would like a cup of coffee, please.", "The weather was cold and grey all week.",
         "Transformers are what people fine-tune now.", "She scored twice in the second half.",
         "Prices rose by 3.5% in November.", "Where is the nearest train station?",
         "Ünïcödé, accents and CJK: 東京は大きい。", "short", "An embedding of a longer sentence that runs past the "
         "thirty-two tokens the benchmark's bundle is built for, so that it is truncated as the tokenizer does.",
         "Good morning!"]


class Classifier(nn.Module):
    """MiniLM (texelfit.minilm) and a Linear head on its embedding."""

    def __init__(self, encoder, classes=CLASSES):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.position_embeddings.shape[1], classes)

    def forward(self, input_ids, attention_mask):
        return self.head(self.encoder(input_ids, attention_mask))


def tf_weights(model):
    """The state_dict in one float32 blob for the TF.js page: {name: [offset, shape]}, names without
    the `encoder.` prefix (the page's names are MiniLMEncoder's, and `head.*`)."""
    spec, chunks, off = {}, [], 0
    for name, t in model.state_dict().items():
        a = np.ascontiguousarray(t.detach().numpy(), dtype=np.float32)
        spec[name.removeprefix("encoder.")] = [off, list(a.shape)]
        chunks.append(a.reshape(-1))
        off += a.size
    return spec, np.concatenate(chunks)


def prepare(site, compile_onnx, export_inputs, quantize, frameworks):
    from texelfit import minilm

    os.makedirs(os.path.join(site, "data"))
    os.symlink(common.PAGES, os.path.join(site, "pages"))
    os.symlink(common.TFJS_DIST, os.path.join(site, "tfjs"))
    os.symlink(common.TFJS_WASM_DIST, os.path.join(site, "tfjs-wasm"))
    os.symlink(common.TFJS_WEBGPU_DIST, os.path.join(site, "tfjs-webgpu"))
    os.symlink(e.ORT_DIST, os.path.join(site, "ort"))
    torch.manual_seed(0)
    model = Classifier(minilm.minilm_l6(TOKENS)).eval()
    info = {"parameters": sum(p.numel() for p in model.parameters())}
    t0 = time.perf_counter()
    if any(f.startswith("ort") for f in frameworks):
        e._write(os.path.join(site, "data", "minilm.onnx"), e._ort_copy(export_inputs(model.encoder)))
    onnx_model = export_inputs(model) if any(f.startswith("texelfit") for f in frameworks) else None
    info["export_s"] = time.perf_counter() - t0
    bundles = {}
    for key, trainable, q in ([("head", HEAD, "none"), ("last", LAST, "none")] +
                              [(f"head-{q}", HEAD, q) for q in quantize]) if onnx_model else []:
        t0 = time.perf_counter()
        r = compile_onnx(onnx_model, name="minilm", input_shape=[(TOKENS,), (TOKENS,)], max_batch=SENTENCES,
                         trainable=trainable, quantize=q, weights_file=True, webgpu="texelfit-webgpu" in frameworks)
        d = os.path.join(site, "bundles", key)
        os.makedirs(d)
        for name, text in r.files.items():
            e._write(os.path.join(d, name), text)
        bundles[key] = {"trainable": trainable, "quantize": q, "build_s": time.perf_counter() - t0,
                        "files": {n: len(t if isinstance(t, bytes) else t.encode()) for n, t in r.files.items()}}
    spec, blob = tf_weights(model)
    e._write(os.path.join(site, "data", "tf_weights.bin"), blob.tobytes())
    e._write(os.path.join(site, "data", "tf_spec.json"), json.dumps(spec))
    ids = minilm.tokenize(TEXTS, TOKENS)
    y = np.random.default_rng(19).integers(0, CLASSES, SENTENCES).astype(np.int32)
    for k in ("input_ids", "attention_mask"):
        e._write(os.path.join(site, "data", f"{k}.bin"), ids[k].numpy().astype(np.int32).tobytes())
    e._write(os.path.join(site, "data", "y.bin"), y.tobytes())
    with torch.no_grad():
        emb = model.encoder(ids["input_ids"], ids["attention_mask"]).numpy()
        logits1 = model(ids["input_ids"][:1], ids["attention_mask"][:1]).numpy()
        loss = float(F.cross_entropy(model(ids["input_ids"][:BATCH], ids["attention_mask"][:BATCH]),
                                     torch.from_numpy(y[:BATCH]).long()))
    e._write(os.path.join(site, "data", "ref_embeddings.bin"), emb.tobytes())
    e._write(os.path.join(site, "data", "ref_logits1.bin"), logits1.tobytes())
    info.update(bundles=bundles, pytorch_first_loss_b8=loss, tf_weights=int(blob.size))
    return info


def page_args(fw, part, url, args):
    d = f"{url}/data"
    a = dict(part=part, warmup=args.warmup, repeats=args.repeats, headEpochs=args.head_epochs, batch=BATCH,
             tokens=TOKENS, optimizer=e.ADAM, checkTol=CHECK_REL_L2, slow={"ms": args.slow_s * 1000, "repeats": 1},
             ids=f"{d}/input_ids.bin", mask=f"{d}/attention_mask.bin", y=f"{d}/y.bin",
             refEmbeddings=f"{d}/ref_embeddings.bin", refLogits=f"{d}/ref_logits1.bin")
    if fw.startswith("texelfit"):  # (texelfit-webgpu: the same bundle, built with --webgpu, on createModel's WebGPU)
        return dict(a, bundle=f"{url}/bundles/{part}/minilm.js", backend="webgpu" if fw.endswith("webgpu") else "webgl2")
    if fw.startswith("tfjs"):
        return dict(a, backend=fw.split("-")[1], wasmPath=f"{url}/tfjs-wasm/", spec=f"{d}/tf_spec.json",
                    weights=f"{d}/tf_weights.bin", layers=6, lastLayer=5,
                    headSteps=args.head_epochs * -(-SENTENCES // BATCH))
    return dict(a, ep=fw.split("-")[1], wasmPath=f"{url}/ort/", model=f"{d}/minilm.onnx")


def run_page(browser, url, fw, part, args):
    return e.run_page(browser, url, fw, part, args, bench="minilm", arguments=page_args)


LOAD_JS = """async (a) => {
  const mod = await import(a.bundle);
  const t0 = performance.now();
  const m = await mod.createModel();
  const loadMs = performance.now() - t0;
  const ids = new Int32Array(await (await fetch(a.ids)).arrayBuffer());
  const mask = new Int32Array(await (await fetch(a.mask)).arrayBuffer());
  const n = ids.length / a.tokens;
  const out = Array.from(await m.features({ input_ids: ids, attention_mask: mask }, n));
  const info = { precision: m.info.precision };
  m.dispose();
  return { loadMs, out, info };
}"""


def quantized_rows(browser, url, info, args):
    """Load time and embedding agreement (cosine with PyTorch's float32 embeddings) of each build."""
    ref = None
    rows = {}
    for key, b in info["bundles"].items():
        if not key.startswith("head"):
            continue
        res = common.call_in_page(browser, url, "minilm_texelfit", lambda page, key=key: page.evaluate(LOAD_JS, {
            "bundle": f"{url}/bundles/{key}/minilm.js", "ids": f"{url}/data/input_ids.bin",
            "mask": f"{url}/data/attention_mask.bin", "tokens": TOKENS}))
        if "error" in res:
            rows[key] = {"error": res["error"]}
            continue
        if ref is None:
            ref = np.fromfile(os.path.join(args.site, "data", "ref_embeddings.bin"), dtype=np.float32).reshape(SENTENCES, -1)
        got = np.asarray(res["out"], dtype=np.float32).reshape(SENTENCES, -1)
        cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
        rows[key] = {"quantize": b["quantize"], "loadMs": res["loadMs"], "files": b["files"],
                     "cosineMin": float(cos.min()), "cosineMean": float(cos.mean()), "precision": res["info"]["precision"]}
    return rows


def markdown(result):
    md = e.markdown(result, title="MiniLM (all-MiniLM-L6-v2) benchmark", rows=ROWS, labels=ROW_LABELS,
                    frameworks=FRAMEWORKS, target=False)
    lines = ["", f"Builds (weights beside the code; `features` of the {SENTENCES} sentences against PyTorch's "
             "float32 embeddings):", "", "| build | minilm.js | minilm.weights.bin | load ms | cosine min | cosine mean |",
             "|---|---|---|---|---|---|"]
    for key, r in result["builds"].items():
        if "error" in r:
            lines.append(f"| {key} | {r['error']} | | | | |")
            continue
        f = r["files"]
        lines.append(f"| {key} ({r['quantize']}) | {f.get('minilm.js', 0):,} | {f.get('minilm.weights.bin', 0):,} | "
                     f"{r['loadMs']:.0f} | {r['cosineMin']:.6f} | {r['cosineMean']:.6f} |")
    return md + "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-s", type=float, default=20.0, help="a row whose first call takes longer is timed once")
    ap.add_argument("--head-epochs", type=int, default=6, help="epochs of the timed head fit")
    ap.add_argument("--quantize", nargs="*", default=["fp16", "int8"], choices=["fp16", "int8"])
    ap.add_argument("--frameworks", nargs="+", default=FRAMEWORKS, choices=FRAMEWORKS)
    ap.add_argument("--page-timeout", type=int, default=900)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args(argv)
    _, compile_onnx, export_simplified = common.use_texelfit(None, None)
    with tempfile.TemporaryDirectory() as site:
        args.site = site
        t0 = time.perf_counter()
        info = prepare(site, compile_onnx, lambda m: export_simplified(m, [(TOKENS,), (TOKENS,)], NAMES, "int64"),
                       args.quantize, args.frameworks)
        print(f"prepared in {time.perf_counter() - t0:.0f} s", flush=True)
        httpd, url = common.serve(site)
        pages, version, builds = [], None, {}
        try:
            for r in range(args.rounds):
                got, version = e.browser_round(url, args, r, PAGES, run_page)
                pages += got
            if "texelfit" in args.frameworks:
                from playwright.sync_api import sync_playwright
                with sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=common.CHROMIUM, headless=True,
                                                args=common.CHROMIUM_ARGS)
                    builds = quantized_rows(browser, url, info, args)
                    browser.close()
        finally:
            httpd.shutdown()
    del args.site
    e.write_result(args, "minilm", pages, version, info, markdown, builds=builds)

if __name__ == "__main__":
    main()
