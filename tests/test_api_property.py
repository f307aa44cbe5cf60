"""A property of the whole API (issue 18): whatever options, array types and call orders a page
throws at a model, every call resolves or rejects with a TexelfitError whose code is documented in
the README; a rejection leaves the weights as they were; nothing reaches the console and WebGL
reports no error. Hypothesis draws the calls; each example runs in one fresh model."""
from __future__ import annotations

import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import build_module
from models import mlp_45_31_7

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def documented_codes() -> set[str]:
    text = open(README, encoding="utf-8").read()
    section = text.split("### Error codes", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M))


# values that are right for some options and wrong for others
VALUES = st.sampled_from([1, 2, 3, 0, -1, 2.5, 1e-3, True, False, "x", "sgd", "false", None, [0.9, 0.99], {}, "__undefined__"])
FIT_KEYS = ["batchSize", "epochs", "shuffle", "seed", "loss", "onStep", "epoch", "lr", "batch_size", "trainable"]
OPT_KEYS = ["lr", "momentum", "dampening", "nesterov", "weightDecay", "betas", "eps", "learningRate"]
optimizer = st.one_of(
    st.sampled_from(["sgd", None, 3]),
    st.fixed_dictionaries({"type": st.sampled_from(["sgd", "adam", "adamw", "rmsprop", "__undefined__"])},
                          optional={k: VALUES for k in OPT_KEYS}),
)
fit_options = st.one_of(st.none(), st.just("__undefined__"),
                        st.dictionaries(st.sampled_from(FIT_KEYS), VALUES, max_size=3),
                        st.fixed_dictionaries({"optimizer": optimizer}))
X_KINDS = st.sampled_from(["f32", "f64", "u8", "i32", "plain", "string", "short", "nan"])
Y_KINDS = st.sampled_from(["i32", "plain", "f32", "out-of-range"])
call = st.one_of(
    st.tuples(st.just("predict"), X_KINDS, st.sampled_from([1, 2, 9, "1", 0, 2.5])),
    st.tuples(st.just("fit"), X_KINDS, Y_KINDS, fit_options),
    st.tuples(st.just("gradients"), X_KINDS, Y_KINDS, st.one_of(st.none(), st.dictionaries(st.sampled_from(["loss", "los"]), VALUES, max_size=1))),
    st.tuples(st.just("setWeights"), st.sampled_from(["good", "unknown", "short", "u8", "null", "nan"])),
    st.tuples(st.just("save"), st.sampled_from(["k", "", 5])),
    st.tuples(st.just("restore"), st.sampled_from(["k", "never"])),
    st.tuples(st.just("getWeights")),
)

BODY = """async (args) => {
  const mod = await import(args.url);
  const canvas = document.createElement('canvas');
  const gl = canvas.getContext('webgl2');
  const m = await mod.createModel({ canvas });
  const arr = (o) => JSON.stringify(Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Array.from(v)])));
  const U = (v) => {  // '__undefined__' stands for undefined (JSON has none)
    if (v === '__undefined__') return undefined;
    if (v && typeof v === 'object' && !Array.isArray(v)) return Object.fromEntries(Object.entries(v).map(([k, w]) => [k, U(w)]));
    return v;
  };
  const n = 9;
  const good = Float32Array.from({ length: n * 45 }, (_, i) => Math.sin(i));
  const xOf = (kind, samples) => {
    const f = good.subarray(0, samples * 45);
    return { f32: f, f64: Float64Array.from(f), u8: new Uint8Array(f.length), i32: new Int32Array(f.length),
             plain: Array.from(f), string: '1,2,3', short: f.subarray(0, f.length - 1),
             nan: Float32Array.from(f, (v, i) => (i === 3 ? NaN : v)) }[kind];
  };
  const yOf = (kind) => ({ i32: Int32Array.from({ length: n }, (_, i) => i % 7), plain: [0, 1, 2], f32: new Float32Array(n),
                           'out-of-range': Int32Array.from({ length: n }, () => 7) }[kind]);
  const results = [];
  for (const c of args.calls) {
    const before = arr(await m.getWeights());
    let outcome;
    try {
      if (c[0] === 'predict') await m.predict(xOf(c[1], typeof c[2] === 'number' && Number.isInteger(c[2]) ? c[2] : 1), c[2]);
      else if (c[0] === 'fit') {
        const o = U(c[3]);
        if (o && typeof o === 'object' && 'onStep' in o && o.onStep === 1) o.onStep = () => {};
        await m.fit(xOf(c[1], n), yOf(c[2]), o);
      } else if (c[0] === 'gradients') await m.gradients(xOf(c[1], n), yOf(c[2]), U(c[3]));
      else if (c[0] === 'setWeights') {
        const w = await m.getWeights();
        const b = w['0.bias'];
        await m.setWeights({ good: { '0.bias': b.map((v) => v + 0.5) }, unknown: { nope: b }, short: { '0.bias': b.subarray(1) },
                             u8: { '0.bias': new Uint8Array(b.length) }, null: null,
                             nan: { '0.bias': b.map((v, i) => (i ? v : NaN)) } }[c[1]]);
      } else if (c[0] === 'save') await m.save(c[1]);
      else if (c[0] === 'restore') await m.restore(c[1]);
      else await m.getWeights();
      outcome = { ok: true };
    } catch (e) {
      outcome = { ok: false, texelfit: e instanceof mod.TexelfitError, name: e && e.name, code: e && e.code,
                  message: String(e && e.message), same: arr(await m.getWeights()) === before };
    }
    results.push(outcome);
  }
  const glError = gl.getError();
  m.dispose();
  return { results, glError };
}"""


@pytest.fixture(scope="module")
def bundle(site):
    torch.manual_seed(9)
    return build_module(site, "property_mlp", mlp_45_31_7(), (45,), max_batch=8)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(calls=st.lists(call, min_size=1, max_size=4))
def test_every_call_resolves_or_rejects_cleanly(page, site, bundle, calls):
    codes = documented_codes()
    assert len(codes) > 20, "the README's error-code table was not found"
    messages: list[str] = []
    listener = lambda msg: messages.append(f"console.{msg.type}: {msg.text}")  # noqa: E731
    page.on("console", listener)
    page.on("pageerror", lambda exc: messages.append(f"pageerror: {exc}"))
    try:
        page.goto(f"{site.url}/index.html")
        got = page.evaluate(BODY, {"url": bundle, "calls": [list(c) for c in calls]})
    finally:
        page.remove_listener("console", listener)
    for c, r in zip(calls, got["results"]):
        if r["ok"]:
            continue
        assert r["texelfit"] and r["name"] == "TexelfitError", (c, r)
        assert r["code"] in codes, f"{c}: code {r['code']!r} is not in the README's table ({r['message']})"
        assert r["code"] not in ("gpu-error", "out-of-memory"), f"{c}: the GPU failed ({r['message']})"
        assert r["same"], f"{c}: rejected ({r['code']}) but the weights changed"
    assert got["glError"] == 0, f"WebGL error {got['glError']}"
    assert not messages, "\n".join(messages[:5])
