"""The CPU backend (runtime/cpu.js): the same API and schedule as WebGL2, in plain JavaScript.

The parity checks of test_ops.py, test_cnn_ops.py, test_train.py and test_cnn_train.py are re-run
through the same helpers with createModel({ backend: 'cpu' }), with the same tolerances:
  forward    atol 2e-5 + rtol 2e-4 * |ref|       gradients  atol 2e-6 + rtol 2e-4 * |ref|
  trajectory weights atol 2e-5 + rtol 2e-4 * |ref|, losses atol 1e-5 + rtol 1e-4
Then: the lifecycle API on the CPU, and the automatic choice of the CPU where WebGL2 is missing.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from helpers import FWD, TRAJ_LOSS, TRAJ_W, assert_close, build_module, check_op, check_training, run_model
from models import (BLOCKED_BATCH, BLOCKED_CASES, CNN_CASES, OP_CASES, ShuffleNetTiny, SmallCNN, mlp_45_31_7,
                    sample_blocked_mlp)

CPU = {"backend": "cpu"}


def _seed(case):
    return zlib.crc32(case.encode()) % 1000


# ---- ops: forward and every gradient -------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_cross_entropy(web, site, case):
    factory, shape = OP_CASES[case]
    check_op(web, site, case, factory, shape, "cross_entropy", batch=11, seed=_seed(case), options=CPU)


@pytest.mark.parametrize("case", ["linear_relu_linear", "sigmoid_output", "unfused_activations", "matmul_add"])
def test_op_mse(web, site, case):
    factory, shape = OP_CASES[case]
    check_op(web, site, case, factory, shape, "mse", batch=11, seed=_seed(case), options=CPU)


@pytest.mark.parametrize("case", sorted(CNN_CASES))
def test_cnn_op(web, site, case):
    factory, shape, loss = CNN_CASES[case]
    batch = BLOCKED_BATCH if case in BLOCKED_CASES else 3  # (the blocked passes run from 8 samples on)
    check_op(web, site, case, factory, shape, loss, batch=batch, seed=_seed(case), options=CPU)


# ---- training trajectories -----------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("opt_name", ["sgd", "sgd_momentum_wd", "adam", "adamw"])
def test_mlp_trajectory(web, site, opt_name, loss):
    # 50 samples in batches of 16 (the last one partial), 3 epochs = 12 steps
    got = check_training(web, site, mlp_45_31_7, (45,), opt_name, loss, samples=50, batch_size=16, epochs=3,
                         tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=CPU)
    assert got["info"]["backend"] == "cpu"


def test_sample_blocked_mlp_trajectory(web, site):
    # batches of 14 run the blocked passes, the last of 5 the one-sample twins
    got = check_training(web, site, sample_blocked_mlp, (45,), "adam", "cross_entropy", samples=47, batch_size=14,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=CPU)
    assert got["info"]["backend"] == "cpu"


def small_cnn():
    return SmallCNN(1, 10)


def test_small_cnn_trajectory(web, site):
    got = check_training(web, site, small_cnn, (1, 12, 12), "adam", "cross_entropy", samples=21, batch_size=8,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=CPU)
    assert got["info"]["backend"] == "cpu"


def test_shufflenet_units_trajectory(web, site):
    got = check_training(web, site, ShuffleNetTiny, (3, 13, 11), "adam", "cross_entropy", samples=21, batch_size=8,
                         epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=CPU)
    assert got["info"]["backend"] == "cpu"


# ---- the API around the backend ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_bundle(site):
    torch.manual_seed(21)
    return build_module(site, "cpu_lifecycle", mlp_45_31_7(), (45,), max_batch=8)


def test_info_lifecycle_and_checkpoints_on_cpu(web, mlp_bundle):
    g = torch.Generator().manual_seed(5)
    data = {"x": torch.randn(40 * 45, generator=g).tolist(), "y": torch.randint(0, 7, (40,), generator=g).tolist()}
    got = run_model(web, mlp_bundle, """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
        const opts = (extra) => ({ batchSize: 4, epochs: 3, shuffle: true, seed: 3,
                                   optimizer: { type: 'adam', lr: 0.01 }, ...extra });
        const make = () => mod.createModel({ backend: 'cpu' });
        // an uninterrupted run on a second model, from the same initial weights
        const straight = await make();
        const reference = (await straight.fit(x, y, opts({}))).loss;
        const refWeights = arr(await straight.getWeights());

        // paused at step 7, resumed: the same run
        const states = [m.state];
        let steps = 0;
        const p = m.fit(x, y, opts({ onStep: ({ step }) => { steps++; if (step === 7) m.pause(); } }));
        while (m.state !== 'paused') await sleep(5);
        states.push(m.state);
        const paused = steps;
        await sleep(100);
        const later = steps;
        m.resume();
        const loss = (await p).loss;
        states.push(m.state);
        const weightsAfterResume = arr(await m.getWeights());

        // saved, restored into a fresh model, trained on: the same as training on
        await m.save('cpu-progress');
        const restored = await make();
        await restored.restore('cpu-progress');
        const sameRestored = JSON.stringify(arr(await restored.getWeights())) === JSON.stringify(arr(await m.getWeights()));
        await m.fit(x, y, opts({ epochs: 1 }));
        await restored.fit(x, y, opts({ epochs: 1 }));
        const sameAfter = JSON.stringify(arr(await restored.getWeights())) === JSON.stringify(arr(await m.getWeights()));
        straight.dispose();
        restored.dispose();

        let bad = null;
        try { await mod.createModel({ backend: 'webgpu' }); } catch (e) { bad = { code: e.code, message: e.message }; }
        return { info: m.info, states, paused, later, steps, loss, reference, sameRestored, sameAfter, bad,
                 sameWeights: JSON.stringify(refWeights) === JSON.stringify(weightsAfterResume) };
    """, data, {"backend": "cpu"})
    assert got["info"]["backend"] == "cpu" and got["info"]["precision"] == "float32"
    assert got["info"]["foldedTextures"] == 0
    assert got["states"] == ["idle", "paused", "idle"]
    assert got["paused"] == got["later"] == 8, "no step may run while paused"
    assert got["steps"] == 30
    assert got["loss"] == got["reference"] and got["sameWeights"], "pause/resume changed the run"
    assert got["sameRestored"] and got["sameAfter"]
    assert got["bad"]["code"] == "no-webgpu" and "--webgpu" in got["bad"]["message"]  # (a bundle without WGSL)


# A page where WebGL2 is missing (canvases give no webgl2 context): createModel() picks the CPU.
NO_WEBGL2 = """
for (const C of [globalThis.HTMLCanvasElement, globalThis.OffscreenCanvas]) {
  if (!C) continue;
  const getContext = C.prototype.getContext;
  C.prototype.getContext = function (type, ...rest) { return type === 'webgl2' ? null : getContext.call(this, type, ...rest); };
}
"""


def test_cpu_is_chosen_where_webgl2_is_missing(web, site):
    web.add_init_script(NO_WEBGL2)
    web.reload()
    torch.manual_seed(8)
    module = mlp_45_31_7().eval()
    url = build_module(site, "cpu_auto", module, (45,), max_batch=8)
    x = torch.randn(5, 45)
    got = run_model(web, url, """
        let forced = null;
        try { await mod.createModel({ backend: 'webgl2' }); } catch (e) { forced = e.code; }
        return { info: m.info, out: Array.from(await m.predict(new Float32Array(args), 5)), forced };
    """, x.reshape(-1).tolist())
    assert got["info"]["backend"] == "cpu" and got["info"]["precision"] == "float32"
    assert got["info"]["fallbackReason"] == "not webgl2: no WebGL2 context here"
    assert got["forced"] == "no-webgl2", "backend: 'webgl2' must fail rather than fall back"
    assert_close("predict on the automatic CPU backend", got["out"], module(x).detach().numpy(), **FWD)
