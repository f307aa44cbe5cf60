"""conv: Y = act(conv2d(X, W, b)), any kernel, stride, padding (t, l, b, r), dilation, groups.
W[OC, ICg, KH, KW] is laid out [ceil4(OC) rows, KH*KW*ceil(ICg/4) texels] (layout.py).

forward        conv_forward       X, W, B        -> Y        rows: batch
backward       conv_grad_weight   DY, Y, X       -> dW       rows: full
               conv_grad_bias     DY, Y          -> db       rows: full
               conv_grad_input    DY, Y, W       -> dX       rows: batch   (when X needs a gradient)
groups == 1 runs 4x4 channel blocks per fetch; grouped and depthwise convs run per lane.
"""
from __future__ import annotations

from texelfit.prep.layout import ceil_div

from ..kernels import Kernel, Pass
from .common import activation, grad_target, lanes


def _consts(layer, graph):
    ic, ih, iw = graph.shapes[layer.inputs[0]]
    oc, oh, ow = graph.shapes[layer.outputs[0]]
    a = layer.attrs
    g = a["groups"]
    (kh, kw), (sh, sw), (pt, pl, _, _), (dh, dw) = a["kernel"], a["strides"], a["pads"], a["dilations"]
    return dict(activation(layer), **lanes(oc), ic=ic, ih=ih, iw=iw, oc=oc, oh=oh, ow=ow, ic4=ceil_div(ic, 4),
                oc4=ceil_div(oc, 4), kh=kh, kw=kw, sh=sh, sw=sw, pt=pt, pl=pl, dh=dh, dw=dw, groups=g,
                icg=ic // g, ocg=oc // g, icg4=ceil_div(ic // g, 4), has_bias="bias" in layer.params)


def _title(c, what):
    act = "" if c["act"] == "none" else f" {c['act']}"
    return (f"{what} {c['ic']}x{c['ih']}x{c['iw']}->{c['oc']}x{c['oh']}x{c['ow']} k{c['kh']}x{c['kw']} "
            f"s{c['sh']}x{c['sw']} g{c['groups']}{act}")


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    inputs = ["X", "W"] + (["B"] if c["has_bias"] else [])
    textures = [plan.tensor(layer.inputs[0]), "param:" + layer.params["weight"]]
    if c["has_bias"]:
        textures.append("param:" + layer.params["bias"])
    k = Kernel(_title(c, "conv_forward"), "conv_forward.glsl.j2", tuple(inputs), consts=c)
    return [Pass(k, textures, [plan.tensor(layer.outputs[0])], "batch", layer.name)]


def backward(layer, graph, plan):
    c = _consts(layer, graph)
    x, y = layer.inputs[0], layer.outputs[0]
    dy, ty, tx = plan.grad(y), plan.tensor(y), plan.tensor(x)
    w = layer.params["weight"]
    passes = [Pass(Kernel(_title(c, "conv_grad_weight"), "conv_grad_weight.glsl.j2", ("DY", "Y", "X"),
                          uniforms=("u_batch",), consts=c), [dy, ty, tx], ["pgrad:" + w], "full", layer.name)]
    if c["has_bias"]:
        passes.append(Pass(Kernel(_title(c, "conv_grad_bias"), "conv_grad_bias.glsl.j2", ("DY", "Y"),
                                  uniforms=("u_batch",), consts=c),
                           [dy, ty], ["pgrad:" + layer.params["bias"]], "full", layer.name))
    target = grad_target(plan, layer, 0)
    if target:
        passes.append(Pass(Kernel(_title(c, "conv_grad_input"), "conv_grad_input.glsl.j2", ("DY", "Y", "W"),
                                  consts=c), [dy, ty, "param:" + w], [target], "batch", layer.name))
    return passes
