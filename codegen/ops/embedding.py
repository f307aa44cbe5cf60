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
The gradient keeps its GLSL template and JS twin: the optimizer pass includes it (ops/optim.py), which
reads a template's valueAt and CPU_KERNELS. The ids (an input) never need a gradient; a frozen table (--trainable) has no backward pass.
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, lane, load, maximum, minimum, to_int
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
    k = Kernel(f"embedding_grad_weight {c['t']}x{c['rows']}x{c['f']}", "embedding_grad_weight.glsl.j2", ("IDS", "DY"),
               uniforms=("u_batch", "u_loss_scale"), consts=c)
    return [Pass(k, [plan.tensor(layer.inputs[0]), plan.grad(layer.outputs[0])], [param_grad(plan, layer, "weight")],
                 "full", layer.name)]
