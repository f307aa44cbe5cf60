"""Image inputs (issue 17): texelfit.images against torch's antialiased interpolate, the browser's
fromImages against texelfit.images for every source type on 1- and 3-channel models (WebGL2, its
RGBA8 fallback and the CPU backend), image arrays in predict/fit/features, the errors, and the
weights file beside the bundle (NAME.weights.bin)."""
from __future__ import annotations

import base64
import functools
import io
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close
from texelfit.build import compile_onnx
from texelfit.images import ImageError, crop_box, normalization, preprocess, resize_unnormalized
from texelfit.prep.load import BuildError, export_simplified

nn = torch.nn
TOL = 2 / 255  # the bound, per value before normalisation
RGB_SHAPE, GRAY_SHAPE = (3, 32, 48), (1, 20, 16)  # non-square: the crop matters


def rgb_net():
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16 * 24, 5))


def gray_net():
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 10 * 8, 3))


@functools.lru_cache(maxsize=1)
def images() -> list[np.ndarray]:
    """Test pictures, uint8 H x W x 3: a photo (scikit-learn's china.jpg, 427 x 640: shrinking 13x, with
    its crop), a small noise image (upscaling, cropped the other way) and a mid-size one."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(17)
    photo = load_sample_images().images[0]
    return [photo, rng.integers(0, 256, (17, 30, 3), dtype=np.uint8), rng.integers(0, 256, (70, 61, 3), dtype=np.uint8)]


# ---- texelfit.images against torch ----------------------------------------------------------------

@pytest.mark.parametrize("size,out", [((70, 90), (32, 48)), ((17, 30), (32, 48)), ((427, 640), (20, 16)),
                                      ((5, 300), (7, 9)), ((40, 40), (40, 40)), ((33, 50), (2, 3)), ((1, 1), (4, 6))])
def test_preprocess_matches_torch_antialiased_bilinear(size, out):
    """Crop (whole pixels, centred) then torch.nn.functional.interpolate(bilinear, antialias=True,
    align_corners=False): torchvision's resize(antialias=True) on tensors."""
    h, w = size
    a = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    x0, y0, cw, ch = crop_box(w, h, out[1], out[0])
    assert abs(cw / ch - out[1] / out[0]) <= max(1 / ch, 1 / cw) * out[1] / out[0] + 1e-12
    t = torch.from_numpy(a[y0:y0 + ch, x0:x0 + cw].astype(np.float32) / 255).permute(2, 0, 1)[None]
    ref = F.interpolate(t, size=out, mode="bilinear", antialias=True, align_corners=False)[0].numpy()
    assert_close("preprocess unit", preprocess(a, (3,) + out, "unit")[0], ref, atol=2e-6, rtol=0)
    gray = np.tensordot(np.array([0.299, 0.587, 0.114], np.float32), ref, axes=1)[None]
    assert_close("preprocess gray", preprocess([a], (1,) + out, "unit")[0], gray, atol=2e-6, rtol=0)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    assert_close("preprocess imagenet", preprocess(a, (3,) + out, "imagenet")[0],
                 (ref - mean[:, None, None]) / std[:, None, None], atol=1e-5, rtol=0)


def test_preprocess_takes_pil_images_and_matches_pil_resize():
    """A PIL image gives the same as its array; PIL's own BILINEAR resize (uint8, rounded) agrees within 1/255."""
    from PIL import Image

    photo = images()[0]
    im = Image.fromarray(photo)
    got = preprocess([im], RGB_SHAPE, "unit")[0]
    assert np.array_equal(got, preprocess([photo], RGB_SHAPE, "unit")[0])
    x0, y0, cw, ch = crop_box(640, 427, 48, 32)
    pil = np.asarray(im.crop((x0, y0, x0 + cw, y0 + ch)).resize((48, 32), Image.BILINEAR, reducing_gap=None))
    assert np.abs(got - pil.transpose(2, 0, 1) / 255).max() <= 1 / 255


def test_normalization_modes_and_errors():
    assert normalization("imagenet", 3)["std"] == [0.229, 0.224, 0.225]
    assert normalization("unit", 1) == {"mode": "unit", "mean": [0.0], "std": [1.0]}
    assert normalization("0.5,0.5,0.5:0.25,0.5,1", 3) == {"mode": "custom", "mean": [0.5] * 3, "std": [0.25, 0.5, 1.0]}
    for mode, channels, msg in [("imagenet", 1, "3-channel"), ("0.5:0.5", 3, "give 3 of each"), ("0.5,1:0.5", 1, "give 1"),
                                ("0.5:0", 1, "> 0"), ("bogus", 3, "not imagenet"), ("a:b", 1, "not imagenet")]:
        with pytest.raises(ImageError, match=msg):
            normalization(mode, channels)
    with pytest.raises(ImageError, match="uint8"):
        resize_unnormalized(np.zeros((4, 4, 3), np.float32), RGB_SHAPE)


def test_build_records_the_normalization_and_refuses_non_images():
    torch.manual_seed(0)
    res = compile_onnx(export_simplified(rgb_net(), RGB_SHAPE), name="m", input_shape=RGB_SHAPE, input_normalize="imagenet")
    assert res.report["input_normalize"] == {"mode": "imagenet", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                                             "channels": 3, "height": 32, "width": 48}
    assert '"image":{"mode":"imagenet"' in res.files["m.js"] and "fromImages" in res.files["m.d.ts"]
    plain = compile_onnx(export_simplified(rgb_net(), RGB_SHAPE), name="m", input_shape=RGB_SHAPE)
    assert plain.report["input_normalize"] is None and "IMAGE_SHADER" not in plain.files["m.js"]
    mlp = nn.Sequential(nn.Linear(45, 7))
    with pytest.raises(BuildError, match=r"--input-normalize unit: an image input is \(C, H, W\) with 1 or 3 channels; this input is \[45\]"):
        compile_onnx(export_simplified(mlp, (45,)), name="m", input_shape=(45,), input_normalize="unit")
    with pytest.raises(BuildError, match="imagenet is for a 3-channel"):
        compile_onnx(export_simplified(gray_net(), GRAY_SHAPE), name="m", input_shape=GRAY_SHAPE, input_normalize="imagenet")


# ---- fromImages in the browser ----------------------------------------------------------------------

MODES = {"rgb_imagenet": (rgb_net, RGB_SHAPE, "imagenet"), "rgb_unit": (rgb_net, RGB_SHAPE, "unit"),
         "rgb_custom": (rgb_net, RGB_SHAPE, "0.5,0.4,0.3:0.2,0.3,0.4"),
         "gray_custom": (gray_net, GRAY_SHAPE, "0.45:0.25")}


@pytest.fixture(scope="module")
def bundles(site):
    """url, the module, its normalisation, for every case of MODES; and the test pictures as PNG files."""
    out = {}
    for case, (factory, shape, mode) in MODES.items():
        torch.manual_seed(0)
        module = factory().eval()
        res = compile_onnx(export_simplified(module, shape), name="m", input_shape=shape, input_normalize=mode)
        out[case] = (site.add_files(f"img_{case}", res.files) + "/m.js", module, res.report["input_normalize"], shape)
    from PIL import Image

    pngs = {}
    for i, a in enumerate(images()):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "PNG")
        pngs[f"pic{i}.png"] = buf.getvalue()
    site.add_files("img_pics", pngs)
    return out


def rgba_b64(a: np.ndarray) -> str:
    return base64.b64encode(np.concatenate([a, np.full(a.shape[:2] + (1,), 255, np.uint8)], axis=2).tobytes()).decode()


KINDS = ["ImageData", "HTMLCanvasElement", "OffscreenCanvas", "ImageBitmap", "HTMLImageElement", "VideoFrame",
         "HTMLVideoElement"]

# Each kind made from the same RGBA bytes in the page; a video plays a canvas's captureStream(), and its
# reference is the frame drawn into a 2-D canvas (the codec's YUV round trip changes the pixels).
MAKE_SOURCES = """
const bytes = (b64) => Uint8ClampedArray.from(atob(b64), (c) => c.charCodeAt(0));
const pics = args.pics.map(([w, h, b64, png]) => ({ w, h, data: new ImageData(bytes(b64), w, h), png }));
const canvasOf = (p) => { const c = document.createElement('canvas'); c.width = p.w; c.height = p.h; c.getContext('2d').putImageData(p.data, 0, 0); return c; };
async function make(kind, p) {
  switch (kind) {
    case 'ImageData': return [p.data];
    case 'HTMLCanvasElement': return [canvasOf(p)];
    case 'OffscreenCanvas': { const c = new OffscreenCanvas(p.w, p.h); c.getContext('2d').putImageData(p.data, 0, 0); return [c]; }
    case 'ImageBitmap': return [await createImageBitmap(p.data)];
    case 'HTMLImageElement': { const im = new Image(); im.src = p.png; await im.decode(); return [im]; }
    case 'VideoFrame': return [new VideoFrame(canvasOf(p), { timestamp: 0 })];
    case 'HTMLVideoElement': {
      const c = canvasOf(p), ctx = c.getContext('2d');
      const timer = setInterval(() => ctx.putImageData(p.data, 0, 0), 20);
      const v = document.createElement('video');
      v.muted = true;
      v.srcObject = c.captureStream();
      await v.play();
      while (v.readyState < 2 || v.videoWidth !== p.w) await new Promise((r) => setTimeout(r, 20));
      await new Promise((r) => v.requestVideoFrameCallback(r));
      clearInterval(timer);
      v.pause();
      const d = document.createElement('canvas'); d.width = p.w; d.height = p.h;
      const dc = d.getContext('2d', { willReadFrequently: true });
      dc.drawImage(v, 0, 0);
      const px = dc.getImageData(0, 0, p.w, p.h).data;
      let bin = '';
      for (let i = 0; i < px.length; i += 8192) bin += String.fromCharCode(...px.subarray(i, i + 8192));
      return [v, btoa(bin)];
    }
  }
}
"""

FROM_IMAGES = MAKE_SOURCES + """
const out = {};
for (const kind of args.kinds) {
  const t0 = performance.now();
  const made = await Promise.all(pics.map((p) => make(kind, p)));
  const t1 = performance.now();
  const x = await m.fromImages(made.map((s) => s[0]));
  out[kind] = { x: Array.from(x), frames: made.map((s) => s[1] ?? null), ms: [t1 - t0, performance.now() - t1] };
  for (const [s] of made) if (s.close) s.close();
}
return { out, info: m.info };
"""


@functools.lru_cache(maxsize=1)
def _rgba_b64s() -> tuple[str, ...]:
    return tuple(rgba_b64(a) for a in images())


def pics_arg(site):
    return [[a.shape[1], a.shape[0], b64, f"{site.url}/img_pics/pic{i}.png"] for i, (a, b64) in enumerate(zip(images(), _rgba_b64s()))]


def check_from_images(web, site, bundles, case, kinds, options=None):
    from helpers import run_model

    url, _, norm, shape = bundles[case]
    got = run_model(web, url, FROM_IMAGES, {"pics": pics_arg(site), "kinds": kinds}, options)
    std = min(norm["std"])
    pics = images()
    errors = {}
    for kind in kinds:
        r = got["out"][kind]
        frames = [pics[i] if f is None else np.frombuffer(base64.b64decode(f), np.uint8).reshape(pics[i].shape[:2] + (4,))[:, :, :3]
                  for i, f in enumerate(r["frames"])]
        ref = preprocess(frames, shape, norm)
        x = np.asarray(r["x"], np.float32).reshape(ref.shape)
        errors[kind] = float(np.abs(x - ref).max() * std)
        assert_close(f"{case} fromImages({kind})", x, ref, atol=TOL / std, rtol=0)
    if os.environ.get("TEXELFIT_PRINT_ERRORS"):
        print(f"[parity] {case} {got['info']['backend']}/{got['info']['precision']} max error x 255 before normalising:",
              {k: round(v * 255, 3) for k, v in errors.items()},
              "ms (make, fromImages):", {k: [round(t) for t in got["out"][k]["ms"]] for k in kinds})
    return got


@pytest.mark.parametrize("case", ["rgb_imagenet", "gray_custom"])
def test_from_images_matches_texelfit_images_every_source_type(web, site, bundles, case):
    """WebGL2 (float32 targets): every source type, 3 channels and 1 (luminance)."""
    got = check_from_images(web, site, bundles, case, KINDS)
    assert got["info"]["backend"] == "webgl2" and got["info"]["image"] == bundles[case][2]


@pytest.mark.parametrize("case", ["rgb_unit", "rgb_custom"])
def test_from_images_every_normalization(web, site, bundles, case):
    check_from_images(web, site, bundles, case, ["ImageData", "HTMLCanvasElement"])


@pytest.mark.parametrize("case,options", [("rgb_imagenet", {"backend": "cpu"}), ("gray_custom", {"backend": "cpu"}),
                                          ("rgb_unit", {"precision": "rgba8"}), ("gray_custom", {"precision": "rgba8"}),
                                          ("rgb_custom", {"maxTextureSize": 512})],
                         ids=["cpu-rgb", "cpu-gray", "rgba8-rgb", "rgba8-gray", "webgl2-source-over-texture-limit"])
def test_from_images_on_the_cpu_backend_and_the_rgba8_path(web, site, bundles, case, options):
    """The CPU backend (a 2-D canvas and the filter in JS), RGBA8 passes where float targets are not used,
    and on WebGL2 a source larger than the textures (the 640-wide photo under maxTextureSize 512): in JS."""
    check_from_images(web, site, bundles, case, [k for k in KINDS if k != "HTMLVideoElement"], options)


SOURCES_IN_PLACE_OF_X = MAKE_SOURCES + """
const srcs = [];
for (const p of pics) srcs.push((await make('HTMLCanvasElement', p))[0]);
const x = await m.fromImages(srcs);
const n = srcs.length;
const fromSources = Array.from(await m.predict(srcs));
const fromX = Array.from(await m.predict(x, n));
const same = Array.from(await m.predict(srcs, n));
const feats = m.info.trunk ? [Array.from(await m.features(srcs)), Array.from(await m.features(x, n))] : null;
const y = Int32Array.from({ length: n }, (_, i) => i % 3);
const opt = { batchSize: 2, epochs: 2, shuffle: false, optimizer: { type: 'sgd', lr: 0.05 } };
const w0 = await m.getWeights();
const a = await m.fit(srcs, y, opt);
const wa = arr(await m.getWeights());
await m.setWeights(w0);
const b = await m.fit(x, y, opt);
return { x: Array.from(x), fromSources, fromX, same, feats, lossA: a.loss, lossB: b.loss, wa, wb: arr(await m.getWeights()) };
"""


@pytest.mark.parametrize("backend", ["webgl2", "cpu"])
def test_predict_fit_features_take_image_sources(web, site, backend):
    """An array of sources in place of x: the same as fromImages' values (predict's batch may be left
    out); predict matches PyTorch on texelfit.images' tensor."""
    from helpers import FWD, run_model

    torch.manual_seed(3)
    module = rgb_net().eval()
    res = compile_onnx(export_simplified(module, RGB_SHAPE), name="m", input_shape=RGB_SHAPE, input_normalize="imagenet",
                       trainable="3.*")
    url = site.add_files("img_sources_x", res.files) + "/m.js"
    got = run_model(web, url, SOURCES_IN_PLACE_OF_X, {"pics": pics_arg(site)}, {"backend": backend})
    assert got["fromSources"] == got["fromX"] == got["same"]
    ref_x = preprocess(images(), RGB_SHAPE, "imagenet")
    assert_close("fromImages", got["x"], ref_x, atol=TOL / 0.225, rtol=0)
    with torch.no_grad():
        ref = module(torch.from_numpy(np.asarray(got["x"], np.float32).reshape(ref_x.shape))).numpy()
    assert_close("predict(sources)", got["fromSources"], ref, **FWD)
    assert got["feats"] is not None and got["feats"][0] == got["feats"][1]
    assert got["lossA"] == got["lossB"] and got["wa"] == got["wb"]


ERRORS = MAKE_SOURCES + """
const codes = {};
const grab = async (name, f) => { try { await f(); codes[name] = 'resolved'; } catch (e) { codes[name] = e.code + '|' + e.message; } };
const bmp = await createImageBitmap(pics[1].data);
bmp.close();
const frame = new VideoFrame((await make('HTMLCanvasElement', pics[1]))[0], { timestamp: 0 });
frame.close();
const foreign = new Image();
foreign.src = args.foreign;
await foreign.decode();
await grab('not decoded', () => m.fromImages([pics[1].data, new Image()]));
await grab('video not ready', () => m.fromImages([document.createElement('video')]));
await grab('zero size', () => m.fromImages([new OffscreenCanvas(0, 3)]));
await grab('closed bitmap', () => m.fromImages([bmp]));
await grab('closed frame', () => m.fromImages([frame]));
await grab('tainted', () => m.fromImages([pics[1].data, foreign]));
await grab('not a source', () => m.fromImages([{ width: 3, height: 3 }]));
await grab('not an array', () => m.fromImages(pics[1].data));
await grab('empty', () => m.fromImages([]));
await grab('batch mismatch', () => m.predict([pics[1].data], 2));
return codes;
"""


@pytest.mark.parametrize("backend", ["webgl2", "cpu"])
def test_from_images_errors_name_the_source(web, site, bundles, backend):
    from helpers import run_model

    foreign = site.url.replace("127.0.0.1", "localhost") + "/img_pics/pic1.png"  # another origin, no CORS
    codes = run_model(web, bundles["rgb_unit"][0], ERRORS, {"pics": pics_arg(site), "foreign": foreign}, {"backend": backend})
    want = {"not decoded": "sources[1] (a HTMLImageElement) (src \"\") is not decoded",
            "video not ready": "sources[0] (a HTMLVideoElement) has no frame to read yet (readyState 0)",
            "zero size": "sources[0] (a OffscreenCanvas) has zero size (0 x 3",
            "closed bitmap": "sources[0] (a ImageBitmap) has zero size (0 x 0",
            "closed frame": "sources[0] (a VideoFrame) has zero size (0 x 0",
            "tainted": "sources[1] (a HTMLImageElement) is tainted (cross-origin without CORS)",
            "not a source": "sources[0] (a Object) is not an image source",
            "not an array": "fromImages needs a non-empty array of image sources, got a ImageData",
            "empty": "fromImages needs a non-empty array of image sources, got a plain Array"}
    for case, text in want.items():
        assert codes[case].startswith("bad-input|texelfit: " + text), (case, codes[case])
    assert codes["batch mismatch"].startswith("bad-batch|texelfit: batch is 2 for 1 image sources"), codes["batch mismatch"]


def test_a_bundle_without_input_normalize_refuses_image_sources(web, site):
    from helpers import run_model

    torch.manual_seed(0)
    res = compile_onnx(export_simplified(rgb_net(), RGB_SHAPE), name="m", input_shape=RGB_SHAPE)
    url = site.add_files("img_plain", res.files) + "/m.js"
    got = run_model(web, url, """
        const c = new OffscreenCanvas(4, 4);
        const out = [];
        for (const f of [() => m.fromImages([c]), () => m.predict([c], 1), () => m.fit([c], new Int32Array([0]))]) {
          try { await f(); out.push('resolved'); } catch (e) { out.push(e.code + '|' + e.message); }
        }
        return [out, m.info.image];
    """)
    assert got[1] is None
    assert got[0][0] == "bad-input|texelfit: this bundle has no image input: build it with --input-normalize"
    for msg in got[0][1:]:  # (an array in place of x: as any array that is not a Float32Array)
        assert msg.startswith("bad-input|texelfit: x must be a Float32Array (or a Float64Array), got a plain Array"), msg


# ---- the weights file ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def weight_builds():
    """The same model built with its weights in m.weights.bin and embedded; and other weights for it."""
    torch.manual_seed(5)
    module = rgb_net().eval()
    onnx_model = export_simplified(module, RGB_SHAPE)
    file = compile_onnx(onnx_model, name="m", input_shape=RGB_SHAPE, weights_file=True)
    again = compile_onnx(export_simplified(module, RGB_SHAPE), name="m", input_shape=RGB_SHAPE, weights_file=True)
    embedded = compile_onnx(onnx_model, name="m", input_shape=RGB_SHAPE)
    torch.manual_seed(6)
    other = rgb_net().eval()
    other_build = compile_onnx(export_simplified(other, RGB_SHAPE), name="m", input_shape=RGB_SHAPE, weights_file=True)
    return module, file, again, embedded, other, other_build


def test_weights_file_is_the_embedded_blob_and_deterministic(weight_builds):
    _, file, again, embedded, _, _ = weight_builds
    blob = file.files["m.weights.bin"]
    assert isinstance(blob, bytes) and blob == again.files["m.weights.bin"] and file.files["m.js"] == again.files["m.js"]
    import re

    b64 = re.search(r'^const WEIGHTS = "([^"]*)";$', embedded.files["m.js"], re.M).group(1)
    assert base64.b64decode(b64) == blob
    assert re.search(r'^const WEIGHTS = "";$', file.files["m.js"], re.M)
    crc = int.from_bytes(blob[-4:], "little")
    assert file.report["weights_file"] == {"name": "m.weights.bin", "bytes": len(blob), "crc32": crc}
    assert f'const WEIGHTS_FILE = {{"name":"m.weights.bin","bytes":{len(blob)},"crc32":{crc}}};' in file.files["m.js"]
    assert embedded.report["weights_file"] is None and "m.weights.bin" not in embedded.files
    assert len(file.files["m.js"]) < len(embedded.files["m.js"]) - len(b64) + 200


def test_weights_file_default_over_4_mib():
    from texelfit.build import WEIGHTS_FILE_BYTES

    assert WEIGHTS_FILE_BYTES == 4 * 1024 * 1024
    big = nn.Sequential(nn.Linear(1100, 1000))  # 4.4 MB of float32
    res = compile_onnx(export_simplified(big, (1100,)), name="big", input_shape=(1100,), max_batch=2)
    assert "big.weights.bin" in res.files and len(res.files["big.weights.bin"]) > WEIGHTS_FILE_BYTES
    small = compile_onnx(export_simplified(big, (1100,)), name="big", input_shape=(1100,), max_batch=2, quantize="int8")
    assert "big.weights.bin" not in small.files  # int8: 1.1 MB, embedded
    forced = compile_onnx(export_simplified(big, (1100,)), name="big", input_shape=(1100,), max_batch=2, weights_file=False)
    assert "big.weights.bin" not in forced.files


PREDICT = """
const x = new Float32Array(args.x);
const out = Array.from(await m.predict(x, args.n));
return out;
"""

CREATE = """async ([url, options]) => {
    const mod = await import(url);
    const opts = {};
    for (const [k, v] of Object.entries(options)) {
      opts[k] = k === 'weights' && v.startsWith('buffer:') ? await (await fetch(v.slice(7))).arrayBuffer()
        : k === 'weights' ? new URL(v, location.href) : v;
    }
    try {
      const m = await mod.createModel(opts);
      const x = new Float32Array(%d).map((_, i) => Math.sin(i * 0.1));
      const out = Array.from(await m.predict(x, 2));
      m.dispose();
      return { out };
    } catch (e) {
      return { error: e.code + '|' + e.message };
    }
}"""


def _create(page, url, options=None):
    return page.evaluate(CREATE % (2 * int(np.prod(RGB_SHAPE))), [url, options or {}])


def _torch_out(module):
    x = torch.sin(torch.arange(2 * int(np.prod(RGB_SHAPE)), dtype=torch.float32) * 0.1).reshape((2,) + RGB_SHAPE)
    with torch.no_grad():
        return module(x).numpy()


def test_weights_file_fetched_once_and_weights_from_elsewhere(page, site, weight_builds):
    """m.js fetches m.weights.bin beside it, its only request; createModel({ weights }) takes an ArrayBuffer or a URL."""
    from helpers import FWD

    module, file, _, embedded, other, other_build = weight_builds
    base = site.add_files("wfile", file.files)
    site.add_files("wfile_other", {"other.bin": other_build.files["m.weights.bin"]})
    emb = site.add_files("wfile_embedded", embedded.files)
    errors, requests = [], []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{site.url}/index.html")
    page.on("request", lambda r: requests.append(r.url))
    got = _create(page, base + "/m.js")
    assert "out" in got, got
    assert requests == [base + "/m.js", base + "/m.weights.bin"], requests
    assert_close("predict, weights from the file", got["out"], _torch_out(module), **FWD)
    other_url = f"{site.url}/wfile_other/other.bin"
    for where, opts in [("file bundle, URL", {"weights": other_url}), ("file bundle, ArrayBuffer", {"weights": "buffer:" + other_url}),
                        ("embedded bundle, URL", {"weights": other_url})]:
        requests.clear()
        got = _create(page, (emb if where.startswith("embedded") else base) + "/m.js", opts)
        assert "out" in got, (where, got)
        assert_close(f"predict, {where}", got["out"], _torch_out(other), **FWD)
        assert f"{base}/m.weights.bin" not in requests, where
    got = _create(page, emb + "/m.js")
    assert_close("predict, embedded", got["out"], _torch_out(module), **FWD)
    bad = page.evaluate("""async (url) => {
        const mod = await import(url);
        try { await mod.createModel({ weights: 'm.weights.bin' }); return 'resolved'; } catch (e) { return e.code + '|' + e.message; }
    }""", base + "/m.js")
    assert bad.startswith("bad-option|texelfit: createModel options.weights must be an ArrayBuffer or a URL"), bad
    assert not errors, errors


def test_weights_file_missing_or_corrupt(page, site, weight_builds):
    _, file, _, _, _, other_build = weight_builds
    blob = file.files["m.weights.bin"]
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x10
    site.add_files("wmissing", {"m.js": file.files["m.js"]})
    site.add_files("wcorrupt", {"m.js": file.files["m.js"], "m.weights.bin": bytes(flipped)})
    site.add_files("wforeign", {"m.js": file.files["m.js"], "m.weights.bin": other_build.files["m.weights.bin"]})
    site.add_files("wshort", {"m.js": file.files["m.js"], "m.weights.bin": blob[:-9]})
    errors = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{site.url}/index.html")
    missing = _create(page, f"{site.url}/wmissing/m.js")["error"]
    assert missing.startswith(f"weights-unavailable|texelfit: the weights could not be loaded from {site.url}/wmissing/m.weights.bin "
                              "(HTTP 404"), missing
    assert [e for e in errors if "404" not in e] == []  # (Chromium logs the failed load itself)
    corrupt = _create(page, f"{site.url}/wcorrupt/m.js")["error"]
    assert corrupt.startswith(f"corrupt-weights|texelfit: the weights in {site.url}/wcorrupt/m.weights.bin are corrupted"), corrupt
    for folder in ("wforeign", "wshort"):
        msg = _create(page, f"{site.url}/{folder}/m.js")["error"]
        assert msg.startswith(f"corrupt-weights|texelfit: the weights in {site.url}/{folder}/m.weights.bin are corrupted"), msg
        assert f"; built: {len(blob)} bytes, CRC-32 {int.from_bytes(blob[-4:], 'little'):x}" in msg, msg
    gone = _create(page, f"{site.url}/wmissing/m.js", {"weights": f"{site.url}/nowhere.bin"})["error"]
    assert gone.startswith(f"weights-unavailable|texelfit: the weights could not be loaded from {site.url}/nowhere.bin"), gone
    bad_buffer = page.evaluate("""async (url) => {
        const mod = await import(url);
        try { await mod.createModel({ weights: new ArrayBuffer(40) }); return 'resolved'; } catch (e) { return e.code + '|' + e.message; }
    }""", f"{site.url}/wmissing/m.js")
    assert bad_buffer.startswith("corrupt-weights|texelfit: the weights in the ArrayBuffer given are corrupted"), bad_buffer
