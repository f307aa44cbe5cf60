"""conv_transpose: Y = act(conv_transpose2d(X, W) + b), any kernel, stride, padding, output_padding,
dilation, groups. Its three products are a conv's, with the roles of X and Y swapped: a transposed conv
is the input gradient of the conv `C` that maps a tensor of Y's shape to one of X's with the same
weight (W[IC, OCg, KH, KW] is C's [OC, ICg, KH, KW], laid out as a conv weight: layout.py). So it runs
the conv kernels on C's constants (`_as_conv`):

forward        conv_transpose_forward   X (C's dZ), W, B  -> Y   rows: batch   (conv_grad_input with the bias and activation:
                                                                              transposed_forward)
backward       activation_grad    DY, Y              -> DZ      rows: batch   (only with a fused activation)
               samples_last       DZ                 -> DZT     rows: full    (dZ with the samples as channels)
               conv_grad_weight   X (C's dZ), DZT    -> dW      rows: full    (C's weight gradient, dZ as its X)
               conv_grad_bias     DZ                 -> db      rows: full
               conv_grad_input... conv_forward       DZ, W              -> dX      rows: batch   (C itself)

The pads (the rows and columns cut from the full output) are C's pads; output_padding only makes the
output larger, which C's output size absorbs. No sample-blocked twins (webgl2/blocking.py: sample_blocked). The GLSL templates are WebGL2 routines beside the generic
kernels of ops/conv_kl.py (Kernel.routine), which the CPU backend and WGSL run.
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div

from ..kernels import Kernel, Pass
from .common import activation_grad, fused_activation, grad_target, lanes, param_grad, samples_last_pass
from .conv import grad_bias
from .conv_kl import forward_kl, grad_input_kl, grad_weight_kl


def _as_conv(layer, graph) -> dict:
    """The constants of the conv kernels for C (see above): input Y's shape, output X's."""
    ic, ih, iw = graph.shapes[layer.outputs[0]]  # C's input
    oc, oh, ow = graph.shapes[layer.inputs[0]]  # C's output
    a = layer.attrs
    g = a["groups"]
    (kh, kw), (sh, sw), (pt, pl, _, _), (dh, dw) = a["kernel"], a["strides"], a["pads"], a["dilations"]
    return dict(fused_activation("none", {}), **lanes(oc), ic=ic, ih=ih, iw=iw, oc=oc, oh=oh, ow=ow,
                ic4=ceil_div(ic, 4), oc4=ceil_div(oc, 4), kh=kh, kw=kw, sh=sh, sw=sw, pt=pt, pl=pl, dh=dh, dw=dw,
                groups=g, icg=ic // g, ocg=oc // g, depthwise=g == ic == oc, has_bias=False, blocked=False)


def _title(layer, graph, what: str) -> str:
    (c, h, w), (oc, oh, ow) = graph.shapes[layer.inputs[0]], graph.shapes[layer.outputs[0]]
    a = layer.attrs
    act = layer.attrs.get("act", "none")
    return (f"conv_transpose {what} {c}x{h}x{w}->{oc}x{oh}x{ow} k{a['kernel'][0]}x{a['kernel'][1]} "
            f"s{a['strides'][0]}x{a['strides'][1]} g{a['groups']}" + ("" if act == "none" else f" {act}"))


def forward(layer, graph, plan):
    c = _as_conv(layer, graph)
    act = fused_activation(layer.attrs.get("act", "none"), layer.attrs.get("act_attrs", {}))
    has_bias = "bias" in layer.params
    k = Kernel(_title(layer, graph, "forward"), "conv_transpose_forward.glsl.j2", ("DZ", "W") + (("B",) if has_bias else ()),
               consts=dict(c, **act, transposed_forward=True, add_bias=has_bias),
               kl=grad_input_kl(c, has_bias, layer.attrs.get("act", "none"), layer.attrs.get("act_attrs", {})))
    inputs = [plan.tensor(layer.inputs[0]), "param:" + layer.params["weight"]]
    return [Pass(k, inputs + (["param:" + layer.params["bias"]] if has_bias else []), [plan.tensor(layer.outputs[0])],
                 "batch", layer.name)]


def backward(layer, graph, plan):
    y = layer.outputs[0]
    if y not in plan.needs_grad:
        return []
    c = _as_conv(layer, graph)
    out, x, w = [], plan.tensor(layer.inputs[0]), "param:" + layer.params["weight"]
    dz = plan.grad(y)
    act = layer.attrs.get("act", "none")
    if act != "none":
        if y not in plan.act_grad_fused:
            k = activation_grad(act, layer.attrs.get("act_attrs", {}))
            out.append(Pass(k, [dz, plan.tensor(y)], ["dz:" + y], "batch", layer.name))
        dz = "dz:" + y
    weight = layer.params["weight"]
    if "pgrad:" + weight in plan.textures:
        out.append(samples_last_pass(plan, dz, "dzt:" + y, layer.name))
        nb4 = plan.textures["dzt:" + y].packing.c4
        out.append(Pass(Kernel(_title(layer, graph, "grad_weight"), "conv_grad_weight.glsl.j2", ("DZ", "XT"),
                               uniforms=("u_batch", "u_loss_scale"), consts=dict(c, nb4=nb4),
                               kl=grad_weight_kl(dict(c, nb4=nb4))),
                        [x, "dzt:" + y], [param_grad(plan, layer, "weight")], "full", layer.name))
    bias = layer.params.get("bias")
    if bias and "pgrad:" + bias in plan.textures:
        oc, oh, ow = graph.shapes[y]
        out.append(Pass(grad_bias(oc, oh, ow), [dz], [param_grad(plan, layer, "bias")], "full", layer.name))
    target = grad_target(plan, layer, 0)
    if target:
        assert layer.inputs[0] not in plan.act_grad_fused  # only for a dense consumer (layout.py)
        out.append(Pass(Kernel(_title(layer, graph, "grad_input"), "conv_forward.glsl.j2", ("X", "W"), consts=c,
                               kl=forward_kl(c)),
                        [dz, w], [target], "batch", layer.name))
    return out
