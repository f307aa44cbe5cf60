"""Import rules of Identity and Dropout, and of Gemm and MatMul: a dense layer on one vector a sample, a
token-wise matmul on rows of tokens, or a batched matmul of two activations."""
from __future__ import annotations

import numpy as np

from .. import batch_axis as ba
from ..errors import BuildError
from ..ir import Layer
from .common import unsupported_attr, where
from .layers import dense
from .registry import imports


@imports("Dropout")
def dropout_in_training(cx, s) -> bool:
    """A Dropout kept by the exporter (prep/load.py: export_module) in training mode: applied in fit."""
    ins, consts = s.ins, cx.consts
    if not (len(ins) > 2 and ins[2] and bool(np.asarray(consts.get(ins[2], False))) and
            float(np.asarray(consts.get(ins[1], 0.5))) > 0):
        return False
    ratio = {"ratio": float(np.asarray(consts[ins[1]]) if ins[1] in consts else 0.5)}
    v = cx.lazy.get(cx.alias.get(ins[0], ins[0]))
    if v is not None:  # (on a view whose batch moved: on its source, elementwise, the view kept)
        t = f"{s.out}:src"
        cx.layers.append(Layer("dropout", s.node.name, [v.src], [t], ratio))
        cx.shapes[t] = cx.shapes[v.src]
        cx.set_lazy(s.out, ba.Lazy(t, list(v.ops), v.fine, [list(g) for g in v.groups], v.origin))
        return True
    cx.layers.append(Layer("dropout", s.node.name, [cx.act(ins[0])], [s.out], ratio))
    cx.shapes[s.out] = cx.shapes[cx.layers[-1].inputs[0]]
    return True


@imports("Identity", "Dropout")
def identity(cx, s) -> bool:
    x = cx.alias.get(s.ins[0], s.ins[0])
    cx.alias[s.out] = x if x in cx.lazy else cx.act(x)  # (a view whose batch moved stays one)
    return True


@imports("Gemm")
def gemm(cx, s) -> bool:
    node, a, ins, out, params = s.node, s.a, s.ins, s.out, cx.params
    for k, default in (("alpha", 1.0), ("beta", 1.0), ("transA", 0)):
        if a.get(k, default) != default:
            unsupported_attr(node, k, a[k], "only alpha=1, beta=1, transA=0 are supported")
    if cx.token_wise(ins[0]):  # Gemm on rows of tokens (a Linear on [N, T, F] reshaped to [N*T, F])
        cx.token_matmul(node, ins[0], cx.param(node, 1, matmul_layout=not a.get("transB", 0)), out,
                        ins[2] if len(ins) > 2 and ins[2] else None)
        return True
    x = cx.act(ins[0])
    w = cx.param(node, 1, matmul_layout=not a.get("transB", 0))
    layer = dense(node, x, params[w], cx.shapes)
    if len(ins) > 2 and ins[2]:
        b = cx.param(node, 2)
        if params[b].array.size != cx.shapes[out][0]:
            raise BuildError(f"{where(node)}: bias {b!r} of shape {params[b].array.shape} is not per-output")
        params[b].array = params[b].array.reshape(-1)
        layer.params["bias"] = b
    cx.layers.append(layer)
    return True


def _runs(pattern) -> tuple:
    """A blocks pattern (the batch "N" and the sizes of the other leading factors) with adjacent sizes multiplied:
    (N, 4, 2) and (N, 2, 2, 2) are one order of 8 blocks a sample (windows and heads, factored apart or not)."""
    out: list = []
    for d in pattern:
        if d != ba.N and out and out[-1] != ba.N:
            out[-1] *= d
        else:
            out.append(d)
    return tuple(out)


@imports("MatMul")
def matmul_of_activations(cx, s) -> bool:
    """A MatMul of two activations, batched over the leading axes."""
    node, ins, out, shapes = s.node, s.ins, s.out, cx.shapes
    if ins[1] in cx.consts:
        return False
    (ta, ga, pa), (tb, gb, pb) = (cx.materialise(t, "blocks", "MatMul", where(node)) for t in ins[:2])
    same_blocks = pa == pb or (_runs(pa) == _runs(pb) and cx.lz(ins[0]).sizes()[:-2] == cx.lz(ins[1]).sizes()[:-2])
    if ga != gb or not same_blocks or shapes[ta][1] * gb != shapes[tb][0]:
        raise BuildError(f"{where(node)}: MatMul of {cx.lz(ins[0]).sizes()} and {cx.lz(ins[1]).sizes()}: the "
                         "leading (batch) axes or the inner dims differ")
    m = shapes[ta][0] // ga
    t = f"{out}:rows"
    cx.layers.append(Layer("matmul", node.name, [ta, tb], [t], {"groups": ga}))
    shapes[t] = (ga * m, shapes[tb][1])
    cx.set_lazy(out, ba.after_blocks_op(t, cx.lz(ins[0]), m, shapes[tb][1]))
    return True


@imports("MatMul")
def matmul_of_tokens(cx, s) -> bool:
    if not cx.token_wise(s.ins[0]):
        return False
    cx.token_matmul(s.node, s.ins[0], cx.param(s.node, 1, matmul_layout=True), s.out, None)
    return True


@imports("MatMul")
def matmul_dense(cx, s) -> bool:
    node = s.node
    x = cx.act(s.ins[0])
    if len(cx.shapes[x]) != 1:
        raise BuildError(f"{where(node)}: MatMul on a per-sample shape {cx.shapes[x]} is not supported "
                         "(only 2-D activations)")
    w = cx.param(node, 1, matmul_layout=True)
    cx.layers.append(dense(node, x, cx.params[w], cx.shapes))
    return True
