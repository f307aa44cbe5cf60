"""dense: Y = act(X @ W.T + b). W is laid out [ceil4(O) rows, ceil(I/4) texels] (layout.py).

forward        dense_forward      X, W, B        -> Y        rows: batch
  or, split-K  dense_forward      X, W           -> split:Y  rows: batch   (S rows a sample: blocking.split_k)
               dense_reduce       split:Y, B     -> Y        rows: batch
backward       activation_grad    DY, Y          -> DZ       rows: batch   (only with a fused activation:
                                                                        DZ = DY * act'(Y); without, DZ is DY)
               dense_grad_weight  DZ, X          -> dW       rows: full
               dense_grad_bias    DZ             -> db       rows: full
               dense_grad_input   DZ, W          -> dX       rows: batch   (when X needs a gradient)
A sample-blocked layer (webgl2/blocking.py: sample_blocked) also has blocked twins of forward and
grad_input, dense_* blocked (8 samples a fragment, rows: blocks, into blk0..7:T) + interleave
(-> T), and of its weight gradient (samples_last DZ -> DZT, dZ with the samples as channels, then
dense_grad_weight blocked DZT, X, 8 rows a fragment, + interleave -> dW); they run from 8 samples
on (Pass.blocked). In a training step the pass writing dW or db is left out: the optimizer pass
includes its kernel (ops/optim.py).
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div

from .. import kl
from ..kernels import Kernel
from ..kl import COL, load, splat, uniform
from .common import activation, lanes, weighted_passes


def _consts(layer, graph):
    i, o = graph.shapes[layer.inputs[0]][0], graph.shapes[layer.outputs[0]][0]
    return dict(activation(layer), **lanes(o), in_features=i, out_features=o, in4=ceil_div(i, 4),
                out4=ceil_div(o, 4), has_bias="bias" in layer.params)


def _title(c, what):
    act = "" if c["act"] == "none" else f" {c['act']}"
    return f"{what} {c['in_features']}->{c['out_features']}{act}"


# dense_grad_weight and dense_grad_bias read their sizes from the textures: one program for all layers
_GENERIC = ("grad_weight",)


def _grad_bias_kl() -> kl.KernelDef:
    """db[o] = sum_n dZ[n, o], in the kernel language: texel o4 of db sums column o4 of dZ's batch rows."""
    k = kl.KernelDef()
    acc = k.let("acc", splat(0.0))
    with k.loop("n", uniform("u_batch", "int")) as n:
        k.set(acc, acc + load("DZ", n, COL))
    k.out(acc / uniform("u_loss_scale", "float"))  # the loss gradient came scaled (kernels.py: u_loss_scale)
    return k


def _grad_bias(c) -> Kernel:
    return Kernel("dense_grad_bias", "kl", ("DZ",), uniforms=("u_batch", "u_loss_scale"), kl=_grad_bias_kl())


def forward(layer, graph, plan):
    return weighted_passes(layer, plan, "dense", _consts(layer, graph), _title, _grad_bias, _GENERIC)[0]


def backward(layer, graph, plan):
    return weighted_passes(layer, plan, "dense", _consts(layer, graph), _title, _grad_bias, _GENERIC)[1]
