"""Elementwise ops (prep/elementwise.py: relu, clip, hardswish, add, mul, prelu, ...), every one of them
through the same two kernels, with ONNX broadcasting of the operands.

forward    elementwise_forward   X0, X1, ...        -> Y        rows: batch
backward   elementwise_grad      DY, X0, .. [, Y]   -> dX_j     rows: batch   (an activation operand j)
                                                   -> dP       rows: full    (a parameter operand: the
                                                                             optimizer includes this kernel)

An operand is an activation (a texture), a parameter (a texture, trainable) or a constant baked into
the source as an array of texels. Each has a per-sample shape (C, H, W) (or (F,) as (F, 1, 1)) whose
axes are the output's or 1; the kernels read operand i at output position (n, h, w, c4) from
(n or 0, h or 0, w or 0, c4 or 0, the lane splat when its C is 1). The gradient of an operand sums
dY * d_j over the axes it was broadcast along (the batch too, for a parameter), inside the fragment
that writes its texel.

The expressions come from the declarations, rendered per language by codegen/expr.py: GLSL into the
kernel's source (`glsl_*` constants, not shipped as JSON), JavaScript into the bundle's ELEMENTWISE
table, keyed by `fn` (the CPU backend's twins call ELEMENTWISE[fn].f and .d[j]).
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.elementwise import derivatives_of, forward_of, leaves
from texelfit.prep.ir import operands
from texelfit.prep.layout import ceil_div, chw, shares_gradient

from ..expr import functions
from ..kernels import Kernel, Pass
from .common import grad_target, lanes


def _operand(o: dict, i: int, out: tuple[int, int, int]) -> dict:
    c, h, w = chw(tuple(o["shape"]))
    d = {"kind": o["kind"], "name": f"K{i}" if o["kind"] == "const" else f"X{i}", "c": c, "h": h, "w": w, "c4": ceil_div(c, 4),
         "batched": o["kind"] == "act", "bc": c == 1 and out[0] > 1, "bh": h == 1 and out[1] > 1,
         "bw": w == 1 and out[2] > 1}
    if o["kind"] == "const":
        values = o["values"]
        if len(o["shape"]) == 2:  # tokens (R, F) are stored (F, R, 1): the values in that order
            values = np.asarray(values).reshape(o["shape"]).T.reshape(-1).tolist()
        c4 = ceil_div(c, 4)
        vals = [0.0] * (h * w * c4 * 4)
        for hh in range(h):
            for ww in range(w):
                for ch in range(c):  # (C, H, W) row-major -> texel (hh * w + ww) * c4 + ch // 4, lane ch % 4
                    vals[((hh * w + ww) * c4 + ch // 4) * 4 + ch % 4] = values[(ch * h + hh) * w + ww]
        d["texels"] = [vals[k:k + 4] for k in range(0, len(vals), 4)]
    return d


def _consts(layer, graph):
    y = layer.outputs[0]
    out = chw(graph.shapes[y])
    ops = [_operand(o, i, out) for i, o in enumerate(operands(layer, graph))]
    f, ds = forward_of(layer.op, layer.attrs), derivatives_of(layer.op, layer.attrs)
    return dict(lanes(out[0]), c=out[0], h=out[1], w=out[2], c4=ceil_div(out[0], 4), operands=ops,
                **functions(f, ds, len(ops)))


def _title(layer, c, what):
    shapes = ",".join(f"{o['c']}x{o['h']}x{o['w']}" if o["kind"] != "const" else f"k{o['c']}x{o['h']}x{o['w']}"
                      for o in c["operands"])
    return f"{what} {layer.op} {shapes}->{c['c']}x{c['h']}x{c['w']}"


def _samplers(layer, graph, plan, c) -> tuple[list[str], list[str]]:
    """(sampler names, textures) of the operands read from textures."""
    names, textures = [], []
    for o, spec in zip(c["operands"], operands(layer, graph)):
        if o["kind"] == "act":
            names.append(o["name"])
            textures.append(plan.tensor(layer.inputs[spec["input"]]))
        elif o["kind"] == "param":
            names.append(o["name"])
            textures.append("param:" + layer.params[spec["role"]])
    return names, textures


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    names, textures = _samplers(layer, graph, plan, c)
    k = Kernel(_title(layer, c, "elementwise_forward"), "elementwise_forward.glsl.j2", tuple(names), consts=c)
    return [Pass(k, textures, [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    c = _consts(layer, graph)
    names, textures = _samplers(layer, graph, plan, c)
    y = layer.outputs[0]
    passes = []
    for j, spec in enumerate(operands(layer, graph)):
        if spec["kind"] == "const":
            continue
        if spec["kind"] == "act":
            if shares_gradient(layer, spec["input"], graph):
                continue  # its gradient is dY itself (layout.py shares the texture)
            target, rows = grad_target(plan, layer, spec["input"]), "batch"
            if not target:
                continue
        elif graph.is_trainable(layer.params[spec["role"]]):
            target, rows = "pgrad:" + layer.params[spec["role"]], "full"
        else:
            continue  # a frozen parameter (build --trainable)
        reads_y = "out" in leaves(derivatives_of(layer.op, layer.attrs)[j])
        inputs = ("DY",) + tuple(names) + (("Y",) if reads_y else ())
        uniforms = ("u_batch",) + (("u_loss_scale",) if spec["kind"] == "param" else ())
        k = Kernel(_title(layer, c, f"elementwise_grad d{j}"), "elementwise_grad.glsl.j2", inputs, uniforms=uniforms,
                   consts=dict(c, j=j, target=c["operands"][j], reads_y=reads_y, param=spec["kind"] == "param"))
        passes.append(Pass(k, [plan.grad(y)] + textures + ([plan.tensor(y)] if reads_y else []), [target], rows,
                           layer.name))
    return passes
