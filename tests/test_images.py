"""Image inputs (issue 17): texelfit.images against torch's antialiased interpolate, the browser's
fromImages against texelfit.images for every source type on 1- and 3-channel models (WebGL2, its
RGBA8 fallback and the CPU backend), image arrays in predict/fit/features, the errors, and the
weights file beside the bundle (NAME.weights.bin)."""
from __future__ import annotations

import base64
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
         "gray_unit": (gray_net, GRAY_SHAPE, "unit"), "gray_custom": (gray_net, GRAY_SHAPE, "0.45:0.25")}


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
      return [v, Array.from(dc.getImageData(0, 0, p.w, p.h).data)];
    }
  }
}
"""

FROM_IMAGES = MAKE_SOURCES + """
const out = {};
for (const kind of args.kinds) {
  const made = await Promise.all(pics.map((p) => make(kind, p)));
  const x = await m.fromImages(made.map((s) => s[0]));
  out[kind] = { x: Array.from(x), frames: made.map((s) => s[1] ?? null) };
  for (const [s] of made) if (s.close) s.close();
}
return { out, info: m.info };
"""


def pics_arg(site):
    return [[a.shape[1], a.shape[0], rgba_b64(a), f"{site.url}/img_pics/pic{i}.png"] for i, a in enumerate(images())]


def check_from_images(web, site, bundles, case, kinds, options=None):
    from helpers import run_model

    url, _, norm, shape = bundles[case]
    got = run_model(web, url, FROM_IMAGES, {"pics": pics_arg(site), "kinds": kinds}, options)
    std = min(norm["std"])
    pics = images()
    errors = {}
    for kind in kinds:
        r = got["out"][kind]
        frames = [pics[i] if f is None else np.asarray(f, np.uint8).reshape(pics[i].shape[:2] + (4,))[:, :, :3]
                  for i, f in enumerate(r["frames"])]
        ref = preprocess(frames, shape, norm)
        x = np.asarray(r["x"], np.float32).reshape(ref.shape)
        errors[kind] = float(np.abs(x - ref).max() * std)
        assert_close(f"{case} fromImages({kind})", x, ref, atol=TOL / std, rtol=0)
    if os.environ.get("TEXELFIT_PRINT_ERRORS"):
        print(f"[parity] {case} {got['info']['backend']}/{got['info']['precision']} max error x 255 before normalising:",
              {k: round(v * 255, 3) for k, v in errors.items()})
    return got


@pytest.mark.parametrize("case", sorted(MODES))
def test_from_images_matches_texelfit_images_every_source_type(web, site, bundles, case):
    """WebGL2 (float32 targets): every source type, for each normalisation, 1 and 3 channels."""
    got = check_from_images(web, site, bundles, case, KINDS)
    assert got["info"]["backend"] == "webgl2"


@pytest.mark.parametrize("case,options", [("rgb_imagenet", {"backend": "cpu"}), ("gray_custom", {"backend": "cpu"}),
                                          ("rgb_unit", {"precision": "rgba8"}), ("gray_unit", {"precision": "rgba8"})],
                         ids=["cpu-rgb", "cpu-gray", "rgba8-rgb", "rgba8-gray"])
def test_from_images_on_the_cpu_backend_and_the_rgba8_path(web, site, bundles, case, options):
    check_from_images(web, site, bundles, case, [k for k in KINDS if k != "HTMLVideoElement"], options)
