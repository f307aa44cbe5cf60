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
    cx.layers.append(Layer("dropout", s.node.name, [cx.act(ins[0])], [s.out],
                           {"ratio": float(np.asarray(consts[ins[1]]) if ins[1] in consts else 0.5)}))
    cx.shapes[s.out] = cx.shapes[cx.layers[-1].inputs[0]]
    return True


@imports("Identity", "Dropout")
def identity(cx, s) -> bool:
    cx.alias[s.out] = cx.act(s.ins[0])
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


@imports("MatMul")
def matmul_of_activations(cx, s) -> bool:
    """A MatMul of two activations, batched over the leading axes."""
    node, ins, out, shapes = s.node, s.ins, s.out, cx.shapes
    if ins[1] in cx.consts:
        return False
    (ta, ga, pa), (tb, gb, pb) = (cx.materialise(t, "blocks", "MatMul", where(node)) for t in ins[:2])
    if ga != gb or pa != pb or shapes[ta][1] * gb != shapes[tb][0]:
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
