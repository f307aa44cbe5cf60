"""The CPU backend (runtime/cpu.js): the same API and schedule as WebGL2, in plain JavaScript. Its parity checks
against PyTorch (every op's forward and gradients, trajectories): test_backend_parity.py. Here: the lifecycle API on
the CPU, and the automatic choice of the CPU where WebGL2 is missing.
"""
from __future__ import annotations

import pytest
import torch

from helpers import FWD, PAUSE_PRELUDE, PAUSED_AT_STEP_7, assert_close, build_module, pause_data, run_model
from models import mlp_45_31_7


# ---- the API around the backend ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_bundle(site):
    torch.manual_seed(21)
    return build_module(site, "cpu_lifecycle", mlp_45_31_7(), (45,), max_batch=8)


def test_info_lifecycle_and_checkpoints_on_cpu(web, mlp_bundle):
    data = pause_data()
    got = run_model(web, mlp_bundle, PAUSE_PRELUDE + """
        const make = () => mod.createModel({ backend: 'cpu' });
        // an uninterrupted run on a second model, from the same initial weights
        const straight = await make();
        const reference = (await straight.fit(x, y, opts({}))).loss;
        const refWeights = arr(await straight.getWeights());

        // paused at step 7, resumed: the same run
""" + PAUSED_AT_STEP_7 + """        const weightsAfterResume = arr(await m.getWeights());

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


@pytest.mark.fresh_page  # (its init script stays with the page)
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
