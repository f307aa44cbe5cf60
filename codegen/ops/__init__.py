"""Op families: each module declares the forward and backward passes of its ops.

    dense.py        dense (+ fused activation)
    activation.py   relu, leaky_relu, sigmoid, tanh on their own
    loss.py         cross_entropy, mse: gradient pass and loss-value pass
    optim.py        sgd, adam (AdamW is adam with decoupled weight decay)

`flatten` of dense data needs no pass: the layout plan aliases its texture.
"""
from __future__ import annotations

from texelfit.prep.ir import ACTIVATIONS

from . import activation, dense
from .loss import LOSSES, loss_passes
from .optim import OPTIMIZERS, optimizer_pass

_FAMILIES = {"dense": dense, **{a: activation for a in ACTIVATIONS}}


def forward(layer, graph, plan):
    if layer.op == "flatten":
        return []
    return _FAMILIES[layer.op].forward(layer, graph, plan)


def backward(layer, graph, plan):
    if layer.op == "flatten":
        return []
    return _FAMILIES[layer.op].backward(layer, graph, plan)


__all__ = ["forward", "backward", "loss_passes", "optimizer_pass", "LOSSES", "OPTIMIZERS"]
