"""Op families: each module declares the forward and backward passes of its ops.

    dense.py        dense (+ fused activation)
    conv.py         conv (+ fused activation)
    conv_transpose.py   conv_transpose (+ fused activation), on the conv kernels
    matmul.py       matmul (token-wise, and of two activations) on tokens (R, F)
    layernorm.py    layernorm over the features of tokens, with its statistics a row
    embedding.py    embedding: rows of a table by integer ids, and its scatter-add gradient
    elementwise.py  every elementwise op (prep/elementwise.py) not fused into a dense or conv layer
    softmax.py      softmax, log_softmax over the channel axis
    reduce.py       mean, sum, max over any per-sample axes
    pool.py         maxpool, avgpool, global_avgpool
    merge.py        concat, and the sum of a tensor's gradient contributions
    dropout.py      dropout (applied in fit's training steps only)
    reshape.py      flatten of (C, H, W) data
    resample.py     resize, upsample (nearest, bilinear) and pad (edge, reflect): taps per row and column
    gather.py       every other shape op (reshape, transpose, slice, split, concat on any axis, squeeze)
    loss.py         cross_entropy, mse: gradient pass and loss-value pass
    optim.py        sgd, adam (AdamW is adam with decoupled weight decay)
"""
from __future__ import annotations

import importlib

from texelfit.prep.ops import REGISTRY

from . import merge
from .loss import LOSSES, loss_passes
from .optim import OPTIMIZERS, optimizer_pass

# IR op -> the module above declaring its passes: each op's `kernels` (prep/ops/); none for an op folded away
# before codegen (batchnorm)
FAMILIES = {op: importlib.import_module(f"{__name__}.{d.kernels}") for op, d in REGISTRY.items() if d.kernels}


def forward(layer, graph, plan):
    return FAMILIES[layer.op].forward(layer, graph, plan)


def backward(layer, graph, plan):
    return FAMILIES[layer.op].backward(layer, graph, plan)


grad_sum = merge.grad_sum
param_grad_sum = merge.param_grad_sum

__all__ = ["forward", "backward", "grad_sum", "param_grad_sum", "loss_passes", "optimizer_pass", "LOSSES", "OPTIMIZERS", "FAMILIES"]
