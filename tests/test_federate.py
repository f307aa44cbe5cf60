"""Issue 34: `texelfit federate` and the bundle's `m.federate`: browsers (separate contexts of real
Chromium) train an MLP on non-IID splits of the 8x8 digits, Flower's FedAvg aggregates, and every
global model matches PyTorch running the same local fits and the same weighted average."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import INDEX
from helpers import assert_close, torch_fit
from texelfit.bridge import Bridge
from texelfit.build import compile_onnx, write_files
from texelfit.federate import Bundle, Federation, Settings
from texelfit.federate_run import architecture, evaluator, write_model
from texelfit.prep.load import export_simplified

SPLITS = ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))  # each client's classes: non-IID
LR, BATCH = 0.3, 16
PARITY = dict(atol=0, rtol=0, norm=1e-4)  # relative L2 error of each tensor


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.data / 16).astype(np.float32), d.target.astype(np.int64)
    held = np.arange(len(y)) % 5 == 0
    train_x, train_y = x[~held], y[~held]
    clients = [(train_x[np.isin(train_y, c)], train_y[np.isin(train_y, c)]) for c in SPLITS]
    return clients, (x[held], y[held])


def make_bundle(folder, trainable="*"):
    module = mlp()
    onnx_model = export_simplified(module, (64,))
    files = compile_onnx(onnx_model, name="mlp", input_shape=(64,), trainable=trainable).files
    files["mlp.onnx"] = onnx_model.SerializeToString()
    files["index.html"] = INDEX.decode()
    write_files(str(folder), files)
    return module


def simulate(start: dict, clients, rounds, trainable=None, mu=0.0):
    """PyTorch: each round every client (rounds[r]: their indices) fits from the global weights with a fresh SGD,
    in order, batch BATCH (with FedProx's proximal term mu / 2 * ||w - w_global||^2 in its loss); the global weights
    become the sample-weighted mean. The globals after each round."""
    glob, out = {k: v.clone() for k, v in start.items()}, []
    for who in rounds:
        fits, counts = [], []
        for i in who:
            m = mlp()
            m.load_state_dict(glob)
            for n, p in m.named_parameters():
                p.requires_grad_(trainable is None or n in trainable)
            x, y = clients[i]
            opt = {"type": "sgd", "lr": LR}
            params = [p for p in m.parameters() if p.requires_grad]
            torch_fit(_Only(m, params), torch.from_numpy(x), torch.from_numpy(y), "cross_entropy", opt, BATCH, 1, mu)
            fits.append({k: v.detach().clone() for k, v in m.state_dict().items()})
            counts.append(len(y))
        total = sum(counts)
        glob = {k: sum(f[k].double() * c for f, c in zip(fits, counts)) / total for k in glob}
        glob = {k: v.float() for k, v in glob.items()}
        out.append({k: v.numpy() for k, v in glob.items()})
    return out


class _Only(torch.nn.Module):
    """The module, whose parameters() are only those that train (helpers.torch_fit optimizes all of them)."""

    def __init__(self, m, params):
        super().__init__()
        self.m, self.params = m, params

    def parameters(self, recurse=True):
        return iter(self.params)

    def forward(self, x):
        return self.m(x)


START = """async ([i, x, y, options]) => {
  const { createModel } = await import('/mlp.js');
  const m = await createModel(options);
  window.rounds = [];
  window.m = m;
  window.result = m.federate(location.origin, { x: new Float32Array(x), y: Int32Array.from(y),
                                                onRound: (r) => window.rounds.push(r) })
    .then(() => 'done', (e) => e.code + ': ' + e.message);
}"""


class Pages:
    """One browser context (its own storage and session) per client, each on a page of the bridge."""

    def __init__(self, browser, url):
        self.browser, self.url, self.contexts, self.pages, self.errors = browser, url, [], [], []

    def open(self):
        ctx = self.browser.new_context()
        page = ctx.new_page()
        page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.goto(self.url + "/index.html")
        self.contexts.append(ctx)
        self.pages.append(page)
        return page

    def close(self):
        for ctx in self.contexts:
            try:
                ctx.close()
            except Exception:  # noqa: BLE001 (closed already)
                pass


def join_all(pages, fed, clients, options=None):
    """Each client's page joins in turn (client #i+1 is clients[i])."""
    for i, (x, y) in enumerate(clients):
        page = pages.open()
        page.evaluate(START, [i, x.reshape(-1).tolist(), y.tolist(), options or {}])
        deadline = time.monotonic() + 60
        while fed.joined < i + 1:
            assert time.monotonic() < deadline, "a page did not join"
            time.sleep(0.05)


def finish(pages, fed, timeout=150):
    fed.wait(timeout)
    return [p.evaluate("() => window.result") if not p.is_closed() else None for p in pages.pages]


def run_from_pages(pages, fed, joined=2):
    """Once `joined` federation.html pages have joined, start the federation and wait until every page says it
    is over."""
    while fed.joined < joined:
        time.sleep(0.05)
    fed.start()
    for page in pages.pages:
        page.wait_for_function("() => document.getElementById('status').textContent"
                               ".startsWith('The federation is over')", timeout=120_000)


def run_pages(browser, folder, clients, **settings):
    """A federation of the bundle in `folder` (Settings: LR, BATCH and these), one page per client, run to its end:
    every page must end 'done', with no error in any. Returns the Federation."""
    fed = Federation(Bundle.load(str(folder)), Settings(lr=LR, batch_size=BATCH, round_timeout=120, heartbeat=2.0,
                                                         **settings), log=lambda _: None)
    bridge = Bridge(fed).start()
    pages = Pages(browser, bridge.url)
    try:
        join_all(pages, fed, clients)
        fed.start()
        assert finish(pages, fed) == ["done"] * len(clients)
    finally:
        pages.close()
        bridge.close()
    assert not pages.errors, pages.errors
    return fed


def check_rounds(fed, expected, what):
    assert [e["round"] for e in fed.history] == list(range(len(expected) + 1))
    for r, ref in enumerate(expected, 1):
        for name, w in fed.history[r]["arrays"].items():
            assert_close(f"{what}: global {name} after round {r}", w, ref[name], **PARITY)


def test_three_browsers_fedavg_matches_pytorch(browser, tmp_path):
    clients, (hx, hy) = digits()
    module = make_bundle(tmp_path)
    bundle = Bundle.load(str(tmp_path))
    graph = architecture(bundle, None)
    np.savez(tmp_path / "held.npz", x=hx, y=hy)
    settings = Settings(rounds=3, min_clients=3, lr=LR, batch_size=BATCH, round_timeout=120, heartbeat=2.0)
    fed = Federation(bundle, settings, evaluate=evaluator(bundle, graph, str(tmp_path / "held.npz")),
                     log=lambda _: None)
    bridge = Bridge(fed).start()
    pages = Pages(browser, bridge.url)
    try:
        join_all(pages, fed, clients)
        fed.start()
        results = finish(pages, fed)
        assert results == ["done"] * 3, results
        rounds = [p.evaluate("() => window.rounds") for p in pages.pages]
        final = pages.pages[0].evaluate("async () => Object.fromEntries(Object.entries(await window.m.getWeights())"
                                        ".map(([k, v]) => [k, Array.from(v)]))")
    finally:
        pages.close()
        bridge.close()
    assert not pages.errors, pages.errors
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    expected = simulate(start, clients, [[0, 1, 2]] * 3)
    check_rounds(fed, expected, "FedAvg of 3 browsers")
    for r in range(1, 4):
        assert sorted(fed.history[r]["clients"]) == [1, 2, 3]
    for i, got in enumerate(rounds):  # each page took part in every round and sent float32 deltas of every weight
        assert [g["round"] for g in got] == [1, 2, 3]
        assert all(g["sent"] == 4 * 2410 and np.isfinite(g["loss"]) for g in got)
    for name, w in final.items():  # the page ends holding the final global model
        assert_close(f"page's {name} after the federation", w, expected[-1][name], **PARITY)

    # the global model beats every client's local-only model (same start, same 3 epochs, its own classes only)
    x_held, y_held = torch.from_numpy(hx), torch.from_numpy(hy)
    local = []
    for x, y in clients:
        m = mlp()
        torch_fit(m, torch.from_numpy(x), torch.from_numpy(y), "cross_entropy", {"type": "sgd", "lr": LR}, BATCH, 3)
        local.append(float((m(x_held).argmax(1) == y_held).float().mean()))
    acc = [e["metrics"]["accuracy"] for e in fed.history]
    print(f"global accuracy by round {acc}, local-only {local}")
    assert acc[-1] > max(local), f"global accuracy {acc} against local-only {local}"

    write_model(fed, graph, str(tmp_path / "global.onnx"))  # --out global.onnx: the model with these weights
    import onnx
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "global.onnx")).graph.initializer}
    for name, w in expected[-1].items():
        assert_close(f"global.onnx {name}", inits[name].reshape(-1), w.reshape(-1), **PARITY)


def test_fedprox_local_fits_have_the_proximal_term(browser, tmp_path):
    """--strategy fedprox: Flower's FedProx sends proximal-mu in the fit config, and each page's local fit adds
    mu / 2 * ||w - w_global||^2 to its loss (fit options.proximal): the globals are PyTorch's FedProx, not FedAvg's."""
    clients, _ = digits()
    module = make_bundle(tmp_path)
    fed = run_pages(browser, tmp_path, clients, strategy="fedprox", proximal_mu=2.0, rounds=2, min_clients=3)
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    check_rounds(fed, simulate(start, clients, [[0, 1, 2]] * 2, mu=2.0), "FedProx of 3 browsers")
    plain = simulate(start, clients, [[0, 1, 2]] * 2)[-1]["2.weight"]  # the term matters here: far from FedAvg's
    assert np.linalg.norm(fed.history[2]["arrays"]["2.weight"] - plain) > 100 * 1e-4 * np.linalg.norm(plain)


def test_a_browser_closed_mid_round_does_not_stall(browser, tmp_path):
    clients, _ = digits()
    module = make_bundle(tmp_path, trainable="2.*")  # a frozen trunk: only the head travels
    bundle = Bundle.load(str(tmp_path))
    settings = Settings(rounds=3, min_clients=2, lr=LR, batch_size=BATCH, round_timeout=120, heartbeat=1.0)
    fed = Federation(bundle, settings, log=lambda _: None)
    bridge = Bridge(fed).start()
    pages = Pages(browser, bridge.url)

    # the third client's fit never ends in round 2 (its second fit): it is closed mid-round
    hang = """() => { const fit = window.m.fit.bind(window.m); let n = 0;
        window.m.fit = async (...a) => { if (++n === 2) { window.midRound = true; return new Promise(() => {}); }
                                         return fit(...a); }; }"""
    try:
        join_all(pages, fed, clients)
        pages.pages[2].evaluate(hang)  # (before its first task: the federation has not started)
        started = time.monotonic()
        fed.start()
        pages.pages[2].wait_for_function("() => window.midRound === true", timeout=120_000)
        assert fed.round == 1
        pages.contexts[2].close()  # the browser goes away mid-round 2
        results = finish(pages, fed)
        elapsed = time.monotonic() - started
    finally:
        pages.close()
        bridge.close()
    assert not pages.errors, pages.errors
    assert results[:2] == ["done", "done"], results
    assert elapsed < 60, f"the federation took {elapsed:.1f}s: the closed page stalled it"
    assert [sorted(e["clients"]) for e in fed.history[1:]] == [[1, 2, 3], [1, 2], [1, 2]]
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    expected = simulate(start, clients, [[0, 1, 2], [0, 1], [0, 1]], trainable={"2.weight", "2.bias"})
    check_rounds(fed, [{k: e[k] for k in ("2.weight", "2.bias")} for e in expected], "one client closed in round 2")
    assert set(fed.history[-1]["arrays"]) == {"2.weight", "2.bias"}
    for name in ("0.weight", "0.bias"):  # the frozen trunk never travelled and never changed
        assert np.array_equal(fed.full_weights()[name], module.state_dict()[name].numpy())


# ---- the bridge's checks, and DP: clients that speak its HTTP protocol from Python ----------------------

def post(url, path, token=None, meta=None, body=b""):
    """(status, JSON answer) of one POST to the bridge."""
    import json
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if meta is not None:
        headers["X-Texelfit-Update"] = meta if isinstance(meta, str) else json.dumps(meta)
    req = urllib.request.Request(url + "/federation/" + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def task(url, token):
    import base64

    while True:
        status, t = post(url, "task", token)
        assert status == 200, t
        if not t.get("wait"):
            t["flat"] = np.frombuffer(base64.b64decode(t["weights"]), "<f4") if "weights" in t else None
            return t


def update(t, delta, samples, **over):
    meta = {"round": t["round"], "samples": samples, "loss": 0.5, "format": "float32", "names": t["names"],
            "sizes": t["sizes"], **over}
    return meta, np.asarray(delta, "<f4").tobytes()


def federation(tmp_path, **settings):
    make_bundle(tmp_path, trainable="2.*")
    lines = []
    fed = Federation(Bundle.load(str(tmp_path)), Settings(min_clients=2, heartbeat=30.0, **settings), log=lines.append)
    return fed, Bridge(fed).start(), lines


def test_bad_updates_are_refused_and_change_nothing(tmp_path):
    fed, bridge, lines = federation(tmp_path, rounds=2, max_update_norm=5.0)
    url, size = bridge.url, 330
    try:
        a, b = post(url, "join")[1]["token"], post(url, "join")[1]["token"]
        fed.start()
        ta, tb = task(url, a), task(url, b)
        assert ta["round"] == tb["round"] == 1 and ta["names"] == ["2.weight", "2.bias"] and ta["sizes"] == [320, 10]
        good_a = np.random.default_rng(1).standard_normal(size).astype(np.float32) * 0.05
        good_b = np.random.default_rng(2).standard_normal(size).astype(np.float32) * 0.05
        nan = good_a.copy()
        nan[7] = np.nan
        bad = {
            "no token": (None, *update(ta, good_a, 100)),
            "a forged token": ("forged", *update(ta, good_a, 100)),
            "a wrong shape": (a, *update(ta, good_a[:-1], 100, sizes=[320, 9])),
            "a wrong length": (a, *update(ta, good_a[:-1], 100)),
            "wrong names": (a, *update(ta, good_a, 100, names=["2.bias", "2.weight"])),
            "NaN": (a, *update(ta, nan, 100)),
            "over the norm bound": (a, *update(ta, good_a * 1000, 100)),
            "a future round": (a, *update(ta, good_a, 100, round=2)),
            "no samples": (a, *update(ta, good_a, 0)),
            "no metadata": (a, "not json", b""),
        }
        for what, (token, meta, body) in bad.items():
            status, answer = post(url, "update", token, meta, body)
            assert 400 <= status < 500 and answer["error"], (what, status, answer)
        assert len([line for line in lines if line.startswith("refused")]) == len(bad), lines
        assert post(url, "update", a, *update(ta, good_a, 100))[0] == 200
        assert post(url, "update", a, *update(ta, good_a, 100))[0] == 409  # the same update again: refused
        assert post(url, "update", b, *update(tb, good_b, 300))[0] == 200
        ta2 = task(url, a)
        assert ta2["round"] == 2
        replay = post(url, "update", a, *update(ta, good_a, 100))  # round 1's update, replayed in round 2
        assert replay[0] == 409 and "replay" in replay[1]["error"], replay
        start = ta["flat"]
        after1 = start + (good_a * 100 + good_b * 300) / 400
        assert_close("global after round 1 (the good updates only)", ta2["flat"], after1, atol=1e-7, rtol=1e-6)
        tb2 = task(url, b)
        assert post(url, "update", a, *update(ta2, -good_a, 100))[0] == 200
        assert post(url, "update", b, *update(tb2, good_b, 100))[0] == 200
        fed.wait(60)
        closed = post(url, "join")
        assert closed[0] == 410 and "over" in closed[1]["error"], closed
    finally:
        bridge.close()
    got = np.concatenate([fed.global_weights[n].reshape(-1) for n in ("2.weight", "2.bias")])
    assert_close("global after round 2", got, after1 + (good_b - good_a) / 2, atol=1e-7, rtol=1e-6)


def test_dp_clips_and_noises_as_flower_defines(tmp_path):
    from flwr.supercore.differential_privacy import compute_clip_model_update

    clip, noise, seed = 0.5, 0.8, 1234
    fed, bridge, _ = federation(tmp_path, rounds=1, dp_clip=clip, dp_noise=noise, seed=seed)
    url = bridge.url
    raw = np.random.default_rng(3).standard_normal(330).astype(np.float32)  # norm ~18: the page clips it to 0.5
    deltas = [raw * np.float32(clip / np.sqrt(np.sum(raw.astype(np.float64) ** 2))),
              np.random.default_rng(4).standard_normal(330).astype(np.float32) * 0.01]  # norm ~0.18: kept
    try:
        tokens = [post(url, "join")[1]["token"] for _ in deltas]
        fed.start()
        tasks = [task(url, t) for t in tokens]
        assert tasks[0]["config"]["epochs"] == 1 and tasks[0]["config"]["clip"] == clip  # the page clips to it
        status, body = post(url, "update", tokens[0], *update(tasks[0], raw, 100))
        assert status == 422 and "exceeds --dp-clip" in body["error"], body  # not clipped: refused, never seen
        for t, tk, d, n in zip(tokens, tasks, deltas, (100, 300)):
            assert post(url, "update", t, *update(tk, d, n))[0] == 200
        fed.wait(60)
    finally:
        bridge.close()
    # the same computation in Python: Flower's clipping of each update, FedAvg, then noise N(0, (Z C / K)^2) drawn
    # from numpy's generator seeded as --seed seeds it
    start = np.split(tasks[0]["flat"].astype(np.float32), [320])
    shaped = [s.reshape(sh) for s, sh in zip(start, [(10, 32), (10,)])]
    clipped = []
    for d in deltas:
        params = [g + dd.reshape(g.shape) for g, dd in zip(shaped, np.split(d, [320]))]
        compute_clip_model_update(params, shaped, clip)
        clipped.append(params)
    assert abs(np.sqrt(sum(float(np.sum((p - g) ** 2)) for p, g in zip(clipped[0], shaped))) - clip) < 1e-5
    avg = [(a * 100 / 400 + b * 300 / 400) for a, b in zip(*clipped)]
    np.random.seed(seed)
    std = noise * clip / 2
    expected = [a + np.random.normal(0, std, a.shape).astype(np.float32) for a in avg]
    for name, e in zip(("2.weight", "2.bias"), expected):
        assert_close(f"DP global {name}", fed.global_weights[name], e, atol=1e-6, rtol=1e-5)
    plain = [a for a in avg]  # and the noise is there: the global is not the clipped average
    assert np.abs(fed.global_weights["2.weight"] - plain[0]).max() > std


def test_pages_clip_their_updates_before_sending_them(browser, tmp_path):
    """--dp-clip: each page clips its delta to the norm before it leaves; the global model is the start plus the
    sample-weighted mean of the clipped deltas (noise 0 here), each delta as PyTorch computes it."""
    clients, _ = digits()
    clients, clip = clients[:2], 0.05
    module = make_bundle(tmp_path)
    fed = run_pages(browser, tmp_path, clients, rounds=1, min_clients=2, dp_clip=clip, dp_noise=0.0)
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    fits = [simulate(start, [c], [[0]])[0] for c in clients]
    deltas = [{k: f[k].astype(np.float64) - start[k].double().numpy() for k in f} for f in fits]
    norms = [np.sqrt(sum(float(np.sum(v ** 2)) for v in d.values())) for d in deltas]
    assert min(norms) > 2 * clip  # both were clipped
    counts = [len(y) for _, y in clients]
    for k in start:
        mean = sum(d[k] * (clip / n) * c for d, n, c in zip(deltas, norms, counts)) / sum(counts)
        assert_close(f"global {k}", fed.global_weights[k], start[k].double().numpy() + mean, **PARITY)


RECORD_FIRST_FIT = """() => { const fit = window.m.fit.bind(window.m);
    window.m.fit = async (...a) => { if (!window.first) window.first = Object.fromEntries(Object.entries(
      await window.m.getWeights()).map(([k, v]) => [k, Array.from(v)])); return fit(...a); }; }"""


HOLD_SECOND_FIT = """() => { const fit = window.m.fit.bind(window.m); let n = 0;
    window.m.fit = async (...a) => { if (++n === 2) while (!window.release) await new Promise((r) => setTimeout(r, 20));
                                     return fit(...a); }; }"""


def test_a_late_page_takes_the_next_round_from_the_current_global(browser, tmp_path):
    """A page that joins (or is reloaded) mid-federation takes part from the next round on, starting from the
    global weights of that moment."""
    clients, _ = digits()
    make_bundle(tmp_path, trainable="2.*")
    settings = Settings(rounds=3, min_clients=2, lr=LR, batch_size=BATCH, heartbeat=2.0)
    fed = Federation(Bundle.load(str(tmp_path)), settings, log=lambda _: None)
    bridge = Bridge(fed).start()
    pages = Pages(browser, bridge.url)
    try:
        join_all(pages, fed, clients[:2])
        for p in pages.pages:  # the first two hold their second fit until the late page is in
            p.evaluate(HOLD_SECOND_FIT)
        fed.start()
        while fed.round < 1:
            assert not fed.done.is_set()
            time.sleep(0.05)
        late = pages.open()
        x, y = clients[2]
        late.evaluate(START, [2, x.reshape(-1).tolist(), y.tolist(), {}])
        late.evaluate(RECORD_FIRST_FIT)
        while fed.joined < 3:
            time.sleep(0.05)
        for p in pages.pages[:2]:
            p.evaluate("() => { window.release = true; }")
        results = finish(pages, fed)
        rounds = [r["round"] for r in late.evaluate("() => window.rounds")]
        first = late.evaluate("() => window.first")
    finally:
        pages.close()
        bridge.close()
    assert not pages.errors, pages.errors
    assert results == ["done"] * 3, results
    assert rounds and rounds[0] >= 2 and rounds == list(range(rounds[0], 4)), rounds
    assert [3 in e["clients"] for e in fed.history[1:]] == [r in rounds for r in (1, 2, 3)]
    for name, w in fed.history[rounds[0] - 1]["arrays"].items():  # the global weights of the round before
        assert np.array_equal(np.asarray(first[name], np.float32), w.reshape(-1)), name


def test_cli_federation_int8_eval_and_out(browser, tmp_path):
    """`texelfit federate DIR` as a user runs it: progress lines with the global loss and accuracy, int8 updates,
    and the global model written as a state_dict that loads into the PyTorch module."""
    clients, (hx, hy) = digits()
    make_bundle(tmp_path / "b", trainable="2.*")
    np.savez(tmp_path / "held.npz", x=hx, y=hy)
    cmd = [sys.executable, "-m", "texelfit.cli", "federate", str(tmp_path / "b"), "--port", "0", "--rounds", "2",
           "--min-clients", "2", "--lr", str(LR), "--batch-size", str(BATCH), "--quantize-updates", "int8",
           "--eval-data", str(tmp_path / "held.npz"), "--out", str(tmp_path / "global.pt")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pages = None
    try:
        first = proc.stdout.readline()
        m = re.search(r"on (http://127\.0\.0\.1:\d+)/", first)
        assert m, first + proc.stderr.read()
        pages = Pages(browser, m.group(1))
        for i, (x, y) in enumerate(clients[:2]):
            pages.open().evaluate(START, [i, x.reshape(-1).tolist(), y.tolist(), {"backend": "cpu"}])
        out, err = proc.communicate(timeout=150)
        results = [p.evaluate("() => window.result") for p in pages.pages]
        sent = [r["sent"] for p in pages.pages for r in p.evaluate("() => window.rounds")]
        final = pages.pages[0].evaluate("async () => Array.from((await window.m.getWeights())['2.weight'])")
    finally:
        if proc.poll() is None:
            proc.kill()
        if pages:
            pages.close()
    assert proc.returncode == 0, out + err
    assert results == ["done", "done"], results
    assert "2 trainable tensors travel (330 values: 1320 bytes float32)" in first
    assert sent == [4 * 2 + 330] * 4  # int8: a float32 scale per tensor and a byte a value
    lines = [line for line in out.splitlines() if line.startswith("round ")]
    assert re.match(r"round 0/2 \[-+\] the initial model; global loss [\d.]+, accuracy [\d.]+%", lines[0]), out
    assert re.match(r"round 2/2 \[#+\] [\d.]+s; clients #1, #2; global loss [\d.]+, accuracy [\d.]+%", lines[2]), out
    assert f"wrote the global model to {tmp_path / 'global.pt'}" in out
    state = torch.load(tmp_path / "global.pt", weights_only=True)
    module = mlp()
    module.load_state_dict(state)  # strict: every weight, under the module's names
    assert np.array_equal(state["2.weight"].numpy().reshape(-1), np.asarray(final, np.float32))
    acc = float(re.search(r"accuracy ([\d.]+)%", lines[2]).group(1)) / 100
    with torch.no_grad():
        ref = float((module(torch.from_numpy(hx)).argmax(1) == torch.from_numpy(hy)).float().mean())
    assert abs(acc - ref) < 1e-4


def test_errors_leave_the_model_usable(browser, tmp_path):
    """federate rejects with network (no bridge), federation-refused (a bundle of other weights; an update over
    the norm bound) and federation-closed (the federation is over); the model predicts afterwards."""
    clients, _ = digits()
    make_bundle(tmp_path, trainable="2.*")
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))  # a 5-class head
    other_files = compile_onnx(export_simplified(other, (64,)), name="mlp", input_shape=(64,)).files
    write_files(str(tmp_path / "other"), other_files)
    lines = []
    fed = Federation(Bundle.load(str(tmp_path)), Settings(rounds=1, min_clients=1, max_update_norm=1e-6, heartbeat=2.0),
                     log=lines.append)
    bridge = Bridge(fed).start()
    pages = Pages(browser, bridge.url)
    x, y = clients[0]
    data = [x[:40].reshape(-1).tolist(), y[:40].tolist()]
    attempt = """async ([module, url, x, y]) => {
        const { createModel } = await import(module);
        const m = await createModel({ backend: 'cpu' });
        let error = null;
        try { await m.federate(url ?? location.origin, { x: new Float32Array(x), y: Int32Array.from(y) }); }
        catch (e) { error = e.code + ': ' + e.message; }
        const out = await m.predict(new Float32Array(x.slice(0, 64)), 1);
        return { error, usable: out.length };
    }"""
    try:
        page = pages.open()
        fed.start()
        unreachable = page.evaluate(attempt, ["/mlp.js", "http://127.0.0.1:9", *data])
        wrong = page.evaluate(attempt, ["/other/mlp.js", None, *data])
        too_big = page.evaluate(attempt, ["/mlp.js", None, *data])
        fed.wait(60)
        closed = page.evaluate(attempt, ["/mlp.js", None, *data])
    finally:
        pages.close()
        bridge.close()
    assert unreachable["error"].startswith("network: texelfit: http://127.0.0.1:9: "), unreachable
    assert wrong["error"] == ("federation-refused: texelfit: federation join: 409 this page's model is not the "
                              "federation's: its weights lack 2.weight of 320 values, 2.bias of 10 values"), wrong
    assert too_big["error"].startswith("federation-refused: texelfit: federation update: 422 the update's L2 norm")
    assert closed["error"] == "federation-closed: texelfit: federation join: 410 the federation is over", closed
    assert [r["usable"] for r in (unreachable, wrong, too_big, closed)] == [10, 5, 10, 10]
    assert any("exceeds --max-update-norm" in line for line in lines)
    assert any("not the federation's" in line for line in lines)
    assert all("Failed to load resource" in e or "CORS" in e or "127.0.0.1:9" in e for e in pages.errors), pages.errors
    assert fed.history[-1]["clients"] == []  # the refused update never reached Flower: round 1 had none


def test_federation_page(browser, tmp_path):
    """/federation.html, as a person uses it: choose a data file, Join, watch the rounds; the page is served
    under a Content-Security-Policy of 'self' (no inline script)."""
    import json

    clients, (hx, hy) = digits()
    make_bundle(tmp_path / "b", trainable="2.*")
    np.savez(tmp_path / "held.npz", x=hx, y=hy)
    bundle = Bundle.load(str(tmp_path / "b"))
    fed = Federation(bundle, Settings(rounds=2, min_clients=2, lr=LR, batch_size=BATCH, heartbeat=2.0),
                     evaluate=evaluator(bundle, architecture(bundle, None), str(tmp_path / "held.npz")),
                     log=lambda _: None)
    bridge = Bridge(fed).start()
    pages = Pages(browser, bridge.url)
    try:
        for i, (x, y) in enumerate(clients[:2]):
            path = tmp_path / f"data{i}.json"
            path.write_text(json.dumps({"x": x.tolist(), "y": y.tolist()}))
            page = pages.open()
            page.goto(bridge.url + "/federation.html")
            page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Choose')")
            page.set_input_files("input[type=file]", str(path))
            page.click("#join")
        run_from_pages(pages, fed)
        # its status line polls the bridge every second: it comes to show the last round and the global accuracy
        pages.pages[0].wait_for_function("() => document.getElementById('round').textContent === '2'", timeout=10_000)
        text = {k: pages.pages[0].text_content(f"#{k}") for k in ("round", "rounds", "loss", "accuracy")}
        csp = pages.pages[0].evaluate("async () => (await fetch('/federation.html'))"
                                      ".headers.get('content-security-policy')")
    finally:
        pages.close()
        bridge.close()
    assert not pages.errors, pages.errors
    assert text["rounds"] == "2" and float(text["loss"]) > 0
    assert re.fullmatch(r"\d+\.\d%", text["accuracy"]), text
    assert csp.startswith("default-src 'self'")


def test_an_update_after_its_round_closed_is_not_aggregated(tmp_path):
    fed, bridge, lines = federation(tmp_path, rounds=2, round_timeout=1.5)
    url = bridge.url
    try:
        a, b = post(url, "join")[1]["token"], post(url, "join")[1]["token"]
        fed.start()
        ta, tb = task(url, a), task(url, b)
        da, db = np.full(330, 0.1, np.float32), np.full(330, -0.2, np.float32)
        answer = post(url, "update", b, *update(tb, db, 100))
        assert answer == (200, {"ok": True, "round": 1, "norm": pytest.approx(0.2 * 330 ** 0.5, rel=1e-5)})
        while fed.round < 1:  # a's update does not come: round 1 closes at its timeout, with b's alone
            time.sleep(0.05)
        assert post(url, "update", a, *update(ta, da, 100)) == (200, {"ok": False, "round": 1, "late": True})
        ta2, tb2 = task(url, a), task(url, b)
        assert ta2["round"] == tb2["round"] == 2
        assert_close("global after round 1: b's update alone", ta2["flat"], ta["flat"] + db, atol=1e-7, rtol=1e-6)
        for t, tk in ((a, ta2), (b, tb2)):
            assert post(url, "update", t, *update(tk, da, 100))[1]["ok"] is True
        fed.wait(30)
        assert task(url, a)["done"] is True
        # a heartbeat a page's timer sent while that task call was answered: not refused (CI saw a 401 there)
        assert post(url, "alive", a) == (200, {"done": True})
        assert post(url, "alive", "forged")[0] == 401
        assert post(url, "task", a)[0] == 401  # the session itself is gone
    finally:
        bridge.close()
    assert any("came after the round closed" in line for line in lines)
    assert [sorted(e["clients"]) for e in fed.history[1:]] == [[2], [1, 2]]


@pytest.mark.parametrize("strategy", ["fedadam", "fedprox"])
def test_other_strategies_are_flowers(tmp_path, strategy):
    """--strategy fedadam / fedprox: Flower's FedAdam / FedProx aggregate; the global model is what the same
    Flower strategy makes of the same replies."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp import strategy as st

    fed, bridge, _ = federation(tmp_path, rounds=1, strategy=strategy)
    url = bridge.url
    deltas = [np.full(330, 0.1, np.float32), np.linspace(-1, 1, 330).astype(np.float32)]
    try:
        tokens = [post(url, "join")[1]["token"] for _ in deltas]
        fed.start()
        tasks = [task(url, t) for t in tokens]
        for t, tk, d, n in zip(tokens, tasks, deltas, (50, 150)):
            assert post(url, "update", t, *update(tk, d, n))[1]["ok"] is True
        fed.wait(30)
        replies = []
        start = [a.reshape(s) for a, s in zip(np.split(tasks[0]["flat"], [320]), [(10, 32), (10,)])]
        for d, n in zip(deltas, (50, 150)):
            new = {k: Array(s + p.reshape(s.shape)) for k, s, p in zip(("2.weight", "2.bias"), start,
                                                                          np.split(d, [320]))}
            content = RecordDict({"arrays": ArrayRecord(new), "metrics": MetricRecord({"num-examples": n})})
            replies.append(Message(content, dst_node_id=1, message_type="train"))
    finally:
        bridge.close()
    ref = st.FedAdam() if strategy == "fedadam" else st.FedProx(proximal_mu=0.1)
    ref.current_arrays = dict(zip(("2.weight", "2.bias"), start))  # (what FedOpt's configure_train records)
    got, _ = ref.aggregate_train(1, replies)
    for name in ("2.weight", "2.bias"):
        assert_close(f"{strategy} global {name}", fed.global_weights[name], got[name].numpy(), atol=1e-7, rtol=1e-6)
    plain = start[0] + (deltas[0][:320] * 50 + deltas[1][:320] * 150).reshape(10, 32) / 200
    assert (strategy == "fedprox") == np.allclose(fed.global_weights["2.weight"], plain, atol=1e-6)


def small_cnn():
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def test_federation_page_with_photos(browser, tmp_path):
    """The README's example in small: an image model (--input-normalize) on /federation.html, each person choosing
    photos per class; round 1's global model equals PyTorch's FedAvg of the two local fits on the same pictures
    (texelfit.images.preprocess, as fromImages)."""
    from PIL import Image

    from texelfit.images import preprocess

    module = small_cnn()
    result = compile_onnx(export_simplified(module, (3, 8, 8)), name="cnn", input_shape=(3, 8, 8), trainable="3.*",
                          input_normalize="unit")
    write_files(str(tmp_path / "b"), {**result.files, "index.html": INDEX.decode()})
    rng = np.random.default_rng(5)
    people = [{0: 3, 1: 2}, {1: 2, 2: 4}]  # class -> photos, per person
    photos = []
    for i, have in enumerate(people):
        mine = {}
        for c, n in have.items():
            mine[c] = []
            for k in range(n):
                pixels = rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)
                path = tmp_path / f"p{i}_c{c}_{k}.png"
                Image.fromarray(pixels).save(path)
                mine[c].append((path, pixels))
        photos.append(mine)
    settings = Settings(rounds=1, min_clients=2, lr=0.5, batch_size=4, heartbeat=2.0)
    fed = Federation(Bundle.load(str(tmp_path / "b")), settings, log=lambda _: None)
    bridge = Bridge(fed).start()
    pages = Pages(browser, bridge.url)
    try:
        for mine in photos:
            page = pages.open()
            page.goto(bridge.url + "/federation.html")
            page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Choose')")
            inputs = page.query_selector_all("input[type=file]")
            assert len(inputs) == 3  # one a class of the model's output
            for c, files in mine.items():
                inputs[c].set_input_files([str(p) for p, _ in files])
            page.click("#join")
        run_from_pages(pages, fed)
    finally:
        pages.close()
        bridge.close()
    assert not pages.errors, pages.errors
    fits, counts = [], []
    for mine in photos:  # the page reads the classes in order, each class's files in order
        pictures = [px for c in sorted(mine) for _, px in mine[c]]
        labels = [c for c in sorted(mine) for _ in mine[c]]
        x = torch.from_numpy(preprocess(pictures, (3, 8, 8), result.report["input_normalize"]))
        m = small_cnn()
        head = [p for n, p in m.named_parameters() if n.startswith("3.")]
        for n, p in m.named_parameters():
            p.requires_grad_(n.startswith("3."))
        torch_fit(_Only(m, head), x, torch.tensor(labels), "cross_entropy", {"type": "sgd", "lr": 0.5}, 4, 1)
        fits.append({n: p.detach().numpy() for n, p in m.named_parameters() if n.startswith("3.")})
        counts.append(len(labels))
    for name, got in fed.history[1]["arrays"].items():
        ref = sum(f[name] * c for f, c in zip(fits, counts)) / sum(counts)
        assert_close(f"global {name} of two pages' photos", got, ref, **PARITY)


def test_cli_bad_input_names_the_problem(tmp_path):
    from helpers import run_cli

    make_bundle(tmp_path / "b")
    cases = {
        (str(tmp_path / "nowhere"),): "is not a bundle folder (texelfit build --out)",
        (str(tmp_path / "b"), "--dp-clip", "1"): "differential privacy needs both --dp-clip and --dp-noise",
        (str(tmp_path / "b"), "--out", "global.txt"): "--out 'global.txt' must end in .pt (a state_dict) or .onnx",
        (str(tmp_path / "b"), "--batch-size", "65"): "--batch-size 65 is more than the bundle's maxBatch, 64",
        (str(tmp_path / "b"), "--fraction", "0"): "argument --fraction: must be a number in (0, 1], got '0'",
        (str(tmp_path / "b"), "--eval-data", str(tmp_path / "none.npz")): "cannot read --eval-data",
    }
    for args, message in cases.items():
        r = run_cli("federate", *args)
        assert r.returncode in (1, 2) and message in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
