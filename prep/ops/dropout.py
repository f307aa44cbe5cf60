"""dropout (attrs: ratio): applied in fit's training steps only (prep/dropout.py); the inference form is the
identity. Its kernels: codegen/ops/dropout.py."""
from __future__ import annotations

from .registry import no_params, passes_channels, per_output, register, same_attrs, saves_nothing


def forward(m, layer, ins):
    """The inference form (a training step's mask: prep/dropout.py)."""
    return ins[0]


register("dropout", flops=per_output, torch=forward, prune=passes_channels, cut=same_attrs, weight_layout=no_params,
         saves=saves_nothing, kernels="dropout")
