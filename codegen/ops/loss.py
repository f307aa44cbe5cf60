"""Losses, mean reduction as in PyTorch. Each has a gradient pass (d loss / d output,
written into the output's gradient texture) and a value pass (the batch's mean loss,
written into one texel of the loss ring, read back asynchronously every few steps).
With many classes (layout.ce_stats) cross_entropy computes the softmax's max and sum of
each sample once before them (cross_entropy_stats, into the texture layout.CE_STATS), and
both read those.

cross_entropy   torch.nn.functional.cross_entropy(logits, labels)   (outputs of shape (classes,))
mse             torch.nn.functional.mse_loss(output, targets)
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.layout import CE_STATS, ce_stats
from ..kernels import Kernel, Pass, glsl_float
from .common import lanes

LOSSES = ("cross_entropy", "mse")


def loss_passes(loss, out_spec, grad_texture):
    features = int(np.prod(out_spec.shape[1:]))
    c = dict(lanes(out_spec.packing.chans), features=features, features_float=glsl_float(features),
             sample_rows=out_spec.sample_rows, width=out_spec.width)
    first = []
    if loss == "cross_entropy":
        inputs, textures = ("Z", "LABELS"), [out_spec.name, "labels"]
        if ce_stats(features):  # the softmax's max and sum, once a sample, for both passes below
            c["stats"] = True
            stats = Kernel("cross_entropy_stats", "cross_entropy_stats.glsl.j2", ("Z",), consts=c)
            first = [Pass(stats, [out_spec.name], [CE_STATS], "batch", loss)]
            inputs, textures = inputs + ("S",), textures + [CE_STATS]
    else:
        inputs, textures = ("Y", "T"), [out_spec.name, "targets"]
    g = Kernel(f"{loss}_grad", f"{loss}_grad.glsl.j2", inputs, uniforms=("u_batch", "u_loss_scale"), consts=c)
    v = Kernel(f"{loss}_value", f"{loss}_value.glsl.j2", inputs, uniforms=("u_batch",), consts=c)
    return first + [Pass(g, textures, [grad_texture], "batch", loss), Pass(v, textures, ["loss"], "ring", loss)]
