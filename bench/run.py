"""texelfit benchmark (issue 6): texelfit against TensorFlow.js 4.22 (WebGL and WASM backends) in
headless Chromium, with PyTorch CPU (2 threads) as a reference.

    npm install && .venv/bin/python bench/run.py            # from the repository root (~6-8 min on 2 cores)

Writes bench/results/results.json and bench/results/results.md. This is not a test: nothing here is
collected by pytest (pyproject's testpaths is tests/, and no file here is named test_*).

Method (see bench/README.md): every (case, framework) runs in a fresh page of a fresh browser
context; each of `--rounds` rounds launches a fresh browser. In a page: the cold first step
(model creation + first training step, shaders compiled on the way), then `--warmup` steps, then
`--windows` timed windows of `--steps` steps each, every window ended by one readback. ms/step of
a round = the median over its windows of (window time / steps); the tables give min / median / max
over the rounds.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import functools
import gzip
import http.server
import json
import os
import platform
import re
import shutil
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The same browser and flags as tests/conftest.py (kept in sync by hand: importing conftest would
# pull in pytest fixtures).
CHROMIUM = os.environ.get("TEXELFIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

TFJS_DIST = os.path.join(ROOT, "node_modules", "@tensorflow", "tfjs", "dist")
TFJS_WASM_DIST = os.path.join(ROOT, "node_modules", "@tensorflow", "tfjs-backend-wasm", "dist")
TFJS_WEBGPU_DIST = os.path.join(ROOT, "node_modules", "@tensorflow", "tfjs-backend-webgpu", "dist")
PAGES = os.path.join(ROOT, "bench", "pages")
FRAMEWORKS = ["texelfit", "tfjs-webgl", "tfjs-wasm"]
SEED = 1234


# ---- models -------------------------------------------------------------------------------------

def mlp():
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


class CNN(nn.Module):
    """1x28x28: conv 3x3 8 -> relu -> maxpool 2 -> conv 3x3 16 -> relu -> maxpool 2 -> dense 10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


MODELS = {
    "mlp": dict(factory=mlp, shape=(784,), tf_shape=[784],
                tf_layers=[{"type": "dense", "units": 128, "relu": True}, {"type": "dense", "units": 10}]),
    "cnn": dict(factory=CNN, shape=(1, 28, 28), tf_shape=[28, 28, 1],
                tf_layers=[{"type": "conv", "filters": 8, "kernel": 3, "relu": True}, {"type": "maxpool", "size": 2},
                           {"type": "conv", "filters": 16, "kernel": 3, "relu": True}, {"type": "maxpool", "size": 2},
                           {"type": "flatten"}, {"type": "dense", "units": 10}]),
}


def tf_weights(name, module):
    """The PyTorch weights in TF.js layers' order and layout: dense kernels [in, out], conv kernels
    [kh, kw, in, out], and the dense layer after the flatten permuted from (C, H, W) to (H, W, C)."""
    sd = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    if name == "mlp":
        ws = [sd["0.weight"].T, sd["0.bias"], sd["2.weight"].T, sd["2.bias"]]
    else:
        fc = sd["fc.weight"].reshape(10, 16, 5, 5).transpose(2, 3, 1, 0).reshape(400, 10)
        ws = [sd["conv1.weight"].transpose(2, 3, 1, 0), sd["conv1.bias"],
              sd["conv2.weight"].transpose(2, 3, 1, 0), sd["conv2.bias"], fc, sd["fc.bias"]]
    ws = [np.ascontiguousarray(w, dtype=np.float32) for w in ws]
    return ws


# ---- cases --------------------------------------------------------------------------------------

SGD = {"type": "sgd", "lr": 0.1}
ADAM = {"type": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8}

CASES = [
    dict(id="A_mlp_b64_sgd", label="A MLP b64 SGD", model="mlp", batch=64, optimizer=SGD),
    dict(id="A_mlp_b64_adam", label="A MLP b64 Adam", model="mlp", batch=64, optimizer=ADAM),
    dict(id="B_cnn_b32_adam", label="B CNN b32 Adam", model="cnn", batch=32, optimizer=ADAM),
    dict(id="C_mlp_b1_sgd", label="C MLP b1 SGD", model="mlp", batch=1, optimizer=SGD),
    dict(id="C_mlp_b1_adam", label="C MLP b1 Adam", model="mlp", batch=1, optimizer=ADAM),
    dict(id="D_predict_mlp_b1", label="D predict MLP b1", model="mlp", batch=1, optimizer=None),
]

# Reference numbers from the issue (median ms/step; None: cannot train).
REFERENCE = {
    "A_mlp_b64_sgd": {"tfjs-webgl": 21.5, "tfjs-wasm": 9.7, "pytorch": 0.87},
    "A_mlp_b64_adam": {"tfjs-webgl": 39.9, "tfjs-wasm": 13.5, "pytorch": 1.40},
    "B_cnn_b32_adam": {"tfjs-webgl": 171, "tfjs-wasm": None, "pytorch": 6.0},
    "C_mlp_b1_sgd": {"tfjs-webgl": 14.6, "tfjs-wasm": 3.2, "pytorch": 0.55},
    "C_mlp_b1_adam": {"tfjs-webgl": 25.1, "tfjs-wasm": 3.7, "pytorch": 1.20},
    "D_predict_mlp_b1": {"tfjs-webgl": 5.9, "tfjs-wasm": 0.4, "pytorch": 0.07},
}


# ---- the site -----------------------------------------------------------------------------------

class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm",
                      ".js": "text/javascript", ".mjs": "text/javascript"}

    def log_message(self, *args):
        pass

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(root):
    httpd = _Server(("127.0.0.1", 0), functools.partial(_Handler, directory=root))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def write_bin(path, array):
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(array).tobytes())


# ---- preparation: bundles, weights, data ---------------------------------------------------------

def use_texelfit(rev, tmp):
    """Import texelfit from the working tree, or (--rev) from a `git archive` of that revision laid
    out as the installed package (texelfit/, with prep/, codegen/ and runtime_template/ inside)."""
    if rev:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
        pkg = os.path.join(tmp, "pkg", "texelfit")
        shutil.copytree(os.path.join(src, "texelfit"), pkg)
        for sub in ("prep", "codegen", "runtime_template"):
            shutil.copytree(os.path.join(src, sub), os.path.join(pkg, sub))
        sys.path.insert(0, os.path.join(tmp, "pkg"))  # ahead of the editable install's finder
    import texelfit
    from texelfit.build import compile_onnx
    from texelfit.prep.load import export_simplified
    return os.path.dirname(texelfit.__file__), compile_onnx, export_simplified


def cpu_model():
    """The CPU's model name (/proc/cpuinfo) and the vector extensions SwiftShader's code can use: the same
    bench's ratios move with the machine, so its results say which machine."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.machine())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    ext = [f for f in ("avx2", "avx512f", "f16c") if f in flags]
    return f"{model} ({', '.join(ext) or 'no avx2'})"


def git_state(rev):
    def git(*a):
        r = subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True)
        return r.stdout.rstrip() if r.returncode == 0 else None
    state = {"head": git("rev-parse", "HEAD"), "rev": rev}
    if rev:
        state["rev_commit"] = git("rev-parse", rev)
    else:  # what the bundles were built from may differ from HEAD
        status = git("status", "--porcelain", "--", "texelfit", "prep", "codegen", "runtime_template")
        state["uncommitted_source_changes"] = status.splitlines() if status else []
    return state


def prepare(site, args, compile_onnx, export_simplified):
    """Builds one bundle per model from a seeded PyTorch init, writes the same weights for TF.js and
    the same random batches for everyone. Returns the initial modules and per-case inputs."""
    os.makedirs(os.path.join(site, "bundles"))
    os.makedirs(os.path.join(site, "data"))
    os.symlink(PAGES, os.path.join(site, "pages"))
    os.symlink(TFJS_DIST, os.path.join(site, "tfjs"))
    os.symlink(TFJS_WASM_DIST, os.path.join(site, "tfjs-wasm"))
    os.symlink(TFJS_WEBGPU_DIST, os.path.join(site, "tfjs-webgpu"))  # (bench/webgpu.py's rows; tfjs.html loads it)
    built = {}
    for i, (name, spec) in enumerate(MODELS.items()):
        torch.manual_seed(SEED + i)
        module = spec["factory"]()
        t0 = time.perf_counter()
        result = compile_onnx(export_simplified(module, spec["shape"]), name=name, input_shape=spec["shape"],
                              max_batch=64)
        build_s = time.perf_counter() - t0
        d = os.path.join(site, "bundles", name)
        os.makedirs(d)
        for fname, text in result.files.items():
            with open(os.path.join(d, fname), "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
        ws = tf_weights(name, module)
        write_bin(os.path.join(site, "data", f"{name}_weights.bin"), np.concatenate([w.reshape(-1) for w in ws]))
        js = result.files[f"{name}.js"]
        built[name] = dict(module=module, js=js, report=result.report, build_s=build_s,
                           tf_shapes=[list(w.shape) for w in ws], sha256=hashlib.sha256(js.encode()).hexdigest())
    data = {}
    rng = np.random.default_rng(SEED)
    batches = 1 + args.warmup + args.steps  # cold step, warm-up, timed window
    for case in CASES:
        spec = MODELS[case["model"]]
        n = batches * case["batch"] if case["optimizer"] else 1 + args.warmup + args.steps
        x = rng.standard_normal((n,) + spec["shape"], dtype=np.float32)
        y = rng.integers(0, 10, n).astype(np.int32)
        write_bin(os.path.join(site, "data", f"{case['id']}_x.bin"), x)
        write_bin(os.path.join(site, "data", f"{case['id']}_y.bin"), y)
        data[case["id"]] = (x, y)
    return built, data


def schedule_passes(js):
    """Passes per training step, from the bundle's static schedule (the backward of a step is
    trainBackward where the bundle has one: without the gradient passes its optimizer fuses)."""
    m = re.search(r"^const SCHEDULE = (\{.*\});$", js, re.M)
    if not m:
        return None
    s = json.loads(m.group(1))
    losses = s["loss"] if isinstance(s["loss"], list) else [s["loss"]]  # (a list: one an output)
    return {"forward": len(s["forward"]), "loss": [{k: len(v) for k, v in d.items()} for d in losses],
            "backward": len(s.get("trainBackward", s["backward"])), "optimizer": {k: len(v) for k, v in s["optimizer"].items()}}


def gz(data: bytes) -> int:
    return len(gzip.compress(data, compresslevel=9, mtime=0))


def sizes(built):
    out = {}
    for name, b in built.items():
        js = b["js"]
        stripped, n = re.subn(r'^const WEIGHTS = "[^"]*";$', 'const WEIGHTS = "";', js, flags=re.M)
        assert n == 1, "the bundle's WEIGHTS string was not found"
        out[f"texelfit {name}.js"] = {"bytes": len(js.encode()), "gzip": gz(js.encode()),
                                      "gzip_without_weights": gz(stripped.encode()),
                                      "bytes_without_weights": len(stripped.encode())}
    for label, path in [("tf.min.js", os.path.join(TFJS_DIST, "tf.min.js")),
                        ("tf-backend-wasm.min.js", os.path.join(TFJS_WASM_DIST, "tf-backend-wasm.min.js")),
                        ("tfjs-backend-wasm-simd.wasm", os.path.join(TFJS_WASM_DIST, "tfjs-backend-wasm-simd.wasm"))]:
        raw = open(path, "rb").read()
        out[label] = {"bytes": len(raw), "gzip": gz(raw)}
    return out


# ---- CPU contention -----------------------------------------------------------------------------
# The machine may be shared: other processes' CPU use while a page (or a PyTorch case) runs is
# measured, recorded with each result, and a result taken under contention is retried.

def _my_tree_ticks():
    """utime + stime (clock ticks) of this process and all its live descendants (Playwright's
    driver, Chromium and its children)."""
    parent, ticks = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(fields[1])
        ticks[int(d)] = int(fields[11]) + int(fields[12])
    mine, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in mine:
                mine.add(c)
                frontier.append(c)
    return sum(ticks.get(p, 0) for p in mine)


def _busy_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4]  # all but idle and iowait


def cpu_sample():
    try:
        return time.monotonic(), _busy_ticks(), _my_tree_ticks()
    except OSError:  # no /proc: contention is not measured
        return None


def foreign_cores(a, b):
    """CPU cores used by processes outside this benchmark between two samples (None if unknown)."""
    if not a or not b or b[0] - a[0] < 0.05:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / hz / (b[0] - a[0]))


class Retries:
    def __init__(self, threshold, budget, wait_budget_s):
        self.threshold, self.left, self.log = threshold, budget, []
        self.wait_left, self.waited = wait_budget_s, 0.0

    def wait_quiet(self):
        """Before a measurement: wait (within the run's waiting budget) until other processes have
        used under `threshold` cores for a whole second."""
        if self.wait_left <= 0:
            return
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.wait_left:
            a = cpu_sample()
            time.sleep(1.0)
            f = foreign_cores(a, cpu_sample())
            if f is None or f < self.threshold:
                break
        dt = time.monotonic() - t0
        self.wait_left -= dt
        self.waited += dt

    def run(self, what, fn):
        """Runs fn() -> result dict (given "foreignCores"); reruns it while another process used more
        than `threshold` cores meanwhile and retries are left; keeps the least disturbed result."""
        self.wait_quiet()
        best = fn()
        tries = 0
        while (best.get("foreignCores") or 0) > self.threshold and self.left > 0 and tries < 2 and "error" not in best:
            self.left -= 1
            tries += 1
            self.wait_quiet()
            again = fn()
            self.log.append({"what": what, "foreign_cores": [best["foreignCores"], again.get("foreignCores")]})
            print(f"    retried {what}: other processes used {best['foreignCores']:.2f} cores, "
                  f"then {again.get('foreignCores') or 0:.2f}", flush=True)
            if (again.get("foreignCores") or 0) < best["foreignCores"]:
                best = again
        return best


# ---- browser runs -------------------------------------------------------------------------------

def page_args(case, fw, url, built, args):
    spec = MODELS[case["model"]]
    common = dict(x=f"{url}/data/{case['id']}_x.bin", y=f"{url}/data/{case['id']}_y.bin", warmup=args.warmup,
                  steps=args.steps, windows=args.windows)
    if fw == "tfjs-webgl" and case["model"] == "cnn":
        common["windows"] = args.slow_windows  # ~0.17 s/step: keep the run short
    if fw == "texelfit":
        return dict(common, bundle=f"{url}/bundles/{case['model']}/{case['model']}.js", batch=case["batch"],
                    optimizer=case["optimizer"])
    return dict(common, backend=fw.split("-")[1], wasmPath=f"{url}/tfjs-wasm/", layers=spec["tf_layers"],
                inputShape=spec["tf_shape"], weights=f"{url}/data/{case['model']}_weights.bin",
                shapes=built[case["model"]]["tf_shapes"], batch=case["batch"], classes=10,
                optimizer=case["optimizer"])


# After a page has loaded, Chromium keeps working for a second or so: a measurement started at once
# competes with it for the 2 cores (bench/README.md, "How it is timed", has the numbers).
SETTLE_CORES, SETTLE_SPAN, SETTLE_MAX = 0.15, 0.5, 5.0


def settle():
    """Wait (at most SETTLE_MAX s) until this process tree (Playwright, Chromium) has used under
    SETTLE_CORES cores for SETTLE_SPAN s; returns the seconds waited."""
    hz = os.sysconf("SC_CLK_TCK")
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < SETTLE_MAX:
            a, ta = _my_tree_ticks(), time.monotonic()
            time.sleep(SETTLE_SPAN)
            if (_my_tree_ticks() - a) / hz / (time.monotonic() - ta) < SETTLE_CORES:
                break
    except OSError:  # no /proc: nothing to wait for
        pass
    return time.monotonic() - t0


def call_in_page(browser, url, page_name, call, prepare=None):
    """Open bench/pages/PAGE_NAME.html in a fresh context, wait for it, let the machine settle, then
    `call(page)` (the page's result dict), recording the other processes' CPU load around it; an
    exception, or the page's console errors, are recorded in the result and the run goes on.
    `prepare(page)` runs before the page loads (timeouts, exposed functions)."""
    ctx = browser.new_context()
    page = ctx.new_page()
    if prepare:
        prepare(page)
    errors = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    try:
        page.goto(f"{url}/pages/{page_name}.html")
        page.wait_for_function("window.benchReady === true", timeout=60_000)
        settled_s = settle()
        c0 = cpu_sample()  # the page's renderer is alive from here until ctx.close()
        result = call(page)
        result["foreignCores"] = foreign_cores(c0, cpu_sample())
        result["settledS"] = settled_s
    except Exception as e:  # recorded, the run goes on
        result = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
    finally:
        ctx.close()
    if errors:
        result["pageErrors"] = errors[:10]
    return result


def run_in_page(browser, url, case, fw, built, args, extra=None):
    fn = "predict" if case["optimizer"] is None else "train"
    page_args_ = {**page_args(case, fw, url, built, args), **(extra or {})}
    return call_in_page(browser, url, "texelfit" if fw == "texelfit" else "tfjs",
                        lambda page: page.evaluate(f"(a) => window.bench.{fn}(a)", page_args_))


def browser_round(url, built, args, r, retries):
    from playwright.sync_api import sync_playwright
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        version = browser.version
        # Rotate the framework order from round to round, so that none is always first.
        order = FRAMEWORKS[r % 3:] + FRAMEWORKS[:r % 3]
        for case in CASES:
            if args.cases and case["id"] not in args.cases:
                continue
            for fw in order:
                if fw not in args.frameworks:
                    continue
                t0 = time.perf_counter()
                res = retries.run(f"round {r + 1} {case['id']} {fw}",
                                  lambda: run_in_page(browser, url, case, fw, built, args))
                res["pageWallS"] = time.perf_counter() - t0
                out.setdefault(case["id"], {})[fw] = res
                msg = res.get("error") or f"{res['perStep']:.3f} ms/step, cold {res['coldMs']:.0f} ms"
                if res.get("foreignCores") is not None:
                    msg += f", others {res['foreignCores']:.2f} cores"
                print(f"  round {r + 1} {case['id']:18s} {fw:11s} {msg}  ({res['pageWallS']:.1f} s)", flush=True)
            if r == 0 and case["optimizer"] and "texelfit" in args.frameworks:
                # diagnostic page, not timed: the first step with every draw synced and timed
                res = run_in_page(browser, url, case, "texelfit", built, args, {"profileFirst": True})
                out[case["id"]]["texelfit-first-step-profile"] = res
        browser.close()
    return out, version


# ---- PyTorch ------------------------------------------------------------------------------------

def pytorch_case(case, built, data, args):
    c0 = cpu_sample()
    res = _pytorch_case(case, built, data, args)
    res["foreignCores"] = foreign_cores(c0, cpu_sample())
    return res


def _pytorch_case(case, built, data, args):
    x_np, y_np = data[case["id"]]
    module = copy.deepcopy(built[case["model"]]["module"])
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np).long()
    b = case["batch"]
    if case["optimizer"] is None:
        module.eval()
        with torch.no_grad():
            first = module(x[:1]).numpy().reshape(-1).tolist()
            for i in range(1, 1 + args.warmup):
                module(x[i:i + 1])
            per = []
            for _ in range(args.windows):
                t0 = time.perf_counter()
                for i in range(1 + args.warmup, 1 + args.warmup + args.steps):
                    out = module(x[i:i + 1])
                out.numpy()
                per.append((time.perf_counter() - t0) * 1000 / args.steps)
        return {"perStep": statistics.median(per), "windows": [{"perStep": v} for v in per], "firstOut": first}
    o = case["optimizer"]
    opt = (torch.optim.SGD(module.parameters(), lr=o["lr"]) if o["type"] == "sgd" else
           torch.optim.Adam(module.parameters(), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"]))

    def step(i):
        opt.zero_grad()
        loss = F.cross_entropy(module(x[i * b:(i + 1) * b]), y[i * b:(i + 1) * b])
        loss.backward()
        opt.step()
        return loss

    first = step(0).item()
    for i in range(1, 1 + args.warmup):
        loss = step(i)
    warm_last = loss.item()
    per, last = [], []
    for _ in range(args.windows):
        t0 = time.perf_counter()
        for i in range(1 + args.warmup, 1 + args.warmup + args.steps):
            loss = step(i)
        last.append(loss.item())
        per.append((time.perf_counter() - t0) * 1000 / args.steps)
    return {"perStep": statistics.median(per), "windows": [{"perStep": v, "lastLoss": l} for v, l in zip(per, last)],
            "firstLoss": first, "warmupLastLoss": warm_last}


# ---- summary ------------------------------------------------------------------------------------

def mmm(values):
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def summarize(rounds, torch_rounds, built, args):
    summary = {}
    for case in CASES:
        cid = case["id"]
        if args.cases and cid not in args.cases:
            continue
        s = {}
        for fw in FRAMEWORKS:
            res = [r[cid][fw] for r in rounds if fw in r.get(cid, {})]
            if not res:
                continue
            ok = [x for x in res if "error" not in x]
            e = {"steady_ms": mmm([x["perStep"] for x in ok]), "cold_ms": mmm([x["coldMs"] for x in ok]),
                 "foreign_cores_max": max((x.get("foreignCores") or 0 for x in res), default=None),
                 "errors": sorted({x["error"] for x in res if "error" in x})}
            if fw == "texelfit":
                e["create_ms"] = mmm([x["createMs"] for x in ok])
                e["first_step_ms"] = mmm([x["firstStepMs"] for x in ok])
                e["import_ms"] = mmm([x["importMs"] for x in ok])
                if case["optimizer"]:
                    e["longest_task_fit_ms"] = max((x["longestTaskFit"] for x in ok), default=None)
                    e["longest_task_first_fit_ms"] = max((x["longestTaskFirstFit"] for x in ok), default=None)
                    e["longest_task_create_ms"] = max((x["longestTaskCreate"] for x in ok), default=None)
                if ok:
                    d = ok[0]["diag"]
                    e["gl_calls_per_step"] = {k: v / d["steps"] for k, v in d["counts"].items() if v}
                    pr = ok[0].get("profile")
                    if pr:
                        e["profile_round1"] = {
                            "fenced_ms_per_step": {k: v["ms"] / pr["steps"] for k, v in
                                                   sorted(pr["byKernel"].items(), key=lambda kv: -kv[1]["ms"])},
                            "calls_per_step": {k: v["calls"] / pr["steps"] for k, v in pr["byKernel"].items()},
                            "wall_ms_per_step": pr["ms"] / pr["steps"], "sync_round_trip_ms": pr["syncMs"]}
                fp = rounds[0].get(cid, {}).get("texelfit-first-step-profile")
                if fp and "profile" in fp:
                    pr = fp["profile"]
                    e["first_step_profile_round1"] = {
                        "ms": {k: v["ms"] for k, v in sorted(pr["byKernel"].items(), key=lambda kv: -kv[1]["ms"])},
                        "wall_ms": pr["ms"], "sync_round_trip_ms": pr["syncMs"]}
                if ok and "timers" in ok[0]:
                    e["timer_delays_ms"] = ok[0]["timers"]
            else:
                e["init_ms"] = mmm([x["initMs"] for x in ok])
                if ok and "perStepByReadback" in ok[0]:
                    e["steady_ms_by_readback"] = {m: mmm([x["perStepByReadback"][m] for x in ok]) for m in ("sync", "async")}
                    e["readback_used"] = [x["readback"] for x in ok]
                e["first_step_ms"] = mmm([x["firstStepMs"] for x in ok])
                if ok:
                    e["env"] = ok[0]["env"]
            s[fw] = e
        s["pytorch"] = {"steady_ms": mmm([t[cid]["perStep"] for t in torch_rounds if cid in t]),
                        "foreign_cores_max": max((t[cid].get("foreignCores") or 0 for t in torch_rounds if cid in t),
                                                 default=None)}
        med = lambda fw: (s.get(fw, {}).get("steady_ms") or {}).get("median")  # noqa: E731
        tx = med("texelfit")
        s["ratios"] = {f"texelfit/{o}": (tx / med(o) if tx and med(o) else None)
                       for o in ["tfjs-webgl", "tfjs-wasm", "pytorch"]}
        cold_tx = (s.get("texelfit", {}).get("cold_ms") or {}).get("median")
        cold_tf = (s.get("tfjs-webgl", {}).get("cold_ms") or {}).get("median")
        s["ratios"]["cold texelfit/tfjs-webgl"] = cold_tx / cold_tf if cold_tx and cold_tf else None
        s["checks"] = agreement(case, rounds, torch_rounds)
        summary[cid] = s
    return summary


def agreement(case, rounds, torch_rounds):
    """Do the frameworks compute the same thing? Losses (or outputs) against PyTorch, round 1."""
    cid = case["id"]
    ref = torch_rounds[0].get(cid) if torch_rounds else None
    if not ref or not rounds:
        return None
    out = {}
    for fw, res in rounds[0].get(cid, {}).items():
        if fw not in FRAMEWORKS or "error" in res:
            continue
        if case["optimizer"] is None:
            out[fw] = {"max_abs_diff_first_output": float(np.max(np.abs(np.subtract(res["firstOut"], ref["firstOut"]))))}
        else:
            out[fw] = {"first_loss": res["firstLoss"], "pytorch_first_loss": ref["firstLoss"],
                       "loss_after_window_1": res["windows"][0]["lastLoss"],
                       "pytorch_loss_after_window_1": ref["windows"][0]["lastLoss"]}
    return out


def fmt(x, digits=None):
    if x is None:
        return "–"
    if digits is None:
        digits = 3 if x < 1 else 2 if x < 10 else 1 if x < 100 else 0
    return f"{x:.{digits}f}"


def fmt_mmm(m, flag=False):
    if not m:
        return "–"
    return f"**{fmt(m['median'])}** ({fmt(m['min'])}–{fmt(m['max'])}){' †' if flag else ''}"


def markdown(result):
    s, meta = result["summary"], result["meta"]

    def ref(cid):
        r = REFERENCE.get(cid, {})
        return " / ".join("cannot" if r.get(k, 0) is None else fmt(r.get(k)) for k in ("tfjs-webgl", "tfjs-wasm", "pytorch"))

    L = ["# texelfit benchmark results", "",
         f"{meta['date']}; {meta['cpu']} ({meta['cpus']} CPUs); Chromium {meta['chromium']} headless, "
         f"WebGL renderer: {meta.get('webgl_renderer', '?')}; texelfit backend {meta.get('texelfit_info', {}).get('backend', '?')}, "
         f"{meta.get('texelfit_info', {}).get('precision', '?')}; TF.js {meta['tfjs']}; "
         f"PyTorch {meta['torch']} CPU, {meta['torch_threads']} threads.", "",
         f"Steady state: ms per step, **median** (min–max) over {meta['rounds']} fresh browsers; each browser's "
         f"value is the median of {meta['windows']} windows of {meta['steps']} steps after {meta['warmup']} warm-up "
         f"steps, each window ended by one readback (TF.js WebGL on the CNN: {meta['slow_windows']} window). "
         "Ratios are texelfit's median time over the other's: below 1 texelfit is faster. "
         f"† = in at least one round, other processes on the machine used over {meta['max_foreign_load']} CPU cores "
         "during that measurement even after waiting and rerunning (see the note at the end).", "",
         "| case | texelfit | TF.js WebGL | TF.js WASM | PyTorch CPU | texelfit / WebGL | texelfit / WASM | texelfit / PyTorch | "
         "issue's reference WebGL / WASM / PyTorch |",
         "|---|---|---|---|---|---|---|---|---|"]
    for case in CASES:
        c = s.get(case["id"])
        if not c:
            continue
        busy = lambda fw: (c.get(fw, {}).get("foreign_cores_max") or 0) > meta["max_foreign_load"]  # noqa: E731
        cell = lambda fw: (fmt_mmm(c[fw]["steady_ms"], busy(fw)) if c.get(fw, {}).get("steady_ms")  # noqa: E731
                           else ("cannot train" if c.get(fw, {}).get("errors") else "–"))
        r = c["ratios"]
        L.append(f"| {case['label']} | {cell('texelfit')} | {cell('tfjs-webgl')} | {cell('tfjs-wasm')} | "
                 f"{cell('pytorch')} | {fmt(r['texelfit/tfjs-webgl'], 2)} | {fmt(r['texelfit/tfjs-wasm'], 2)} | "
                 f"{fmt(r['texelfit/pytorch'], 1)} | {ref(case['id'])} |")
    L += ["", "Cold first step, ms: creating the model (context, shader compiles, weights) plus the first "
          "training step (the first predict for D) read back, in a fresh page; median (min–max). TF.js: "
          "setBackend + building the layers model + setWeights + first step. texelfit's bundle import "
          "(parsing the module, weights included) is listed apart and not counted.", "",
          "| case | texelfit | of which createModel | texelfit import | TF.js WebGL | TF.js WASM | texelfit / WebGL |",
          "|---|---|---|---|---|---|---|"]
    for case in CASES:
        c = s.get(case["id"])
        if not c:
            continue
        busy = lambda fw: (c.get(fw, {}).get("foreign_cores_max") or 0) > meta["max_foreign_load"]  # noqa: E731
        cold = lambda fw: fmt_mmm(c.get(fw, {}).get("cold_ms"), busy(fw)) if c.get(fw, {}).get("cold_ms") else (  # noqa: E731
            "cannot train" if c.get(fw, {}).get("errors") else "–")
        tx = c.get("texelfit", {})
        L.append(f"| {case['label']} | {cold('texelfit')} | {fmt_mmm(tx.get('create_ms'))} | "
                 f"{fmt_mmm(tx.get('import_ms'))} | {cold('tfjs-webgl')} | {cold('tfjs-wasm')} | "
                 f"{fmt(c['ratios']['cold texelfit/tfjs-webgl'], 2)} |")
    L += ["", "texelfit's first training step, profiled (round 1, a separate fresh page, not timed: each draw "
          "followed by a synchronous 1-texel readPixels of its output; ms, largest first):", "",
          "| case | createModel (that page) | first fit, wall | sum of draws | largest items |", "|---|---|---|---|---|"]
    for case in CASES:
        c = s.get(case["id"], {}).get("texelfit")
        fp = c and c.get("first_step_profile_round1")
        if not fp:
            continue
        draws = sum(v for k, v in fp["ms"].items() if not k.startswith("("))
        top = "; ".join(f"{k} {fmt(v)}" for k, v in list(fp["ms"].items())[:5])
        create = result["raw"]["browser_rounds"][0][case["id"]]["texelfit-first-step-profile"].get("createMs")
        L.append(f"| {case['label']} | {fmt(create)} | {fmt(fp['wall_ms'])} | {fmt(draws)} | {top} |")
    d = s.get("D_predict_mlp_b1", {})
    notes = []
    for fw in ("tfjs-webgl", "tfjs-wasm"):
        b = d.get(fw, {}).get("steady_ms_by_readback")
        if b and b["sync"] and b["async"]:
            notes.append(f"{fw}: dataSync() {fmt_mmm(b['sync'])}, await data() {fmt_mmm(b['async'])}")
    t = d.get("texelfit", {}).get("timer_delays_ms")
    if notes or t:
        L += ["", "Predict (D): TF.js is timed with both readbacks in alternating windows and the table gives the "
              "faster one's; ms per predict: " + ("; ".join(notes) or "–") + "." +
              (f" In the texelfit page (round 1) a chain of setTimeout(0) wake-ups took {fmt(t['setTimeout0Ms'])} ms "
               f"each, a chain of MessageChannel messages {fmt(t['messageChannelMs'])} ms each." if t else "")]
    sz = result["sizes"]
    L += ["", "Sizes (gzip -9):", "", "| file | bytes | gzip | gzip, WEIGHTS emptied |", "|---|---|---|---|"]
    for k, v in sz.items():
        stripped = f"{v['gzip_without_weights']:,}" if "gzip_without_weights" in v else "–"
        L.append(f"| {k} | {v['bytes']:,} | {v['gzip']:,} | {stripped} |")
    L += ["", "Longest main-thread task (PerformanceObserver long tasks, which only reports tasks over 50 ms; "
          "0 = none over 50 ms), texelfit, worst over all rounds, ms:", "",
          "| case | during the timed fits | during the first fit | during createModel |", "|---|---|---|---|"]
    for case in CASES:
        c = s.get(case["id"], {}).get("texelfit")
        if c and case["optimizer"]:
            L.append(f"| {case['label']} | {fmt(c.get('longest_task_fit_ms'), 0)} | "
                     f"{fmt(c.get('longest_task_first_fit_ms'), 0)} | {fmt(c.get('longest_task_create_ms'), 0)} |")
    L += ["", "Targets (issue 6):", ""]
    L += [f"- {t['target']}: **{'met' if t['met'] else 'missed'}** — {t['detail']}" for t in result["targets"]]
    L += ["", "texelfit work per step (from the bundle's schedule and a count of WebGL calls over 10 steps, "
          "untimed):", "", "| case | passes (schedule) | drawArrays / step | texSubImage2D / step | "
          "steady ms/step ÷ draws |", "|---|---|---|---|---|"]
    for case in CASES:
        c = s.get(case["id"], {}).get("texelfit")
        if not c or "gl_calls_per_step" not in c:
            continue
        g = c["gl_calls_per_step"]
        p = result["passes"].get(case["model"])
        if case["optimizer"]:
            kern = "sgd" if case["optimizer"]["type"] == "sgd" else "adam"
            sched = (f"{p['forward']} fwd + {sum(d.get('cross_entropy', 0) for d in p['loss'])} loss + {p['backward']} bwd + "
                     f"{p['optimizer'][kern]} opt") if p else "?"
        else:
            sched = f"{p['forward']} fwd" if p else "?"
        draws = g.get("drawArrays", 0)
        L.append(f"| {case['label']} | {sched} | {fmt(draws, 1)} | {fmt(g.get('texSubImage2D', 0), 1)} | "
                 f"{fmt(c['steady_ms']['median'] / draws if draws else None, 3)} |")
    L += ["", "Where texelfit's GPU time goes (round 1, an untimed diagnostic fit of 10 steps in which every draw "
          "is issued 8 times between two synchronous 1-texel readPixels of its output, so a draw's time is its "
          "GPU work plus 1/8 of a round trip, the idle round trip being listed; uploads and readbacks as issued; "
          "ms per step, largest first; (Nx) = calls per step):", "",
          "| case | sum / step | wall / step (synced run) | idle round trip | largest items |",
          "|---|---|---|---|---|"]
    for case in CASES:
        c = s.get(case["id"], {}).get("texelfit")
        pr = c and c.get("profile_round1")
        if not pr:
            continue
        items = list(pr["fenced_ms_per_step"].items())
        total = sum(v for _, v in items)
        top = "; ".join(f"{k} {fmt(v)} ({fmt(pr['calls_per_step'][k], 1)}x)" for k, v in items[:6])
        L.append(f"| {case['label']} | {fmt(total)} | {fmt(pr['wall_ms_per_step'])} | "
                 f"{fmt(pr['sync_round_trip_ms'])} | {top} |")
    L += ["", "Sanity: the same computation everywhere (round 1; losses after the first step and after the "
          "first timed window):", "", "| case | framework | first loss | PyTorch | loss after window 1 | PyTorch |",
          "|---|---|---|---|---|---|"]
    for case in CASES:
        ch = s.get(case["id"], {}).get("checks") or {}
        for fw, v in ch.items():
            if "first_loss" in v:
                L.append(f"| {case['label']} | {fw} | {v['first_loss']:.6f} | {v['pytorch_first_loss']:.6f} | "
                         f"{v['loss_after_window_1']:.6f} | {v['pytorch_loss_after_window_1']:.6f} |")
            else:
                L.append(f"| {case['label']} | {fw} | max abs diff of the first output against PyTorch: "
                         f"{v['max_abs_diff_first_output']:.2e} | | | |")
    errs = [(cid, fw, e) for cid, c in s.items() for fw in FRAMEWORKS for e in c.get(fw, {}).get("errors", [])]
    if errs:
        L += ["", "Errors:", ""] + [f"- {cid} {fw}: `{e}`" for cid, fw, e in errs]
    g = meta["git"]
    src = (f"git revision {g['rev']} ({(g.get('rev_commit') or '?')[:12]})" if g.get("rev") else
           f"the working tree at HEAD {(g.get('head') or '?')[:12]}" +
           (f" with uncommitted changes to {', '.join(x[3:] for x in g['uncommitted_source_changes'])}"
            if g.get("uncommitted_source_changes") else ""))
    worst = max(((c[fw].get("foreign_cores_max") or 0, f"{cid} {fw}") for cid, c in s.items()
                 for fw in FRAMEWORKS + ["pytorch"] if fw in c), default=None)
    if worst:
        L += ["", f"Other processes on the machine: the most CPU they used during a kept measurement was "
              f"{worst[0]:.2f} cores ({worst[1]}); the run waited {meta['waited_for_quiet_s']:.0f} s in all for them "
              f"to quiet down, and {len(meta['retries'])} measurements were rerun because others used over "
              f"{meta['max_foreign_load']} cores meanwhile (results.json: meta.retries, and foreignCores in each raw "
              "result)."]
    if g.get("same_bundles_as"):
        src += (f" (recorded at the end of the run); the measured bundles are byte-identical (sha256) to those "
                f"built from commit {g['same_bundles_as'][:12]}")
    L += ["", f"texelfit built from {src}. Total run time: {meta['run_s']:.0f} s. Raw numbers: results.json.", ""]
    return "\n".join(L)


def targets(summary, sz):
    out = []
    train = [c["id"] for c in CASES if c["optimizer"] and c["id"] in summary]
    for cid in train:
        r = summary[cid]["ratios"]
        w, a = r["texelfit/tfjs-webgl"], r["texelfit/tfjs-wasm"]
        out.append({"target": f"{cid}: >= 4x faster than TF.js WebGL", "met": bool(w is not None and w <= 0.25),
                    "detail": f"texelfit/WebGL = {fmt(w, 3)} (needs <= 0.25; speed-up {fmt(1 / w if w else None, 2)}x)"})
        wasm_err = summary[cid].get("tfjs-wasm", {}).get("errors")
        out.append({"target": f"{cid}: faster than TF.js WASM",
                    "met": bool(a is not None and a < 1) or (a is None and bool(wasm_err)),
                    "detail": (f"texelfit/WASM = {fmt(a, 3)}" if a is not None else
                               "TF.js WASM cannot train this model" if wasm_err else "not measured")})
    for cid in train:
        r = summary[cid]["ratios"]["cold texelfit/tfjs-webgl"]
        out.append({"target": f"{cid}: cold first step <= 1/3 of TF.js WebGL's", "met": bool(r is not None and r <= 1 / 3),
                    "detail": f"ratio {fmt(r, 3)} (needs <= 0.333)"})
    for k, v in sz.items():
        if k.startswith("texelfit"):
            b = v["gzip_without_weights"]
            out.append({"target": f"{k} runtime without weights < 30 KB gzip", "met": b < 30_000,
                        "detail": f"{b:,} bytes gzip, against 30 KB read as 30,000 bytes (it is "
                                  f"{'under' if b < 30_720 else 'over'} 30 KiB = 30,720 bytes); "
                                  f"tf.min.js: {sz['tf.min.js']['gzip']:,}"})
    worst = [(summary[c]["texelfit"].get("longest_task_fit_ms"), c) for c in train if "texelfit" in summary[c]]
    worst = [w for w in worst if w[0] is not None]
    if worst:
        m = max(worst)
        out.append({"target": "no main-thread task over 50 ms during fit", "met": m[0] == 0,
                    "detail": "none over 50 ms in any timed fit" if m[0] == 0 else f"longest {m[0]:.0f} ms ({m[1]})"})
    return out


# ---- main ---------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh browsers (default 3)")
    ap.add_argument("--steps", type=int, default=50, help="steps per timed window (default 50)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up steps (default 10)")
    ap.add_argument("--windows", type=int, default=3, help="timed windows per page (default 3)")
    ap.add_argument("--slow-windows", type=int, default=1, help="windows for TF.js WebGL on the CNN (default 1)")
    ap.add_argument("--cases", nargs="*", help="case ids (default: all)")
    ap.add_argument("--frameworks", nargs="*", default=FRAMEWORKS, choices=FRAMEWORKS)
    ap.add_argument("--no-pytorch", action="store_true")
    ap.add_argument("--max-foreign-load", type=float, default=0.25,
                    help="rerun a page or PyTorch case when other processes used more CPU cores than this "
                         "meanwhile (default 0.25)")
    ap.add_argument("--retries", type=int, default=12, help="most reruns in all (default 12)")
    ap.add_argument("--max-wait", type=float, default=120,
                    help="seconds in all to wait for other processes to quiet down before measurements (default 120)")
    ap.add_argument("--rev", help="benchmark texelfit as committed at this git revision (git archive) instead "
                                  "of the working tree")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--render", action="store_true",
                    help="only rewrite results.md from the results.json in --out (no measuring)")
    args = ap.parse_args(argv)
    if args.render:
        with open(os.path.join(args.out, "results.json")) as f:
            result = json.load(f)
        result["targets"] = targets(result["summary"], result["sizes"])
        result["meta"].setdefault("texelfit_info", next(
            (res["texelfit"]["info"] for r in result["raw"]["browser_rounds"] for res in r.values()
             if "info" in res.get("texelfit", {})), None))
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(markdown(result))
        print(f"bench: rewrote {os.path.join(args.out, 'results.md')}")
        return
    if args.steps < 2 or args.warmup < 1:
        ap.error("--steps must be >= 2 and --warmup >= 1")
    for path in (CHROMIUM, os.path.join(TFJS_DIST, "tf.min.js"), os.path.join(TFJS_WASM_DIST, "tf-backend-wasm.min.js")):
        if not os.path.exists(path):
            sys.exit(f"bench: {path} is missing (run ./scripts/setup.sh and npm install)")
    torch.set_num_threads(2)
    t_start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="texelfit-bench-")
    site = os.path.join(tmp, "site")
    os.makedirs(site)
    httpd, url = serve(site)
    try:
        source, compile_onnx, export_simplified = use_texelfit(args.rev, tmp)
        print(f"bench: building bundles and data (texelfit from {source})", flush=True)
        built, data = prepare(site, args, compile_onnx, export_simplified)
        source_state = git_state(args.rev)  # what the bundles were built from (others may edit on)
        rounds, torch_rounds, versions, loadavg = [], [], [], []
        retries = Retries(args.max_foreign_load, args.retries, args.max_wait)
        for r in range(args.rounds):
            print(f"bench: round {r + 1}/{args.rounds} (fresh browser)", flush=True)
            load0 = os.getloadavg()
            res, version = browser_round(url, built, args, r, retries)
            rounds.append(res)
            versions.append(version)
            if not args.no_pytorch:  # with the browser closed: nothing else competes for the CPUs
                tr = {}
                for case in CASES:
                    if not args.cases or case["id"] in args.cases:
                        tr[case["id"]] = retries.run(f"round {r + 1} {case['id']} pytorch",
                                                     lambda: pytorch_case(case, built, data, args))
                        fc = tr[case["id"]].get("foreignCores")
                        print(f"  round {r + 1} {case['id']:18s} pytorch     {tr[case['id']]['perStep']:.3f} ms/step"
                              + (f", others {fc:.2f} cores" if fc is not None else ""), flush=True)
                torch_rounds.append(tr)
            loadavg.append([load0, os.getloadavg()])
    finally:
        httpd.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    sz = sizes(built)
    summary = summarize(rounds, torch_rounds, built, args)
    renderer = next((res[fw]["env"]["renderer"] for r in rounds for res in r.values() for fw in res
                     if fw == "tfjs-webgl" and "env" in res[fw] and "renderer" in res[fw]["env"]), None)
    cpu = cpu_model()
    result = {
        "meta": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu,
                 "cpus": os.cpu_count(), "chromium": versions[0] if versions else None, "chromium_args": CHROMIUM_ARGS,
                 "webgl_renderer": renderer, "tfjs": "4.22.0", "torch": torch.__version__,
                 "torch_threads": torch.get_num_threads(), "rounds": args.rounds, "steps": args.steps,
                 "warmup": args.warmup, "windows": args.windows, "slow_windows": args.slow_windows,
                 "seed": SEED,
                 "run_s": time.perf_counter() - t_start, "git": source_state,
                 "loadavg_per_round": loadavg, "retries": retries.log, "max_foreign_load": args.max_foreign_load,
                 "waited_for_quiet_s": retries.waited,
                 "texelfit_info": next((res["texelfit"]["info"] for r in rounds for res in r.values()
                                        if "info" in res.get("texelfit", {})), None),
                 "bundle_sha256": {k: b["sha256"] for k, b in built.items()},
                 "bundle_build_s": {k: b["build_s"] for k, b in built.items()}},
        "cases": CASES, "reference_from_issue": REFERENCE, "sizes": sz,
        "passes": {k: schedule_passes(b["js"]) for k, b in built.items()},
        "summary": summary, "raw": {"browser_rounds": rounds, "pytorch_rounds": torch_rounds},
    }
    result["targets"] = targets(summary, sz)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    md = markdown(result)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    print(md)
    print(f"bench: wrote {os.path.relpath(args.out, ROOT)}/results.json and results.md "
          f"({result['meta']['run_s']:.0f} s)")


if __name__ == "__main__":
    main()
