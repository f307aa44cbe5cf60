"""Resampling along H and W: every output element a weighted sum of a few input elements of its channel.

    Y[n, c, y, x] = sum over (i, a) in rows[y], (j, b) in cols[x] of a * b * X[n, c, i, j]

One op, `resample`, covers what moves data within the image plane by a rule per axis: `Resize` and
`Upsample` (nearest, with every nearest_mode; linear, that is bilinear; every coordinate_transformation_mode
PyTorch exports, integer and fractional scales) and `Pad` in the edge and reflect modes. Its backward is
the same sum with the taps transposed (`transpose`): an input element gets the gradients of the outputs
that read it, so nearest upsampling sums the gradient of each copy and bilinear scatters by the weights.
The taps are computed here, in float64, once, and baked into the kernels (codegen/ops/resample.py).
"""
from __future__ import annotations

import math

from .errors import BuildError

Taps = tuple[tuple[tuple[int, float], ...], ...]  # per output index: (input index, weight) pairs


def _source_coord(x: int, scale: float, n_in: int, n_out: int, mode: str) -> float:
    """ONNX Resize: the input coordinate of output coordinate x."""
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else 0.0
    if mode == "align_corners":
        return 0.0 if n_out == 1 else x * (n_in - 1) / (n_out - 1)
    if mode == "asymmetric":  # in float32, as PyTorch's nearest computes it (a floor can tell the difference)
        import numpy as np

        return float(np.float32(x) * np.float32(1.0 / scale))
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    raise BuildError(f"coordinate_transformation_mode {mode!r} is not supported (half_pixel, pytorch_half_pixel, "
                     "align_corners, asymmetric, tf_half_pixel_for_nn are)")


_NEAREST = {
    "round_prefer_floor": lambda v: math.ceil(v - 0.5),
    "round_prefer_ceil": lambda v: math.floor(v + 0.5),
    "floor": math.floor,
    "ceil": math.ceil,
}


def resize_taps(n_in: int, n_out: int, scale: float, mode: str, coord: str, nearest: str) -> Taps:
    """The taps of one axis of ONNX Resize (mode nearest or linear, without antialiasing)."""
    taps = []
    for x in range(n_out):
        v = _source_coord(x, scale, n_in, n_out, coord)
        if mode == "nearest":
            if nearest not in _NEAREST:
                raise BuildError(f"nearest_mode {nearest!r} is not supported ({', '.join(_NEAREST)} are)")
            taps.append(((min(max(_NEAREST[nearest](v), 0), n_in - 1), 1.0),))
            continue
        v = min(max(v, 0.0), n_in - 1)  # linear: the coordinate clamped to the input, as PyTorch and ONNX do
        i0 = min(int(math.floor(v)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        t = v - i0
        taps.append(((i0, 1.0 - t),) if i1 == i0 or t == 0 else ((i0, 1.0 - t), (i1, t)))
    return tuple(taps)


def pad_taps(n_in: int, before: int, after: int, mode: str) -> Taps:
    """The taps of one axis of Pad in mode edge or reflect (a negative pad crops)."""
    taps = []
    for o in range(n_in + before + after):
        i = o - before
        if mode == "edge":
            i = min(max(i, 0), n_in - 1)
        else:  # reflect: about the edge element, which is not repeated (PyTorch's reflect)
            if n_in == 1:
                i = 0
            while i < 0 or i >= n_in:
                i = -i if i < 0 else 2 * (n_in - 1) - i
        taps.append(((i, 1.0),))
    return tuple(taps)


def transpose(taps: Taps, n_in: int) -> Taps:
    """The taps of the backward: per input index, the outputs that read it and their weights."""
    out: list[list[tuple[int, float]]] = [[] for _ in range(n_in)]
    for o, ts in enumerate(taps):
        for i, w in ts:
            out[i].append((o, w))
    return tuple(tuple(t) for t in out)


def width(taps: Taps) -> int:
    """The most taps of one index (the kernels loop this far, padding with weight 0)."""
    return max(1, max(len(t) for t in taps))


def matrix(taps: Taps, n_in: int):
    """The axis's [out, in] matrix (the PyTorch reference, prep/torch_ir.py)."""
    import numpy as np

    m = np.zeros((len(taps), n_in), dtype=np.float64)
    for o, ts in enumerate(taps):
        for i, w in ts:
            m[o, i] += w
    return m


def _text(a: dict, key: str, default: str) -> str:
    v = a.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def pad_mode(a: dict) -> str:
    return _text(a, "mode", "constant")


def from_onnx(where: str, op: str, a: dict, vals: list, shape: tuple[int, ...]):
    """(kind, rows, cols, output shape) of a Resize, Upsample or Pad (edge, reflect) node on a (C, H, W)
    activation; `vals` are its inputs after the first (constants, or None)."""
    if len(shape) != 3:
        raise BuildError(f"{where}: {op} needs a (C, H, W) input here, got the per-sample shape {shape}")
    c, h, w = shape
    if op == "Pad":
        mode = pad_mode(a)
        pads = vals[0] if vals and vals[0] is not None else a.get("pads")
        axes = vals[2] if len(vals) > 2 and vals[2] is not None else None
        if pads is None or any(isinstance(v, str) for v in pads):
            raise BuildError(f"{where}: Pad needs constant pads")
        pads = [int(v) for v in pads]
        axes = [int(v) % 4 for v in axes] if axes is not None else list(range(len(pads) // 2))
        by_axis = {ax: (pads[i], pads[i + len(axes)]) for i, ax in enumerate(axes)}
        if any(by_axis.get(ax, (0, 0)) != (0, 0) for ax in (0, 1)):
            raise BuildError(f"{where}: Pad in mode {mode!r} pads only H and W here (pads {pads})")
        (t, b), (l, r) = by_axis.get(2, (0, 0)), by_axis.get(3, (0, 0))
        if mode == "reflect" and max(t, b) >= h or mode == "reflect" and max(l, r) >= w:
            raise BuildError(f"{where}: reflect padding ({pads}) must be smaller than the input {h}x{w}")
        rows, cols = pad_taps(h, t, b, mode), pad_taps(w, l, r, mode)
        return f"pad {mode}", rows, cols, (c, len(rows), len(cols))
    mode = _text(a, "mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise BuildError(f"{where}: {op} mode {mode!r} is not supported (nearest and linear are)")
    if a.get("antialias", 0):
        raise BuildError(f"{where}: {op} with antialias=1 is not supported")
    if a.get("axes") is not None and sorted(int(v) % 4 for v in a["axes"]) != [2, 3]:
        raise BuildError(f"{where}: {op} over axes {list(a['axes'])}: only H and W are resized here")
    coord = _text(a, "coordinate_transformation_mode", "half_pixel" if op == "Resize" else "asymmetric")
    nearest = _text(a, "nearest_mode", "round_prefer_floor" if op == "Resize" else "floor")
    if op == "Upsample":  # opset 7-9: scales as an attribute or the second input; asymmetric, floor
        scales, sizes = (vals[0] if vals and vals[0] is not None else a.get("scales")), None
    else:  # opset 10: X, scales; 11+: X, roi, scales, sizes
        scales = vals[0] if len(vals) == 1 else (vals[1] if len(vals) > 1 else None)
        sizes = vals[2] if len(vals) > 2 else None
    scales = None if scales is None or len(scales) == 0 else [float(v) for v in scales]
    if scales is not None:
        if len(scales) == 2:
            scales = [1.0, 1.0] + scales
        if len(scales) != 4 or scales[0] != 1 or scales[1] != 1:
            raise BuildError(f"{where}: {op} scales {scales}: only H and W are resized here")
        out = (int(math.floor(h * scales[2])), int(math.floor(w * scales[3])))
        scale = (scales[2], scales[3])
    elif sizes is not None:
        sizes = list(sizes)[-2:]
        if any(isinstance(v, str) for v in sizes):
            raise BuildError(f"{where}: {op} needs constant output sizes")
        out = (int(sizes[0]), int(sizes[1]))
        scale = (out[0] / h, out[1] / w)
    else:
        raise BuildError(f"{where}: {op} needs constant scales or sizes")
    if min(out) < 1:
        raise BuildError(f"{where}: {op} output would be {out[0]}x{out[1]}")
    rows = resize_taps(h, out[0], scale[0], mode, coord, nearest)
    cols = resize_taps(w, out[1], scale[1], mode, coord, nearest)
    return f"resize {'bilinear' if mode == 'linear' else 'nearest'}", rows, cols, (c,) + out
