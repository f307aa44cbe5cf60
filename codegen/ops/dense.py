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

import contextlib

from texelfit.prep.packing import ceil_div

from texelfit.prep.elementwise import derivatives_of, forward_of

from .. import kl
from ..expr import to_kl
from ..kernels import Kernel
from ..kl import COL, ROW, dot, lane, load, minimum, splat, uniform, valid, vec4_of
from .common import activation, batch_outs, lanes, weighted_passes


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


# ---- WebGPU's vectorised kernels (Kernel.wgsl_kl), each computing what its generic kernel above computes
# (tests/test_kl_dense_backends.py runs both, printed as JavaScript, on odd shapes): the generic ones fetch a texel of
# W for every 4 multiply-adds; these fetch 4 texels of W once for ROWS samples (the forward and grad_input) or a
# texel of dZ once for 4 rows of dW (grad_weight), as WebGL2's sample-blocked routines do.

ROWS = 8  # the samples an invocation of WebGPU's forward and grad_input computes
# ... and the output texels of each its forward computes, where they divide out4 (each texel of X fetched serving them):
# bench/run.py's MLP (784 -> 128, batch 64, SGD) on SwiftShader 8.62 -> 7.81 ms a step with 2, 9.37 with 4 (64
# invocations: one workgroup, one thread)
FORWARD_COLS = 2


def _samples(k: kl.KernelDef, block: int) -> list[kl.X]:
    """The sample each of the `block` outputs of an invocation is (block*ROW + t), clamped into the batch's (a block
    past it reads the last sample; batch_outs writes none of its rows)."""
    if block == 1:
        return [ROW]
    last = k.let("last", uniform("u_batch", "int") - 1)
    return [k.let(f"n{t}", minimum(block * ROW + t, last)) for t in range(block)]


def _loop(k: kl.KernelDef, block: int, name: str, stop, step) -> None:
    """The loop `name` over [0, stop) of `step(i, live, suffix)` (suffix: of the names it lets), `live(t)` a block
    over the statements of output t: where the invocation's `block` samples are all the batch's, every output's
    statements run; in the block past them (a small batch's), those of its samples only (not `block` copies of the
    last), each behind a branch (which, in every block, would cost SwiftShader's forward at batch 64 half again)."""
    if block == 1:
        with k.loop(name, stop) as i:
            step(i, lambda t: contextlib.nullcontext(), "")
        return
    batch = uniform("u_batch", "int")
    with k.when(block * ROW + block - 1 < batch):
        with k.loop(name, stop) as i:
            step(i, lambda t: contextlib.nullcontext(), "")
    with k.when(block * ROW + block - 1 >= batch):
        with k.loop(name + "b", stop) as i:
            step(i, lambda t: k.when(block * ROW + t < batch) if t else contextlib.nullcontext(), "b")


def forward_vec_kl(c: dict, act: str = "none", attrs: dict | None = None, block: int = ROWS,
                   cols: int = 1) -> kl.KernelDef:
    """forward_kl (not split), `block` samples an invocation (output t: sample block*ROW + t), each of the 4 texels
    of W a step fetched serving all of them; with `cols`, that many output texels of each (output t * cols + j: texel
    cols*COL + j), each texel of X fetched serving them all. Inputs X, W (, B)."""
    k = kl.KernelDef()
    ns = _samples(k, block)
    cs = [COL] if cols == 1 else [k.let(f"c{j}", cols * COL + j) for j in range(cols)]  # the output texels
    sfc = [f"_{j}" if cols > 1 else "" for j in range(cols)]
    acc = [[k.let(f"acc{t}{sfc[j]}", load("B", 0, cj) if c["has_bias"] else splat(0.0)) for j, cj in enumerate(cs)]
           for t in range(block)]

    def step(i4, live, sfx):
        # outputs 4*cs[j] + i, of texel i4
        w = [[k.let(f"w{i}{sfx}{sfc[j]}", load("W", 4 * cj + i, i4)) for i in range(4)] for j, cj in enumerate(cs)]
        for t, n in enumerate(ns):
            with live(t):
                x = k.let(f"x{t}{sfx}", load("X", n, i4))
                for j in range(cols):
                    k.set(acc[t][j], acc[t][j] + vec4_of(*(dot(x, w[j][i]) for i in range(4))))
    _loop(k, block, "i4", k.sym("in4", c["in4"]), step)
    out_features = k.sym("out_features", c["out_features"])
    batch_outs(k, block, 1, [_activate(a, act, attrs or {}) * valid(out_features, cs[j]) for row in acc
                             for j, a in enumerate(row)], cols)
    return k


def grad_input_vec_kl(c: dict, dact: tuple[str, dict] | None = None, block: int = ROWS) -> kl.KernelDef:
    """grad_input_kl, `block` samples an invocation (output t: sample block*ROW + t), each of the 4 texels of W a
    step fetched serving all of them. Inputs DZ, W (, Y with `dact`)."""
    k = kl.KernelDef()
    ns = _samples(k, block)
    acc = [k.let(f"acc{t}", splat(0.0)) for t in range(block)]

    def step(o4, live, sfx):
        w = [k.let(f"w{j}{sfx}", load("W", 4 * o4 + j, COL)) for j in range(4)]  # rows 4*o4 + j, of texel COL
        for t, n in enumerate(ns):
            with live(t):
                d = k.let(f"d{t}{sfx}", load("DZ", n, o4))
                k.set(acc[t], acc[t] + w[0] * lane(d, 0) + w[1] * lane(d, 1) + w[2] * lane(d, 2) + w[3] * lane(d, 3))
    _loop(k, block, "o4", k.sym("out4", c["out4"]), step)
    if dact:
        acc = [a * _grad_of(k.let(f"y{t}", load("Y", n, COL)), *dact) for t, (a, n) in enumerate(zip(acc, ns))]
    batch_outs(k, block, 1, acc)
    return k


def grad_weight_texels(out4: int) -> int:
    """The texels of dZ (4 rows of dW each) an invocation of grad_weight_vec_kl takes: 4, 2 or 1, the most that
    divide out4 (a layer's 784 -> 128 weight gradient at batch 64 on SwiftShader's WebGPU: 6.6 ms with 1, 4.7 with
    2, 4.0 with 4)."""
    return next(t for t in (4, 2, 1) if out4 % t == 0)


def grad_weight_vec_kl(texels: int = 1) -> kl.KernelDef:
    """grad_weight_kl (dZ as it is), 4 * `texels` rows of dW an invocation (output t: row 4*texels*ROW + t, of dZ's
    output texels texels*ROW + j), each texel of X fetched serving them all, each of dZ its 4: dW's rows are
    4 * out4, a multiple of theirs (grad_weight_texels), so no invocation is past them."""
    k = kl.KernelDef()
    acc = [k.let(f"acc{t}", splat(0.0)) for t in range(4 * texels)]
    with k.loop("n", uniform("u_batch", "int")) as n:
        x = k.let("x", load("X", n, COL))
        for j in range(texels):
            d = k.let(f"d{j}", load("DZ", n, texels * ROW + j))
            for t in range(4):
                k.set(acc[4 * j + t], acc[4 * j + t] + x * lane(d, t))
    for t in range(4 * texels):
        k.out(acc[t] / uniform("u_loss_scale", "float"), t)
    return k


def _vectorised(layer, plan, out4: int):
    """WebGPU's kernel in place of each generic one, as Kernel fields: the forward (not split: on WebGPU the
    one-pass forward runs in place of split-K's, ops/common.py) and grad_input ROWS samples an invocation (below
    ROWS samples, the generic kernels: Kernel.few), the forward FORWARD_COLS output texels of each where they divide
    out4 (Kernel.cols), the weight gradient 4, 8 or 16 rows (of the layer's 4 * out4:
    its constants are not the generic kernel's); {} for a WebGL2 blocked twin's (WebGPU runs the one-sample pass)
    and the rest."""
    act, attrs = layer.attrs.get("act", "none"), layer.attrs.get("act_attrs", {})

    def of(what: str, c: dict) -> dict:
        if c.get("blocked") or c.get("split"):
            return {}
        if what == "forward":
            cols = FORWARD_COLS if c["out4"] % FORWARD_COLS == 0 else 1
            return {"wgsl_kl": forward_vec_kl(c, act, attrs, ROWS, cols), "scatter": ROWS, "few": True, "cols": cols}
        if what == "grad_input":
            dact = plan.act_grad_fused[layer.inputs[0]] if c.get("dact") else None
            return {"wgsl_kl": grad_input_vec_kl(c, dact), "scatter": ROWS, "few": True}
        if what == "grad_weight":
            texels = grad_weight_texels(out4)
            return {"wgsl_kl": grad_weight_vec_kl(texels), "scatter": 4 * texels}
        return {}
    return of


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


def _passes(layer, graph, plan):
    c = _consts(layer, graph)
    return weighted_passes(layer, plan, "dense", c, _title, _grad_bias, _GENERIC, _generic(layer, plan),
                           _vectorised(layer, plan, c["out4"]))


def forward(layer, graph, plan):
    return _passes(layer, graph, plan)[0]


def backward(layer, graph, plan):
    return _passes(layer, graph, plan)[1]
