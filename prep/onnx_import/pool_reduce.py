"""Import rules of pools (MaxPool, AveragePool: 2-D windows) and reductions (GlobalAveragePool, ReduceMean,
ReduceSum, ReduceMax, and ReduceL2 as sqrt(ReduceSum(x ** 2)))."""
from __future__ import annotations

import numpy as np

from ..errors import BuildError
from ..ir import Layer
from .common import pool_out, unsupported_attr, where, window
from .registry import imports


@imports("MaxPool", "AveragePool")
def pool(cx, s) -> bool:
    node, op, a, shapes = s.node, s.op, s.a, cx.shapes
    x = cx.act(s.ins[0])
    if len(shapes[x]) != 3:
        raise BuildError(f"{where(node)}: {op} needs a (C, H, W) input, got {shapes[x]}")
    if len(node.output) > 1 and node.output[1]:
        raise BuildError(f"{where(node)}: MaxPool with an indices output is not supported")
    if a.get("storage_order", 0):
        unsupported_attr(node, "storage_order", a["storage_order"], "only 0 is supported")
    kernel, strides, pads, _ = window(node, a, shapes[x], a["kernel_shape"], allow_dilation=False)
    ceil_mode = bool(a.get("ceil_mode", 0))
    c, h, w_ = shapes[x]
    oh = pool_out(h, kernel[0], strides[0], pads[0], pads[2], 1, ceil_mode)
    ow = pool_out(w_, kernel[1], strides[1], pads[1], pads[3], 1, ceil_mode)
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "ceil_mode": ceil_mode}
    if op == "AveragePool":
        attrs["count_include_pad"] = bool(a.get("count_include_pad", 0))
    cx.layers.append(Layer("maxpool" if op == "MaxPool" else "avgpool", node.name, [x], [s.out], attrs))
    shapes[s.out] = (c, oh, ow)
    return True


@imports("GlobalAveragePool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2")
def reduce(cx, s) -> bool:
    node, op, a, ins, out, shapes, layers = s.node, s.op, s.a, s.ins, s.out, cx.shapes, cx.layers
    x = cx.act(ins[0])
    rank = len(shapes[x]) + 1
    final = out
    if op == "ReduceL2":  # sqrt(ReduceSum(x ** 2)): F.normalize's norm, in three declared ops
        layers.append(Layer("pow", f"{node.name}:square", [x], [f"{out}:square"], {"exponent": 2.0}))
        shapes[f"{out}:square"] = shapes[x]
        x, out = f"{out}:square", f"{out}:sumsq"
    if op == "GlobalAveragePool":  # every axis after the channels (nn.AdaptiveAvgPool1d(1) of [N, C, L]: one)
        axes = list(range(2, rank))
    else:
        axes = a.get("axes")
        if axes is None and len(ins) > 1 and ins[1]:
            axes = np.asarray(cx.consts.get(ins[1])).reshape(-1).tolist()
        if not axes and a.get("noop_with_empty_axes", 0):
            cx.alias[out] = x
            return True
        axes = sorted({int(v) % rank for v in axes}) if axes else list(range(rank))
    if 0 in axes:
        unsupported_attr(node, "axes", axes, "a reduction over the batch axis is not supported")
    keep = bool(a.get("keepdims", 1)) or op == "GlobalAveragePool"
    if op in ("GlobalAveragePool", "ReduceMean") and rank == 4 and axes == [2, 3]:
        layers.append(Layer("global_avgpool", node.name, [x], [out], {"keepdims": keep}))
    else:
        layers.append(Layer("reduce", node.name, [x], [out],
                            {"kind": "sum" if op == "ReduceL2" else "mean" if op == "GlobalAveragePool" else
                             op[len("Reduce"):].lower(),
                             "axes": [v - 1 for v in axes],
                             "keepdims": keep}))
    kept = [d if i + 1 not in axes else 1 for i, d in enumerate(shapes[x])]
    shapes[out] = tuple(kept) if keep else tuple(d for i, d in enumerate(shapes[x]) if i + 1 not in axes)
    if not shapes[out]:
        shapes[out] = (1,)
    if final != out:
        layers.append(Layer("sqrt", f"{node.name}:sqrt", [out], [final]))
        shapes[final] = shapes[out]
    return True
