"""The kernel language: a kernel written once, printed as a GLSL fragment shader and as a JavaScript CPU kernel.

A kernel computes one output texel (4 lanes: a vec4) at its coordinate (`ROW`, `COL`) of the output's texture,
from loads of its input textures at computed texel coordinates, in the channel-packed layout every backend shares
(codegen/webgl2/layout.py). It is a list of statements built in Python:

    k = KernelDef()
    base = k.let("base", COL // c4 * c4)            int, float, vec4 or bool values; + - * / // % < > ...
    m = k.let("m", -3.0e38)
    with k.loop("j", c4) as j:                     for (int j = 0; j < c4; j++)
        k.set(m, maximum(m, hmax(load("X", ROW, base + j))))
    with k.when(m > 0.0): ...                      if (m > 0.0) { ... }
    k.out(exp(load("X", ROW, COL) - m))            out0: the texel written

Expressions are trees of `X` nodes: constants (Python ints and floats lift to int and float), shape constants
(`k.sym(name, value)`: a literal in GLSL, read from the kernel's constants in JavaScript), `ROW`, `COL`,
`uniform(name)`, `load(tensor, row, col)` (a vec4), `lane(v, i)`, `splat(f)`, `vec4_of(a, b, c, d)`, `to_float(i)`, `to_int(f)`, arithmetic (a vec4
with a float broadcasts), exp, log, sqrt, abs, maximum, minimum, comparisons (`a.eq(b)`, `a.ne(b)` for == and !=), & and | of bools,
`select(cond, a, b)`, `dot`, `hmax`, `hsum`, constant arrays (`t = k.table(name, values)`, read as `t[i]`: values
ints, floats, or 4-tuples read as vec4s), sign, pow_ (what prep/elementwise.py's expressions need), uints
(`u32(v)`, `to_uint(i)`: + and * wrap, ^, >>), and
`valid(cols, j)`: 1.0 in each lane of channel texel j that holds one of `cols` channels, 0.0 in padding lanes
(`is_valid(cols, j)`: the same as a condition), `mix(a, b, t)` (GLSL's: a * (1 - t) + b * t, a choice by a 0-or-1
float without a branch).

An optimizer (ops/optim.py) reads `gradient()`: the parameter's gradient at the output texel, computed by the
gradient kernel its pass includes. GLSL prints it as valueAt(_p), the gradient kernel's function placed before main
(codegen/kernels.py: render_kernel); JavaScript and WGSL as the texel of the output's coordinate in an input named G,
a scratch texture the backend fills with the gradient kernel first (runtime/cpu.js: cpuOptimizer). Statements in
`with k.variant("NAME"):` run in the program compiled with NAME defined alone on WebGL2 (#ifdef NAME: fit's
PROXIMAL variant, runtime/runner.js: variant); the other targets run them always, where they bind what makes them
do nothing in a run without the variant (u_mu 0, the parameter itself as P0).

Printers (codegen/kl_print.py) emit the body of `main()` in GLSL, where a vec4 is a vec4, and a JavaScript function
over the CPU backend's textures, where a vec4 is four numbers (the printer writes each lane out: no arrays).
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass

TYPES = ("int", "float", "vec4", "bool", "bvec4", "uint")


@dataclass(frozen=True)
class X:
    op: str
    args: tuple = ()
    value: object = None
    type: str = "float"

    def _bin(self, op, o, swap=False):
        if self.type == "uint" and isinstance(o, int) and not isinstance(o, bool):
            o = u32(o)
        a, b = (lift(o), self) if swap else (self, lift(o))
        return X(op, (a, b), type=_arith_type(op, a, b))

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __floordiv__(self, o): return self._bin("idiv", o)
    def __rfloordiv__(self, o): return self._bin("idiv", o, True)
    def __mod__(self, o): return self._bin("mod", o)
    def __neg__(self): return X("neg", (self,), type=self.type)
    def __lt__(self, o): return _cmp("lt", self, o)
    def __gt__(self, o): return _cmp("gt", self, o)
    def __le__(self, o): return _cmp("le", self, o)
    def __ge__(self, o): return _cmp("ge", self, o)
    def eq(self, o): return _cmp("eq", self, o)
    def ne(self, o): return _cmp("ne", self, o)

    def __and__(self, o): return _logic("and", self, o)
    def __or__(self, o): return _logic("or", self, o)
    def __xor__(self, o): return self._bin("xor", o)
    def __rshift__(self, o): return self._bin("shr", o)


def lift(v) -> X:
    if isinstance(v, X):
        return v
    if isinstance(v, bool):
        raise TypeError("kl: no bool constants")
    if isinstance(v, int):
        return X("int", value=v, type="int")
    return X("float", value=float(v), type="float")


def u32(v: int) -> X:
    """An unsigned 32-bit constant. uint values (u32, to_uint) wrap modulo 2^32 in + and *, and have ^ and >> (by a
    uint): what an integer hash needs (ops/dropout.py), printed alike in GLSL, JavaScript and WGSL."""
    if not 0 <= v < 1 << 32:
        raise ValueError(f"kl: u32 {v}")
    return X("uint", value=v, type="uint")


def to_uint(i) -> X:
    """A non-negative int as a uint."""
    i = lift(i)
    if i.type != "int":
        raise TypeError(f"kl: to_uint of a {i.type}")
    return X("uint_of", (i,), type="uint")


def _arith_type(op: str, a: X, b: X) -> str:
    if "uint" in (a.type, b.type):
        if a.type != b.type or op not in ("add", "mul", "xor", "shr"):
            raise TypeError(f"kl: {op} of {a.type} and {b.type} (uints: + * ^ >> of two uints)")
        return "uint"
    if op in ("xor", "shr"):
        raise TypeError(f"kl: {op} of {a.type} and {b.type} (uints only)")
    if op in ("idiv", "mod"):
        if a.type != "int" or b.type != "int":
            raise TypeError(f"kl: {op} of {a.type} and {b.type} (integers only)")
        return "int"
    types = {a.type, b.type}
    if types == {"int"}:
        if op == "div":
            raise TypeError("kl: / of two ints (write // for integer division)")
        return "int"
    if "int" in types or types - {"float", "vec4"}:
        raise TypeError(f"kl: {op} of {a.type} and {b.type}")
    return "vec4" if "vec4" in types else "float"


def _cmp(op, a, b) -> X:
    a, b = lift(a), lift(b)
    if a.type == "vec4" or b.type == "vec4":
        return X(op, (a, b), type="bvec4")
    return X(op, (a, b), type="bool")


def _logic(op, a, b) -> X:
    if a.type != "bool" or b.type != "bool":
        raise TypeError(f"kl: {op} of {a.type} and {b.type} (bools only)")
    return X(op, (a, b), type="bool")


def to_float(i) -> X:
    i = lift(i)
    if i.type not in ("int", "uint"):
        raise TypeError(f"kl: to_float of a {i.type}")
    return X("float_of", (i,), type="float")


def to_int(f) -> X:
    """A float's integer part (toward zero): an exact integer stored as a float (an id) as an int."""
    f = lift(f)
    if f.type != "float":
        raise TypeError(f"kl: to_int of a {f.type}")
    return X("int_of", (f,), type="int")


ROW = X("row", type="int")
COL = X("col", type="int")


def uniform(name: str, type_: str) -> X:
    return X("uniform", value=name, type=type_)


def load(tensor: str, row, col) -> X:
    return X("load", (lift(row), lift(col)), tensor, "vec4")


def lane(v: X, i) -> X:
    """Lane i (an int, or an int expression: GLSL indexes a vec4 dynamically) of v."""
    i = lift(i)
    if v.type != "vec4" or i.type != "int":
        raise TypeError(f"kl: lane {i.type} of a {v.type}")
    return X("lane", (v, i), type="float")


def splat(f) -> X:
    return X("splat", (lift(f),), type="vec4")


def vec4_of(a, b, c, d) -> X:
    """The vec4 of 4 floats (lane 0 first)."""
    args = tuple(lift(x) for x in (a, b, c, d))
    if any(x.type != "float" for x in args):
        raise TypeError(f"kl: vec4_of {[x.type for x in args]}")
    return X("vec4_of", args, type="vec4")


def _unary(op):
    def f(x):
        x = lift(x)
        if x.type not in ("float", "vec4"):
            raise TypeError(f"kl: {op} of {x.type}")
        return X(op, (x,), type=x.type)
    return f


exp, log, sqrt, abs_, sign = (_unary(k) for k in ("exp", "log", "sqrt", "abs", "sign"))


def pow_(a, b) -> X:
    """a to the power b (a float or vec4 each; a negative a with a non-integer b is undefined, as in GLSL)."""
    a, b = lift(a), lift(b)
    return X("pow", (a, b), type=_arith_type("pow", a, b))


def maximum(a, b) -> X:
    a, b = lift(a), lift(b)
    return X("max", (a, b), type=_arith_type("max", a, b))


def minimum(a, b) -> X:
    a, b = lift(a), lift(b)
    return X("min", (a, b), type=_arith_type("min", a, b))


def select(cond: X, a, b) -> X:
    """a where cond holds, else b (lane by lane for a bvec4 condition)."""
    a, b = lift(a), lift(b)
    t = "vec4" if "vec4" in (a.type, b.type) else a.type
    if cond.type == "bvec4" and t != "vec4":
        raise TypeError("kl: select by a bvec4 between scalars")
    return X("select", (cond, a, b), type=t)


def mix(a, b, t) -> X:
    """a * (1 - t) + b * t (lane by lane; t a float or vec4): with t 0 or 1 exactly a or b, without a branch."""
    a, b, t = lift(a), lift(b), lift(t)
    ty = _arith_type("mix", a, b)
    if ty not in ("float", "vec4") or t.type not in ("float", "vec4") or (t.type == "vec4" and ty != "vec4"):
        raise TypeError(f"kl: mix of {a.type}, {b.type} by {t.type}")
    return X("mix", (a, b, t), type=ty)


def gradient() -> X:
    """The parameter's gradient at the output texel, in an optimizer's kernel (ops/optim.py; see above)."""
    return X("gradient", type="vec4")


def dot(a: X, b: X) -> X:
    return X("dot", (a, b), type="float")


def hmax(v: X) -> X:
    """The largest of the 4 lanes."""
    return X("hmax", (v,), type="float")


def hsum(v: X) -> X:
    """The sum of the 4 lanes."""
    return X("hsum", (v,), type="float")


def valid(cols, j) -> X:
    """1.0 in each lane of channel texel j that holds one of the `cols` channels (an int or a shape constant),
    else 0.0: lane i of texel j holds channel 4 * j + i."""
    return X("valid", (lift(j), lift(cols)), type="vec4")


def is_valid(cols, j) -> X:
    """valid(cols, j) as a condition: true in the lanes that hold a channel (for select)."""
    return X("isvalid", (lift(j), lift(cols)), type="bvec4")


def var(name: str, type_: str) -> X:
    return X("var", value=name, type=type_)


class Table:
    """A kernel's constant array of ints, floats or vec4s (KernelDef.table), read at an int index: t[i]."""

    def __init__(self, name: str, values: tuple):
        self.name, self.values = name, values
        self.type = ("vec4" if all(isinstance(v, tuple) for v in values)
                     else "int" if all(isinstance(v, int) for v in values) else "float")

    def __getitem__(self, i) -> X:
        i = lift(i)
        if i.type != "int":
            raise TypeError(f"kl: {self.name}[{i.type}]")
        return X("at", (i,), (self.name, self.values), self.type)


# words GLSL ES 3.00 or JavaScript reserve that a kernel might take for a variable's name (GLSL's flat, sample, ...)
_RESERVED = frozenset(
    "attribute break buffer case cast centroid class common const continue default discard do double else enum "
    "extern external filter fixed flat for function goto half highp if image in inline inout input interface "
    "invariant layout let long lowp mediump namespace new noinline noperspective out output packed partition patch "
    "precision public resource return sample shared short sizeof smooth static struct superp switch template this "
    "typedef typeof uniform union unsigned using var varying void volatile while with yield".split())
_JS_RESERVED = {"var", "let", "const", "new", "this", "function", "class", "in", "of", "do", "if", "for", "case",
                "default", "delete", "typeof", "void", "with", "yield", "await", "null", "true", "false", "Math"}


class KernelDef:
    """A kernel's statements: ("let", name, expr), ("set", name, expr), ("for", name, start, stop, body),
    ("if", cond, body), ("variant", name, body), ("setlane", name, i, expr), ("out", i, expr). `inputs`: the textures it loads, in the order they are bound; `outputs`: how many it writes."""

    def __init__(self):
        self._blocks: list[list] = [[]]
        self._names: set[str] = set()
        self.written: set[int] = set()
        self.symbols: dict[str, int | float] = {}
        # a loss-value kernel (a "ring" pass, ops/loss.py): it writes one texel, u_ring of the output's row 0 (ROW 0,
        # COL u_ring), where WebGL2's viewport puts it; the JavaScript and WGSL printers write that texel alone
        self.ring = False

    @property
    def body(self) -> list:
        assert len(self._blocks) == 1, "kl: a loop is still open"
        return self._blocks[0]

    def _name(self, name: str) -> str:
        # (nor a name the JavaScript printer gives its temporaries, t1, f2, v3, nor one GLSL or JavaScript reserves)
        if (name in self._names or name in ("row", "col", "c", "u", "rows", "o", "l") or not name.isidentifier()
                or re.fullmatch(r"[tfv][0-9]+", name) or name in _RESERVED or name in _JS_RESERVED
                or name.startswith("gl_") or "__" in name):
            raise ValueError(f"kl: name {name!r} is taken")
        self._names.add(name)
        return name

    def sym(self, name: str, value) -> X:
        """A shape constant: baked into the GLSL as its value; the JavaScript function reads it from the kernel's
        constants (c[name]), so one function serves every layer of the same structure."""
        if not name.isidentifier() or self.symbols.get(name, value) != value or isinstance(value, bool):
            raise ValueError(f"kl: symbol {name!r} = {value!r}")
        self.symbols[name] = value
        return X("sym", value=(name, value), type="int" if isinstance(value, int) else "float")

    def table(self, name: str, values) -> Table:
        """A constant array: baked into the GLSL and WGSL as a constant array; the JavaScript function reads it from
        the kernel's constants (c[name]), as a shape constant."""
        values = tuple(tuple(float(x) for x in v) if isinstance(v, (tuple, list)) else v if isinstance(v, int)
                       else float(v) for v in values)
        if any(isinstance(v, tuple) and len(v) != 4 for v in values):
            raise ValueError(f"kl: table {name!r} of vec4s holds 4 lanes a value")
        plain = [list(v) if isinstance(v, tuple) else v for v in values]
        if not name.isidentifier() or not values or self.symbols.get(name, plain) != plain:
            raise ValueError(f"kl: table {name!r}")
        self.symbols[name] = plain
        return Table(name, values)

    def syms(self, **values) -> list[X]:
        return [self.sym(k, v) for k, v in values.items()]

    def let(self, name: str, e) -> X:
        e = lift(e)
        self._blocks[-1].append(("let", self._name(name), e))
        return var(name, e.type)

    def set(self, v: X, e) -> None:
        e = lift(e)
        if v.op != "var" or v.type != e.type:
            raise TypeError(f"kl: cannot set {v} to a {e.type}")
        self._blocks[-1].append(("set", v.value, e))

    @contextmanager
    def loop(self, name: str, stop, start=0):
        i = var(self._name(name), "int")
        self._blocks.append([])
        yield i
        body = self._blocks.pop()
        self._blocks[-1].append(("for", name, lift(start), lift(stop), body))

    @contextmanager
    def when(self, cond: X):
        """The statements inside run only where cond (a bool) holds."""
        if cond.type != "bool":
            raise TypeError(f"kl: when of a {cond.type}")
        self._blocks.append([])
        yield
        body = self._blocks.pop()
        self._blocks[-1].append(("if", cond, body))

    @contextmanager
    def variant(self, name: str):
        """The statements inside run in the program compiled with `name` defined (GLSL: #ifdef); the other targets
        run them always (see the module's doc)."""
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            raise ValueError(f"kl: variant {name!r}")
        self._blocks.append([])
        yield
        body = self._blocks.pop()
        self._blocks[-1].append(("variant", name, body))

    def set_lane(self, v: X, i, e) -> None:
        """Lane i (an int expression) of vec4 variable v becomes the float e."""
        i, e = lift(i), lift(e)
        if v.op != "var" or v.type != "vec4" or i.type != "int" or e.type != "float":
            raise TypeError(f"kl: cannot set lane {i.type} of {v} to a {e.type}")
        self._blocks[-1].append(("setlane", v.value, i, e))

    def out(self, e, i: int = 0) -> None:
        e = lift(e)
        if e.type != "vec4" or i in self.written:
            raise TypeError(f"kl: out{i} takes one vec4, got a {e.type}")
        self.written.add(i)
        self._blocks[-1].append(("out", i, e))
