"""Import rules of shape ops on activations: a shape op that moves or merges the batch axis (or reads a tensor
whose batch axis moved) is followed as a lazy view (prep/batch_axis.py); on the per-sample dims, Concat,
Transpose, Squeeze, Unsqueeze, Slice, Pad, Split, Reshape and Flatten become gather layers (prep/onnx_shape.py)
or none (an alias); Resize, Upsample and an edge or reflect Pad a resample layer."""
from __future__ import annotations

import numpy as np

from .. import onnx_shape, resample
from ..errors import BuildError
from ..ir import Layer
from ..shape import MAX_CONSTANT_FLOATS
from .common import N, unsupported_attr, where
from .. import batch_axis as ba
from .registry import imports


@imports("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Gather")
def batch_view(cx, s) -> bool:
    """A shape op on a tensor whose batch axis moved, or that moves it: a lazy view, no layer."""
    v = cx.moves_batch(s.node, s.op, s.a, s.ins)
    if v is None:
        return False
    v.origin = getattr(cx.lazy.get(cx.alias.get(s.ins[0], s.ins[0])), "origin", "") or where(s.node)
    cx.set_lazy(s.out, v)
    return True


@imports("Split")
def split_view(cx, s) -> bool:
    """A Split of a tensor whose batch axis moved (q, k and v of a window attention's [3, N * windows, ...]):
    a lazy view of each part, no layer."""
    node, a, ins = s.node, s.a, s.ins
    x = cx.alias.get(ins[0], ins[0])
    if x not in cx.lazy:
        return False
    v, outs = cx.lazy[x], list(node.output)
    axis = int(a.get("axis", 0)) % v.rank()
    size = int(np.prod([v.fine[f] for f in v.groups[axis] if f != N]))
    if len(ins) > 1 and ins[1]:
        if ins[1] not in cx.consts:
            raise BuildError(f"{where(node)}: Split with sizes computed from activations is not supported")
        sizes = [int(k) for k in np.asarray(cx.consts[ins[1]]).reshape(-1)]
    else:
        sizes = list(a.get("split", [])) or [-(-size // len(outs))] * len(outs)
        sizes[-1] = size - sum(sizes[:-1])
    start = 0
    for out, k in zip(outs, sizes):
        part = ba.narrow(where(node), v, axis, start, start + k)
        part.origin = v.origin
        cx.set_lazy(out, part)
        start += k
    return True


@imports("Concat")
def concat(cx, s) -> bool:
    node, a, ins, out, shapes = s.node, s.a, s.ins, s.out, cx.shapes
    operands = [cx.batch_consts[i] if i in cx.batch_consts else cx.act(i) for i in ins]
    sample = [o.shape if isinstance(o, np.ndarray) else shapes[o] for o in operands]
    rank = len(sample[0])
    axis = onnx_shape.axis(where(node), a.get("axis", 1), rank + 1)
    if axis == -1:
        raise BuildError(f"{where(node)}: Concat on the batch axis is not supported")
    if any(len(s_) != rank or s_[:axis] + s_[axis + 1:] != sample[0][:axis] + sample[0][axis + 1:]
           for s_ in sample):
        raise BuildError(f"{where(node)}: Concat of per-sample shapes {sample} on axis {axis + 1}: the other "
                         "dims differ")
    if len(operands) > onnx_shape.MAX_GATHER_INPUTS and all(isinstance(o, str) for o in operands) and \
            not any(i in cx.expanded_params for i in ins):
        # more tensors than a pass reads (an unrolled recurrent layer's steps): concatenated in pieces first
        pieces = range(0, len(operands), onnx_shape.MAX_GATHER_INPUTS)
        for k in pieces:
            piece, t = operands[k:k + onnx_shape.MAX_GATHER_INPUTS], f"{out}:piece{k}"
            parts, tensors = onnx_shape.concat_parts(where(node), axis, piece, [shapes[o] for o in piece])
            cx.gather(node, t, parts, tensors, name=f"{node.name}:piece{k}")
        operands = [cx.act(f"{out}:piece{k}") for k in pieces]
        sample = [shapes[o] for o in operands]
    if axis == 0 and rank != 2 and not any(isinstance(o, np.ndarray) for o in operands):
        # the first per-sample axis (channels; of flat data: the stored order): its own kernel
        cx.layers.append(Layer("concat", node.name, operands, [out]))
        shapes[out] = (sum(shapes[t][0] for t in operands),) + shapes[operands[0]][1:]
        return True
    # any other axis, or constant operands: a gather of the operands, each padded to its place
    # (a parameter expanded over the batch, a class token, is a part that reads it and trains)
    # (and a constant too big for a kernel, coordinate channels of a big image, is a part reading a frozen texture)
    tokens = {k: cx.param(node, k, source=cx.expanded_params[i]) for k, i in enumerate(ins) if i in cx.expanded_params}
    tokens.update({k: cx.constant(ins[k], o) for k, o in enumerate(operands)
                   if isinstance(o, np.ndarray) and o.size > MAX_CONSTANT_FLOATS and k not in tokens})
    parts, tensors = onnx_shape.concat_parts(where(node), axis, operands, sample,
                                             {k: ("part:" + t, cx.params[t].array) for k, t in tokens.items()})
    cx.gather(node, out, parts, tensors, params={"part:" + t: t for t in tokens.values()})
    return True


@imports("Resize", "Upsample", "Pad")
def resample_layer(cx, s) -> bool:
    node, op, a, ins = s.node, s.op, s.a, s.ins
    if not (op in ("Resize", "Upsample") or (op == "Pad" and resample.pad_mode(a) in ("edge", "reflect"))):
        return False
    x = cx.act(ins[0])
    if any(i and i not in cx.consts for i in ins[1:]):
        raise BuildError(f"{where(node)}: {op} with scales, sizes or pads computed from activations "
                         "is not supported")
    kind, rows, cols, cx.shapes[s.out] = resample.from_onnx(
        where(node), op, a, [cx.consts[i] if i else None for i in ins[1:]], cx.shapes[x])
    cx.layers.append(Layer("resample", node.name, [x], [s.out], {"kind": kind, "rows": rows, "cols": cols}))
    return True


@imports("Transpose", "Squeeze", "Unsqueeze", "Slice", "Pad")
def per_sample_view(cx, s) -> bool:
    node, op, ins = s.node, s.op, s.ins
    x = cx.act(ins[0])
    if any(i and i not in cx.consts for i in ins[1:]):
        raise BuildError(f"{where(node)}: {op} with axes or bounds computed from activations is not supported")
    cx.view(node, x, onnx_shape.view_ops(where(node), op, s.a, [cx.consts[i] if i else None for i in ins[1:]],
                                         cx.shapes[x]))
    return True


@imports("Split")
def split(cx, s) -> bool:
    """One gather layer per output (a slice each), not one layer with several outputs: every IR layer has one
    output tensor (layout, schedule and prune read Layer.outputs[0]), and the gradient of the input is then the
    sum of the slices' gradients, as for any tensor read by several layers. Outputs nothing reads get no layer;
    layer names key the gradient routing, so each has its own."""
    node, ins = s.node, s.ins
    x = cx.act(ins[0])
    sizes = cx.consts.get(ins[1]) if len(ins) > 1 and ins[1] else None
    chains = onnx_shape.split_ops(where(node), s.a, sizes, cx.shapes[x], len(node.output))
    for i, (o, ops) in enumerate(zip(node.output, chains)):
        if o in cx.used:
            cx.view(node, x, ops, o, f"{node.name}:{i}")
    return True


@imports("Flatten", "Reshape")
def flatten_reshape(cx, s) -> bool:
    node, op, a, ins, out, shapes = s.node, s.op, s.a, s.ins, s.out, cx.shapes
    x = cx.act(ins[0])
    if op == "Flatten":
        axis = onnx_shape.axis(where(node), a.get("axis", 1), len(shapes[x]) + 1) + 1
        if axis == 0 or int(np.prod(shapes[x][:axis - 1])) != 1:
            unsupported_attr(node, "axis", a.get("axis"), f"on {[N] + list(shapes[x])} it does not give "
                             "(batch, features)")
    else:
        target = cx.consts.get(ins[1])
        if target is None:
            raise BuildError(f"{where(node)}: the target shape is not a constant")
        new = onnx_shape.reshape_target(where(node), list(np.asarray(target, dtype=object).reshape(-1)),
                                        shapes[x], bool(a.get("allowzero", 0)), cx.batch_dim)
        if len(new) != 1:
            cx.view(node, x, [("reshape", new)])
            return True
    size = int(np.prod(shapes[x]))
    if shapes[x] == (size,):
        cx.alias[out] = x  # already (features,)
        return True
    if len(shapes[x]) == 2:  # tokens (R, F), stored F-packed: a gather into PyTorch's order
        cx.view(node, x, [("reshape", (size,))])
        return True
    cx.layers.append(Layer("flatten", node.name, [x], [out]))
    shapes[out] = (size,)
    return True
