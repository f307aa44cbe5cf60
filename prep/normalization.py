"""InstanceNormalization (nn.GroupNorm, nn.InstanceNorm1d/2d) lowered into the ops the IR has (prep/lower.py:
LOWERINGS).

    y = (x - mean) / sqrt(var + eps) * scale + bias,   mean and var over the axes after the channel axis,
                                                       per sample and channel; scale and bias per channel

becomes ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div (and a Mul and an Add by the scale and bias, each
unsqueezed to [C, 1, ...]), so its forward and every gradient are those of ops already checked against PyTorch,
with nothing written twice. PyTorch's exports:

    nn.GroupNorm(G, C)        Reshape [N, G, -1], InstanceNormalization with a constant scale of ones and bias of
                              zeros [G], Reshape back, Mul by weight [C, 1, 1], Add bias [C, 1, 1] (the
                              parameters are read by those: trainable elementwise operands)
    nn.InstanceNorm2d(C)      InstanceNormalization with scale and bias [C]: the parameters `norm.weight`,
                              `norm.bias` when affine, else constants (ones, zeros)

A constant scale of ones and bias of zeros (what the exporter makes, not a parameter) is left out; a parameter is
always applied, whatever its values (a fresh one is ones and zeros too, and must train).
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from .errors import BuildError
from .lower import LOWERINGS


def instance_normalization(node, ctx) -> list:
    x, scale, bias = node.input[0], node.input[1], node.input[2]
    shape = ctx.shape(x)
    if shape is None or len(shape) < 3:
        raise BuildError(f"InstanceNormalization node {node.name!r}: needs an input [N, C, ...] of rank 3 or more, "
                         f"got {shape}")
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    axes = list(range(2, len(shape)))
    n = node.name or node.output[0]

    def t(hint):
        return ctx.fresh(f"{n}/{hint}")

    def reduce_mean(src, out):
        if ctx.opset >= 18:
            return helper.make_node("ReduceMean", [src, ctx.initializer(f"{n}/axes", np.array(axes, np.int64))], [out],
                                    name=out, keepdims=1)
        return helper.make_node("ReduceMean", [src], [out], name=out, axes=axes, keepdims=1)

    mean, d, sq, var, ve, std = (t(h) for h in ("mean", "centred", "square", "var", "var_eps", "std"))
    nodes = [reduce_mean(x, mean),
             helper.make_node("Sub", [x, mean], [d], name=d),
             helper.make_node("Mul", [d, d], [sq], name=sq),
             reduce_mean(sq, var),
             helper.make_node("Add", [var, ctx.initializer(f"{n}/eps", np.array(eps, np.float32))], [ve], name=ve),
             helper.make_node("Sqrt", [ve], [std], name=std)]
    y = node.output[0]
    steps = [(op, p) for op, p, skip in (("Mul", scale, 1.0), ("Add", bias, 0.0)) if not _leaves_out(ctx, p, skip)]
    last = y if not steps else t("normalized")
    nodes.append(helper.make_node("Div", [d, std], [last], name=last))
    per_channel = np.arange(1, len(shape) - 1, dtype=np.int64)  # [C] -> [C, 1, ...] against [N, C, ...]
    for k, (op, p) in enumerate(steps):
        u = t(f"{op.lower()}_operand")
        nodes.append(helper.make_node("Unsqueeze", [p, ctx.initializer(f"{n}/channel_axes", per_channel)], [u], name=u))
        out = y if k == len(steps) - 1 else t("scaled")
        nodes.append(helper.make_node(op, [last, u], [out], name=out))
        last = out
    return nodes


def _leaves_out(ctx, name: str, identity: float) -> bool:
    """Whether the scale (identity 1) or bias (identity 0) `name` can be left out: a constant of the exporter's
    that changes nothing, never a parameter."""
    if ctx.is_parameter(name):
        return False
    value = ctx.const(name)
    return value is not None and bool(np.all(np.asarray(value) == identity))


LOWERINGS["InstanceNormalization"] = instance_normalization
