"""Elementwise ops, declared once: a forward and a derivative per operand, as small expressions.

Every reader of an elementwise op's meaning reads it from here:

    codegen/expr.py     renders an expression into GLSL (vec4 per texel) and into JavaScript
                        (a number per lane, the CPU backend)
    prep/ops/torch_expr.py  evaluates it on torch tensors (for prep/torch_ir.py, the PyTorch reference of the IR)
    prep/graph.py       imports the ONNX op of each declaration (its `onnx` name and attributes)
    prep/fuse.py        fuses an op into the dense or conv layer that feeds it where its derivative
                        reads only its output Y (`fusable`)
    codegen/webgl2/layout.py      shares the output's gradient with an operand whose derivative is 1
                        (`passes_gradient`: a residual add costs no backward pass)

An expression is a tree of `E` nodes. Leaves: `arg(i)` (operand i; X, A and B below), `Y`
(the op's output), `const(v)` and `attr(name)` (an ONNX attribute, replaced by its value when a
layer is built: `bind`). Inner nodes: + - * / and unary minus, exp, log, sqrt, abs, sign, tanh,
erf, sigmoid, max, min, pow (constant exponent), where(cond, a, b) with cond one of gt, lt, ge, le.

A derivative `d[i]` is d op / d operand i; the backward computes dOperand_i = dY * d[i], summed
over the axes operand i was broadcast along (ONNX multidirectional broadcasting).

Adding an op is one entry of UNARY, BINARY or NORMS (and its tests): nothing else lists ops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class E:
    op: str
    args: tuple = ()
    value: object = None

    def __add__(self, o): return E("add", (self, lift(o)))
    def __radd__(self, o): return E("add", (lift(o), self))
    def __sub__(self, o): return E("sub", (self, lift(o)))
    def __rsub__(self, o): return E("sub", (lift(o), self))
    def __mul__(self, o): return E("mul", (self, lift(o)))
    def __rmul__(self, o): return E("mul", (lift(o), self))
    def __truediv__(self, o): return E("div", (self, lift(o)))
    def __rtruediv__(self, o): return E("div", (lift(o), self))
    def __neg__(self): return E("neg", (self,))
    def __gt__(self, o): return E("gt", (self, lift(o)))
    def __lt__(self, o): return E("lt", (self, lift(o)))
    def __ge__(self, o): return E("ge", (self, lift(o)))
    def __le__(self, o): return E("le", (self, lift(o)))


def lift(v) -> E:
    return v if isinstance(v, E) else E("const", value=float(v))


def arg(i: int) -> E:
    return E("arg", value=i)


def const(v: float) -> E:
    return E("const", value=float(v))


def attr(name: str) -> E:
    return E("attr", value=name)


def _fn(op):
    return lambda *a: E(op, tuple(lift(x) for x in a))


exp, log, sqrt, abs_, sign, tanh, erf, sigmoid = (_fn(k) for k in
                                                    ("exp", "log", "sqrt", "abs", "sign", "tanh", "erf", "sigmoid"))
maximum, minimum = _fn("max"), _fn("min")


def where(cond: E, a, b) -> E:
    return E("where", (cond, lift(a), lift(b)))


def pow_(x: E, exponent) -> E:
    return E("pow", (x, lift(exponent)))


X = A = arg(0)
B = arg(1)
Y = E("out")

COMPARISONS = ("gt", "lt", "ge", "le")


@dataclass(frozen=True)
class Elementwise:
    """One elementwise op. `attrs`: ONNX attribute -> default (also the IR layer's attrs);
    `onnx`: the ONNX op it imports from (None: recognised from a pattern, prep/graph.py)."""

    name: str
    onnx: str | None
    f: E
    d: tuple[E, ...]
    attrs: dict = field(default_factory=dict)

    @property
    def arity(self) -> int:
        return len(self.d)

    @property
    def fusable(self) -> bool:
        """A unary op whose derivative reads only its output: it can run inside the kernel that
        produces its input (the backward then has Y, not X)."""
        return self.arity == 1 and leaves(self.d[0]) <= {"out"}


def leaves(e: E) -> set[str]:
    if e.op == "arg":
        return {f"arg{e.value}"}
    if e.op in ("out", "const", "attr"):
        return {e.op} - {"const", "attr"}
    return set().union(*(leaves(a) for a in e.args)) if e.args else set()


def bind(e: E, attrs: dict) -> E:
    """The expression with every attr node replaced by its value."""
    if e.op == "attr":
        return const(attrs[e.value])
    if not e.args:
        return e
    args = tuple(bind(a, attrs) for a in e.args)
    if e.op in _FOLD and all(a.op == "const" for a in args):  # attribute arithmetic (pow's exponent - 1)
        return const(_FOLD[e.op](*(a.value for a in args)))
    return E(e.op, args, e.value)


_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "neg": lambda a: -a}


def is_one(e: E) -> bool:
    return e.op == "const" and e.value == 1.0


_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875  # ONNX's float32 defaults
_alpha = attr("alpha")
_clip01 = lambda v: minimum(maximum(v, 0.0), 1.0)  # noqa: E731

# name -> declaration. f in the operands (X), d[0] = dY/dX, written in Y where that is exact, so that
# the op fuses into its producer (`fusable`).
UNARY = {e.name: e for e in [
    Elementwise("relu", "Relu", maximum(X, 0.0), (where(Y > 0.0, 1.0, 0.0),)),
    Elementwise("leaky_relu", "LeakyRelu", where(X > 0.0, X, X * _alpha), (where(Y > 0.0, 1.0, _alpha),),
                {"alpha": 0.01}),
    Elementwise("sigmoid", "Sigmoid", sigmoid(X), (Y * (1.0 - Y),)),
    Elementwise("tanh", "Tanh", tanh(X), (1.0 - Y * Y,)),
    # ReLU6 and clamp; the gradient passes strictly inside (min, max), as torch's hardtanh
    Elementwise("clip", "Clip", minimum(maximum(X, attr("min")), attr("max")),
                (where(Y > attr("min"), 1.0, 0.0) * where(Y < attr("max"), 1.0, 0.0),),
                {"min": -3.4028234663852886e38, "max": 3.4028234663852886e38}),
    Elementwise("hardsigmoid", "HardSigmoid", _clip01(_alpha * X + attr("beta")),
                (where(Y > 0.0, 1.0, 0.0) * where(Y < 1.0, _alpha, 0.0),), {"alpha": 0.2, "beta": 0.5}),
    # torch's form x * relu6(x + 3) / 6, and its backward (hardswish_backward)
    Elementwise("hardswish", "HardSwish", X * minimum(maximum(X + 3.0, 0.0), 6.0) / 6.0,
                (where(X < -3.0, 0.0, where(X <= 3.0, X / 3.0 + 0.5, 1.0)),)),
    Elementwise("elu", "Elu", where(X > 0.0, X, _alpha * (exp(X) - 1.0)), (where(Y > 0.0, 1.0, Y + _alpha),),
                {"alpha": 1.0}),
    Elementwise("selu", "Selu", attr("gamma") * where(X > 0.0, X, _alpha * (exp(X) - 1.0)),
                (where(Y > 0.0, attr("gamma"), Y + attr("gamma") * _alpha),),
                {"alpha": _SELU_ALPHA, "gamma": _SELU_GAMMA}),
    # log(1 + e^x) without overflow; its derivative in X (in Y it would cancel for large negative x)
    Elementwise("softplus", "Softplus", maximum(X, 0.0) + log(1.0 + exp(-abs_(X))), (sigmoid(X),)),
    Elementwise("exp", "Exp", exp(X), (Y,)),
    Elementwise("log", "Log", log(X), (1.0 / X,)),
    Elementwise("sqrt", "Sqrt", sqrt(X), (0.5 / sqrt(X),)),  # in X: 0.5 / Y is infinite in padding lanes (Y = 0)
    Elementwise("neg", "Neg", -X, (const(-1.0),)),
    Elementwise("abs", "Abs", abs_(X), (sign(X),)),
    Elementwise("sign", "Sign", sign(X), (const(0.0),)),  # (torch.sign's gradient is zero, at 0 too)
    Elementwise("reciprocal", "Reciprocal", 1.0 / X, (-(Y * Y),)),
    # Pow with a constant exponent (prep/graph.py takes it from the second input)
    Elementwise("pow", "Pow", pow_(X, attr("exponent")), (attr("exponent") * pow_(X, attr("exponent") - 1.0),),
                {"exponent": 1.0}),
    Elementwise("erf", "Erf", erf(X), (2.0 / math.sqrt(math.pi) * exp(-(X * X)),)),
    # x * sigmoid(x), what nn.SiLU exports as (Sigmoid and Mul of one tensor: prep/graph.py recognises it)
    Elementwise("silu", None, X * sigmoid(X), (sigmoid(X) * (1.0 + X * (1.0 - sigmoid(X))),)),
    # nn.GELU, x * (erf(x / sqrt 2) + 1) * 0.5 as torch exports it (and Gelu lowers: prep/lower_ops.py), five
    # nodes that prep/fuse.py recognises (fuse_gelu): one pass forward and one backward where they were five each
    Elementwise("gelu", None, X * (erf(X / math.sqrt(2.0)) + 1.0) * 0.5,
                ((erf(X / math.sqrt(2.0)) + 1.0) * 0.5 + X * exp(X * X * -0.5) * (1.0 / math.sqrt(2.0 * math.pi)),)),
    # Where(Equal(x, value), fill, other) of constants (masked_fill: a bool attention mask made additive,
    # prep/graph.py recognises it); no gradient reaches x. An infinite fill is taken as the largest float
    # Where(IsNaN(x), fill, x) of a constant fill (torch's scaled_dot_product_attention export: a row of scores all
    # masked gives 0 attention, not NaN): x, or fill where x is NaN (neither < 0 nor >= 0); its gradient 1 where
    # x is a number, else 0
    Elementwise("nan_to", None, where(X < 0.0, X, where(X >= 0.0, X, attr("fill"))),
                (where(X < 0.0, 1.0, where(X >= 0.0, 1.0, 0.0)),), {"fill": 0.0}),
    Elementwise("select_eq", None,
                where(X > attr("value"), attr("other"), where(X < attr("value"), attr("other"), attr("fill"))),
                (const(0.0),), {"value": 0.0, "fill": 0.0, "other": 0.0}),
]}

BINARY = {e.name: e for e in [
    Elementwise("add", "Add", A + B, (const(1.0), const(1.0))),
    Elementwise("sub", "Sub", A - B, (const(1.0), const(-1.0))),
    Elementwise("mul", "Mul", A * B, (B, A)),
    Elementwise("div", "Div", A / B, (1.0 / B, -A / (B * B))),
    # the slope B is a parameter, per channel or one (prep/graph.py)
    Elementwise("prelu", "PRelu", where(A > 0.0, A, A * B), (where(A > 0.0, 1.0, B), where(A > 0.0, 0.0, A))),
]}

# Batch-norm in inference form where it cannot fold into the layer before it (prep/fold.py: free_batchnorm):
# operands X, the scale and the shift (parameters, per channel: the batch-norm's weight and bias), the running mean
# and 1 / sqrt(running_var + eps) (constants, per channel)
_M, _S = arg(3), arg(4)
NORMS = {e.name: e for e in [
    Elementwise("batchnorm_affine", None, (X - _M) * _S * B + arg(2),
                (_S * B, (X - _M) * _S, const(1.0), -(_S * B), (X - _M) * B)),
]}

OPS: dict[str, Elementwise] = {**UNARY, **BINARY, **NORMS}
BY_ONNX: dict[str, Elementwise] = {e.onnx: e for e in OPS.values() if e.onnx}


def layer_attrs(decl: Elementwise, attrs: dict) -> dict:
    """The attribute values a layer of `decl` computes with: its own, else the defaults."""
    return {k: float(attrs.get(k, v)) for k, v in decl.attrs.items()}


def forward_of(op: str, attrs: dict) -> E:
    decl = OPS[op]
    return bind(decl.f, layer_attrs(decl, attrs))


def derivatives_of(op: str, attrs: dict) -> tuple[E, ...]:
    decl = OPS[op]
    a = layer_attrs(decl, attrs)
    return tuple(bind(d, a) for d in decl.d)


def passes_gradient(op: str, slot: int) -> bool:
    """Whether operand `slot`'s gradient is the output's gradient as it is (d = 1)."""
    return op in OPS and is_one(OPS[op].d[slot])


# erf(x) for the targets without one (GLSL, JavaScript), as an expression: Abramowitz and Stegun
# 7.1.26, |error| <= 1.5e-7
_ERF_P, _ERF_A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf_expansion(x: E) -> E:
    t = 1.0 / (1.0 + _ERF_P * abs_(x))
    poly = const(_ERF_A[-1])
    for a in reversed(_ERF_A[:-1]):
        poly = a + t * poly
    return sign(x) * (1.0 - t * poly * exp(-(x * x)))
