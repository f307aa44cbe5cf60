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

Both kernels are written in the kernel language (codegen/kl.py), the expressions of the declarations turned into
its values by codegen/expr.py (to_kl): the GLSL, the CPU backend's function and the WGSL are printed from them.
A constant operand is a constant array of vec4s (one texel a value).
"""
from __future__ import annotations

import numpy as np

from texelfit.prep.elementwise import derivatives_of, forward_of, leaves
from texelfit.prep.ir import operands
from texelfit.prep.packing import ceil_div, chw
from texelfit.codegen.webgl2.layout import shares_gradient

from .. import kl
from ..expr import to_kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, hsum, is_valid, lane, load, select, splat, uniform
from .common import grad_target, param_grad


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
    return dict(c=out[0], h=out[1], w=out[2], c4=ceil_div(out[0], 4), operands=ops)


def _read(k: kl.KernelDef, c: dict, n, hh, ww, cc) -> list:
    """The operands at output sample n, row hh, column ww, channel texel cc (prep/ir.py: broadcast), as variables
    x0, x1, ...: each read where its broadcast puts it (an axis of size 1 at 0; a single channel splat over the
    lanes); a constant from its array of texels, texel (h * W + w) * C4 + c4 of its (C, H, W)."""
    xs = []
    for i, o in enumerate(c["operands"]):
        oh, ow, oc4 = k.syms(**{f"h{i}": o["h"], f"w{i}": o["w"], f"c4_{i}": o["c4"]})
        r_h, r_w, r_c = (0 if o["bh"] else hh), (0 if o["bw"] else ww), (0 if o["bc"] else cc)
        if o["kind"] == "const":
            v = k.table(o["name"], [tuple(t) for t in o["texels"]])[(r_h * ow + r_w) * oc4 + r_c]
        else:
            v = load(o["name"], (n if o["batched"] else 0) * oh + r_h, r_w * oc4 + r_c)
        xs.append(k.let(f"x{i}", splat(lane(v, 0)) if o["bc"] else v))
    return xs


def _vec4(v):
    return v if v.type == "vec4" else splat(v)


def _forward_kl(layer, c: dict) -> kl.KernelDef:
    """Y = f(x0, x1, ...) at each output texel; padding lanes stay zero (a select: f may be infinite there, log(0)
    say)."""
    k = kl.KernelDef()
    ch, h, c4 = k.syms(c=c["c"], h=c["h"], c4=c["c4"])
    n = k.let("n", ROW // h)
    hh = k.let("hh", ROW - n * h)
    ww = k.let("ww", COL // c4)
    cc = k.let("cc", COL - ww * c4)
    xs = _read(k, c, n, hh, ww, cc)
    k.out(select(is_valid(ch, cc), _vec4(to_kl(forward_of(layer.op, layer.attrs), xs)), 0.0))
    return k


def _grad_kl(layer, c: dict, j: int, reads_y: bool, param: bool) -> kl.KernelDef:
    """d operand j = the sum over its broadcast axes of dY * d_j: its texel (sample tn, row th, column tw, channel
    texel tc) sums over the output positions it was read at, which run over the axes where it is 1 and the output
    is not (and over the batch, for a parameter)."""
    t = c["operands"][j]
    k = kl.KernelDef()
    ch, h, w, c4 = k.syms(c=c["c"], h=c["h"], w=c["w"], c4=c["c4"])
    tch, th_, tc4 = k.syms(t_c=t["c"], t_h=t["h"], t_c4=t["c4"])
    tn = k.let("tn", ROW // th_)
    th = k.let("th", ROW - tn * th_)
    tw = k.let("tw", COL // tc4)
    tc = k.let("tc", COL - tw * tc4)
    acc = k.let("acc", splat(0.0))
    n_range = (tn + 1, tn) if t["batched"] else (uniform("u_batch", "int"), 0)
    with k.loop("n", *n_range) as n, \
            k.loop("hh", *((h, 0) if t["bh"] else (th + 1, th))) as hh, \
            k.loop("ww", *((w, 0) if t["bw"] else (tw + 1, tw))) as ww, \
            k.loop("cc", *((c4, 0) if t["bc"] else (tc + 1, tc))) as cc:
        dy = k.let("dy", load("DY", n * h + hh, ww * c4 + cc))
        y = k.let("y", load("Y", n * h + hh, ww * c4 + cc)) if reads_y else None
        xs = _read(k, c, n, hh, ww, cc)
        d = to_kl(derivatives_of(layer.op, layer.attrs)[j], xs, y)
        # padding lanes give nothing (a select: the derivative may be infinite there)
        g = k.let("g", select(is_valid(ch, cc), dy * d, 0.0))
        if t["bc"]:
            k.set_lane(acc, 0, lane(acc, 0) + hsum(g))
        else:
            k.set(acc, acc + g)
    if not t["bc"]:
        k.set(acc, select(is_valid(tch, tc), acc, 0.0))
    k.out(acc / uniform("u_loss_scale", "float") if param else acc)  # a parameter's gradient came scaled
    return k


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
    k = Kernel(_title(layer, c, "elementwise_forward"), "kl", tuple(names), kl=_forward_kl(layer, c))
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
            target, rows = param_grad(plan, layer, spec["role"]), "full"
        else:
            continue  # a frozen parameter (build --trainable)
        reads_y = "out" in leaves(derivatives_of(layer.op, layer.attrs)[j])
        inputs = ("DY",) + tuple(names) + (("Y",) if reads_y else ())
        uniforms = ("u_batch",) + (("u_loss_scale",) if spec["kind"] == "param" else ())
        k = Kernel(_title(layer, c, f"elementwise_grad d{j}"), "kl", inputs, uniforms=uniforms,
                   kl=_grad_kl(layer, c, j, reads_y, spec["kind"] == "param"))
        passes.append(Pass(k, [plan.grad(y)] + textures + ([plan.tensor(y)] if reads_y else []), [target], rows,
                           layer.name))
    return passes
