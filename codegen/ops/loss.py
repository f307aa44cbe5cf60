"""Losses, mean reduction as in PyTorch. Each has a gradient pass (d loss / d output,
written into the output's gradient texture) and a value pass (the batch's mean loss,
written into one texel of the loss ring, read back asynchronously every few steps).

cross_entropy   torch.nn.functional.cross_entropy(logits, labels)
mse             torch.nn.functional.mse_loss(output, targets)
"""
from __future__ import annotations

from ..kernels import Kernel, Pass, glsl_float
from .common import lanes

LOSSES = ("cross_entropy", "mse")


def loss_passes(loss, out_spec, plan):
    out = out_spec.name
    grad = "grad:" + out.split(":", 1)[1]
    c = dict(lanes(out_spec.cols), cols_float=glsl_float(out_spec.cols))
    if loss == "cross_entropy":
        inputs, textures = ("Z", "LABELS"), [out, "labels"]
    else:
        inputs, textures = ("Y", "T"), [out, "targets"]
    g = Kernel(f"{loss}_grad", f"{loss}_grad.glsl.j2", inputs, uniforms=("u_batch",), consts=c)
    v = Kernel(f"{loss}_value", f"{loss}_value.glsl.j2", inputs, uniforms=("u_batch",), consts=c)
    return [Pass(g, textures, [grad], "batch", loss), Pass(v, textures, ["loss"], "ring", loss)]
