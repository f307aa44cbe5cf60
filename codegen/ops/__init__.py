"""Op families: each module declares the forward and backward passes of its ops.

    dense.py        dense (+ fused activation)
    conv.py         conv (+ fused activation)
    activation.py   relu, leaky_relu, sigmoid, tanh on their own
    pool.py         maxpool, avgpool, global_avgpool
    merge.py        add, concat, and the sum of a tensor's gradient contributions
    reshape.py      flatten of (C, H, W) data
    gather.py       every other shape op (reshape, transpose, slice, split, concat on any axis, squeeze)
    loss.py         cross_entropy, mse: gradient pass and loss-value pass
    optim.py        sgd, adam (AdamW is adam with decoupled weight decay)
"""
from __future__ import annotations

from texelfit.prep.ir import ACTIVATIONS, POOLS

from . import activation, conv, dense, gather, merge, pool, reshape
from .loss import LOSSES, loss_passes
from .optim import OPTIMIZERS, optimizer_pass

FAMILIES = {"dense": dense, "conv": conv, "add": merge, "concat": merge, "flatten": reshape, "gather": gather,
            **{a: activation for a in ACTIVATIONS}, **{p: pool for p in POOLS}}


def forward(layer, graph, plan):
    return FAMILIES[layer.op].forward(layer, graph, plan)


def backward(layer, graph, plan):
    return FAMILIES[layer.op].backward(layer, graph, plan)


grad_sum = merge.grad_sum

__all__ = ["forward", "backward", "grad_sum", "loss_passes", "optimizer_pass", "LOSSES", "OPTIMIZERS", "FAMILIES"]
