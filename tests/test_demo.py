"""The main job as a person meets it: the demo page, driven with real mouse events; and the
weights a person trained in the browser, brought back into PyTorch."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import assert_close
from texelfit.demo import NAME, build_demo
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.graph import to_ir
from texelfit.prep.load import load_onnx
from texelfit.prep.torch_ir import PREFIX, IRModule, key

ARTIFACTS = os.environ.get("TEXELFIT_ARTIFACTS", os.path.join(os.path.dirname(__file__), "..", "test-results"))


def circle(cx, cy, rx, ry, n=20):
    return [(cx + rx * math.sin(2 * math.pi * i / n), cy - ry * math.cos(2 * math.pi * i / n)) for i in range(n + 1)]


# strokes (lists of points on the 200x200 pad) of digits a person might draw, two of each
STROKES = {
    1: [[(100, 30), (100, 170)]],
    0: [circle(100, 100, 45, 65)],
    7: [[(50, 40), (150, 40), (80, 170)]],
    4: [[(120, 170), (120, 30), (50, 120), (155, 120)]],
}


@pytest.fixture(scope="module")
def demo(site):
    build_demo(site.path("demo"), progress=False)
    return f"{site.url}/demo/index.html"


def draw(page, strokes, dx=0, dy=0):
    box = page.locator("#pad").bounding_box()
    for stroke in strokes:
        x0, y0 = stroke[0]
        page.mouse.move(box["x"] + x0 + dx, box["y"] + y0 + dy)
        page.mouse.down()
        for a, b in zip(stroke, stroke[1:]):
            for t in (0.25, 0.5, 0.75, 1.0):  # a person's stroke is many small moves
                x, y = a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t
                page.mouse.move(box["x"] + x + dx, box["y"] + y + dy)
        page.mouse.up()


def test_person_draws_labels_and_fine_tunes(web, demo):
    web.goto(demo)
    web.wait_for_selector("body[data-ready=true]", timeout=60_000)
    assert "backend webgl2, precision float32" in web.inner_text("#caps")
    for label, strokes in STROKES.items():
        for dx, dy in ((-8, -6), (9, 7)):
            draw(web, strokes, dx, dy)
            web.wait_for_function("document.body.dataset.prediction !== ''")
            web.click(f"#labels button[data-label='{label}']")
    assert web.inner_text("#count") == str(2 * len(STROKES))
    web.click("#finetune")
    web.wait_for_selector("body[data-finetuned]", timeout=120_000)
    result = json.loads(web.get_attribute("body", "data-finetuned"))
    assert result["last"] < 0.5 * result["first"], result
    assert result["after"]["own"] == 1.0, f"the model still gets some of the drawn examples wrong: {result}"
    assert result["after"]["digits"] > 0.9, f"fine-tuning made the model forget the digits: {result}"
    # a new drawing of a learnt digit is now read right
    web.click("#clear")
    draw(web, STROKES[7], 2, 0)
    web.wait_for_function("document.body.dataset.prediction === '7'", timeout=10_000)
    os.makedirs(ARTIFACTS, exist_ok=True)
    web.screenshot(path=os.path.join(ARTIFACTS, "demo.png"), full_page=True)


@pytest.mark.parametrize("fmt", ["pt", "onnx"])
def test_weights_trained_in_the_browser_come_back_to_pytorch(web, demo, site, tmp_path, fmt):
    web.goto(demo)
    web.wait_for_selector("body[data-ready=true]", timeout=60_000)
    x = np.random.default_rng(0).random((6, 64)).astype(np.float32)
    got = web.evaluate("""async (x) => {
        const m = window.texelfitDemo.model;
        const data = await (await fetch('./digits.json')).json();
        const n = 128;
        const xs = Float32Array.from(data.x.slice(0, n * 64), (v) => v / data.scale);
        await m.fit(xs, Int32Array.from(data.y.slice(0, n)), { epochs: 2, batchSize: 32, optimizer: { type: 'sgd', lr: 0.05, momentum: 0.9 } });
        const w = await m.getWeights();
        return { weights: Object.fromEntries(Object.entries(w).map(([k, v]) => [k, Array.from(v)])),
                 out: Array.from(await m.predict(new Float32Array(x), 6)) };
    }""", x.reshape(-1).tolist())
    weights_file = tmp_path / "weights.json"
    weights_file.write_text(json.dumps(got["weights"]))
    out = tmp_path / f"imported.{fmt}"
    source = site.path("demo", NAME + ".onnx")
    r = subprocess.run([sys.executable, "-m", "texelfit.cli", "import-weights", str(weights_file), "--source", source,
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    if fmt == "pt":
        graph = fold_batchnorm(to_ir(load_onnx(source)))
        module = IRModule(graph).eval()
        state = torch.load(out, weights_only=True)
        assert sorted(state) == sorted(got["weights"])
        module.load_state_dict({PREFIX + key(n): v for n, v in state.items()})  # the state_dict, as a user loads it
    else:
        graph = fold_batchnorm(to_ir(load_onnx(str(out))))
        module = IRModule(graph).eval()
    with torch.no_grad():
        ref = module(torch.from_numpy(x.reshape(6, 1, 8, 8))).numpy()
    assert_close(f"browser-trained weights in PyTorch ({fmt})", got["out"], ref, atol=2e-5, rtol=2e-4)


def test_progress_and_loss_curve_move_during_fine_tuning(web, demo):
    """Issue 18, item 9: with 24 drawings the fine-tuning is a 90-step fit (15 epochs of 6 batches);
    the progress bar and the loss curve must move while it runs, frame by frame."""
    web.goto(demo)
    web.wait_for_selector("body[data-ready=true]", timeout=60_000)
    for label, strokes in STROKES.items():
        for k in range(6):
            draw(web, strokes, -9 + 3 * k, 6 - 2 * k)
            web.wait_for_function("document.body.dataset.prediction !== ''")
            web.click(f"#labels button[data-label='{label}']")
    assert web.inner_text("#count") == "24"
    # what each rendered frame shows, until the fit has resolved
    web.evaluate("""() => {
        window.frames_ = [];
        const sample = () => {
          if (document.body.dataset.finetuned) return;
          window.frames_.push([document.getElementById('progress').value, Number(document.body.dataset.curvePoints || 0)]);
          requestAnimationFrame(sample);
        };
        requestAnimationFrame(sample);
    }""")
    web.click("#finetune")
    web.wait_for_selector("body[data-finetuned]", timeout=120_000)
    frames = web.evaluate("window.frames_")
    progress = {p for p, _ in frames if 0 < p < 1}
    points = {n for _, n in frames if n > 0}
    assert len(progress) >= 5 and len(points) >= 5, f"progress values {sorted(progress)}, curve points {sorted(points)}"


def test_page_opened_from_disk_says_how_to_serve_it(page, demo, site):
    # (a module import from file:// fails in the console: this test uses the plain page fixture)
    page.goto("file://" + site.path("demo", "index.html"))
    page.wait_for_selector("body[data-file-protocol=true]", timeout=10_000)
    text = page.inner_text("#caps")
    assert "served over http" in text and "python3 -m http.server" in text, text
