"""Constants and helpers shared by the op families."""
from __future__ import annotations

from contextlib import contextmanager

from texelfit.prep.elementwise import UNARY, X, const, derivatives_of, forward_of
from texelfit.prep.packing import ceil_div, chw  # noqa: F401 (chw: the ops take it from here)

from .. import kl
from ..expr import functions, to_kl
from ..kernels import Kernel, Pass
from ..webgl2.blocking import COLUMN_BLOCK, COLUMN_HALVES, COLUMN_PARTS, SAMPLE_BLOCK  # noqa: F401
from .conv_kl import interleave_cols_kl


def lanes(cols: int) -> dict:
    """Constants of kernels/lanes.glsl.j2: which lanes of the last channel texel hold real channels."""
    rem = cols % 4 or 4
    return {"cols": cols, "cols4": ceil_div(cols, 4),
            "last_mask": ", ".join("1.0" if i < rem else "0.0" for i in range(4))}


def activation(layer) -> dict:
    """Constants of kernels/activation.glsl.j2 for a dense or conv layer's fused activation."""
    return fused_activation(layer.attrs.get("act", "none"), layer.attrs.get("act_attrs", {}))


def fused_activation(act: str, attrs: dict) -> dict:
    """The activation `act` (a fusable unary op of prep/elementwise.py, or "none") as kernel constants:
    its name and its GLSL (activate(x0) and activateGrad(y)) for the WebGL2 routines' templates."""
    if act == "none":
        return {"act": "none", **functions(X, (const(1.0),))}
    assert UNARY[act].fusable, act
    return {"act": act, **functions(forward_of(act, attrs), derivatives_of(act, attrs))}


def grad_target(plan, layer, slot: int):
    """The texture the backward of `layer` writes the gradient of input `slot` into, or None
    when that input needs no gradient (it depends on no weight)."""
    if layer.inputs[slot] not in plan.needs_grad:
        return None
    return plan.grad_targets[(layer.name, slot)]


def weighted_passes(layer, plan, family: str, c: dict, title, grad_bias, generic: tuple[str, ...] = (),
                    generic_kl=None, vec_kl=None):
    """Forward and backward passes of a layer with a weight, a bias and a fused activation
    (dense and conv): {family}_forward, {family}_grad_weight, _grad_bias and _grad_input, with
    the kernel constants `c` and `title(c, what)` naming each kernel. The kernels in `generic`
    (e.g. "grad_bias") depend on no constant of the layer: they get none and a plain name, so
    one program serves every layer (programs are shared by source, codegen/schedule.py), which
    saves a shader compile per layer at the first step. A sample-blocked layer's passes have a
    blocked twin for larger batches (blockable below). `grad_bias(c)`: the family's bias gradient kernel (written in
    the kernel language). `generic_kl(what, consts)`: the generic kernel (a kl.KernelDef, or None) of the kernel
    `what` with the constants `consts`, which the hand template stands beside as its WebGL2 routine
    (Kernel.routine): the CPU backend and WGSL print it. `vec_kl(what, consts)`: the kernel WebGPU runs in its place,
    as the Kernel's fields (wgsl_kl, and scatter or split: ops/conv_vec.py), or {}."""
    x, y = layer.inputs[0], layer.outputs[0]
    w = "param:" + layer.params["weight"]
    b = "param:" + layer.params["bias"] if c["has_bias"] else None

    def kernel(what, inputs, uniforms=(), outputs=1, **more):
        blocked = " blocked" if more.get("blocked") else " split" if more.get("split") else \
            (" columns, read as columns" if more.get("colin") else " columns") if more.get("colblock") else ""
        consts = more if what in generic else dict(c, **more)
        name = f"{family}_{what}{blocked}" if what in generic else title(c, f"{family}_{what}") + blocked
        return Kernel(name, f"{family}_{what}.glsl.j2", inputs, outputs, uniforms, consts=consts,
                      kl=generic_kl(what, consts) if generic_kl else None, **(vec_kl(what, consts) if vec_kl else {}))

    def blockable(what, names, uniforms, inputs, output, rows, blocked_reads=None):
        """The pass writing `output` (its batch rows, or all of a weight gradient). With blk0..7:output
        planned (webgl2/blocking.py: sample_blocked) also its blocked twin: the pass computing SAMPLE_BLOCK
        samples (or rows) a fragment into those, and the interleave into `output`. The blocked twin
        runs at batches of BLOCK_MIN_BATCH or more on devices with SAMPLE_BLOCK draw buffers, the
        one-sample pass otherwise (Pass.blocked). `blocked_reads`: the blocked twin's (names, inputs)
        where they differ."""
        plain = Pass(kernel(what, names, uniforms, blocked=False), inputs, [output], rows, layer.name)
        if "blk0:" + output not in plan.textures:
            return [plain]
        plain.blocked = False
        names, inputs = blocked_reads or (names, inputs)
        parts = [f"blk{t}:{output}" for t in range(SAMPLE_BLOCK)]
        return [plain,
                Pass(kernel(what, names, tuple(dict.fromkeys(uniforms + ("u_batch",))), SAMPLE_BLOCK, blocked=True,
                            block=SAMPLE_BLOCK),
                     inputs, parts, "blocks" if rows == "batch" else rows, layer.name, blocked=True),
                Pass(interleave_kernel(), parts, [output], rows, layer.name,
                     {"u_rows": plan.textures[parts[0]].sample_rows or 1}, blocked=True)]

    forward = blockable("forward", ("X", "W") + (("B",) if b else ()), (), [plan.tensor(x), w] + ([b] if b else []),
                        plan.tensor(y), "batch")
    if "split:" + y in plan.textures:
        # split-K (blocking.split_k): the one-sample forward as partial sums over slices of the inputs
        # (S rows a sample, into split:Y) and their sum, with the bias and activation (dense_reduce); WebGPU runs the
        # one pass (its vectorised kernel computes several samples an invocation: Pass.webgpu)
        one, parts = forward[0], plan.textures["split:" + y].sample_rows
        split = kernel("forward", ("X", "W"), split=parts, chunk=ceil_div(c["in4"], parts), blocked=False)
        one.webgpu = True
        forward[:1] = [
            one,
            Pass(split, one.inputs[:2], ["split:" + y], "batch", layer.name, blocked=one.blocked, webgpu=False),
            Pass(kernel("reduce", ("P",) + (("B",) if b else ()), split=parts), ["split:" + y] + ([b] if b else []),
                 one.outputs, "batch", layer.name, blocked=one.blocked, webgpu=False)]
    if "col0:" + plan.tensor(y) in plan.textures:
        # column-blocked (blocking.column_blocked): the forward, at every batch, computes 4 positions and 2 halves a
        # fragment into col0..7:Y (or, on a device drawing fewer than 8 targets, a half a draw: Pass.wide), and a
        # pass interleaves them into Y, unless only such convs read Y (blocking.column_only); one whose X is kept
        # that way reads its parts X0..7
        one, parts = forward[0], [f"col{k}:{plan.tensor(y)}" for k in range(COLUMN_PARTS)]
        names, inputs, colin = one.kernel.inputs, one.inputs, plan.columns_only(x)
        if colin:
            names = tuple(f"X{k}" for k in range(COLUMN_PARTS)) + names[1:]
            inputs = [f"col{k}:{plan.tensor(x)}" for k in range(COLUMN_PARTS)] + inputs[1:]

        def columns(halves, outputs, wide):
            k = kernel("forward", names, (), len(outputs), blocked=False, colblock=COLUMN_BLOCK, colin=colin,
                       halves=halves)
            if len(halves) < COLUMN_HALVES:
                k = Kernel(f"{k.name} half {halves[0]}", k.template, k.inputs, k.outputs, k.uniforms, k.consts,
                           kl=k.kl, wgsl_kl=k.wgsl_kl, scatter=k.scatter, split=k.split)
            return Pass(k, inputs, outputs, "batch", layer.name, blocked=one.blocked, wide=wide)
        forward[:1] = [columns(list(range(COLUMN_HALVES)), parts, True)] + \
            [columns([g], parts[COLUMN_BLOCK * g:COLUMN_BLOCK * (g + 1)], False) for g in range(COLUMN_HALVES)]
        if not plan.columns_only(y):
            interleave = Kernel("interleave_cols", "kl", tuple(f"T{k}" for k in range(COLUMN_PARTS)),
                                uniforms=("u_c4", "u_qb"), kl=interleave_cols_kl(COLUMN_BLOCK, COLUMN_HALVES))
            forward.insert(1 + COLUMN_HALVES, Pass(interleave, parts, one.outputs, "batch", layer.name,
                                {"u_c4": c["oc4"], "u_qb": ceil_div(c["ow"], COLUMN_BLOCK)}, blocked=one.blocked))
            if not colin:  # WebGPU computes Y whole in one pass (Pass.webgpu), not its parts dealt out and interleaved
                for p in forward:
                    p.webgpu = False
                one.webgpu = True
                forward.insert(0, one)
    backward = []
    if y not in plan.needs_grad:  # below the lowest trainable layer: the backward stops before this one
        return forward, backward
    dz, tx = plan.grad(y), plan.tensor(x)
    if c["act"] != "none":
        # dZ = dY * act'(Y) once, into dz:Y (layout.py allocates it): the gradient kernels below
        # read only dZ, the gradient before the activation. Where Y's one consumer is a dense layer, its
        # grad_input writes dz:Y itself (layout.py: act_grad_fused).
        if y not in plan.act_grad_fused:
            backward.append(Pass(activation_grad(c["act"], layer.attrs.get("act_attrs", {})),
                                 [dz, plan.tensor(y)], ["dz:" + y], "batch", layer.name))
        dz, c = "dz:" + y, dict(c, **fused_activation("none", {}))  # the kernels below apply no activation
    # grad_weight sums over the samples: it reads the factor that the weight's texel does not pack
    # with the samples as channels (layout.py), 4 samples a fetch: X of a conv, and dZ of a dense
    # layer where its weight gradient is blocked (only that twin reads it: the one-sample pass reads dZ)
    # a frozen weight or bias has no gradient pass (layout.py plans no texture for it)
    weight, bias = layer.params["weight"], b and layer.params["bias"]
    if family == "dense":
        src, st, names, factors = dz, "dzt:" + y, ("DZ", "X"), [dz, tx]
    else:
        src, st, names = tx, "xt:" + tx[len("act:"):], ("DZ", "XT")
        factors = [dz, st]
    blocked_reads = None
    if st in plan.textures:
        c = dict(c, nb4=plan.textures[st].packing.c4)
        backward.append(samples_last_pass(plan, src, st, layer.name, blocked=True if family == "dense" else None))
        if family == "dense":
            blocked_reads = ("DZT", "X"), [st, tx]
    if "pgrad:" + weight in plan.textures:
        backward += blockable("grad_weight", names, ("u_batch", "u_loss_scale"), factors,
                              param_grad(plan, layer, "weight"), "full", blocked_reads)
    if b and "pgrad:" + bias in plan.textures:
        backward.append(Pass(grad_bias(c), [dz],
                             [param_grad(plan, layer, "bias")], "full", layer.name))
    target = grad_target(plan, layer, 0)
    if target and x in plan.act_grad_fused:  # dX times act'(X) of the layer before: its dZ (see above)
        act, attrs = plan.act_grad_fused[x]
        c = dict(c, **fused_activation(act, attrs), dact=True)
        backward += blockable("grad_input", ("DZ", "W", "Y"), (), [dz, w, tx], target, "batch")
    elif target:
        backward += blockable("grad_input", ("DZ", "W"), (), [dz, w], target, "batch")
    return forward, backward


def interleave_kernel() -> Kernel:
    """The pass interleaving SAMPLE_BLOCK blocked parts into their tensor (u_rows: rows a sample, 1 for rows)."""
    return Kernel("interleave", "interleave.glsl.j2", tuple(f"T{t}" for t in range(SAMPLE_BLOCK)),
                  uniforms=("u_rows",), consts={"block": SAMPLE_BLOCK}, kl=interleave_kl(SAMPLE_BLOCK))


def interleave_kl(block: int) -> kl.KernelDef:
    """The `block` parts T0.. of a blocked output (layout.py: blk0..) interleaved: sample (or row, u_rows = 1) n of
    the output is sample n / block of part n % block, u_rows rows a sample. The generic kernel of
    kernels/interleave.glsl.j2 (its WebGL2 routine, Kernel.routine); an optimizer includes it as a blocked weight's
    gradient (ops/optim.py)."""
    k = kl.KernelDef()
    block, rows = k.sym("block", block), kl.uniform("u_rows", "int")
    n = k.let("n", kl.ROW // rows)
    t, row = k.let("t", n % block), k.let("at_row", kl.ROW - (n - n // block) * rows)  # (row n / block of part t)
    v = k.let("v", kl.splat(0.0))
    for j in range(block.value[1]):
        with k.when(t.eq(j)):
            k.set(v, kl.load(f"T{j}", row, kl.COL))
    k.out(v)
    return k


def samples_last_pass(plan, src: str, dst: str, label: str, blocked=None) -> Pass:
    """The pass laying `src` out with the samples as channels into `dst` (layout.py: samples_last_packing),
    for a weight gradient that sums over the samples."""
    spec = plan.textures[dst]
    ch, h, w = chw(spec.shape[:-1])
    # (c4 only matters with w > 1: dense layers share one program)
    k = samples_last_kl(ceil_div(ch, 4) if w > 1 else 0, h, spec.packing.c4)
    return Pass(Kernel(f"samples_last {h}x{w}", "kl", ("A",), uniforms=("u_batch",), kl=k),
                [src], [dst], "full", label, blocked=blocked)


def samples_last_kl(c4: int, h: int, nb4: int) -> kl.KernelDef:
    """T = A with the samples as channels (layout.py: samples_last_packing): texel (w*nb4 + n4, c*h + h) holds
    A[n, c, h, w] of the samples n = 4*n4 .. 4*n4+3, zero past u_batch (and in padded channels, whose lanes of A
    are zero). A is (C, h, W) a sample, c4 texels a w (a dense tensor is (F, 1, 1), and w is always 0). For the
    weight gradients: dZ of a dense, X of a conv."""
    k = kl.KernelDef()
    c4, h, nb4 = k.syms(c4=c4, h=h, nb4=nb4)
    ch = k.let("ch", kl.ROW // h)
    w = k.let("w", kl.COL // nb4)
    n = k.let("n", 4 * (kl.COL - w * nb4))
    ci = k.let("ci", ch // 4)
    pick = k.let("pick", ch - 4 * ci)  # channel ch's lane of its texel
    at, row = k.let("at", w * c4 + ci), k.let("at_row", n * h + kl.ROW - ch * h)
    last = k.let("last", kl.uniform("u_batch", "int") - n)
    t = k.let("t", kl.splat(0.0))
    with k.loop("i", 4) as i:  # (a constant count: the GLSL compiler unrolls it, as the template was written)
        with k.when(i < last):  # the samples n .. n + 3 in the batch
            k.set_lane(t, i, kl.lane(kl.load("A", row + i * h, at), pick))
    k.out(t)
    return k


def activation_grad(act: str, attrs: dict) -> Kernel:
    """The kernel dZ = dY * act'(Y) of a layer's fused activation `act` (dense, conv, conv_transpose), its
    derivative written in the output Y = act(Z): inputs DY, Y."""
    k = kl.KernelDef()
    d = to_kl(derivatives_of(act, attrs)[0], [], k.let("y", kl.load("Y", kl.ROW, kl.COL)))
    k.out(kl.load("DY", kl.ROW, kl.COL) * (d if d.type == "vec4" else kl.splat(d)))
    return Kernel(f"activation_grad {act}", "kl", ("DY", "Y"), kl=k)


def param_grad(plan, layer, role: str) -> str:
    """The texture that `layer`'s gradient of its parameter `role` goes to: pgrad:P, or for a parameter several
    layers read (a tied one) pgrad{j}:P, j the layer's place among them; their sum is pgrad:P (schedule.py)."""
    name = layer.params[role]
    readers = plan.param_grad_parts.get(name)
    return f"pgrad{readers.index(layer.name)}:{name}" if readers else "pgrad:" + name


@contextmanager
def channel_lanes(k, c4, count):
    """A kernel of the language that fills its output texel (ROW, COL) lane by lane, each lane a channel: yields
    (x, ch, j, v) inside the loop over the 4 lanes j, where channel ch = cc * 4 + j is one of the `count` (the
    padding lanes stay 0): x = COL // c4, the texel's position in its row, cc its channel texel, v the texel
    (zero to start), which the caller writes out after (k.out). Gather, flatten's and concat's gradients."""
    x = k.let("x", kl.COL // c4)
    cc = k.let("cc", kl.COL - x * c4)
    v = k.let("v", kl.splat(0.0))
    with k.loop("j", 4) as j:
        ch = k.let("ch", cc * 4 + j)
        with k.when(ch < count):
            yield x, ch, j, v


def batch_outs(k: kl.KernelDef, block: int, per_sample, values: list[kl.X], cols: int = 1) -> None:
    """Output t of the invocation; `block` rows an invocation: only the rows of the batch's samples, `per_sample`
    rows each (the dispatch covers ceil(rows / block) blocks: kl_wgsl.wgsl's `scatter`); `cols` texels of each row
    (kl_wgsl.wgsl's `cols`): value t * cols + j that of row t's texel j."""
    if block == 1 and cols == 1:
        k.out(values[0])
        return
    batch = kl.uniform("u_batch", "int")
    rows = k.let("nrows", batch if isinstance(per_sample, int) and per_sample == 1 else batch * per_sample)
    for t in range(block):
        with k.when(block * kl.ROW + t < rows):
            for j in range(cols):
                k.out(values[t * cols + j], t * cols + j)
