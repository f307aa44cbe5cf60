"""The ops on tokens (R, F): matmul (token-wise x @ B (+ b), or of two activations, batched), layernorm over the
features, embedding (rows of a table by integer ids). Their kernels: codegen/ops/matmul.py (matmul, layernorm),
codegen/ops/embedding.py."""
from __future__ import annotations

from ..channel_groups import Seg, channels_of
from ..packing import matrix_packing
from .registry import bias_and_act, moves_data, out_size, register, same_attrs, saves_nothing


def matmul_flops(layer, graph) -> int:
    """(R, K) @ (K, P) a block: 2 * K multiply-adds an output."""
    return 2 * graph.shapes[layer.inputs[0]][1] * out_size(layer, graph) + bias_and_act(layer, graph)


def layernorm_flops(layer, graph) -> int:
    """Mean, variance, normalise, scale and shift."""
    return 7 * out_size(layer, graph)


def matmul_forward(m, layer, ins):
    """Token-wise x @ B (+ b), or a batched product of two activations."""
    x, a = ins[0], layer.attrs
    if len(ins) == 2:
        g, n = a["groups"], x.shape[0]
        y = x.reshape(n, g, -1, x.shape[-1]) @ ins[1].reshape(n, g, -1, ins[1].shape[-1])
        return y.reshape(n, -1, y.shape[-1])
    w, b = m.param(layer, "weight"), m.param(layer, "bias")
    y = x @ w if m.graph.params[layer.params["weight"]].transposed else x @ w.T
    return y + b if b is not None else y


def layernorm_forward(m, layer, ins):
    import torch.nn.functional as F

    w = m.param(layer, "weight")  # its size, not x.shape[-1]: a traced export needs a constant shape
    return F.layer_norm(ins[0], (int(w.shape[0]),), w, m.param(layer, "bias"), layer.attrs["eps"])


def embedding_forward(m, layer, ins):
    """ids (as integers or exact floats) -> rows of the table."""
    import torch.nn.functional as F

    return F.embedding(ins[0].long(), m.param(layer, "weight"), padding_idx=layer.attrs.get("padding_idx"))


def token_prune(layer, graph, axes, gs):
    """Tokens are not pruned: the inputs stay whole, the output is a new group that stays whole."""
    why = f"{layer.op} {layer.name!r} works on tokens, which are not pruned"
    for t in layer.inputs:
        for s in axes[t]:
            gs.fix(s.group, why)
    n = channels_of(graph.shapes[layer.outputs[0]])
    return (Seg(gs.new(n, reason=why), n, 1),)


def matmul_layout(layer, graph, p, role):
    o, i = p.canonical().shape
    if layer.attrs.get("weight_rows") == "out":
        # a tied embedding table read as the weight [O, I]: the table's layout, I in the texel (prep.graph)
        return matrix_packing(o, i), o
    return matrix_packing(i, o, not p.transposed), i  # B[I, O] of x @ B, O in the texel (canonical() is [O, I])


def layernorm_saves(layer, graph) -> tuple:
    """A texel a row, float32 in every tier (role "partial"): its statistics (mean, 1 / std), and where its input
    needs a gradient its backward's two sums a row (codegen/ops/layernorm.py: lnstat:Y, lnsum:Y)."""
    rows = (graph.shapes[layer.outputs[0]][0], 2)
    return (("lnstat:", "partial", rows),) + ((("lnsum:", "partial", rows),) if layer.inputs[0] in graph.needs_grad()
                                               else ())


def layernorm_layout(layer, graph, p, role):
    """Per feature vectors, as a bias: one row."""
    return matrix_packing(1, p.array.size), 1


def embedding_layout(layer, graph, p, role):
    """The table W[V, F]: a row an id, F in the texel (folded when V is large)."""
    return matrix_packing(*p.array.shape), p.array.shape[0]


register("matmul", flops=matmul_flops, torch=matmul_forward, prune=token_prune, cut=same_attrs,
         weight_layout=matmul_layout, saves=saves_nothing, kernels="matmul")
register("layernorm", flops=layernorm_flops, torch=layernorm_forward, prune=token_prune, cut=same_attrs,
         weight_layout=layernorm_layout, saves=layernorm_saves, kernels="layernorm")
register("embedding", flops=moves_data, torch=embedding_forward, prune=token_prune, cut=same_attrs,
         weight_layout=embedding_layout, saves=saves_nothing, kernels="embedding")
