"""embedding: rows of a table W [V, F] by integer ids, ids (T,) -> tokens (T, F) (nn.Embedding).

The ids are an activation (T,) a sample, 4 ids a texel, stored as exact floats (< 2^24) in every tier;
the table is V rows of ceil(F/4) texels (layout.py), folded past the texture limit like any texture.

forward    embedding_forward       IDS, W   -> Y     rows: batch   Y[n*T + t] = W[ids[n, t]] (the kernel language)
backward   embedding_grad_weight   IDS, DY  -> dW    rows: full    dW[v] = sum over the batch's (n, t) with
                                                                   ids[n, t] == v of dY[n*T + t]; 0 for the
                                                                   padding_idx row (PyTorch gives it none)

The gradient is a scatter-add, drawn as a gather: each fragment of dW (a row v, 4 features) loops over
the batch's N*T ids and adds the rows of dY whose id is v. That is N*T id comparisons a texel (cheap at
the batches that train: 16 x 128 ids is 2048 fetches of 4 ids, 512 a texel), exact and the same in
every tier; but V * F/4 * N * T in all (SwiftShader: 121 ms at V = 1000, F = 64, 16 x 32 ids; 1.1 s at
V = 5000), so it suits small trainable vocabularies. A faster one: the runtime, which holds the ids in JS,
could upload each batch's positions sorted by id (an offset per table row) so that a row loops over its
own occurrences only. A scatter by points with additive blending would be V times fewer fetches, but blending
into float32 targets needs EXT_float_blend, and packed floats (the rgba8 tier) cannot be blended at all.
Both kernels are written in the kernel language; the optimizer pass includes the gradient as its printed valueAt
(ops/optim.py). The CPU backend runs the same gather (its former scatter-add twin did N*T*F/4 texel adds in all, this
V times more: a large trainable vocabulary trains slowly there). The ids (an input) never need a gradient; a frozen
table (--trainable) has no backward pass.
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, lane, load, maximum, minimum, splat, to_int, uniform
from .common import param_grad


def _forward_kl(t: int, rows: int) -> kl.KernelDef:
    """Y[n*T + t] = W[ids[n, t]], the id clamped into the table (the runtime has rejected any outside it)."""
    k = kl.KernelDef()
    t, rows = k.syms(t=t, rows=rows)
    n = k.let("n", ROW // t)
    i = k.let("i", ROW - n * t)
    ident = k.let("id", to_int(lane(load("IDS", n, i // 4), i % 4)))
    k.out(load("W", minimum(maximum(ident, 0), rows - 1), COL))
    return k


def _grad_weight_kl(c: dict) -> kl.KernelDef:
    """dW[v, f] = sum over the batch's (n, t) with ids[n, t] == v of dY[n*T + t, f], v = ROW; nothing into the
    padding_idx row. A fetch of 4 ids, each lane compared where it is (no index by a variable), and a fetch of dY
    where an id matches; the last T % 4 ids a texel of their own."""
    k = kl.KernelDef()
    t, tq = k.syms(t=c["t"], tq=c["t"] // 4)
    acc = k.let("acc", splat(0.0))

    def ids_of(n, t4, count):
        ids = k.let(f"ids{count}", load("IDS", n, t4))
        for j in range(count):
            with k.when(to_int(lane(ids, j)).eq(ROW)):
                k.set(acc, acc + load("DY", n * t + t4 * 4 + j, COL))

    def gather():
        with k.loop("n", uniform("u_batch", "int")) as n:
            if c["t"] >= 4:
                with k.loop("q4", tq) as t4:
                    ids_of(n, t4, 4)
            if c["t"] % 4:
                ids_of(n, tq, c["t"] % 4)

    if c["padding_idx"] >= 0:
        with k.when(ROW.ne(k.sym("padding_idx", c["padding_idx"]))):
            gather()
    else:
        gather()
    k.out(acc / uniform("u_loss_scale", "float"))
    return k


def _consts(layer, graph):
    (t,) = graph.shapes[layer.inputs[0]]
    v, f = graph.params[layer.params["weight"]].array.shape
    pad = layer.attrs.get("padding_idx")
    return dict(t=t, t4=ceil_div(t, 4), rows=v, f=f, padding_idx=-1 if pad is None else int(pad))


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    k = Kernel(f"embedding_forward {c['t']}x{c['rows']}x{c['f']}", "kl", ("IDS", "W"), kl=_forward_kl(c["t"], c["rows"]))
    return [Pass(k, [plan.tensor(layer.inputs[0]), "param:" + layer.params["weight"]],
                 [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    if not graph.is_trainable(layer.params["weight"]):
        return []
    c = _consts(layer, graph)
    k = Kernel(f"embedding_grad_weight {c['t']}x{c['rows']}x{c['f']}", "kl", ("IDS", "DY"),
               uniforms=("u_batch", "u_loss_scale"), kl=_grad_weight_kl(c))
    return [Pass(k, [plan.tensor(layer.inputs[0]), plan.grad(layer.outputs[0])], [param_grad(plan, layer, "weight")],
                 "full", layer.name)]
