"""Import rules of elementwise ops (prep/elementwise.py's declarations): a bias added to a dense or token-wise
matmul's output is that layer's bias; x * sigmoid(x) is nn.SiLU; on a lazy view of the batch axis
(prep/batch_axis.py) an op is computed on the view's source or its rows; anything else is one elementwise
layer with ONNX broadcasting."""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import batch_axis as ba
from ..elementwise import BY_ONNX
from ..errors import BuildError
from ..ir import Layer
from .common import collapse_broadcast, where
from .layers import elementwise_of, is_silu
from . import tables
from .registry import imports

BINARY_ONNX = tuple(op for op, decl in BY_ONNX.items() if decl.arity == 2)


@imports("Add")
def add_bias(cx, s) -> bool:
    """A bias vector added to a MatMul output (Linear without Gemm): the dense or token-wise matmul layer's bias.
    Falls through to the elementwise rules where it is not, having materialised the other operand as an
    activation (act) where it was not a lazy view."""
    node, ins, out = s.node, s.ins, s.out
    consts, alias, lazy, shapes, params = cx.consts, cx.alias, cx.lazy, cx.shapes, cx.params
    if len([i for i in ins if i not in consts]) != 1:
        return False
    xi = next(i for i in ins if i not in consts)  # (its ONNX name, whose readers are counted; xo: what it stands for)
    xo = alias.get(xi, xi)
    c = next(i for i in ins if i in consts)
    if xo in lazy or len(shapes.get(xo, ())) == 2:  # a bias added to a token-wise MatMul's rows
        v = cx.lz(xo)
        prod = next((l for l in cx.layers if v.src in l.outputs), None)
        if (prod is not None and prod.op == "matmul" and "weight" in prod.params and "bias" not in prod.params
                and c in cx.initializer_names and np.size(consts[c]) == shapes[v.src][1]
                and np.ndim(consts[c]) <= 1 and len(cx.users(xi)) == 1):
            b = cx.param(node, ins.index(c))
            params[b].array = params[b].array.reshape(-1)
            prod.params["bias"] = b
            if xo in lazy:
                lazy[out] = lazy[xo]
            else:
                alias[out] = xo
            return True
    x = xo if xo in lazy else cx.act(xo)
    prod = next((l for l in cx.layers if x in l.outputs), None)
    bias = consts[c]
    if (prod is not None and prod.op == "dense" and "bias" not in prod.params
            and c in cx.initializer_names and np.size(bias) == shapes[x][0] and np.ndim(bias) <= 2
            and len(cx.users(x)) == 1):
        b = cx.param(node, ins.index(c))
        params[b].array = params[b].array.reshape(-1)
        prod.params["bias"] = b
        alias[out] = x
        return True
    return False


@imports("Mul")
def silu(cx, s) -> bool:
    """x * sigmoid(x): nn.SiLU."""
    if not is_silu(s.node, s.ins, cx.layers, cx.g):
        return False
    sig = next(l for l in cx.layers if l.op == "sigmoid" and l.outputs[0] in (cx.alias.get(t, t) for t in s.ins))
    cx.layers.remove(sig)
    cx.layers.append(Layer("silu", s.node.name, list(sig.inputs), [s.out]))
    cx.shapes[s.out] = cx.shapes[sig.inputs[0]]
    return True


@imports(*BINARY_ONNX)
def constant_on_lazy_view(cx, s) -> bool:
    """A constant of several values (an attention mask added to the scores) on a lazy view: on its rows form,
    the constant spread over those rows."""
    node, op, a, ins, out = s.node, s.op, s.a, s.ins, s.out
    consts, alias, lazy = cx.consts, cx.alias, cx.lazy
    if not (len(ins) == 2 and sum(alias.get(i, i) in lazy for i in ins) == 1
            and any(i in consts and np.size(consts[i]) > 1 for i in ins)):
        return False
    k = next(j for j, i in enumerate(ins) if alias.get(i, i) in lazy)
    v, cst = lazy[alias.get(ins[k], ins[k])], np.asarray(consts[ins[1 - k]], dtype=np.float32)
    nb = [j for j, grp in enumerate(v.groups) if ba.N in grp]
    if v.groups[nb[0]][0] != ba.N or cst.ndim > v.rank() or (cst.ndim == v.rank() and cst.shape[nb[0]] != 1):
        raise BuildError(f"{where(node)}: {op} of a constant of shape {list(cst.shape)} and a tensor of "
                         f"ONNX shape {v.sizes()}: not supported")
    # (the batch's axis without it: 1, or the windows merged after it, over which the constant broadcasts)
    full = [d[1] if isinstance(d, tuple) else d for d in v.sizes()]
    name = ins[1 - k]
    per_feature = all(d == 1 for d in cst.shape[:-1])
    if not per_feature and ((name in cx.initializer_names and name in cx.trainable_names)
                            or np.prod(full) > 4096 >= cst.size):
        # a parameter in the view's shape (ConvNeXt's [C, 1, 1] layer scale), or a constant that its rows form
        # would spread past what a kernel holds: on the view itself (materialised, as its next reader needs it)
        return False
    x = cx.materialise(ins[k], "rows", op, where(node))[0]
    if not per_feature:  # not per feature alone: spread over the rows
        spread = np.broadcast_to(cst, full).reshape(cx.shapes[x])
        name = f"{node.name}:const"
        consts[name] = np.maximum(np.minimum(spread, 3.4028234663852886e38), -3.4028234663852886e38)
    t = f"{out}:rows"
    operand_ins = [x, name] if k == 0 else [name, x]
    cx.layers.append(elementwise_of(cx, node, t, a, operand_ins))
    cx.set_lazy(out, ba.after_rows_op(t, v, cx.shapes[x][1]))
    return True


@imports(*BY_ONNX)
def same_lazy_views(cx, s) -> bool:
    """Two activations seen through the same view (GELU's x * (erf(x / sqrt 2) + 1)): on their sources."""
    ins, alias, lazy = s.ins, cx.alias, cx.lazy
    if not (len(ins) == 2 and all(alias.get(i, i) in lazy for i in ins) and (
            va := lazy[alias.get(ins[0], ins[0])]).ops == (vb := lazy[alias.get(ins[1], ins[1])]).ops and
            va.fine == vb.fine and va.groups == vb.groups and cx.shapes[va.src] == cx.shapes[vb.src]):
        return False
    t = f"{s.out}:src"
    cx.layers.append(elementwise_of(cx, s.node, t, s.a, [va.src, vb.src]))
    cx.set_lazy(s.out, ba.Lazy(t, list(va.ops), va.fine, [list(grp) for grp in va.groups], va.origin))
    return True


@imports(*BY_ONNX)
def pointwise_on_lazy_view(cx, s) -> bool:
    """Pointwise on a lazy view (an activation, a scale): computed on its source, the view kept."""
    ins, alias, lazy, consts = s.ins, cx.alias, cx.lazy, cx.consts
    if not (any(alias.get(i, i) in lazy for i in ins) and all(
            alias.get(i, i) in lazy or (i in consts and np.size(consts[i]) == 1) for i in ins[:2]) and
            sum(alias.get(i, i) in lazy for i in ins[:2]) == 1):
        return False
    k = next(j for j, i in enumerate(ins) if alias.get(i, i) in lazy)
    v = lazy[alias.get(ins[k], ins[k])]
    t = f"{s.out}:src"
    cx.layers.append(elementwise_of(cx, s.node, t, s.a, ins[:k] + [v.src] + ins[k + 1:]))
    cx.set_lazy(s.out, ba.Lazy(t, list(v.ops), v.fine, [list(grp) for grp in v.groups]))
    return True


@imports(*BY_ONNX)
def on_merged_batch(cx, s) -> bool:
    """An elementwise op of tensors whose batch is merged with windows first ([N * windows, ...]: MobileViT's residual
    sum of two such): on their merged form (windows, ...), a constant broadcast over the windows, the output seen
    with the batch merged again (prep/batch_axis.py: merged_batch)."""
    node, alias, lazy = s.node, cx.alias, cx.lazy
    operands = s.ins[:BY_ONNX[s.op].arity]
    if s.op == "Add" and any(i in cx.window_biases for i in operands):  # scores + (table view + window mask)
        k = next(j for j, i in enumerate(operands) if i in cx.window_biases)
        table, mask = cx.window_biases[operands[k]]
        first = f"{s.out}:with_table"
        if not tables.table_added(cx, dataclasses.replace(s, ins=[operands[1 - k], table], out=first)):
            return False
        return on_merged_batch(cx, dataclasses.replace(s, ins=[first, mask]))
    views = [lazy.get(alias.get(i, i)) for i in operands]
    if not any(v is not None and ba.merged_batch(v) for v in views):
        return False
    ins = list(s.ins)
    for k, (i, v) in enumerate(zip(operands, views)):
        if i in cx.merged_consts:  # (a constant sample in the merged form: (windows, ...), broadcast as one)
            ins[k] = f"{i}:per_sample"
            cx.consts[ins[k]] = cx.merged_consts[i][None]
            continue
        if i in cx.consts:
            continue
        if v is None or not ba.merged_batch(v):
            raise BuildError(f"{where(node)}: {s.op} of a tensor whose batch is merged with windows "
                             f"({views[1 - k].sizes()}) and one of ONNX shape {v.sizes() if v else 'per sample'}")
        ins[k] = cx.materialise(i, "merged", s.op, where(node))[0]
    rank = max(len(cx.shapes[i]) for i in ins[:len(operands)] if i not in cx.consts)
    shapes = [cx.shapes[i] if i not in cx.consts else  # (a constant's ONNX shape, its batch axis of 1 dropped)
              ((1,) * (rank + 1 - np.ndim(cx.consts[i])) + np.shape(cx.consts[i]))[1:] for i in ins[:len(operands)]]
    full = tuple(max(d) for d in zip(*shapes))
    if len(full) > 3 and any(sh != full for sh in shapes):  # (a mask of every window on every head: fewer axes)
        full_c, shapes_c = collapse_broadcast(full, shapes)
        for k, (i, sh) in enumerate(zip(list(ins), shapes_c)):
            if i in cx.consts:
                ins[k] = f"{i}:collapsed"
                cx.consts[ins[k]] = np.asarray(cx.consts[i]).reshape((1,) + sh)
            else:
                ins[k] = f"{i}:collapsed"
                cx.view(node, i, [("reshape", sh)], out=ins[k], name=f"{node.name}:collapsed{k}")
    t = f"{s.out}:merged"
    cx.layers.append(elementwise_of(cx, node, t, s.a, ins))
    v = ba.merged(t, full)
    cx.set_lazy(s.out, ba.Lazy(t, [("reshape", full)], v.fine, v.groups) if cx.shapes[t] != full else v)
    return True


@imports(*BY_ONNX)
def elementwise(cx, s) -> bool:
    # a parameter read through a view broadcasts in the view's shape (a [C] scale as [C, 1, 1])
    view_shapes = {s.ins[k]: np.shape(cx.consts[t]) for k, t in enumerate(s.node.input[:2]) if t in cx.param_views}
    cx.layers.append(elementwise_of(cx, s.node, s.out, s.a, s.ins, view_shapes))
    return True
