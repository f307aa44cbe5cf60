"""The demo page as a person uses it (`texelfit demo`): EfficientNet-Lite0 with a new head, taught the
user's own pictures in the browser.

Built once for the session (the tier measured, the bundle, lite0.onnx) and served from 127.0.0.1 with the
Content-Security-Policy that `texelfit demo` sends, built with --webgpu. Chromium with the fake capture device
(`--use-fake-device-for-media-stream --use-fake-ui-for-media-stream`: a synthetic moving picture, the
permission granted) serves both flows, the files flow without WebGPU (the page runs WebGL2 and its capability
line says why not WebGPU), the webcam flow with it (`--enable-unsafe-webgpu`: the page runs WebGPU):

* files: 3 classes (crops of scikit-learn's two sample photos, and generated pictures), 9 image files
  dropped on each (a DataTransfer of Files), kept across a reload (IndexedDB); trained (every third
  example held out: 6 train and 3 held out a class); at least 90% of the held-out crops right; a dropped
  test image predicted; the head saved, restored after a reload, downloaded, and brought back into
  PyTorch by `texelfit import-weights --partial`, which predicts as the page does.
* webcam: two classes of dropped photo crops and one of frames captured from the fake camera; trained,
  held-out accuracy at least 90%, and the live prediction on the webcam is the webcam's class.

A screenshot of each flow goes to test-results/ (TEXELFIT_ARTIFACTS), its path printed.
"""
from __future__ import annotations

import base64
import io
import json
import os
import time

import numpy as np
import pytest
import torch

from conftest import CHROMIUM, CHROMIUM_ARGS
from helpers import assert_close
from texelfit.photos_demo import CSP, NAME, build_photos_demo, generated_images, photo_crops, sample_photos

ARTIFACTS = os.environ.get("TEXELFIT_ARTIFACTS", os.path.join(os.path.dirname(__file__), "..", "test-results"))
FAKE_CAMERA = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
PER_CLASS = 9  # every third held out: 6 train, 3 held out
TIMEOUT = 240_000


@pytest.fixture(scope="session")  # (not "module": pytest orders the [chromium] test apart, which built it twice)
def photos(site):
    start = time.perf_counter()
    summary = build_photos_demo(site.path("photos"), progress=False)
    print(f"built the demo in {time.perf_counter() - start:.1f} s: {summary['quantization']['tier']}")
    summary["onnx"] = site.path("photos", NAME + ".onnx")
    site.headers_for["/photos/"] = {"Content-Security-Policy": CSP}
    return f"{site.url}/photos/index.html", summary


@pytest.fixture(scope="module")
def camera_browser(playwright):
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS + FAKE_CAMERA)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def camera_webgpu_browser(playwright):
    """The fake-camera browser with WebGPU (SwiftShader's adapter): the demo, built with --webgpu, runs there."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=CHROMIUM_ARGS + FAKE_CAMERA + ["--enable-unsafe-webgpu"])
    yield browser
    browser.close()


@pytest.fixture
def person(camera_browser, site):
    """A fresh profile (empty IndexedDB) in the fake-camera browser (no WebGPU: the demo falls back to WebGL2);
    console errors and requests that leave 127.0.0.1 fail the test."""
    yield from _person(camera_browser, site)


@pytest.fixture
def webgpu_person(camera_webgpu_browser, site):
    """As `person`, in the fake-camera browser with WebGPU."""
    yield from _person(camera_webgpu_browser, site)


def _person(browser, site):
    context = browser.new_context(accept_downloads=True)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site.url)
    page = context.new_page()
    errors, outside = [], []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith((site.url, "blob:", "data:")) else None)
    yield page
    context.close()
    assert not errors, "errors in the page:\n" + "\n".join(errors)
    assert not outside, f"requests that left 127.0.0.1: {outside}"


def png(img: np.ndarray, side: int = 256) -> bytes:
    from PIL import Image

    im = Image.fromarray(img)
    im.thumbnail((side, side))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def pictures():
    """{class name: [PNG bytes]}: crops of the temple photo, of the flower photo, and generated pictures
    (other seeds than the build's agreement set)."""
    china, flower = sample_photos()
    return {"temple": [png(c) for c in photo_crops(china, PER_CLASS, seed=7)],
            "flower": [png(c) for c in photo_crops(flower, PER_CLASS, seed=8)],
            "shapes": [png(g) for g in generated_images(PER_CLASS, seed=9)]}


def drop_files(page, selector: str, files: list[bytes], stem: str):
    """Drop image files on an element, as a person dragging them from a file manager."""
    dt = page.evaluate_handle("""(files) => {
        const dt = new DataTransfer();
        for (const f of files) {
          const bin = atob(f.b64), u = new Uint8Array(bin.length);
          for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
          dt.items.add(new File([u], f.name, { type: 'image/png' }));
        }
        return dt;
    }""", [{"name": f"{stem}-{i}.png", "b64": base64.b64encode(b).decode()} for i, b in enumerate(files)])
    page.dispatch_event(selector, "dragover", {"dataTransfer": dt})
    page.dispatch_event(selector, "drop", {"dataTransfer": dt})


def choose_files(page, selector: str, files: list[bytes], stem: str):
    """Pick image files in a class's "Choose files" dialog (the file input behind it)."""
    page.set_input_files(f"{selector} input[type=file]",
                         [{"name": f"{stem}-{i}.png", "mimeType": "image/png", "buffer": b} for i, b in enumerate(files)])


def paste_picture(page, selector: str, picture: bytes):
    """Put a PNG on the system clipboard, select the class by clicking its card, press Ctrl-V."""
    page.evaluate("""async (b64) => {
        const bin = atob(b64), u = new Uint8Array(bin.length);
        for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
        await navigator.clipboard.write([new ClipboardItem({ 'image/png': new Blob([u], { type: 'image/png' }) })]);
    }""", base64.b64encode(picture).decode())
    page.click(f"{selector} .thumbs")
    page.wait_for_selector(f"{selector}.active", state="attached")
    page.keyboard.press("Control+V")


def poll(condition, seconds: float, message=None):
    """Wait for a condition checked from Python (the page's CSP refuses the eval of wait_for_function)."""
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, f"not true after {seconds} s: {message() if message else ''}"
        time.sleep(0.2)


def open_page(page, url):
    page.goto(url)
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=TIMEOUT)
    print(f"page loaded in {page.get_attribute('body', 'data-load-seconds')} s")


def make_classes(page, names):
    """Rename the two starting classes and add the others, through the page's controls."""
    for n in range(page.locator("#classes .class").count(), len(names)):
        page.click("#add-class")
        page.wait_for_selector(f"#classes .class:nth-child({n + 1})", state="attached")
    for i, name in enumerate(names):
        field = page.locator("#classes .class input.name").nth(i)
        field.fill(name)
        field.press("Enter")
    poll(lambda: json.loads(page.get_attribute("body", "data-classes")) == names, 30,
         lambda: page.get_attribute("body", "data-classes"))


def card(i: int) -> str:
    return f"#classes .class:nth-child({i + 1})"


def train(page, pause: bool = False) -> dict:
    page.evaluate("""() => {
        window.frames_ = [];
        const sample = () => {
          if (document.body.dataset.trained) return;
          window.frames_.push([document.getElementById('progress').value, Number(document.body.dataset.curvePoints || 0)]);
          requestAnimationFrame(sample);
        };
        requestAnimationFrame(sample);
    }""")
    if pause:  # a person pressing Pause as soon as the bar moves (checked every frame)
        page.evaluate("""() => { window.pausedAt_ = null; const f = () => {
            const v = document.getElementById('progress').value;
            if (v > 0 && v < 1) { document.getElementById('pause').click(); window.pausedAt_ = v; } else requestAnimationFrame(f);
        }; requestAnimationFrame(f); }""")
    page.click("#train")
    if pause:
        # the model says it is paused and the steps hold; Resume finishes the training
        page.wait_for_selector("#state:text-matches('^paused')", timeout=TIMEOUT)
        page.wait_for_timeout(500)
        held = page.evaluate("document.getElementById('progress').value")
        page.wait_for_timeout(1500)
        assert page.evaluate("document.getElementById('progress').value") == held < 1
        assert page.get_attribute("body", "data-trained") is None and page.inner_text("#pause") == "Resume"
        page.click("#pause")
    page.wait_for_selector("body[data-trained]", state="attached", timeout=TIMEOUT)
    result = json.loads(page.get_attribute("body", "data-trained"))
    frames = page.evaluate("window.frames_")
    result["progress_values"] = len({p for p, _ in frames if 0 < p < 1})
    result["curve_values"] = len({n for _, n in frames if n > 0})
    return result


def screenshot(page, name: str):
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.abspath(os.path.join(ARTIFACTS, name))
    page.screenshot(path=path, full_page=True)
    print(f"screenshot: {path}")


def check_trained(result, classes):
    assert result["classes"] == classes and result["train"] == 6 * len(classes) and result["held"] == 3 * len(classes), result
    assert result["last"] < 0.5 * result["first"], f"the loss did not fall: {result}"
    assert result["heldOut"]["accuracy"] >= 0.9, f"held-out accuracy under 90%: {result['heldOut']}"
    # the progress bar and the loss curve moved while it trained, not only at the end
    assert result["progress_values"] >= 5 and result["curve_values"] >= 3, result


def test_the_build_ships_the_smallest_tier_that_agrees_with_float32(photos):
    """The tier is the first of int8, fp16 whose measured top-1 agreement reaches the threshold (else
    float32), and it is what the bundle ships; the weights are in lite0.weights.bin beside lite0.js."""
    _, summary = photos
    q = summary["quantization"]
    assert q["images"] >= 64 and q["threshold"] == 0.99
    expected = "none"
    for tier in ("int8", "fp16"):
        if tier not in q["tiers"]:
            break
        m = q["tiers"][tier]
        reached = m["checked"] == q["images"] and m["agreement"] >= q["threshold"]
        assert m["stopped"] == (m["checked"] < q["images"]) and (not m["stopped"] or m["disagree"] > 0), m
        if reached:
            expected = tier
            break
    assert q["tier"] == expected, q
    report = json.loads(open(os.path.join(os.path.dirname(summary["onnx"]), "report.json")).read())
    assert report["quantize"]["mode"] == q["tier"]
    assert report["weights_file"]["name"] == f"{NAME}.weights.bin" and report["weights_file"]["bytes"] == summary["weights_bytes"]
    assert report["input_normalize"]["mode"] == "imagenet" and sorted(report["trainable"]) == ["_fc.bias", "_fc.weight"]
    print(f"quantisation: {q}")


def test_person_drops_photos_trains_and_takes_the_head_to_pytorch(person, photos, pictures, tmp_path):
    url, summary = photos
    page = person
    open_page(page, url)
    caps = page.inner_text("#caps")  # (the bundle carries WGSL; this browser gives no WebGPU, so WebGL2 runs it)
    assert "backend webgl2 (not webgpu: " in caps and "texture limit" in caps and "loaded in" in caps, caps
    assert "bundle" in caps, caps
    names = list(pictures)
    make_classes(page, names)
    for i, name in enumerate(names):
        drop_files(page, card(i), pictures[name], name)
    page.wait_for_selector(f"body[data-examples='{3 * PER_CLASS}']", state="attached", timeout=60_000)
    # everything is kept in IndexedDB: a reload shows the same classes and examples
    open_page(page, url)
    assert json.loads(page.get_attribute("body", "data-classes")) == names
    assert page.get_attribute("body", "data-examples") == str(3 * PER_CLASS)
    assert page.locator(f"{card(0)} .thumbs img").count() == PER_CLASS

    result = train(page, pause=True)
    check_trained(result, names)
    print(f"files flow: held-out {result['heldOut']}, loss {result['first']:.3f} -> {result['last']:.3f}, "
          f"fit {result['seconds']:.1f} s")
    # a new picture, dropped on the test area, is predicted as its class
    china, _ = sample_photos()
    drop_files(page, "#test-drop", [png(photo_crops(china, 1, seed=99)[0])], "test")
    page.wait_for_selector("body[data-prediction-source=image]", state="attached", timeout=60_000)
    assert page.get_attribute("body", "data-prediction") == "temple"
    screenshot(page, "photos-demo-files.png")

    # saved in the browser, restored after a reload
    page.click("#save")
    page.wait_for_selector("#stored:text-is('saved in this browser')")
    open_page(page, url)
    page.click("#restore")
    page.wait_for_selector("body[data-restored=true]", state="attached", timeout=60_000)

    # Download weights -> texelfit import-weights --partial -> PyTorch predicts as the page does
    with page.expect_download() as dl:
        page.click("#download")
    head = tmp_path / f"{NAME}-head.json"
    dl.value.save_as(head)
    assert sorted(json.loads(head.read_text())) == ["_fc.bias", "_fc.weight"]
    got = page.evaluate("""async (b64) => {
        const bin = atob(b64), u = new Uint8Array(bin.length);
        for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
        const d = window.texelfitDemo;
        const x = await d.pixels([new Blob([u], { type: 'image/png' })]);
        return { x: Array.from(x), out: Array.from(await d.model.predict(x, 1)) };
    }""", base64.b64encode(pictures["flower"][0]).decode())
    from helpers import run_cli

    out = tmp_path / "lite0.pt"
    site_onnx = summary["onnx"]
    r = run_cli("import-weights", str(head), "--source", site_onnx, "--out", str(out))
    assert r.returncode != 0 and "--partial" in r.stderr, r.stderr  # a head alone needs --partial
    r = run_cli("import-weights", str(head), "--source", site_onnx, "--partial", "--out", str(out))
    assert r.returncode == 0, r.stderr
    from texelfit.prep.fold import fold_batchnorm
    from texelfit.prep.graph import to_ir
    from texelfit.prep.load import load_onnx
    from texelfit.prep.torch_ir import PREFIX, IRModule, key

    module = IRModule(fold_batchnorm(to_ir(load_onnx(site_onnx)))).eval()
    module.load_state_dict({PREFIX + key(n): v for n, v in torch.load(out, weights_only=True).items()})
    x = torch.tensor(got["x"], dtype=torch.float32).reshape(1, 3, 224, 224)
    with torch.no_grad():
        ref = module(x).numpy()
    assert_close("the browser-trained model in PyTorch", got["out"], ref, atol=0, rtol=0, norm=1e-4)


def test_person_captures_from_the_webcam_trains_and_predicts_live_on_webgpu(webgpu_person, photos, pictures):
    """The webcam flow where the browser gives WebGPU: the demo's createModel() chooses it (the files flow above
    runs where it does not, on WebGL2)."""
    url, _ = photos
    page = webgpu_person
    open_page(page, url)
    caps = page.inner_text("#caps")
    assert caps.startswith("backend webgpu, ") and "not webgpu" not in caps and "texture limit" not in caps, caps
    names = ["temple", "flower", "me"]
    make_classes(page, names)
    drop_files(page, card(0), pictures["temple"], "temple")
    # the flower class through the other two ways in: its "Choose files" input, then Ctrl-V of a picture
    # on the clipboard with the class selected
    choose_files(page, card(1), pictures["flower"][:-1], "flower")
    page.wait_for_selector(f"body[data-examples='{2 * PER_CLASS - 1}']", state="attached", timeout=60_000)
    paste_picture(page, card(1), pictures["flower"][-1])
    page.wait_for_selector(f"body[data-examples='{2 * PER_CLASS}']", state="attached", timeout=60_000)
    assert page.locator(f"{card(1)} .thumbs img").count() == PER_CLASS
    page.click("#camera-toggle")
    page.wait_for_selector("body[data-camera=on]", state="attached", timeout=30_000)
    assert "mirror" in page.get_attribute("#camera", "class")
    assert page.evaluate("getComputedStyle(document.getElementById('camera')).transform") != "none"
    for k in range(PER_CLASS):
        page.click(f"{card(2)} button.capture")
        page.wait_for_selector(f"body[data-examples='{2 * PER_CLASS + k + 1}']", state="attached", timeout=30_000)
        page.wait_for_timeout(150)  # the fake camera's picture moves between frames
    result = train(page)
    check_trained(result, names)
    print(f"webcam flow: held-out {result['heldOut']}, loss {result['first']:.3f} -> {result['last']:.3f}")
    page.click("#predict-camera")
    poll(lambda: int(page.get_attribute("body", "data-predictions") or 0) >= 3, 60)
    assert page.get_attribute("body", "data-prediction-source") == "webcam"
    assert page.get_attribute("body", "data-prediction") == "me"
    screenshot(page, "photos-demo-webcam.png")
    page.click("#predict-camera")


def test_page_opened_from_disk_says_how_to_serve_it(page, photos):
    page.goto("file://" + os.path.join(os.path.dirname(photos[1]["onnx"]), "index.html"))
    page.wait_for_selector("body[data-file-protocol=true]", state="attached", timeout=10_000)
    text = page.inner_text("#caps")
    assert "served over http" in text and "python3 -m http.server" in text, text


def test_import_weights_partial_takes_the_rest_from_the_source():
    """--partial: the tensors FILE lacks come from SOURCE; an unknown or misshapen tensor still fails, and
    without --partial a missing one fails naming the flag."""
    from texelfit.importer import apply_weights
    from texelfit.prep.graph import to_ir
    from texelfit.prep.load import BuildError, export_simplified

    torch.manual_seed(0)
    graph = to_ir(export_simplified(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)),
                                    (4,)), (4,))
    head = {"2.weight": np.full((2, 3), 0.5, np.float32), "2.bias": np.zeros(2, np.float32)}
    out = apply_weights(graph, head, "head.json", partial=True)
    assert np.array_equal(out.params["0.weight"].array, graph.params["0.weight"].array)
    assert np.array_equal(out.params["2.weight"].canonical(), head["2.weight"])
    with pytest.raises(BuildError, match="--partial"):
        apply_weights(graph, head, "head.json")
    with pytest.raises(BuildError, match="unknown"):
        apply_weights(graph, {**head, "9.weight": np.zeros(1, np.float32)}, "head.json", partial=True)
    with pytest.raises(BuildError, match="has 5 values"):
        apply_weights(graph, {"2.bias": np.zeros(5, np.float32)}, "head.json", partial=True)
    with pytest.raises(BuildError, match="does not fit"):
        apply_weights(graph, {}, "head.json", partial=True)


def test_demo_cli_builds_the_photos_page_by_default_and_digits_on_request():
    from texelfit.cli import parser
    from texelfit.demo import DEFAULT_OUT

    assert parser().parse_args(["demo"]).example == "photos"
    assert parser().parse_args(["demo", "--example", "digits"]).example == "digits"
    assert DEFAULT_OUT == {"photos": os.path.join("dist", "demo"), "digits": os.path.join("dist", "demo-digits")}
