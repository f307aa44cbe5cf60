"""dense: Y = act(X @ W.T + b). W is laid out [ceil4(O) rows, ceil(I/4) texels] (layout.py).

forward        dense_forward      X, W, B        -> Y        rows: batch
  or, split-K  dense_forward      X, W           -> split:Y  rows: batch   (S rows a sample: blocking.split_k)
               dense_reduce       split:Y, B     -> Y        rows: batch
backward       activation_grad    DY, Y          -> DZ       rows: batch   (only with a fused activation:
                                                                        DZ = DY * act'(Y); without, DZ is DY)
               dense_grad_weight  DZ, X          -> dW       rows: full
               dense_grad_bias    DZ             -> db       rows: full
               dense_grad_input   DZ, W          -> dX       rows: batch   (when X needs a gradient)
A sample-blocked layer (webgl2/blocking.py: sample_blocked) also has blocked twins of forward and
grad_input, dense_* blocked (8 samples a fragment, rows: blocks, into blk0..7:T) + interleave
(-> T), and of its weight gradient (samples_last DZ -> DZT, dZ with the samples as channels, then
dense_grad_weight blocked DZT, X, 8 rows a fragment, + interleave -> dW); they run from 8 samples
on (Pass.blocked). In a training step the pass writing dW or db is left out: the optimizer pass
includes its kernel (ops/optim.py).

Every kernel here has a generic kernel written in the kernel language (forward_kl, reduce_kl, grad_input_kl,
grad_weight_kl below; interleave_kl in ops/common.py), which the CPU backend and WGSL print; on WebGL2 the hand
templates (kernels/dense_*.glsl.j2, interleave.glsl.j2: the sample-blocked and split-K fragments) run beside them
as routines (Kernel.routine), and the CPU deals a blocked pass's generic result out as the routine lays it out
(runtime/cpu.js: cpuBlocked). tests/test_kl_dense_backends.py runs both on the same inputs.
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div

from texelfit.prep.elementwise import derivatives_of, forward_of

from .. import kl
from ..expr import to_kl
from ..kernels import Kernel
from ..kl import COL, ROW, dot, lane, load, minimum, splat, uniform, valid
from .common import activation, lanes, weighted_passes


def _consts(layer, graph):
    i, o = graph.shapes[layer.inputs[0]][0], graph.shapes[layer.outputs[0]][0]
    return dict(activation(layer), **lanes(o), in_features=i, out_features=o, in4=ceil_div(i, 4),
                out4=ceil_div(o, 4), has_bias="bias" in layer.params)


def _title(c, what):
    act = "" if c["act"] == "none" else f" {c['act']}"
    return f"{what} {c['in_features']}->{c['out_features']}{act}"


# dense_grad_weight and dense_grad_bias read their sizes from the textures: one program for all layers
_GENERIC = ("grad_weight",)


def _grad_bias_kl() -> kl.KernelDef:
    """db[o] = sum_n dZ[n, o], in the kernel language: texel o4 of db sums column o4 of dZ's batch rows."""
    k = kl.KernelDef()
    acc = k.let("acc", splat(0.0))
    with k.loop("n", uniform("u_batch", "int")) as n:
        k.set(acc, acc + load("DZ", n, COL))
    k.out(acc / uniform("u_loss_scale", "float"))  # the loss gradient came scaled (kernels.py: u_loss_scale)
    return k


def _grad_bias(c) -> Kernel:
    return Kernel("dense_grad_bias", "kl", ("DZ",), uniforms=("u_batch", "u_loss_scale"), kl=_grad_bias_kl())


def _activate(z: kl.X, act: str, attrs: dict) -> kl.X:
    """act(z) of a fused activation (a vec4; "none": z)."""
    if act == "none":
        return z
    a = to_kl(forward_of(act, attrs), [z])
    return a if a.type == "vec4" else splat(a)


def _grad_of(y: kl.X, act: str, attrs: dict) -> kl.X:
    """act'(Z) written in the output y = act(Z) (a vec4), as activation_grad (ops/common.py) has it."""
    d = to_kl(derivatives_of(act, attrs)[0], [], y)
    return d if d.type == "vec4" else splat(d)


def forward_kl(c: dict, act: str = "none", attrs: dict | None = None) -> kl.KernelDef:
    """The generic dense forward, a texel the 4 outputs o = 4*COL .. 4*COL+3 of a sample ROW:
    Y[n, o] = act(sum_i X[n, i] * W[o, i] + b[o]), padding lanes zero. Split-K (c["split"] = S parts of
    c["chunk"] input texels each, blocking.split_k): row S*n + s of the output holds sample n's sums over input texels
    [chunk*s, chunk*s + chunk), without bias or activation (reduce_kl adds them). The WebGL2 routine is
    kernels/dense_forward.glsl.j2 (8 samples a fragment when blocked); the CPU runs this over all samples."""
    k = kl.KernelDef()
    in4 = k.sym("in4", c["in4"])
    if c.get("split"):
        split, chunk = k.syms(split=c["split"], chunk=c["chunk"])
        n = k.let("n", ROW // split)
        i0 = k.let("i0", ROW % split * chunk)
        start, stop, acc = i0, minimum(i0 + chunk, in4), k.let("acc", splat(0.0))
    else:
        n, start, stop = ROW, 0, in4
        acc = k.let("acc", load("B", 0, COL) if c["has_bias"] else splat(0.0))
    with k.loop("i4", stop, start) as i4:
        x = k.let("x", load("X", n, i4))
        with k.loop("j", 4) as j:  # output 4*COL + j: x times that row of W (the GLSL's x * mat4(getW(o, i4), ...))
            k.set_lane(acc, j, lane(acc, j) + dot(x, load("W", 4 * COL + j, i4)))
    if c.get("split"):
        k.out(acc)
    else:
        k.out(_activate(acc, act, attrs or {}) * valid(k.sym("out_features", c["out_features"]), COL))
    return k


def reduce_kl(c: dict, act: str = "none", attrs: dict | None = None) -> kl.KernelDef:
    """Y[n, o] = act(sum_s P[S*n + s, o] + b[o]): the sum of a split-K forward's partial sums (S = c["split"])."""
    k = kl.KernelDef()
    split = k.sym("split", c["split"])
    acc = k.let("acc", load("B", 0, COL) if c["has_bias"] else splat(0.0))
    with k.loop("s", split) as s:
        k.set(acc, acc + load("P", split * ROW + s, COL))
    k.out(_activate(acc, act, attrs or {}) * valid(k.sym("out_features", c["out_features"]), COL))
    return k


def grad_input_kl(c: dict, dact: tuple[str, dict] | None = None) -> kl.KernelDef:
    """dX[n, i] = sum_o dZ[n, o] * W[o, i], a texel the 4 inputs i = 4*COL .. 4*COL+3 of sample ROW; with `dact`
    (the activation of the layer before and its attributes: layout.py act_grad_fused) times its derivative in
    Y = act(Z) of that layer, the kernel's input Y (this texel of it): dZ of that layer."""
    k = kl.KernelDef()
    acc = k.let("acc", splat(0.0))
    with k.loop("o4", k.sym("out4", c["out4"])) as o4:
        with k.loop("j", 4) as j:  # output 4*o4 + j: row 4*o4 + j of W times its dZ (the GLSL's mat4(...) * dZ)
            k.set(acc, acc + load("W", 4 * o4 + j, COL) * lane(load("DZ", ROW, o4), j))
    k.out(acc * _grad_of(k.let("y", load("Y", ROW, COL)), *dact) if dact else acc)
    return k


def grad_weight_kl(transposed: bool = False) -> kl.KernelDef:
    """dW[o, i] = sum over the u_batch samples n of dZ[n, o] * X[n, i], a texel the 4 inputs i = 4*COL ..
    4*COL+3 of row o = ROW (every row of dW: a padded row's dZ lanes are zero); dZ read as it is (lane o % 4 of
    texel (n, o / 4)) or, `transposed`, with the samples as channels (samples_last: lane n % 4 of texel
    (o, n / 4)), as the blocked routine reads it. The loss gradient came scaled (u_loss_scale)."""
    k = kl.KernelDef()
    acc = k.let("acc", splat(0.0))
    with k.loop("n", uniform("u_batch", "int")) as n:
        if transposed:
            d = lane(load("DZT", ROW, n // 4), n % 4)
        else:
            d = lane(load("DZ", n, ROW // 4), ROW % 4)
        k.set(acc, acc + load("X", n, COL) * d)
    k.out(acc / uniform("u_loss_scale", "float"))
    return k


def _generic(layer, plan):
    """The generic kernel (the kernel language) of each dense kernel weighted_passes declares, by what it computes
    and its constants: the CPU backend's and WGSL's; WebGL2 runs the hand template beside it (Kernel.routine)."""
    act, attrs = layer.attrs.get("act", "none"), layer.attrs.get("act_attrs", {})

    def of(what: str, c: dict):
        if what == "forward":
            return forward_kl(c, act, attrs)
        if what == "reduce":
            return reduce_kl(c, act, attrs)
        if what == "grad_input":
            return grad_input_kl(c, plan.act_grad_fused[layer.inputs[0]] if c.get("dact") else None)
        if what == "grad_weight":
            return grad_weight_kl(bool(c.get("blocked")))
        return None
    return of


def forward(layer, graph, plan):
    return weighted_passes(layer, plan, "dense", _consts(layer, graph), _title, _grad_bias, _GENERIC,
                           _generic(layer, plan))[0]


def backward(layer, graph, plan):
    return weighted_passes(layer, plan, "dense", _consts(layer, graph), _title, _grad_bias, _GENERIC,
                           _generic(layer, plan))[1]
