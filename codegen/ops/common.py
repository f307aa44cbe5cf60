"""Constants shared by the kernel templates of several op families."""
from __future__ import annotations

from texelfit.prep.layout import ceil_div

from ..kernels import glsl_float


def lanes(cols: int) -> dict:
    """Constants of kernels/lanes.glsl.j2: which lanes of the last texel hold real features."""
    rem = cols % 4 or 4
    return {"cols": cols, "cols4": ceil_div(cols, 4),
            "last_mask": ", ".join("1.0" if i < rem else "0.0" for i in range(4))}


def activation(layer) -> dict:
    """Constants of kernels/activation.glsl.j2 for a layer's (fused or own) activation."""
    act = layer.attrs.get("act", layer.op if layer.op != "dense" else "none")
    return {"act": act, "alpha": glsl_float(layer.attrs.get("alpha", 0.0))}
