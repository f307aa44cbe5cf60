"""The layers that several import rules make: an embedding, a dense layer, an elementwise layer from its ONNX
node (operands broadcast), the Expand of an activation as a broadcasting mul."""
from __future__ import annotations

import numpy as np

from .. import elementwise as ew
from ..elementwise import BY_ONNX
from ..errors import BuildError
from ..ir import Layer, Param
from ..shape import MAX_CONSTANT_FLOATS
from .common import N, where


def embedding(node, a, ids, table: str, params, shapes, padding_idx) -> Layer:
    """Gather(table, ids) on axis 0, what nn.Embedding exports: ids (T,) -> tokens (T, F). The table keeps
    its state_dict name; its padding_idx (prep/naming.py: PADDING_IDX_KEY) is recorded, its row gets no
    gradient as in PyTorch."""
    w = params[table].array
    if int(a.get("axis", 0)) != 0 or w.ndim != 2:
        raise BuildError(f"{where(node)}: Gather of integer ids is supported from a table [rows, features] on "
                         f"axis 0 (nn.Embedding), not axis {a.get('axis', 0)} of shape {list(w.shape)}")
    if len(shapes[ids]) != 1:
        raise BuildError(f"{where(node)}: token ids of per-sample shape {list(shapes[ids])}: one sequence a sample "
                         "(ids of shape [batch, T]) is supported")
    pad = padding_idx.get(table)
    if pad is not None and pad < 0:
        pad += w.shape[0]
    out = node.output[0]
    shapes[out] = (int(shapes[ids][0]), int(w.shape[1]))
    return Layer("embedding", node.name, [ids], [out], {"padding_idx": pad}, {"weight": table})


def dense(node, x, w: Param, shapes) -> Layer:
    if len(shapes[x]) != 1:
        raise BuildError(f"{where(node)}: dense layer on per-sample shape {shapes[x]}; flatten first")
    o, i = w.canonical().shape
    if i != shapes[x][0]:
        raise BuildError(f"{where(node)}: weight {w.name!r} expects {i} inputs, got {shapes[x][0]}")
    out = node.output[0]
    shapes[out] = (int(o),)
    return Layer("dense", node.name, [x], [out], {}, {"weight": w.name})


def is_silu(node, ins, layers, g) -> bool:
    """Mul(x, Sigmoid(x)) where the sigmoid is read by nothing else: nn.SiLU's export."""
    if len(ins) != 2:
        return False
    for i, j in ((0, 1), (1, 0)):
        sig = next((l for l in layers if l.op == "sigmoid" and l.outputs[0] == ins[j]), None)
        if sig is not None and sig.inputs[0] == ins[i] and sum(ins[j] in n.input for n in g.node) == 1 \
                and sum(t == ins[j] for t in node.input) == 1:
            return True
    return False


def expand(node, x, out, target, shapes) -> Layer:
    """Expand of an activation to a constant shape whose batch dim is 1 (the mask of nn.MultiheadAttention,
    [N, 1, 1, T] repeated over the heads): the activation times ones of the broadcast shape, an elementwise
    mul that repeats it (x * 1 is x exactly; no gradient reaches a mask input)."""
    full = (N,) + tuple(shapes[x])
    rank = max(len(full), len(target))
    padded_x = (1,) * (rank - len(full)) + full
    padded_t = (1,) * (rank - len(target)) + tuple(int(d) for d in target)
    if padded_x[0] != N or padded_t[0] != 1:
        raise BuildError(f"{where(node)}: Expand of {list(full)} to {target} repeats the batch axis")
    out_full = broadcast_shapes(node, [padded_x, padded_t])
    per_sample = tuple(int(d) for d in out_full[1:])
    if len(per_sample) not in (1, 2, 3):
        raise BuildError(f"{where(node)}: Expand to a per-sample shape of rank {len(per_sample)} ({list(per_sample)})")
    if len(shapes[x]) != len(per_sample):
        x_shape = list(padded_x[1:])
    else:
        x_shape = list(shapes[x])
    if len(x_shape) != len(shapes[x]):
        raise BuildError(f"{where(node)}: Expand of {list(full)} to {target} adds axes (broadcasting across ranks "
                         "is not supported)")
    ones = [int(d) for d in padded_t[1:]]
    shapes[out] = per_sample
    operands = [{"kind": "act", "input": 0, "shape": x_shape},
                {"kind": "const", "shape": ones, "values": [1.0] * int(np.prod(ones))}]
    return Layer("mul", node.name, [x], [out], dict(ew.layer_attrs(ew.OPS["mul"], {}), operands=operands))


def broadcast_shapes(node, full: list[tuple]) -> tuple[int, ...]:
    """ONNX multidirectional broadcasting of full shapes (batch axis first, "N" for activations)."""
    rank = max(len(s) for s in full)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] if axis - rank + len(s) >= 0 else 1 for s in full} - {1}
        if len(dims) > 1:
            raise BuildError(f"{where(node)}: shapes {[list(s) for s in full]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def elementwise(node, out, a, ins, consts, shapes, act, param, initializer_names, trainable_names,
                 view_shapes=None, constant=None) -> Layer:
    """An elementwise layer (prep/elementwise.py) from its ONNX node: the declaration's attributes, its
    operands (activations, constants baked into the kernel, or trainable parameters: an initializer that
    is an nn.Parameter, such as a layer scale, or a PRelu slope) broadcast to the output's shape. A constant
    of more than MAX_CONSTANT_FLOATS values is read from a frozen texture, `constant(tensor, values)`'s (the
    importer's: prep/onnx_import/ctx.py), as a frozen parameter is."""
    decl = BY_ONNX[node.op_type]
    attrs = {k: a[k] for k in decl.attrs if k in a}
    if decl.arity == 1:
        if decl.name == "clip" and len(ins) > 1:  # opset 11+: min and max are (optional) inputs
            for k, i in (("min", 1), ("max", 2)):
                if len(ins) > i and ins[i]:
                    if ins[i] not in consts:
                        raise BuildError(f"{where(node)}: Clip with a {k} computed from activations is not supported")
                    attrs[k] = float(np.asarray(consts[ins[i]]).reshape(-1)[0])
        if decl.name == "pow":
            e = np.asarray(consts.get(ins[1], np.zeros(2)))
            if ins[1] not in consts or e.size != 1:
                raise BuildError(f"{where(node)}: Pow is supported with a constant scalar exponent only")
            attrs["exponent"] = float(e.reshape(-1)[0])
        x = act(ins[0])
        shapes[out] = shapes[x]
        return Layer(decl.name, node.name, [x], [out], ew.layer_attrs(decl, attrs))

    operand_ins = ins[:2]
    full = []
    for t in operand_ins:
        if t in consts:
            full.append(tuple((view_shapes or {}).get(t, np.shape(consts[t]))))
        else:
            full.append((N,) + tuple(shapes[act(t)]))
    if all(t in consts for t in operand_ins):
        raise BuildError(f"{where(node)}: {node.op_type} of two constants cannot be evaluated")
    out_full = broadcast_shapes(node, full)
    if out_full[0] != N:
        raise BuildError(f"{where(node)}: a constant operand of shape {[list(s) for s in full]} has a batch "
                         "axis of its own")
    out_shape = tuple(int(d) for d in out_full[1:])
    rank = len(out_shape)
    operands, inputs, roles = [], [], {}
    for slot, (t, s) in enumerate(zip(operand_ins, full)):
        padded = (1,) * (len(out_full) - len(s)) + tuple(s)
        per_sample = [int(d) if d != N else d for d in padded[1:]]
        if per_sample != list(out_shape) and rank not in (1, 2, 3):
            raise BuildError(f"{where(node)}: broadcasting over a per-sample shape of rank {rank} "
                             f"({list(out_shape)} and {per_sample}) is not supported")
        if t not in consts:
            x = act(t)
            if len(shapes[x]) != rank:
                raise BuildError(f"{where(node)}: {node.op_type} of activations of per-sample shapes "
                                 f"{list(shapes[x])} and {list(out_shape)}: broadcasting across ranks is not supported")
            operands.append({"kind": "act", "input": len(inputs), "shape": per_sample})
            inputs.append(x)
            continue
        trainable = t in initializer_names and (decl.name == "prelu" or t in trainable_names)
        if trainable:
            role = "slope" if decl.name == "prelu" else f"operand{slot}"
            roles[role] = param(node, slot)
            operands.append({"kind": "param", "role": role, "shape": per_sample})
        else:
            values = np.asarray(consts[t], dtype=np.float64).reshape(-1)
            if values.size > MAX_CONSTANT_FLOATS:
                role = f"operand{slot}"
                roles[role] = constant(t, np.asarray(consts[t], dtype=np.float32))
                operands.append({"kind": "param", "role": role, "shape": per_sample})
                continue
            operands.append({"kind": "const", "shape": per_sample,
                             "values": [float(np.float32(v)) for v in values]})
    if not inputs:
        raise BuildError(f"{where(node)}: no activation operand")
    shapes[out] = out_shape
    return Layer(decl.name, node.name, inputs, [out], dict(ew.layer_attrs(decl, attrs), operands=operands), roles)


def elementwise_of(cx, node, out, a, ins, view_shapes=None) -> Layer:
    """elementwise() with the importer's (prep/onnx_import/ctx.py) tensors and parameters."""
    return elementwise(node, out, a, ins, cx.consts, cx.shapes, cx.act, cx.param, cx.initializer_names,
                       cx.trainable_names, view_shapes, cx.constant)
