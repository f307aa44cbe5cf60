"""Elementwise expressions (prep/elementwise.py) for the kernels.

    to_kl(e, operands)  the expression over kernel-language values (codegen/kl.py), which every target prints:
                        how the elementwise kernels and every generic kernel's fused activation are written
    glsl(e)             GLSL ES 3.00 over vec4 values (a texel: 4 lanes at once; operands x0, x1, ..., the output
                        y), for the fused activation of the WebGL2 routines' templates (kernels/activation.glsl.j2)

The GLSL table maps a node kind to a snippet with {0}, {1}, ... for its rendered arguments, or to a function of the
node for the few that need more (a constant, pow). A target without a primitive rewrites the node into others
before printing (`REWRITES`, `KL_REWRITES`: erf, tanh), so the printers stay tables.
"""
from __future__ import annotations

from texelfit.prep.elementwise import E, abs_, erf_expansion, exp, sign

from . import kl
from .kernels import glsl_float


def _tanh_expansion(x: E) -> E:
    # tanh without the overflow of (e^2x - 1) / (e^2x + 1) at large |x|
    e = exp(-2.0 * abs_(x))
    return sign(x) * (1.0 - e) / (1.0 + e)


def _pow_glsl(e: E, render) -> str:
    base, n = render(e.args[0]), e.args[1].value
    if n == int(n) and abs(n) <= 4:  # GLSL's pow is undefined for a negative base: multiply
        k = int(abs(n))
        prod = " * ".join([base] * k) if k else "vec4(1.0)"
        return f"(vec4(1.0) / ({prod}))" if n < 0 else f"({prod})"
    if n == int(n):  # |x|^n with the sign of x^n
        p = f"pow(abs({base}), vec4({glsl_float(n)}))"
        return f"({p} * sign({base}))" if int(n) % 2 else p
    return f"pow({base}, vec4({glsl_float(n)}))"


GLSL = {
    "arg": lambda e, r: f"x{e.value}",
    "out": lambda e, r: "y",
    "const": lambda e, r: f"vec4({glsl_float(e.value)})",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "neg": "(-{0})",
    "exp": "exp({0})", "log": "log({0})", "sqrt": "sqrt({0})", "abs": "abs({0})", "sign": "sign({0})",
    "max": "max({0}, {1})", "min": "min({0}, {1})",
    "sigmoid": "(vec4(1.0) / (vec4(1.0) + exp(-{0})))",
    "where": "mix({2}, {1}, {0})",  # mix(b, a, bvec4) selects a where the condition holds, exactly
    "gt": "greaterThan({0}, {1})", "lt": "lessThan({0}, {1})",
    "ge": "greaterThanEqual({0}, {1})", "le": "lessThanEqual({0}, {1})",
    "pow": _pow_glsl,
}


REWRITES = {"glsl": {"erf": erf_expansion, "tanh": _tanh_expansion}}


def _printer(table: dict, rewrites: dict):
    def render(e: E) -> str:
        if e.op in rewrites:
            return render(rewrites[e.op](*e.args))
        rule = table[e.op]
        if callable(rule):
            return rule(e, render)
        return rule.format(*(render(a) for a in e.args))
    return render


glsl = _printer(GLSL, REWRITES["glsl"])


def functions(f, ds) -> dict:
    """Kernel constants holding the GLSL of an expression and its derivatives (`glsl_*`), for a WebGL2 routine's fused
    activation (kernels/activation.glsl.j2); the other targets print the routine's generic kernel (to_kl below)."""
    return {"glsl_f": glsl(f), "glsl_d": [glsl(d) for d in ds]}


# ---- the kernel language (codegen/kl.py): an expression as X nodes over the operands' values ----

KL_REWRITES = {"erf": erf_expansion, "tanh": _tanh_expansion}  # primitives no target of the language has alike


def _kl_pow(base, n: float):
    if n == int(n) and abs(n) <= 4:  # GLSL's pow is undefined for a negative base: multiply
        prod = 1.0
        for _ in range(int(abs(n))):
            prod = base if isinstance(prod, float) else prod * base
        return 1.0 / prod if n < 0 else prod
    if n == int(n):  # |x|^n with the sign of x^n
        p = kl.pow_(kl.abs_(base), n)
        return p * kl.sign(base) if int(n) % 2 else p
    return kl.pow_(base, n)


def to_kl(e: E, args: list, y=None):
    """Expression e (prep/elementwise.py) as a kernel-language value (codegen/kl.py): operand i is args[i] (a vec4
    value), the output `y`. What it prints does what the GLSL table above prints: the same operations on vec4s.
    A constant comes out as a float (kl.splat it where a vec4 is wanted)."""

    def walk(e: E):
        if e.op in KL_REWRITES:
            return walk(KL_REWRITES[e.op](*e.args))
        if e.op == "arg":
            return args[e.value]
        if e.op == "out":
            assert y is not None, "to_kl: the expression reads the output"
            return y
        if e.op == "const":
            return kl.lift(float(e.value))
        if e.op == "pow":
            return _kl_pow(walk(e.args[0]), e.args[1].value)
        a = [walk(x) for x in e.args]
        if e.op == "sigmoid":
            return 1.0 / (1.0 + kl.exp(-a[0]))
        if e.op == "where":  # a bvec4 condition selects lane by lane between vec4s
            cond, p, q = a
            if cond.type == "bvec4" and p.type != "vec4" and q.type != "vec4":
                p = kl.splat(p)
            return kl.select(cond, p, q)
        return _KL[e.op](*a)

    return walk(e)


_KL = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q, "mul": lambda p, q: p * q, "div": lambda p, q: p / q,
       "neg": lambda p: -p, "exp": kl.exp, "log": kl.log, "sqrt": kl.sqrt, "abs": kl.abs_, "sign": kl.sign,
       "max": kl.maximum, "min": kl.minimum,
       "gt": lambda p, q: p > q, "lt": lambda p, q: p < q, "ge": lambda p, q: p >= q, "le": lambda p, q: p <= q}
