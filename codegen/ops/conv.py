"""conv: Y = act(conv2d(X, W, b)), any kernel, stride, padding (t, l, b, r), dilation, groups.
W[OC, ICg, KH, KW] is laid out [KH*ICg rows, KW*ceil(OC/4) texels]: 4 output channels a texel (layout.py).

forward        conv_forward       X, W, B        -> Y        rows: batch
backward       activation_grad    DY, Y          -> DZ       rows: batch   (only with a fused activation:
                                                                        DZ = DY * act'(Y); without, DZ is DY)
               samples_last       X              -> XT       rows: full    (X with the samples as channels)
               conv_grad_weight   DZ, XT         -> dW       rows: full
               conv_grad_bias     DZ             -> db       rows: full
               conv_grad_input    DZ, W          -> dX       rows: batch   (when X needs a gradient)
groups == 1 runs 4x4 channel blocks per fetch, depthwise convs 4 channels a fetch; other grouped
convs run per lane. Those GLSL templates are WebGL2 routines (Kernel.routine): beside each is its generic kernel in
the kernel language (ops/conv_kl.py), which the CPU backend and WGSL run; interleave_cols is written in the language
alone.
A sample-blocked layer (webgl2/blocking.py: sample_blocked) also has blocked twins of forward and
grad_input, conv_* blocked (8 samples a fragment, rows: blocks, into blk0..7:T) + interleave
(-> T), and of its weight gradient (8 rows a fragment + interleave -> dW); they run from 8 samples
on (Pass.blocked). In a training step the pass writing dW or db is left out: the optimizer pass
includes its kernel (ops/optim.py).
A column-blocked layer (webgl2/blocking.py: column_blocked) has the forward conv_forward columns (4 positions
and 2 halves of the channel texels a fragment, into col0..7:Y; where the device draws fewer than 8
targets, conv_forward columns half 0 and half 1, into col0..3 and col4..7: Pass.wide) + interleave_cols
(-> Y), at every batch; where only such convs read Y (webgl2/blocking.py: column_only) there is no interleave,
and they read the parts X0..7 themselves.
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div

from .. import kl
from . import conv_vec
from ..kernels import Kernel
from ..kl import COL, load, splat, uniform
from .common import activation, lanes, weighted_passes
from .conv_kl import forward_kl, grad_input_kl, grad_weight_kl


def _consts(layer, graph):
    ic, ih, iw = graph.shapes[layer.inputs[0]]
    oc, oh, ow = graph.shapes[layer.outputs[0]]
    a = layer.attrs
    g = a["groups"]
    (kh, kw), (sh, sw), (pt, pl, _, _), (dh, dw) = a["kernel"], a["strides"], a["pads"], a["dilations"]
    return dict(activation(layer), **lanes(oc), ic=ic, ih=ih, iw=iw, oc=oc, oh=oh, ow=ow, ic4=ceil_div(ic, 4),
                oc4=ceil_div(oc, 4), kh=kh, kw=kw, sh=sh, sw=sw, pt=pt, pl=pl, dh=dh, dw=dw, groups=g,
                icg=ic // g, ocg=oc // g, depthwise=g == ic == oc, has_bias="bias" in layer.params)


def _title(c, what):
    act = "" if c["act"] == "none" else f" {c['act']}"
    return (f"{what} {c['ic']}x{c['ih']}x{c['iw']}->{c['oc']}x{c['oh']}x{c['ow']} k{c['kh']}x{c['kw']} "
            f"s{c['sh']}x{c['sw']} g{c['groups']}{act}")


def _grad_bias_kl(oh: int, ow: int, oc4: int) -> kl.KernelDef:
    """db[oc] = sum_{n, oh, ow} dZ[n, oc, oh, ow], in the kernel language: texel oc4 of db sums texel oc4 of every
    position of dZ's batch rows."""
    k = kl.KernelDef()
    oh, ow, oc4 = k.syms(oh=oh, ow=ow, oc4=oc4)
    acc = k.let("acc", splat(0.0))
    with k.loop("r", uniform("u_batch", "int") * oh) as r, k.loop("x", ow) as x:
        k.set(acc, acc + load("DZ", r, x * oc4 + COL))
    k.out(acc / uniform("u_loss_scale", "float"))  # the loss gradient came scaled (kernels.py: u_loss_scale)
    return k


def grad_bias(oc: int, oh: int, ow: int) -> Kernel:
    """The bias gradient of a conv (or conv_transpose) with output (oc, oh, ow)."""
    return Kernel(f"conv_grad_bias {oc}x{oh}x{ow}", "kl", ("DZ",), uniforms=("u_batch", "u_loss_scale"),
                  kl=_grad_bias_kl(oh, ow, ceil_div(oc, 4)))


def _grad_bias(c) -> Kernel:
    return grad_bias(c["oc"], c["oh"], c["ow"])


def _generic(layer):
    """The generic kernel (ops/conv_kl.py) beside each hand-written GLSL template of the layer, a WebGL2 routine
    (Kernel.routine): what the CPU backend and WGSL run."""
    def of(what: str, c: dict) -> kl.KernelDef:
        if what == "forward":
            return forward_kl(c, c["act"], layer.attrs.get("act_attrs", {}))
        if what == "grad_weight":
            return grad_weight_kl(c)
        assert what == "grad_input" and not c.get("dact"), what  # (only a dense consumer fuses act': layout.py)
        return grad_input_kl(c)
    return of


def _vectorised(layer):
    """WebGPU's kernel in place of each generic one, as Kernel fields (ops/conv_vec.py), for a conv of groups 1 or a
    depthwise one: the forward and the input gradient conv_vec.ROWS rows an invocation, written in place
    (Kernel.scatter), of groups 1 several texels of each (conv_vec.wgsl_cols: Kernel.cols); the weight gradient
    split into partial sums where it has few texels (Kernel.split). None for a WebGL2 blocked twin's (WebGPU runs
    the one-sample pass)."""
    def of(what: str, c: dict) -> dict:
        if not conv_vec.applies(c) or c.get("blocked"):
            return {}
        if what == "forward":
            act, cols = layer.attrs.get("act_attrs", {}), conv_vec.wgsl_cols(c, "oc4")
            return {"wgsl_kl": conv_vec.forward_vec_kl(c, c["act"], act, conv_vec.ROWS, cols), "scatter": conv_vec.ROWS,
                    "cols": cols}
        if what == "grad_input":
            cols = conv_vec.wgsl_cols(c, "ic4")
            return {"wgsl_kl": conv_vec.grad_input_vec_kl(c, conv_vec.ROWS, cols), "scatter": conv_vec.ROWS,
                    "cols": cols}
        split, chans = conv_vec.split_of(c), conv_vec.chans_of(c)
        return {"wgsl_kl": conv_vec.grad_weight_vec_kl(c, split, chans), "scatter": chans if chans > 1 else 0,
                "split": (split, conv_vec.split_sum_kl(split, c["kh"] * c["icg"])) if split > 1 else ()}
    return of


def _passes(layer, graph, plan):
    return weighted_passes(layer, plan, "conv", _consts(layer, graph), _title, _grad_bias, generic_kl=_generic(layer),
                           vec_kl=_vectorised(layer))


def forward(layer, graph, plan):
    return _passes(layer, graph, plan)[0]


def backward(layer, graph, plan):
    return _passes(layer, graph, plan)[1]
