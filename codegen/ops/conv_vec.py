"""The conv family's vectorised kernels, in the kernel language: what WebGPU runs in place of the generic kernels
(ops/conv_kl.py) for a conv of groups 1 or a depthwise one (Kernel.wgsl_kl; ops/conv.py), each computing what its
generic kernel computes (tests/test_kl_conv.py runs both, printed as JavaScript, on the same inputs and against
PyTorch; tests/test_backend_parity.py runs them on WebGPU).

The generic kernels take a texel's 4 lanes one by one and fetch a texel for every multiply-add (a lane of X or dZ,
a lane of W). These fetch a texel of X (or dZ) once for 4 input channels and multiply it with the 4 texels of W
that hold those channels' weights for the 4 output channels of the output texel: 5 fetches for 16 multiply-adds,
as WebGL2's GLSL templates do (a fragment shader cannot share fetches between outputs; on a software GPU every
fetch is work). A depthwise conv multiplies texels lane by lane: 2 fetches for 4. The weight gradient fetches a
texel of XT (X with the samples as channels: 4 samples) once for 4 samples.

Layouts as in ops/conv_kl.py: X (ic, ih, iw) rows n*ih + h, texel w*ic4 + ic/4; W[oc, j, kh, kw] at row kh*icg + j,
texel kw*oc4 + oc/4, lane oc % 4; XT at row ch*ih + h, texel w*nb4 + n/4, lane n % 4. As the generic kernels, they
read no padding lane of an input as a value (a padding lane of dZ in a sum over output channels is masked) and
write a padding lane of the output zero; no fetch reads past a texture (a padding channel's row of W or XT is
clamped to the last channel's, its lane then zeroed).
"""
from __future__ import annotations

from .. import kl
from ..kl import COL, ROW, lane, load, minimum, splat, uniform, valid, vec4_of
from .common import batch_outs
from .conv_kl import _activate, _inside, _syms


ROWS = 8  # the rows of the output an invocation of WebGPU's forward and grad_input computes (ops/conv.py)
# WebGPU's weight gradient of few texels is split into partial sums over the output's rows (split_of): a kernel of
# fewer invocations than SwiftShader has threads for runs on one (a workgroup is a thread's).
SPLIT_INVOCATIONS = 1024


def applies(c: dict) -> bool:
    """Whether the conv with constants `c` (ops/conv.py: _consts) has vectorised kernels: groups 1, or depthwise."""
    return c["groups"] == 1 or c["depthwise"]


def _rows(k: kl.KernelDef, block: int, per_sample: kl.X) -> list[tuple[kl.X, kl.X]]:
    """The (sample, row in it) of each of the `block` output rows an invocation computes: rows block*ROW + t."""
    if block == 1:
        n = k.let("n", ROW // per_sample)
        return [(n, k.let("y", ROW - n * per_sample))]
    out = []
    for t in range(block):
        r = k.let(f"r{t}", block * ROW + t)
        n = k.let(f"n{t}", r // per_sample)
        out.append((n, k.let(f"y{t}", r - n * per_sample)))
    return out


def _cols(k: kl.KernelDef, cols: int, c4) -> tuple[kl.X, list[kl.X]]:
    """The position x and the channel texels of the `cols` output texels of an invocation (kl_wgsl.wgsl's `cols`: COL
    counts blocks of them; cols divides the c4 texels of a position, so they are one position's)."""
    if cols == 1:
        x = k.let("x", COL // c4)
        return x, [k.let("q", COL - x * c4)]
    first = k.let("tx", cols * COL)
    x = k.let("x", first // c4)
    q = k.let("q", first - x * c4)
    return x, [q] + [k.let(f"q{j}", q + j) for j in range(1, cols)]


def wgsl_cols(c: dict, c4: str) -> int:
    """The output texels an invocation of WebGPU's forward (c4 "oc4") or input gradient ("ic4") of a conv of groups 1
    computes: 2 where 2 divide the texels of a position, else 1 (each input texel fetched then serves both; a
    depthwise conv's texels share no fetch). Not 4: on SwiftShader 4 gained no more than 2 (bench/run.py's CNN) and
    made EfficientNet-Lite0's WGSL a third larger gzipped and its WebGPU createModel 1.6 times as long."""
    if c["depthwise"] and c["groups"] != 1:
        return 1
    return next(n for n in (2, 1) if c[c4] % n == 0)


def _dense_taps(k, block, acc, xr, inside, xc, wcs, wr, full: int, rest: int) -> None:
    """A tap of a conv of groups 1, each row t and output texel j: acc[t][j] += inside[t] * sum over the input
    channels of X's lane times W's texel of the channel (texel wcs[j] of row wr + channel): an input texel fetched a
    row for all the texels, 4 texels of W a texel for all the rows."""
    cols = len(wcs)
    sfx = [f"_{j}" if cols > 1 else "" for j in range(cols)]

    def taps(c4, suffix: str, lanes: int):
        w = [[k.let(f"w{i}{suffix}{sfx[j]}", load("W", wr + 4 * c4 + i, wc)) for i in range(lanes)]
             for j, wc in enumerate(wcs)]
        for t in range(block):
            v = k.let(f"xv{suffix}{t}", load("X", xr[t], xc + c4))
            for j in range(cols):
                s = w[j][0] * lane(v, 0)
                for i in range(1, lanes):
                    s = s + w[j][i] * lane(v, i)
                k.set(acc[t][j], acc[t][j] + s * inside[t])
    if full:
        with k.loop("k4", k.sym("icq", full)) as c4:
            taps(c4, "", 4)
    if rest:
        taps(full, "t", rest)


def _dense_transposed_taps(k, block, acc, dr, hit, dc, wc0, wr, chs, oc, channels: int) -> None:
    """A tap of a conv of groups 1's input gradient, each row t and output texel c: acc[t][c] += hit[t] * (for each
    of the texel's 4 channels j, the sum over the output channels of dZ times W's row wr + chs[c][j]): a texel of dZ
    fetched a row for all the texels, 4 texels of W a texel for all the rows (transposed once, a 4x4 block: then 4
    multiply-adds of texels a row, as the forward's); the last texel of dZ's padding lanes masked."""
    ofull, orest = divmod(channels, 4)
    cols = len(chs)
    sfx = [f"_{c}" if cols > 1 else "" for c in range(cols)]

    def taps(o4, suffix: str, mask: bool):
        wc = k.let(f"wc{suffix}", wc0 + o4)
        wt = []
        for c in range(cols):
            w = [k.let(f"w{j}{suffix}{sfx[c]}", load("W", wr + chs[c][j], wc)) for j in range(4)]
            # the 4x4 block transposed once for the rows: lane i of wt[j] is output channel j's weight of channel i
            wt.append([k.let(f"wt{j}{suffix}{sfx[c]}", vec4_of(*(lane(w[i], j) for i in range(4)))) for j in range(4)])
        for t in range(block):
            d = load("DZ", dr[t], dc + o4)
            d = k.let(f"d{suffix}{t}", d * valid(oc, o4) if mask else d)
            for c in range(cols):
                k.set(acc[t][c], acc[t][c] + (wt[c][0] * lane(d, 0) + wt[c][1] * lane(d, 1) + wt[c][2] * lane(d, 2)
                                              + wt[c][3] * lane(d, 3)) * hit[t])
    if ofull:
        with k.loop("o4", k.sym("ocq", ofull)) as o4:
            taps(o4, "", False)
    if orest:
        taps(ofull, "t", True)


def forward_vec_kl(c: dict, act: str = "none", attrs: dict | None = None, block: int = 1,
                   cols: int = 1) -> kl.KernelDef:
    """forward_kl (ops/conv_kl.py), vectorised: Y = act(conv(X, W) + b), `block` rows of Y an invocation (output t
    is row block*ROW + t), each texel of W fetched serving all of them; with `cols` (wgsl_cols) that many output
    texels of each row (output t * cols + j), each texel of X fetched serving them all. Inputs X, W (, B)."""
    k = kl.KernelDef()
    ih, iw, ic, ic4, oc, oc4, oh, kh, kw, sh, sw, pt, pl, dh, dw = _syms(
        k, c, "ih", "iw", "ic", "ic4", "oc", "oc4", "oh", "kh", "kw", "sh", "sw", "pt", "pl", "dh", "dw")
    rows = _rows(k, block, oh)
    x, qs = _cols(k, cols, oc4)  # the position and the output channel texels
    q = qs[0]
    sfx = [f"_{j}" if cols > 1 else "" for j in range(cols)]
    acc = [[k.let(f"acc{t}{sfx[j]}", load("B", 0, qj) if c["has_bias"] else splat(0.0)) for j, qj in enumerate(qs)]
           for t in range(block)]
    depthwise = c["depthwise"] and c["groups"] != 1
    assert cols == 1 or not depthwise, c
    full, rest = divmod(c["ic"], 4)
    with k.loop("a", kh) as a:
        # each row's input row of the tap (clamped inside X) and whether it is inside (1.0) or padding (0.0)
        xr, inside = [], []
        for t, (n, y) in enumerate(rows):
            hi = k.let(f"hi{t}", y * sh - pt + a * dh)
            inside.append(k.let(f"in{t}", kl.select(_inside(hi, ih), 1.0, 0.0)))
            xr.append(k.let(f"xr{t}", n * ih + kl.maximum(kl.minimum(hi, ih - 1), 0)))
        with k.loop("b", kw) as b:
            wi = k.let("wi", x * sw - pl + b * dw)
            with k.when(_inside(wi, iw)):
                xc = k.let("xc", wi * ic4)
                wcs = [k.let(f"wc{sfx[j]}", b * oc4 + qj) for j, qj in enumerate(qs)]
                if depthwise:  # channel q's 4 lanes times their own weights
                    w = k.let("w", load("W", a, wcs[0]))
                    for t in range(block):
                        k.set(acc[t][0], acc[t][0] + load("X", xr[t], xc + q) * w * inside[t])
                else:
                    _dense_taps(k, block, acc, xr, inside, xc, wcs, k.let("wr", a * ic), full, rest)
    batch_outs(k, block, oh, [_activate(v, act, attrs or {}) * valid(oc, qs[j]) for vs in acc
                              for j, v in enumerate(vs)], cols)
    return k


def grad_input_vec_kl(c: dict, block: int = 1, cols: int = 1) -> kl.KernelDef:
    """grad_input_kl (ops/conv_kl.py), vectorised: dX = the transposed conv of dZ with W, `block` rows of dX an
    invocation (output t is row block*ROW + t), each texel of W fetched serving all of them; with `cols` (wgsl_cols)
    that many output texels of each row (output t * cols + j), each texel of dZ fetched serving them all. Inputs DZ,
    W."""
    k = kl.KernelDef()
    ih, ic, ic4, oc, oc4, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw = _syms(
        k, c, "ih", "ic", "ic4", "oc", "oc4", "oh", "ow", "kh", "kw", "sh", "sw", "pt", "pl", "dh", "dw")
    rows = _rows(k, block, ih)
    x, qs = _cols(k, cols, ic4)  # the position and the input channel texels
    q = qs[0]
    sfx = [f"_{j}" if cols > 1 else "" for j in range(cols)]
    acc = [[k.let(f"acc{t}{sfx[j]}", splat(0.0)) for j in range(cols)] for t in range(block)]
    depthwise = c["depthwise"] and c["groups"] != 1
    assert cols == 1 or not depthwise, c
    # the rows of W of each texel's 4 channels (a padding channel's clamped to the last: its lane is zeroed below)
    chs = [] if depthwise else [[k.let(f"ch{j}{sfx[i]}", kl.minimum(4 * qi + j, ic - 1)) for j in range(4)]
                                for i, qi in enumerate(qs)]
    with k.loop("a", kh) as a:
        # each row's row of dZ for the tap (clamped inside dZ) and whether the tap hits one (1.0) or not (0.0)
        dr, hit = [], []
        for t, (n, y) in enumerate(rows):
            th = k.let(f"th{t}", y + pt - a * dh)
            yh = k.let(f"yh{t}", kl.maximum(th, 0) // sh)
            hit.append(k.let(f"hit{t}", kl.select((th >= 0) & (yh * sh).eq(th) & (yh < oh), 1.0, 0.0)))
            dr.append(k.let(f"dr{t}", n * oh + kl.minimum(yh, oh - 1)))
        with k.loop("b", kw) as b:
            tw = k.let("tw", x + pl - b * dw)
            with k.when(tw >= 0):
                yw = k.let("yw", tw // sw)
                with k.when((yw * sw).eq(tw) & (yw < ow)):
                    dc = k.let("dc", yw * oc4)
                    if depthwise:
                        w = k.let("w", load("W", a, b * oc4 + q))
                        for t in range(block):
                            k.set(acc[t][0], acc[t][0] + load("DZ", dr[t], dc + q) * w * hit[t])
                    else:
                        _dense_transposed_taps(k, block, acc, dr, hit, dc, b * oc4, k.let("wr", a * ic), chs,
                                               oc, c["oc"])
    batch_outs(k, block, ih, [v * valid(ic, qs[j]) for vs in acc for j, v in enumerate(vs)], cols)
    return k


def _weight_rows(c: dict) -> int:
    """The rows of a conv's weight: kh * icg."""
    return c["kh"] * (1 if c["depthwise"] and c["groups"] != 1 else c["ic"])


def chans_of(c: dict) -> int:
    """The rows of the weight gradient an invocation of WebGPU's computes: 4 input channels of a tap where a conv of
    groups 1 has whole texels of them (each texel of dZ fetched serves the 4), else 1."""
    return 4 if c["groups"] == 1 and c["ic"] % 4 == 0 else 1


def split_of(c: dict) -> int:
    """The parts WebGPU splits the weight gradient's sum into (1: none): as many as give SPLIT_INVOCATIONS
    invocations, at most one a row of the output (oh)."""
    invocations = _weight_rows(c) * c["kw"] * c["oc4"] // chans_of(c)
    return max(1, min(c["oh"], -(-SPLIT_INVOCATIONS // invocations)))


def split_sum_kl(split: int, rows: int) -> kl.KernelDef:
    """T[r] = the sum of the `split` partial sums P[p*rows + r] of a split weight gradient (grad_weight_vec_kl), for
    its `rows` rows (zero past them)."""
    k = kl.KernelDef()
    parts, rows = k.syms(parts=split, wrows=rows)
    acc = k.let("acc", splat(0.0))
    with k.when(ROW < rows):
        with k.loop("p", parts) as p:
            k.set(acc, acc + load("P", p * rows + ROW, COL))
    k.out(acc)
    return k


def grad_weight_vec_kl(c: dict, split: int = 1, chans: int = 1) -> kl.KernelDef:
    """grad_weight_kl (ops/conv_kl.py), vectorised: dW = sum over the u_batch samples and positions of dZ times the
    tap's X, X read as XT, 4 samples a fetch of it; rows past the weight's zero. Inputs DZ, XT. `chans` (chans_of)
    rows an invocation, output t row chans*ROW + t, each texel of dZ fetched serving them all. With `split` > 1, row
    p*R + r (R the weight's rows) holds part p of row r's sum: that of the output rows ceil(oh / split) * p on
    (split_sum_kl adds them)."""
    k = kl.KernelDef()
    ih, iw, ic, oc, oc4, oh, ow, kh, sh, sw, pt, pl, dh, dw, nb4 = _syms(
        k, c, "ih", "iw", "ic", "oc", "oc4", "oh", "ow", "kh", "sh", "sw", "pt", "pl", "dh", "dw", "nb4")
    depthwise = c["depthwise"] and c["groups"] != 1
    icg = 1 if depthwise else ic
    assert chans == 1 or (not depthwise and c["ic"] % chans == 0), (chans, c)
    row = chans * ROW if chans > 1 else ROW  # (the first row of the invocation's)
    if split > 1:
        parts, chunk, wrows = k.syms(parts=split, chunk=-(-c["oh"] // split), wrows=_weight_rows(c))
        part = k.let("part", row // wrows)
        row = k.let("wrow", row - part * wrows)
        y0 = k.let("y0", part * chunk)
        ys = (minimum(y0 + chunk, oh), y0)
    else:
        ys = (oh, 0)
    a = k.let("a", row // icg)
    i = k.let("i", row - a * icg)  # the (first) input channel (groups 1)
    b = k.let("b", COL // oc4)
    q = k.let("q", COL - b * oc4)  # the output channel texel
    acc = [k.let(f"acc{t}", splat(0.0)) for t in range(chans)]
    batch = uniform("u_batch", "int")
    full = k.let("full", batch // 4)
    # XT's rows of the 4 channels of texel q (depthwise: a padding channel's clamped to the last; its dZ lane is zero)
    chs = [k.let(f"ch{j}", minimum(4 * q + j, ic - 1)) for j in range(4)] if depthwise else None
    with k.when(a < kh):
        with k.loop("y", *ys) as y:
            hi = k.let("hi", y * sh - pt + a * dh)
            with k.when(_inside(hi, ih)):
                with k.loop("x", ow) as x:
                    wi = k.let("wi", x * sw - pl + b * dw)
                    with k.when(_inside(wi, iw)):
                        xc, dc = k.let("xc", wi * nb4), k.let("dc", x * oc4 + q)
                        # each output row's rows of XT: depthwise, those of the 4 channels (one output row)
                        rows = [[k.let(f"xr{j}", chs[j] * ih + hi) for j in range(4)]] if depthwise else \
                            [[k.let(f"xr{t}", (i + t) * ih + hi)] for t in range(chans)]

                        def xs_of(v: list[kl.X], s) -> kl.X:
                            return vec4_of(*(lane(t, s) for t in v)) if depthwise else lane(v[0], s)
                        with k.loop("n4", full) as n4:
                            v = [[k.let(f"xv{t}{j}", load("XT", r, xc + n4)) for j, r in enumerate(rs)]
                                 for t, rs in enumerate(rows)]
                            for s in range(4):
                                d = k.let(f"d{s}", load("DZ", (4 * n4 + s) * oh + y, dc))
                                for t in range(chans):
                                    k.set(acc[t], acc[t] + d * xs_of(v[t], s))
                        with k.loop("n", batch, 4 * full) as n:
                            v = [[k.let(f"xw{t}{j}", load("XT", r, xc + n // 4)) for j, r in enumerate(rs)]
                                 for t, rs in enumerate(rows)]
                            d = k.let("dn", load("DZ", n * oh + y, dc))
                            for t in range(chans):
                                k.set(acc[t], acc[t] + d * xs_of(v[t], n % 4))
    for t in range(chans):
        k.out(acc[t] / uniform("u_loss_scale", "float") * valid(oc, q), t)
    return k
