"""matmul: the token matmuls, on tensors (R, F) stored with F packed, a texture row a token
(codegen/webgl2/layout.py). `rows` below is the texture rows of one sample of the tensor named.

matmul, token-wise x @ B (+ b), B a weight [I, O] stored O-packed:
forward    matmul_forward       X, B (, BIAS)  -> Y         rows: batch
backward   matmul_grad_a        DY, B          -> dX        rows: batch   dX = dY B^T
           matmul_grad_weight   X, DY          -> dB        rows: full    dB = sum over samples, rows of X^T dY
           rows_sum             DY             -> db        rows: full    db = sum over samples, rows of dY

Row-blocked (webgl2/blocking.py: row_blocked, where a sample's rows are a multiple of 8): matmul_forward and
matmul_grad_a with a weight also have a twin computing 8 rows a fragment into blk0..7 (`... rows`) and an interleave,
which WebGL2 and the CPU run from batch 1 where the device draws 8 targets at once (_rows_twins); where its inputs
are a multiple of 8 too, so does matmul_grad_weight, 8 rows of dB a fragment (into blk0..7:pgrad:B, which the
optimizer's gradient interleaves). WebGPU runs the one-row pass with the twin's kernel as its WGSL, 8 rows an
invocation written in place (Kernel.wgsl_kl), and 4 or 2 output texels of each where they divide its width
(wgsl_cols, Kernel.cols): no parts, no interleave.

matmul of two activations, batched: a (G*M, K) @ b (G*K, P), block g of M rows of a times block g of K
rows of b (attention's Q K^T and A V):
forward    matmul_forward       A, B           -> Y         rows: batch
backward   matmul_grad_a        DY, B          -> dA        rows: batch   dA = dY B^T, a block each
           matmul_grad_b        A, DY          -> dB        rows: batch   dB = A^T dY, a block each

Every kernel here is written in the kernel language (codegen/kl.py): its GLSL, the CPU backend's function and the
WGSL are printed from it. The printed GLSL does what the hand templates it replaced did, fetch for fetch; the
parameter gradients (matmul_grad_weight, layernorm_grad_weight, rows_sum) are included by the optimizer passes as
their printed valueAt (ops/optim.py). layernorm is in ops/layernorm.py.
"""
from __future__ import annotations

import dataclasses

from texelfit.prep.packing import ceil_div

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, dot, hsum, lane, load, minimum, select, splat, sqrt, uniform, valid, vec4_of
from ..webgl2.blocking import ROW_BLOCK
from .common import grad_target, interleave_kernel, lanes, param_grad


def _consts(layer, graph):
    a, y = graph.shapes[layer.inputs[0]], graph.shapes[layer.outputs[0]]
    g = layer.attrs.get("groups", 1)
    weight = "weight" in layer.params
    k = a[1]
    rows_b = 0 if weight else graph.shapes[layer.inputs[1]][0]
    return dict(lanes(y[1]), groups=g, m=a[0] // g, k=k, k4=ceil_div(k, 4), p=y[1], p4=ceil_div(y[1], 4),
                rows_a=a[0], rows_b=rows_b, weight=weight, has_bias="bias" in layer.params)


def _title(c, what):
    b = f"{c['k']}x{c['p']}" if c["weight"] else f"{c['groups']}x{c['k']}x{c['p']}"
    return f"{what} {c['groups']}x{c['m']}x{c['k']}@{b}{' +b' if c['has_bias'] else ''}"


def _b_texture(layer, plan):
    return "param:" + layer.params["weight"] if "weight" in layer.params else plan.tensor(layer.inputs[1])


def _brow(k: kl.KernelDef, c: dict):
    """The row of B that row ROW's product starts at: 0 for a weight, n * rows_b + g * k for block g of sample n's
    b (ROW = n * rows_a + g * m + i)."""
    if c["weight"]:
        return kl.lift(0)
    rows_a, m, rows_b, kk = k.syms(rows_a=c["rows_a"], m=c["m"], rows_b=c["rows_b"], k=c["k"])
    n = k.let("n", ROW // rows_a)
    g = k.let("g", (ROW - n * rows_a) // m)
    return k.let("brow", n * rows_b + g * kk)


def _forward_kl(c: dict) -> kl.KernelDef:
    """Y[r, p] = sum_k A[r, k] * B[brow + k, p] (+ b[p]); a texel: 4 outputs p of one row. 4 values of k a fetch of
    A times the 4 texels of B's rows k .. k+3 (the hand GLSL's mat4 product: no per-component indexing, which
    SwiftShader runs as a branch); the last k % 4 values of k without a fetch of the missing rows of B."""
    k = kl.KernelDef()
    brow = _brow(k, c)
    acc = k.let("acc", load("BIAS", 0, COL) if c["has_bias"] else splat(0.0))
    if c["k"] >= 4:
        with k.loop("k4", k.sym("kq", c["k"] // 4)) as k4:
            r = k.let("r", brow + 4 * k4)
            a = k.let("a", load("A", ROW, k4))
            k.set(acc, acc + (load("B", r, COL) * lane(a, 0) + load("B", r + 1, COL) * lane(a, 1)
                              + load("B", r + 2, COL) * lane(a, 2) + load("B", r + 3, COL) * lane(a, 3)))
    if c["k"] % 4:
        kq = k.sym("kq", c["k"] // 4)
        a = k.let("at", load("A", ROW, kq))
        r = k.let("rt", brow + kq * 4)
        for j in range(c["k"] % 4):
            k.set(acc, acc + lane(a, j) * load("B", r + j, COL))
    k.out(acc * valid(k.sym("p", c["p"]), COL))
    return k


def _col(cols: int, c: int) -> kl.X:
    """The output texel of column c of an invocation's `cols` (kl_wgsl.wgsl's cols: COL counts blocks of them)."""
    return COL if cols == 1 else cols * COL + c


def _forward_rows_kl(c: dict, block: int, cols: int = 1) -> kl.KernelDef:
    """_forward_kl for a weight (B at row 0), `block` rows a fragment (webgl2/blocking.py: row_blocked): output t is
    row block * ROW + t, and each texel of B fetched serves all of them. With `cols` (WebGPU alone: wgsl_cols) also
    that many output texels an invocation, each texel of A fetched serving them all: output t * cols + j."""
    k = kl.KernelDef()
    rows = [block * ROW + t for t in range(block)]
    sfx = [f"_{j}" if cols > 1 else "" for j in range(cols)]
    acc = [[k.let(f"acc{t}{sfx[j]}", load("BIAS", 0, _col(cols, j)) if c["has_bias"] else splat(0.0))
            for j in range(cols)] for t in range(block)]
    if c["k"] >= 4:
        with k.loop("k4", k.sym("kq", c["k"] // 4)) as k4:
            b = [[k.let(f"b{i}{sfx[j]}", load("B", 4 * k4 + i, _col(cols, j))) for i in range(4)] for j in range(cols)]
            for t in range(block):
                a = k.let(f"a{t}", load("A", rows[t], k4))
                for j in range(cols):
                    bj = b[j]
                    k.set(acc[t][j], acc[t][j] + (bj[0] * lane(a, 0) + bj[1] * lane(a, 1) + bj[2] * lane(a, 2)
                                                  + bj[3] * lane(a, 3)))
    if c["k"] % 4:
        kq = k.sym("kq", c["k"] // 4)
        b = [[k.let(f"bt{i}{sfx[j]}", load("B", 4 * kq + i, _col(cols, j))) for i in range(c["k"] % 4)]
             for j in range(cols)]
        for t in range(block):
            a = k.let(f"at{t}", load("A", rows[t], kq))
            for j in range(cols):
                for i in range(c["k"] % 4):
                    k.set(acc[t][j], acc[t][j] + lane(a, i) * b[j][i])
    p = k.sym("p", c["p"])
    for t in range(block):
        for j in range(cols):
            k.out(acc[t][j] * valid(p, _col(cols, j)), t * cols + j)
    return k


def _grad_a_kl(c: dict) -> kl.KernelDef:
    """dA[r, k] = sum_p dY[r, p] * B[brow + k, p] (dY B^T); a texel: 4 k of one row, each fetch of dY serving all 4
    (past the last k, the last row of B is read and the lane written 0)."""
    k = kl.KernelDef()
    brow = _brow(k, c)
    kk = k.sym("k", c["k"])
    rows = [k.let(f"r{j}", brow + minimum(4 * COL + j, kk - 1)) for j in range(4)]
    acc = k.let("acc", splat(0.0))
    with k.loop("p4", k.sym("p4", c["p4"])) as p4:
        d = k.let("d", load("DY", ROW, p4))
        k.set(acc, acc + vec4_of(*(dot(d, load("B", r, p4)) for r in rows)))
    k.out(acc * valid(kk, COL))
    return k


def _grad_a_rows_kl(c: dict, block: int, cols: int = 1) -> kl.KernelDef:
    """_grad_a_kl for a weight, `block` rows a fragment (row_blocked): output t is row block * ROW + t, and each
    texel of B fetched serves all of them. With `cols` (WebGPU alone) also that many output texels an invocation,
    each texel of dY fetched serving them all: output t * cols + j."""
    k = kl.KernelDef()
    kk = k.sym("k", c["k"])
    sfx = [f"_{j}" if cols > 1 else "" for j in range(cols)]
    rows = [[k.let(f"r{i}{sfx[j]}", minimum(4 * _col(cols, j) + i, kk - 1)) for i in range(4)] for j in range(cols)]
    acc = [[k.let(f"acc{t}{sfx[j]}", splat(0.0)) for j in range(cols)] for t in range(block)]
    with k.loop("p4", k.sym("p4", c["p4"])) as p4:
        b = [[k.let(f"b{i}{sfx[j]}", load("B", r, p4)) for i, r in enumerate(rows[j])] for j in range(cols)]
        for t in range(block):
            d = k.let(f"d{t}", load("DY", block * ROW + t, p4))
            for j in range(cols):
                k.set(acc[t][j], acc[t][j] + vec4_of(*(dot(d, bi) for bi in b[j])))
    for t in range(block):
        for j in range(cols):
            k.out(acc[t][j] * valid(kk, _col(cols, j)), t * cols + j)
    return k


def _pick(k: kl.KernelDef, i) -> kl.X:
    """The vec4 with 1.0 in lane i % 4 (a dot with it reads that lane without indexing by a variable)."""
    i4 = k.let("i4", i // 4)
    return k.let("pick", vec4_of(*(select((i - 4 * i4).eq(j), 1.0, 0.0) for j in range(4)))), i4


def _grad_b_kl(c: dict) -> kl.KernelDef:
    """dB[g*k + kk, p] = sum_i A[g*m + i, kk] * dY[g*m + i, p] (A^T dY a block, of each sample)."""
    k = kl.KernelDef()
    rows_a, m, rows_b, kk = k.syms(rows_a=c["rows_a"], m=c["m"], rows_b=c["rows_b"], k=c["k"])
    n = k.let("n", ROW // rows_b)
    rr = k.let("rr", ROW - n * rows_b)
    g = k.let("g", rr // kk)
    col = k.let("kk", rr - g * kk)
    row0 = k.let("row0", n * rows_a + g * m)
    pick, k4 = _pick(k, col)
    acc = k.let("acc", splat(0.0))
    with k.loop("i", m) as i:
        k.set(acc, acc + dot(load("A", row0 + i, k4), pick) * load("DY", row0 + i, COL))
    k.out(acc)
    return k


def _grad_weight_kl(c: dict) -> kl.KernelDef:
    """dB[k, p] = sum over the rows of the batch (rows_a a sample) of X[row, k] * dY[row, p] (X: the input A); the
    loss gradient came scaled (u_loss_scale)."""
    k = kl.KernelDef()
    pick, k4 = _pick(k, ROW)
    acc = k.let("acc", splat(0.0))
    with k.loop("r", uniform("u_batch", "int") * k.sym("rows_a", c["rows_a"])) as r:
        k.set(acc, acc + dot(load("A", r, k4), pick) * load("DY", r, COL))
    k.out(acc / uniform("u_loss_scale", "float"))
    return k


def wgsl_cols(width: int) -> int:
    """The output texels a WebGPU invocation of a row-blocked token matmul computes: 4, or 2, whichever divides the
    output's width in texels, else 1. SwiftShader (2026-12-07, 512 tokens): 384 -> 384 and 1536 -> 384 forwards
    1.45x faster at 4 than at 1 (43 -> 29.5 ms, 167 -> 115), a 384 x 384 weight gradient 1.55x (58 -> 37.5); 16 rows
    by 2 texels as fast as 8 by 4; no slower at 32 tokens (a sentence), where 4 leaves fewer invocations."""
    return 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1


def _rows_twins(layer, plan, one: Pass, blocked) -> list[Pass]:
    """`one`, a token-wise matmul's pass computing a row a fragment, and where its output has row-blocked parts
    (webgl2/blocking.py: row_blocked) its twin computing ROW_BLOCK rows a fragment into them (the kernel
    `blocked(1)`) and their interleave, which run from batch 1 on devices drawing 8 targets at once (Pass.block_from).
    WebGPU runs `one` with the twin's kernel of `wgsl_cols` texels an invocation (`blocked(cols)`) as its WGSL, its
    rows and texels written in place (Kernel.wgsl_kl)."""
    out = one.outputs[0]
    if "blk0:" + out not in plan.textures:
        return [one]
    parts = [f"blk{t}:{out}" for t in range(ROW_BLOCK)]
    k, rows, cols = one.kernel, blocked(1), wgsl_cols(plan.textures[out].width)
    twin = Kernel(k.name + " rows", "kl", k.inputs, ROW_BLOCK, k.uniforms, kl=rows)
    one.kernel = dataclasses.replace(k, wgsl_kl=blocked(cols), scatter=ROW_BLOCK, cols=cols)
    one.blocked, one.block_from = False, 1
    return [one, Pass(twin, one.inputs, parts, one.rows, layer.name, blocked=True, block_from=1),
            Pass(interleave_kernel(), parts, [out], one.rows, layer.name, {"u_rows": 1}, blocked=True, block_from=1)]


def _grad_weight_rows_kl(c: dict, block: int, cols: int = 1) -> kl.KernelDef:
    """_grad_weight_kl, `block` rows of dB a fragment (row_blocked, inputs k a multiple of 8): output t is row
    k = block * ROW + t, a lane of the block / 4 texels of A it reads a row, and each texel of dY fetched serves all.
    With `cols` (WebGPU alone) also that many texels of dB an invocation, each texel of A serving them all: output
    t * cols + j."""
    k = kl.KernelDef()
    sfx = [f"_{j}" if cols > 1 else "" for j in range(cols)]
    acc = [[k.let(f"acc{t}{sfx[j]}", splat(0.0)) for j in range(cols)] for t in range(block)]
    with k.loop("r", uniform("u_batch", "int") * k.sym("rows_a", c["rows_a"])) as r:
        a = [k.let(f"a{q}", load("A", r, block // 4 * ROW + q)) for q in range(block // 4)]
        for j in range(cols):
            d = k.let(f"d{sfx[j]}", load("DY", r, _col(cols, j)))
            for t in range(block):
                k.set(acc[t][j], acc[t][j] + d * lane(a[t // 4], t % 4))
    for t in range(block):
        for j in range(cols):
            k.out(acc[t][j] / uniform("u_loss_scale", "float"), t * cols + j)
    return k


def _rows_out_consts(rows: int, k: int, p: int) -> dict:
    """The consts of a token-wise kernel over `rows` rows a sample, for the roles of a weight stored [O rows, I
    packed] (attrs["weight_rows"] == "out": a tied embedding table, prep.graph.untie_unsupported): each kernel
    below is one of the usual three with its operands swapped, its k the length of the dot product's other
    axis and p the packed one."""
    return dict(lanes(p), groups=1, m=rows, k=k, k4=ceil_div(k, 4), p=p, p4=ceil_div(p, 4), rows_a=rows, rows_b=0,
                weight=True, has_bias=False)


def _rows_out_forward(layer, graph, plan):
    """Y[r, o] = sum_i X[r, i] W[o, i]: matmul_grad_a's dY B^T, with dY := X, B := W [O rows, I packed]."""
    (rows, i), o = graph.shapes[layer.inputs[0]], graph.shapes[layer.outputs[0]][1]
    c = _rows_out_consts(rows, o, i)
    k = Kernel(f"matmul_forward {rows}x{i}@({o}x{i})^T", "kl", ("DY", "B"), kl=_grad_a_kl(c))
    return [Pass(k, [plan.tensor(layer.inputs[0]), _b_texture(layer, plan)], [plan.tensor(layer.outputs[0])], "batch",
                 layer.name)]


def _rows_out_backward(layer, graph, plan):
    """dX[r, i] = sum_o dY[r, o] W[o, i] (matmul_forward, A := dY, B := W); dW[o, i] = sum over the rows of dY[r, o]
    X[r, i] (matmul_grad_weight, A := dY, DY := X): W's own layout, [O rows, I packed]."""
    (rows, i), o = graph.shapes[layer.inputs[0]], graph.shapes[layer.outputs[0]][1]
    y, passes = layer.outputs[0], []
    target = grad_target(plan, layer, 0)
    if target:
        k = Kernel(f"matmul_grad_a {rows}x{o}@{o}x{i}", "kl", ("A", "B"), kl=_forward_kl(_rows_out_consts(rows, o, i)))
        passes.append(Pass(k, [plan.grad(y), _b_texture(layer, plan)], [target], "batch", layer.name))
    if graph.is_trainable(layer.params["weight"]):
        k = Kernel(f"matmul_grad_weight ({rows}x{o})^T@{rows}x{i}", "kl", ("A", "DY"),
                   uniforms=("u_batch", "u_loss_scale"), kl=_grad_weight_kl(_rows_out_consts(rows, o, i)))
        passes.append(Pass(k, [plan.grad(y), plan.tensor(layer.inputs[0])], [param_grad(plan, layer, "weight")],
                           "full", layer.name))
    return passes


def forward(layer, graph, plan):
    if layer.attrs.get("weight_rows") == "out":
        return _rows_out_forward(layer, graph, plan)
    c = _consts(layer, graph)
    names = ("A", "B") + (("BIAS",) if c["has_bias"] else ())
    textures = [plan.tensor(layer.inputs[0]), _b_texture(layer, plan)]
    if c["has_bias"]:
        textures.append("param:" + layer.params["bias"])
    k = Kernel(_title(c, "matmul_forward"), "kl", names, kl=_forward_kl(c))
    one = Pass(k, textures, [plan.tensor(layer.outputs[0])], "batch", layer.name)
    return _rows_twins(layer, plan, one, lambda cols: _forward_rows_kl(c, ROW_BLOCK, cols))


def _rows_sum_kl(rows: int) -> kl.KernelDef:
    """db[p] = sum over the rows of the batch (`rows` a sample) of dY[row, p]; the loss gradient came scaled
    (u_loss_scale)."""
    k = kl.KernelDef()
    rows = k.sym("rows", rows)
    acc = k.let("acc", splat(0.0))
    with k.loop("r", uniform("u_batch", "int") * rows) as r:
        k.set(acc, acc + load("DY", r, COL))
    k.out(acc / uniform("u_loss_scale", "float"))
    return k


def rows_sum_pass(layer, graph, plan, role):
    rows = graph.shapes[layer.outputs[0]][0]
    k = Kernel(f"rows_sum {rows}", "kl", ("DY",), uniforms=("u_batch", "u_loss_scale"), kl=_rows_sum_kl(rows))
    return Pass(k, [plan.grad(layer.outputs[0])], [param_grad(plan, layer, role)], "full", layer.name)


def backward(layer, graph, plan):
    if layer.attrs.get("weight_rows") == "out":
        return _rows_out_backward(layer, graph, plan)
    c = _consts(layer, graph)
    y = layer.outputs[0]
    passes = []
    target = grad_target(plan, layer, 0)
    if target:
        k = Kernel(_title(c, "matmul_grad_a"), "kl", ("DY", "B"), kl=_grad_a_kl(c))
        one = Pass(k, [plan.grad(y), _b_texture(layer, plan)], [target], "batch", layer.name)
        passes += _rows_twins(layer, plan, one, lambda cols: _grad_a_rows_kl(c, ROW_BLOCK, cols))
    if not c["weight"]:
        target = grad_target(plan, layer, 1)
        if target:
            k = Kernel(_title(c, "matmul_grad_b"), "kl", ("A", "DY"), kl=_grad_b_kl(c))
            passes.append(Pass(k, [plan.tensor(layer.inputs[0]), plan.grad(y)], [target], "batch", layer.name))
        return passes
    if graph.is_trainable(layer.params["weight"]):
        k = Kernel(_title(c, "matmul_grad_weight"), "kl", ("A", "DY"),
                   uniforms=("u_batch", "u_loss_scale"), kl=_grad_weight_kl(c))
        one = Pass(k, [plan.tensor(layer.inputs[0]), plan.grad(y)], [param_grad(plan, layer, "weight")], "full",
                   layer.name)
        passes += _rows_twins(layer, plan, one, lambda cols: _grad_weight_rows_kl(c, ROW_BLOCK, cols))
    if c["has_bias"] and graph.is_trainable(layer.params["bias"]):
        passes.append(rows_sum_pass(layer, graph, plan, "bias"))
    return passes
