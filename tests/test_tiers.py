"""Every precision tier, forced on a device that has the best one.

rgba8 packs each float32 into the 4 bytes of an RGBA8 texel: exact, so it is held to the
float32 tolerances. float16 keeps activations and their gradients in half floats (weights,
optimizer state and everything read back stay exact in rgba8), so it is held to looser ones:
  float16 forward    atol 2e-2 + rtol 2e-2 * |ref|
  float16 gradients  per tensor, ||got - ref|| <= 1e-5 + 1e-2 * ||ref|| (L2): half floats carry ~3
                     significant digits, and a value that rounds across a kink (a ReLU at 0, two
                     near-equal maxima of a max-pool) flips a whole term of a gradient, so
                     elementwise bounds are the wrong measure. Measured with loss scaling by 1024
                     (gpu.js): at most 1.2e-3 over every case here.
and must converge: the loss falls over 1,000 steps without a NaN.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from helpers import FWD, GRAD, TRAJ_LOSS, TRAJ_W, build_module, check_op, check_training, run_model
from models import BLOCKED_BATCH, BLOCKED_CASES, CNN_CASES, OP_CASES, ShuffleNetTiny, SmallCNN, mlp_45_31_7

F16_FWD = dict(atol=2e-2, rtol=2e-2)
F16_GRAD = dict(atol=1e-5, rtol=0.0, norm=1e-2)
TOL = {"rgba8": (FWD, GRAD), "float16": (F16_FWD, F16_GRAD)}

CASES = {**{k: (f, s, "cross_entropy") for k, (f, s) in OP_CASES.items()}, **CNN_CASES}


@pytest.mark.parametrize("precision", ["rgba8", "float16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_gradients(web, site, case, precision):
    factory, shape, loss = CASES[case]
    fwd, grad = TOL[precision]
    batch = BLOCKED_BATCH if case in BLOCKED_CASES else 3  # (the blocked passes run from 8 samples on)
    check_op(web, site, case, factory, shape, loss, batch=batch, seed=zlib.crc32(case.encode()) % 1000,
             fwd=fwd, grad=grad, options={"precision": precision})


@pytest.mark.parametrize("opt_name,loss", [("sgd", "cross_entropy"), ("sgd_momentum_wd", "mse"),
                                           ("adam", "cross_entropy"), ("adamw", "cross_entropy")])
def test_rgba8_trajectory(web, site, opt_name, loss):
    check_training(web, site, mlp_45_31_7, (45,), opt_name, loss, samples=50, batch_size=16, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options={"precision": "rgba8"})


def small_cnn():
    return SmallCNN(1, 10)


def test_rgba8_cnn_folded_trajectory(web, site):
    # 16 samples of 12 rows: 192 rows, over the forced limit of 160
    got = check_training(web, site, small_cnn, (1, 12, 12), "adam", "cross_entropy", samples=37,
                         batch_size=16, epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, max_batch=16,
                         options={"precision": "rgba8", "maxTextureSize": 160})
    assert got["info"]["precision"] == "rgba8" and got["folded"] > 0


def test_rgba8_shufflenet_units_trajectory(web, site):
    got = check_training(web, site, ShuffleNetTiny, (3, 13, 11), "adam", "cross_entropy", samples=21, batch_size=8,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options={"precision": "rgba8"})
    assert got["info"]["precision"] == "rgba8"


def test_float16_converges_over_1000_steps(web, site):
    torch.manual_seed(0)
    url = build_module(site, "f16_conv", mlp_45_31_7(), (45,), max_batch=16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(160, 45, generator=g)
    y = (x[:, :7].argmax(1)).tolist()  # a learnable rule
    got = run_model(web, url, """
        const r = await m.fit(new Float32Array(args.x), Int32Array.from(args.y),
                              { batchSize: 16, epochs: 100, seed: 2, optimizer: { type: 'adam', lr: 3e-3 } });
        return { loss: r.loss, precision: m.info.precision };
    """, {"x": x.reshape(-1).tolist(), "y": y}, {"precision": "float16"})
    loss = np.asarray(got["loss"], dtype=np.float64)
    assert got["precision"] == "float16" and loss.size == 1000
    assert np.isfinite(loss).all(), "a non-finite loss in the float16 tier"
    assert loss[-50:].mean() < 0.25 * loss[:50].mean(), (loss[:50].mean(), loss[-50:].mean())


def test_info_reports_the_tier_and_bad_tiers_are_refused(web, site):
    url = build_module(site, "tier_info", mlp_45_31_7(), (45,))
    got = web.evaluate("""async (url) => {
        const mod = await import(url);
        const out = {};
        for (const precision of [undefined, 'float32', 'float16', 'rgba8']) {
          const m = await mod.createModel({ precision });
          out[String(precision)] = m.info.precision;
          m.dispose();
        }
        try { await mod.createModel({ precision: 'float8' }); } catch (e) { out.bad = e.code; }
        return out;
    }""", url)
    assert got == {"undefined": "float32", "float32": "float32", "float16": "float16", "rgba8": "rgba8",
                   "bad": "bad-option"}
