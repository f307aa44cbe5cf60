"""Image inputs: the preprocessing of `m.fromImages(sources)` in Python, for tests and for
`texelfit import-weights` users who feed the trained model from PyTorch.

    preprocess(images, shape, normalize) -> float32 array [N, C, H, W]

Each image (a PIL image, or a uint8 array H x W x 3 / x 4 / H x W) goes through, in this order:

1. values: RGB bytes / 255 (an alpha channel is ignored; a gray image is its own R, G and B);
2. crop to the input's aspect ratio W:H, centred, on whole pixels (`crop_box`):
       the image (w x h) wider than W:H:   cw = round(h * W / H), ch = h, x0 = (w - cw) // 2, y0 = 0
       taller:                             cw = w, ch = round(w * H / W), x0 = 0, y0 = (h - ch) // 2
   (round half up, in integers; a crop never goes below one pixel);
3. resize the crop to H x W: bilinear with antialiasing when shrinking, separable, rows then
   columns (`resample_weights`), exactly the filter of `torch.nn.functional.interpolate(mode=
   'bilinear', antialias=True, align_corners=False)` -- torchvision's `resize(..., antialias=True)`
   on tensors -- and of PIL's BILINEAR resize. Since the crop already has the output's aspect
   ratio, this is torchvision's resize(H, W) then center_crop, with nothing left to cut;
4. a 1-channel input takes the luminance 0.299 R + 0.587 G + 0.114 B (ITU-R 601, PIL's "L");
5. normalise: (value - mean) / std per channel (`normalization`).

The browser (runtime_template/runtime/images.js, its GLSL and its JS twin) implements the same
steps with the same integer crop and the same weights.
"""
from __future__ import annotations

import math

import numpy as np

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LUMA = (0.299, 0.587, 0.114)
MODES = ("imagenet", "unit", "none")


class ImageError(ValueError):
    """A bad image or normalisation (prep.load.BuildError subclasses ValueError too)."""


def normalization(mode: str, channels: int) -> dict:
    """`--input-normalize MODE` for an input of `channels` channels, as the bundle records it:
    {"mode", "mean", "std"} with one mean and std per channel, on values in [0, 1].

    imagenet: the ImageNet mean and std (3 channels only); unit and none: mean 0, std 1 (`none`
    records that the build was given no normalisation); "M1,M2,M3:S1,S2,S3" (or "M:S" for one
    channel): those values."""
    if not isinstance(mode, str) or not mode.strip():
        raise ImageError("--input-normalize must be imagenet, unit, none or MEAN1,MEAN2,MEAN3:STD1,STD2,STD3")
    mode = mode.strip()
    if mode in ("unit", "none"):
        return {"mode": mode, "mean": [0.0] * channels, "std": [1.0] * channels}
    if mode == "imagenet":
        if channels != 3:
            raise ImageError(f"--input-normalize imagenet is for a 3-channel (RGB) input; this input has {channels} "
                             "channel(s): give MEAN:STD for it")
        return {"mode": mode, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
    parts = mode.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        mean = [float(v) for v in parts[0].split(",")]
        std = [float(v) for v in parts[1].split(",")]
    except ValueError:
        raise ImageError(f"--input-normalize {mode!r} is not imagenet, unit, none or MEAN1,MEAN2,MEAN3:STD1,STD2,STD3 "
                         "(numbers, on values in [0, 1])") from None
    if len(mean) != channels or len(std) != channels:
        raise ImageError(f"--input-normalize {mode!r} gives {len(mean)} mean(s) and {len(std)} std(s); the input has "
                         f"{channels} channel(s): give {channels} of each")
    if not all(math.isfinite(v) for v in mean) or not all(math.isfinite(v) and v > 0 for v in std):
        raise ImageError(f"--input-normalize {mode!r}: means must be finite and stds finite and > 0")
    return {"mode": "custom", "mean": mean, "std": std}


def check_image_shape(shape) -> tuple[int, int, int]:
    """(C, H, W) of an image input: 1 or 3 channels."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise ImageError(f"an image input is (C, H, W) with 1 or 3 channels; this input is {list(shape)}")
    return shape


def crop_box(w: int, h: int, out_w: int, out_h: int) -> tuple[int, int, int, int]:
    """(x0, y0, cw, ch): the centred crop of a w x h image to the aspect ratio out_w:out_h."""
    if w * out_h > h * out_w:  # wider than the output
        cw = max(1, min(w, (2 * h * out_w + out_h) // (2 * out_h)))
        return (w - cw) // 2, 0, cw, h
    ch = max(1, min(h, (2 * w * out_h + out_w) // (2 * out_w)))
    return 0, (h - ch) // 2, w, ch


def resample_weights(size_in: int, size_out: int) -> np.ndarray:
    """[size_out, size_in] float64 matrix of the antialiased bilinear (triangle) filter:
    torch's _upsample_bilinear2d_aa / PIL's ImagingResample. scale = in / out; the triangle's
    support is max(scale, 1); output i is centred at (i + 0.5) * scale."""
    scale = size_in / size_out
    support = max(scale, 1.0)
    m = np.zeros((size_out, size_in))
    for i in range(size_out):
        center = (i + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), size_in)
        j = np.arange(lo, hi)
        wts = np.maximum(0.0, 1.0 - np.abs((j - center + 0.5) / support))
        m[i, lo:hi] = wts / wts.sum()
    return m


def to_rgb(image) -> np.ndarray:
    """float64 H x W x 3 in [0, 1] of a PIL image or a uint8 array (H x W, H x W x 3 or x 4)."""
    if hasattr(image, "convert") and hasattr(image, "size"):  # PIL
        image = np.asarray(image.convert("RGB"))
    a = np.asarray(image)
    if a.dtype != np.uint8:
        raise ImageError(f"an image must be a PIL image or a uint8 array, got an array of {a.dtype}")
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ImageError(f"a uint8 image must be H x W, H x W x 3 or H x W x 4; got {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ImageError(f"the image has zero size ({a.shape[1]} x {a.shape[0]})")
    return a[:, :, :3].astype(np.float64) / 255.0


def resize_unnormalized(image, shape) -> np.ndarray:
    """[C, H, W] float64 in [0, 1]: steps 1 to 4 (no normalisation)."""
    c, oh, ow = check_image_shape(shape)
    rgb = to_rgb(image)
    h, w = rgb.shape[:2]
    x0, y0, cw, ch = crop_box(w, h, ow, oh)
    crop = rgb[y0:y0 + ch, x0:x0 + cw]
    rows = np.einsum("xj,hjc->hxc", resample_weights(cw, ow), crop)  # along each row first
    out = np.einsum("yi,ixc->cyx", resample_weights(ch, oh), rows)
    if c == 1:
        out = np.tensordot(np.asarray(LUMA), out, axes=1)[None]
    return out


def preprocess(images, shape, normalize: str | dict = "none") -> np.ndarray:
    """The model's input for a list of images: float32 [N, C, H, W], as `m.fromImages` returns it
    (flattened there). `shape` is the per-sample input shape (C, H, W); `normalize` a mode as given to
    `--input-normalize`, or the bundle's record of it (report.json's "input_normalize")."""
    c, _, _ = check_image_shape(shape)
    if isinstance(images, np.ndarray) and images.ndim == 3 and images.dtype == np.uint8 and images.shape[-1] in (3, 4):
        images = [images]  # one H x W x 3 image, not three gray ones
    norm = normalization(normalize, c) if isinstance(normalize, str) else normalize
    mean = np.asarray(norm["mean"], dtype=np.float64).reshape(c, 1, 1)
    std = np.asarray(norm["std"], dtype=np.float64).reshape(c, 1, 1)
    out = [(resize_unnormalized(im, shape) - mean) / std for im in images]
    if not out:
        raise ImageError("no images given")
    return np.stack(out).astype(np.float32)
