"""Losses, mean reduction as in PyTorch. Each has a gradient pass (d loss / d output,
written into the output's gradient texture) and a value pass (the batch's mean loss,
written into one texel of the loss ring, read back asynchronously every few steps: a "ring"
pass, whose kernel (KernelDef.ring) writes texel u_ring and reduces over the batch).
With many classes (layout.ce_stats) cross_entropy computes the softmax's max and sum of
each sample once before them (cross_entropy_stats, into the texture layout.CE_STATS), and
both read those. Written in the kernel language (codegen/kl.py): the GLSL and the CPU
backend's functions are printed from these.

cross_entropy   torch.nn.functional.cross_entropy(logits, labels)   (outputs of shape (classes,);
                labels: a class id a sample, in lane 0 of its texel)
mse             torch.nn.functional.mse_loss(output, targets)
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.packing import ceil_div

from texelfit.codegen.webgl2.layout import CE_STATS, ce_stats, loss_texture

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, exp, hmax, hsum, is_valid, lane, load, log, maximum, select, splat, to_float, to_int, \
    uniform, vec4_of

LOSSES = ("cross_entropy", "mse")
_LOWEST = -3.0e38  # the max's start, as the GLSL has always had it


def _softmax_stats(k: kl.KernelDef, n, classes, c4, stats: bool):
    """(mx, sum): the max and the sum of exp(z - max) over the real classes of sample n of the logits Z; read from
    S (cross_entropy_stats' output) where that pass runs."""
    if stats:
        s = k.let("st", load("S", n, 0))
        return lane(s, 0), lane(s, 1)
    mx = k.let("mx", _LOWEST)
    with k.loop("j", c4) as j:
        k.set(mx, maximum(mx, hmax(select(is_valid(classes, j), load("Z", n, j), _LOWEST))))
    total = k.let("sum", 0.0)
    with k.loop("i", c4) as i:
        k.set(total, total + hsum(select(is_valid(classes, i), exp(load("Z", n, i) - mx), 0.0)))
    return mx, total


def _label(n):
    """Sample n's class id (an exact integer stored as a float), truncated as the GLSL's int() does."""
    return to_int(lane(load("LABELS", n, 0), 0))


def cross_entropy_stats_kl(classes: int, c4: int) -> kl.KernelDef:
    """S(n, 0) = (max, sum of exp(z - max), 0, 0) of sample n's logits, once a sample."""
    k = kl.KernelDef()
    classes, c4 = k.syms(classes=classes, c4=c4)
    mx, total = _softmax_stats(k, ROW, classes, c4, False)
    k.out(vec4_of(mx, total, 0.0, 0.0))
    return k


def cross_entropy_grad_kl(classes: int, c4: int, stats: bool) -> kl.KernelDef:
    """dZ[n, c] = (softmax(Z[n])[c] - (c == label[n])) / batch, times u_loss_scale (the weight-gradient kernels
    divide it out) and the output's u_loss_weight; padding lanes zero."""
    k = kl.KernelDef()
    classes, c4 = k.syms(classes=classes, c4=c4)
    mx, total = _softmax_stats(k, ROW, classes, c4, stats)
    label = k.let("label", to_float(_label(ROW)))
    prob = k.let("prob", exp(load("Z", ROW, COL) - mx) / total)
    channel = splat(to_float(COL * 4)) + vec4_of(0.0, 1.0, 2.0, 3.0)
    scale = uniform("u_loss_scale", "float") * uniform("u_loss_weight", "float") / to_float(uniform("u_batch", "int"))
    k.out(select(is_valid(classes, COL), select(channel.eq(splat(label)), prob - 1.0, prob) * scale, 0.0))
    return k


def cross_entropy_value_kl(classes: int, c4: int, stats: bool) -> kl.KernelDef:
    """The mean over the batch of logsumexp(Z[n]) - Z[n, label[n]], into texel u_ring of the loss ring."""
    k = kl.KernelDef()
    k.ring = True
    classes, c4 = k.syms(classes=classes, c4=c4)
    batch = uniform("u_batch", "int")
    loss = k.let("loss", 0.0)
    with k.loop("n", batch) as n:
        mx, total = _softmax_stats(k, n, classes, c4, stats)
        label = k.let("label", _label(n))
        picked = lane(load("Z", n, label // 4), label % 4)
        k.set(loss, loss + (log(total) + mx - picked))
    k.out(vec4_of(loss / to_float(batch), 0.0, 0.0, 0.0))
    return k


def mse_grad_kl(features: int) -> kl.KernelDef:
    """dY = 2 (Y - T) / (batch * features), times u_loss_scale and the output's u_loss_weight."""
    k = kl.KernelDef()
    features = k.sym("features", float(features))
    scale = uniform("u_loss_scale", "float") * uniform("u_loss_weight", "float") / \
        (to_float(uniform("u_batch", "int")) * features)
    k.out(2.0 * (load("Y", ROW, COL) - load("T", ROW, COL)) * scale)
    return k


def mse_value_kl(features: int, sample_rows: int, width: int) -> kl.KernelDef:
    """The mean over the batch and the features of (Y - T)^2, into texel u_ring of the loss ring."""
    k = kl.KernelDef()
    k.ring = True
    features = k.sym("features", float(features))
    sample_rows, width = k.syms(sample_rows=sample_rows, width=width)
    batch = uniform("u_batch", "int")
    loss = k.let("loss", 0.0)
    with k.loop("r", batch * sample_rows) as r:
        with k.loop("x", width) as x:
            d = k.let("d", load("Y", r, x) - load("T", r, x))
            k.set(loss, loss + kl.dot(d, d))
    k.out(vec4_of(loss / (to_float(batch) * features), 0.0, 0.0, 0.0))
    return k


def loss_passes(loss, out_spec, grad_texture, k=0, weighted=False):
    """The passes of output k's `loss` of the tensor in `out_spec`, into its textures (layout.loss_texture): the
    gradient into `grad_texture` (None: no trainable parameter reaches the output, its value alone), and the
    value into its loss ring. `weighted` (a model of several outputs): the gradient pass sets u_loss_weight, which
    fit sets to the output's weight (its lossWeights); otherwise the runner's u_loss_weight, 1, is read."""
    features = int(np.prod(out_spec.shape[1:]))
    first = []
    if loss == "cross_entropy":
        classes = out_spec.packing.chans
        c4 = ceil_div(classes, 4)
        inputs, textures = ("Z", "LABELS"), [out_spec.name, loss_texture("labels", k)]
        stats = ce_stats(features)
        if stats:  # the softmax's max and sum, once a sample, for both passes below
            s = Kernel("cross_entropy_stats", "kl", ("Z",), kl=cross_entropy_stats_kl(classes, c4))
            first = [Pass(s, [out_spec.name], [loss_texture(CE_STATS, k)], "batch", loss)]
            inputs, textures = inputs + ("S",), textures + [loss_texture(CE_STATS, k)]
        grad_kl = cross_entropy_grad_kl(classes, c4, stats)
        value_kl = cross_entropy_value_kl(classes, c4, stats)
    else:
        inputs, textures = ("Y", "T"), [out_spec.name, loss_texture("targets", k)]
        grad_kl, value_kl = mse_grad_kl(features), mse_value_kl(features, out_spec.sample_rows, out_spec.width)
    g = Kernel(f"{loss}_grad", "kl", inputs, uniforms=("u_batch", "u_loss_scale", "u_loss_weight"), kl=grad_kl)
    v = Kernel(f"{loss}_value", "kl", inputs, uniforms=("u_batch",), kl=value_kl)
    grad = [Pass(g, textures, [grad_texture], "batch", loss, values={"u_loss_weight": 1.0} if weighted else {})] \
        if grad_texture is not None else []
    return first + grad + [Pass(v, textures, [loss_texture("loss", k)], "ring", loss)]
