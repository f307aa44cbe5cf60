"""The conv family's generic kernels, in the kernel language (codegen/kl.py): what the CPU backend and WGSL run.

WebGL2 runs the hand-written GLSL templates beside them (conv_forward, conv_grad_input, conv_grad_weight,
conv_transpose_forward: 4x4 channel blocks a fetch, depthwise, sample-blocked and column-blocked draws); each such
Kernel has both (Kernel.routine), and the CPU deals the generic kernel's output out as the routine lays it out
(runtime/cpu.js: cpuBlocked; cpu_columns.js: cpuColumns). These are written for clarity: a texel's 4 lanes one by one, each
an output channel, its sum over the taps and the channels of its group. `c` is the conv's constants
(ops/conv.py: _consts; a conv_transpose's, ops/conv_transpose.py: _as_conv); their names are the symbols'.

Layouts (codegen/webgl2/layout.py): X (ic, ih, iw) rows n*ih + h, texel w*ic4 + ic/4, lane ic % 4; Y alike; W[oc, j, kh, kw]
at row kh*icg + j, texel kw*oc4 + oc/4, lane oc % 4; XT (X with the samples as channels, ops/common.py:
samples_last) at row ch*ih + h, texel w*nb4 + n/4, lane n % 4.
"""
from __future__ import annotations

from texelfit.prep.elementwise import forward_of

from .. import kl
from ..expr import to_kl
from ..kl import COL, ROW, lane, load, splat, uniform, valid


def _syms(k: kl.KernelDef, c: dict, *names: str) -> list[kl.X]:
    return k.syms(**{n: c[n] for n in names})


def _activate(z: kl.X, act: str, attrs: dict) -> kl.X:
    """act(z) of a fused activation (prep/elementwise.py), or z."""
    if act == "none":
        return z
    y = to_kl(forward_of(act, attrs), [z])
    return y if y.type == "vec4" else splat(y)


def _inside(i: kl.X, size: kl.X) -> kl.X:
    return (i >= 0) & (i < size)


def forward_kl(c: dict, act: str = "none", attrs: dict | None = None) -> kl.KernelDef:
    """Y[n, oc, oh, ow] = act(b[oc] + sum_{j, kh, kw} X[n, g*icg + j, oh*sh - pt + kh*dh, ow*sw - pl + kw*dw]
    * W[oc, j, kh, kw]), g = oc / ocg, the taps inside the image; padding lanes 0. Inputs X, W (, B)."""
    k = kl.KernelDef()
    ih, iw, ic4, oc, oc4, oh, kh, kw, sh, sw, pt, pl, dh, dw, icg, ocg = _syms(
        k, c, "ih", "iw", "ic4", "oc", "oc4", "oh", "kh", "kw", "sh", "sw", "pt", "pl", "dh", "dw", "icg", "ocg")
    n = k.let("n", ROW // oh)
    y = k.let("y", ROW - n * oh)
    x = k.let("x", COL // oc4)
    q = k.let("q", COL - x * oc4)  # the channel texel
    z = k.let("z", load("B", 0, q) if c["has_bias"] else splat(0.0))
    with k.loop("j", 4) as j:
        o = k.let("oo", 4 * q + j)
        with k.when(o < oc):
            base = k.let("base", o // ocg * icg)  # the group's first input channel
            acc = k.let("acc", lane(z, j))
            with k.loop("a", kh) as a:
                hi = k.let("hi", y * sh - pt + a * dh)
                with k.when(_inside(hi, ih)):
                    with k.loop("b", kw) as b:
                        wi = k.let("wi", x * sw - pl + b * dw)
                        with k.when(_inside(wi, iw)):
                            with k.loop("i", icg) as i:
                                ch = k.let("ch", base + i)
                                k.set(acc, acc + lane(load("X", n * ih + hi, wi * ic4 + ch // 4), ch % 4)
                                      * lane(load("W", a * icg + i, b * oc4 + q), j))
            k.set_lane(z, j, acc)
    k.out(_activate(z, act, attrs or {}) * valid(oc, q))
    return k


def grad_input_kl(c: dict, bias: bool = False, act: str = "none", attrs: dict | None = None) -> kl.KernelDef:
    """dX[n, ch, ih, iw] = sum over the oc of ch's group g and the taps (kh, kw) with oh*sh = ih + pt - kh*dh and
    ow*sw = iw + pl - kw*dw inside Y of dZ[n, oc, oh, ow] * W[oc, ch - g*icg, kh, kw]; padding lanes 0. Inputs
    DZ, W. With `bias` (and `act`): a conv_transpose's forward, act(that + b[ch]) (ops/conv_transpose.py), input B."""
    k = kl.KernelDef()
    ih, ic, ic4, oc4, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, icg, ocg = _syms(
        k, c, "ih", "ic", "ic4", "oc4", "oh", "ow", "kh", "kw", "sh", "sw", "pt", "pl", "dh", "dw", "icg", "ocg")
    n = k.let("n", ROW // ih)
    y = k.let("y", ROW - n * ih)
    x = k.let("x", COL // ic4)
    q = k.let("q", COL - x * ic4)
    z = k.let("z", load("B", 0, q) if bias else splat(0.0))
    with k.loop("j", 4) as j:
        ch = k.let("ch", 4 * q + j)
        with k.when(ch < ic):
            g = k.let("g", ch // icg)
            jj = k.let("jj", ch - g * icg)
            acc = k.let("acc", lane(z, j))
            with k.loop("a", kh) as a:
                th = k.let("th", y + pt - a * dh)
                with k.when(th >= 0):  # (a tap of a row of Y: th a multiple of sh, below oh*sh)
                    yh = k.let("yh", th // sh)
                    with k.when((yh * sh).eq(th) & (yh < oh)):
                        with k.loop("b", kw) as b:
                            tw = k.let("tw", x + pl - b * dw)
                            with k.when(tw >= 0):
                                yw = k.let("yw", tw // sw)
                                with k.when((yw * sw).eq(tw) & (yw < ow)):
                                    with k.loop("m", ocg) as m:
                                        o = k.let("oo", g * ocg + m)
                                        k.set(acc, acc + lane(load("DZ", n * oh + yh, yw * oc4 + o // 4), o % 4)
                                              * lane(load("W", a * icg + jj, b * oc4 + o // 4), o % 4))
            k.set_lane(z, j, acc)
    k.out(_activate(z, act, attrs or {}) * valid(ic, q))
    return k


def grad_weight_kl(c: dict) -> kl.KernelDef:
    """dW[oc, j, kh, kw] = sum over the u_batch samples and the (oh, ow) of dZ[n, oc, oh, ow]
    * X[n, g*icg + j, oh*sh - pt + kh*dh, ow*sw - pl + kw*dw] (inside X), X read as XT; padding lanes 0; the loss
    gradient came scaled (u_loss_scale). Inputs DZ, XT."""
    k = kl.KernelDef()
    ih, iw, oc, oc4, oh, ow, kh, sh, sw, pt, pl, dh, dw, icg, ocg, nb4 = _syms(
        k, c, "ih", "iw", "oc", "oc4", "oh", "ow", "kh", "sh", "sw", "pt", "pl", "dh", "dw", "icg", "ocg", "nb4")
    a = k.let("a", ROW // icg)
    i = k.let("i", ROW - a * icg)
    b = k.let("b", COL // oc4)
    q = k.let("q", COL - b * oc4)
    z = k.let("z", splat(0.0))
    with k.loop("j", 4) as j:
        o = k.let("oo", 4 * q + j)
        with k.when((o < oc) & (a < kh)):
            ch = k.let("ch", o // ocg * icg + i)
            acc = k.let("acc", 0.0)
            with k.loop("y", oh) as y:
                hi = k.let("hi", y * sh - pt + a * dh)
                with k.when(_inside(hi, ih)):
                    with k.loop("x", ow) as x:
                        wi = k.let("wi", x * sw - pl + b * dw)
                        with k.when(_inside(wi, iw)):
                            with k.loop("n", uniform("u_batch", "int")) as n:
                                k.set(acc, acc + lane(load("DZ", n * oh + y, x * oc4 + q), j)
                                      * lane(load("XT", ch * ih + hi, wi * nb4 + n // 4), n % 4))
            k.set_lane(z, j, acc)
    k.out(z / uniform("u_loss_scale", "float"))
    return k


def interleave_cols_kl(block: int, halves: int) -> kl.KernelDef:
    """Y from the block*halves parts T0.. of a column-blocked conv output (webgl2/blocking.py: column_blocked): channel
    texel c4 of position ow of a row is in part block*g + ow % block, g = c4 / c4h its half, at texel column
    (c4 - g*c4h) * u_qb + ow / block; u_c4 texels a position, u_qb blocks a row. One fetch a texel, from the part
    picked by a branch (neighbouring fragments mostly read the same part), as the template it replaced did."""
    k = kl.KernelDef()
    c4s, qb = uniform("u_c4", "int"), uniform("u_qb", "int")
    ow = k.let("ow", COL // c4s)
    c4 = k.let("c4", COL - ow * c4s)
    q = k.let("q", ow // block)
    c4h = k.let("c4h", (c4s + (halves - 1)) // halves)
    g = k.let("g", c4 // c4h)
    at = k.let("at", (c4 - g * c4h) * qb + q)
    part = k.let("part", block * g + ow - block * q)
    v = k.let("v", splat(0.0))
    for t in range(block * halves):
        with k.when(part.eq(t)):
            k.set(v, load(f"T{t}", ROW, at))
    k.out(v)
    return k


def deal_cols_kl(block: int, halves: int) -> kl.KernelDef:
    """Part u_part of a column-blocked conv output from its whole rows Y (the generic kernel's output), the inverse of
    interleave_cols: texel column `col` of part p = block*g + m (g its half) holds channel texel col / u_qb + g*c4h of
    position (col % u_qb) * block + m, zero past u_ow positions and u_c4 texels. The WebGPU backend computes a
    column-blocked conv forward by its generic kernel and deals it out so, a dispatch a part (runtime/webgpu.js), as
    the CPU does in JavaScript (cpu_columns.js: cpuColumns)."""
    k = kl.KernelDef()
    c4s, qb = uniform("u_c4", "int"), uniform("u_qb", "int")
    part, positions = uniform("u_part", "int"), uniform("u_ow", "int")
    c4h = k.let("c4h", (c4s + (halves - 1)) // halves)
    g = k.let("g", part // block)
    ow = k.let("ow", (COL % qb) * block + part - g * block)
    c4 = k.let("c4", COL // qb + g * c4h)
    v = k.let("v", splat(0.0))
    with k.when((ow < positions) & (c4 < c4s)):
        k.set(v, load("Y", ROW, ow * c4s + c4))
    k.out(v)
    return k
