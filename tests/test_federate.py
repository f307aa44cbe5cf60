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


def simulate(start: dict, clients, rounds, trainable=None):
    """PyTorch: each round every client (rounds[r]: their indices) fits from the global weights with a fresh SGD,
    in order, batch BATCH; the global weights become the sample-weighted mean. The globals after each round."""
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
            torch_fit(_Only(m, params), torch.from_numpy(x), torch.from_numpy(y), "cross_entropy", opt, BATCH, 1)
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
    fed = Federation(bundle, settings, evaluate=evaluator(bundle, graph, str(tmp_path / "held.npz")), log=lambda _: None)
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
