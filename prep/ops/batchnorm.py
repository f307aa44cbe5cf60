"""batchnorm in inference form: prep.fold folds it into the layer before it or turns it into a batchnorm_affine
(an elementwise op), so no kernel runs it; its statistics are attrs, not parameters."""
from __future__ import annotations

import numpy as np

from .registry import no_params, out_size, passes_channels, register, saves_nothing


def flops(layer, graph) -> int:
    return 2 * out_size(layer, graph)


def forward(m, layer, ins):
    import torch
    import torch.nn.functional as F

    a = layer.attrs
    c = lambda v: torch.tensor(np.asarray(v, dtype=np.float32))  # noqa: E731
    return F.batch_norm(ins[0], c(a["mean"]), c(a["var"]), c(a["scale"]), c(a["bias"]), False, 0.0, a["eps"])


def cut(layer, graph, plan, cut_param) -> dict:
    """Its statistics of the channels kept."""
    k = plan.kept(layer.inputs[0])
    return dict(layer.attrs, **{s: np.asarray(layer.attrs[s])[k] for s in ("scale", "bias", "mean", "var")})


register("batchnorm", flops=flops, torch=forward, prune=passes_channels, cut=cut, weight_layout=no_params,
         saves=saves_nothing, kernels=None)
