"""Printers of the kernel language (codegen/kl.py): one per target, each a table from node kind to snippet.

    glsl(k)              the body of a GLSL ES 3.00 fragment shader (after the prelude: kernels/prelude.glsl.j2
                         declares getX(row, col4), the uniforms and out0, out1, ...); a vec4 is a vec4
    js(k, inputs, n)     a JavaScript function (c, [X...], [Y...], u, rows) of the CPU backend
                         (runtime/cpu.js: CpuRunner), drawing what the GPU draws: every texel of the first
                         `rows` rows; a vec4 is four numbers, one variable a lane, and each load of a statement
                         reads its texel's index once

The WGSL printer (a compute shader, for the WebGPU backend) is codegen/kl_wgsl.py; it shares _const.
"""
from __future__ import annotations

from .kernels import glsl_float
from .kl import X

_GLSL_TYPE = {"int": "int", "float": "float", "vec4": "vec4", "bool": "bool", "bvec4": "bvec4", "uint": "uint"}
_GLSL_VECTOR_CMP = {"lt": "lessThan", "gt": "greaterThan", "le": "lessThanEqual", "ge": "greaterThanEqual",
                    "eq": "equal", "ne": "notEqual"}
_LOGIC = {"and": "&&", "or": "||"}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "/", "mod": "%"}
_BITS = {"xor": "^", "shr": ">>"}  # of uints (JavaScript's: _JS._op)


def _infix(op: str, a: list[str]) -> str:
    """The operators both languages write alike: arithmetic (GLSL's int / truncates; JavaScript's is a special
    case of its printer), negation, && and ||, and the scalar comparisons."""
    if op == "neg":
        return f"(-{a[0]})"
    sym = _ARITH.get(op) or _LOGIC.get(op) or _BITS.get(op) or _SCALAR_CMP[op]
    return f"({a[0]} {sym} {a[1]})"


_SCALAR_CMP = {"lt": "<", "gt": ">", "le": "<=", "ge": ">=", "eq": "==", "ne": "!="}


_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
         "idiv": lambda a, b: a // b if a >= 0 and b > 0 else None, "mod": lambda a, b: a % b if a >= 0 and b > 0 else None,
         "max": max, "min": min, "neg": lambda a: -a}


def _const(e: X):
    """The value of an int expression of constants and shape constants, or None."""
    if e.op == "int":
        return e.value
    if e.op == "sym" and e.type == "int":
        return e.value[1]
    if e.type != "int" or e.op not in _FOLD:
        return None
    args = [_const(a) for a in e.args]
    return None if None in args else _FOLD[e.op](*args)


def _glsl(e: X) -> str:
    if e.op != "int" and e.type == "int" and _const(e) is not None:
        return _glsl(X("int", value=_const(e), type="int"))
    if e.op == "sym":
        return _glsl(X("float", value=float(e.value[1])))
    op, a = e.op, [_glsl(x) for x in e.args]
    if op == "int":
        return str(e.value) if e.value >= 0 else f"({e.value})"
    if op == "float":
        return glsl_float(e.value) if e.value >= 0 else f"({glsl_float(e.value)})"
    if op == "uint":
        return f"{e.value}u"
    if op == "uint_of":
        return f"uint({a[0]})"
    if op == "at":
        return f"_t{e.value[0]}[{a[0]}]"
    if op in ("var", "uniform"):
        return e.value
    if op == "row":
        return "_p.y"
    if op == "col":
        return "_p.x"
    if op == "load":
        return f"get{e.value}({a[0]}, {a[1]})"
    if op == "lane":
        return f"{a[0]}[{a[1]}]"
    if op == "splat":
        return f"vec4({a[0]})"
    if op == "vec4_of":
        return f"vec4({', '.join(a)})"
    if op == "float_of":
        return f"float({a[0]})"
    if op == "int_of":
        return f"int({a[0]})"
    if op in _LOGIC or op in _ARITH or op in _BITS or op == "neg":
        return _infix(op, a)
    if op in ("exp", "log", "sqrt", "abs", "sign", "max", "min", "dot"):
        return f"{op}({', '.join(a)})"
    if op == "pow":  # pow(vec4, vec4) or pow(float, float)
        if e.type == "vec4":
            a = [_vec(x, t) for x, t in zip(e.args, a)]
        return f"pow({a[0]}, {a[1]})"
    if op == "hmax":
        return f"_hmax({a[0]})"
    if op == "hsum":
        return f"dot({a[0]}, vec4(1.0))"
    if op in _GLSL_VECTOR_CMP:
        if e.type == "bvec4":
            return f"{_GLSL_VECTOR_CMP[op]}({_vec(e.args[0], a[0])}, {_vec(e.args[1], a[1])})"
        return _infix(op, a)
    if op == "select":  # mix(b, a, bvec4) takes a where the condition holds, exactly
        if e.args[0].type == "bvec4":
            return f"mix({_vec(e.args[2], a[2])}, {_vec(e.args[1], a[1])}, {a[0]})"
        if e.type == "vec4":
            return f"({a[0]} ? {_vec(e.args[1], a[1])} : {_vec(e.args[2], a[2])})"
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if op == "valid":
        return f"_valid{_const(e.args[1])}({a[0]})"
    if op == "isvalid":
        return f"greaterThan(_valid{_const(e.args[1])}({a[0]}), vec4(0.0))"
    if op == "mix":
        if e.type == "vec4":
            a = [_vec(x, t) for x, t in zip(e.args[:2], a[:2])] + [a[2]]
        return f"mix({', '.join(a)})"
    if op == "gradient":  # the gradient kernel's function, before main (codegen/kernels.py: render_kernel)
        return "valueAt(_p)"
    raise AssertionError(f"kl glsl: {op}")


def _vec(e: X, text: str) -> str:
    """A float operand where GLSL wants a vec4 (mix, the vector comparisons, the branches of a select)."""
    return text if e.type == "vec4" else f"vec4({text})"


def _glsl_value(type_: str, v) -> str:
    """A constant array's value: an int, a float, or a vec4 (4 floats)."""
    if type_ == "vec4":
        return f"vec4({', '.join(glsl_float(x) for x in v)})"
    return str(v) if type_ == "int" else glsl_float(v)


def glsl(k, value: bool = False) -> str:
    """The body of main(); with `value`, the function vec4 valueAt(ivec2 _p) returning the texel out0 would be:
    how an optimizer includes its parameter's gradient kernel (ops/optim.py; codegen/kernels.py: render_kernel)."""
    assert not value or k.written == {0}, "kl: a value function has one output"
    helpers, need = helper_functions(
        "float _hmax(vec4 v) { return max(max(v.x, v.y), max(v.z, v.w)); }",
        lambda n, last, mask: f"vec4 _valid{n}(int j) {{ return j < {last} ? vec4(1.0) : vec4({mask}); }}",
        lambda name, type_, values: (f"const {type_} _t{name}[{len(values)}] = {type_}[{len(values)}]("
                                     + ", ".join(_glsl_value(type_, v) for v in values) + ");"))
    lines = c_like_block(k.body, 1, _glsl, need, {
        "for": lambda i, start, stop: f"for (int {i} = {start}; {i} < {stop}; {i}++) {{",
        "let": lambda name, type_, e: f"{_GLSL_TYPE[type_]} {name} = {e};",
        "set": lambda name, e: f"{name} = {e};",
        "setlane": lambda name, i, e: f"{name}[{i}] = {e};",
        "out": lambda i, e: f"_value = {e};" if value else f"out{i} = {e};",
        "variant": lambda name: (f"#ifdef {name}", "#endif")})  # (a directive's line: compact_glsl keeps it)
    if value:
        return "\n".join([*sorted(helpers.values()), "vec4 valueAt(ivec2 _p) {", "  vec4 _value;", *lines,
                          "  return _value;", "}"]) + "\n"
    return "\n".join([*sorted(helpers.values()), "void main() {", "  ivec2 _p = outCoord();", *lines, "}"]) + "\n"


def helper_functions(hmax: str, valid, table):
    """The helper functions a kernel's expressions call, as a target spells them: `hmax` (the source of _hmax), and
    valid(n, last, mask) -> the source of _validN (1.0 in every lane of a texel j < last, `mask` in texel `last`),
    table(name, type, values) -> the declaration of constant array _tNAME (KernelDef.table).
    Returns ({name: source}, need), need(e) adding those that expression e calls."""
    helpers: dict[str, str] = {}

    def need(e: X):
        if e.op == "hmax":
            helpers["_hmax"] = hmax
        if e.op == "at":
            helpers[f"_t{e.value[0]}"] = table(e.value[0], e.type, e.value[1])
        if e.op in ("valid", "isvalid"):
            n = _const(e.args[1])
            rem = n % 4 or 4
            helpers[f"_valid{n}"] = valid(n, (n + 3) // 4 - 1, ", ".join("1.0" if i < rem else "0.0" for i in range(4)))
        for x in e.args:
            need(x)

    return helpers, need


def c_like_block(body, indent: int, expr, need, form: dict) -> list[str]:
    """The lines of statements `body` in a language with C's blocks (GLSL, WGSL): `expr` prints an expression,
    `need(e)` is told of every expression printed (for the helper functions it calls), and `form` spells each
    statement: for(i, start, stop) (the loop's head), let(name, type, e), set(name, e), setlane(name, i, e),
    out(i, e), variant(name) (the lines opening and closing a KernelDef.variant block); optionally unroll(s): for
    a loop statement s ("for", i, start, stop, body) it unrolls, each pass's first line (the variable's value),
    else None."""
    lines: list[str] = []
    pad = "  " * indent
    for s in body:
        kind = s[0]
        for e in {"for": s[2:4], "if": s[1:2], "setlane": s[2:4], "variant": ()}.get(kind, s[2:3]):
            need(e)
        if kind == "variant":
            head, tail = form["variant"](s[1])
            lines += [pad + head, *c_like_block(s[2], indent + 1, expr, need, form), pad + tail]
            continue
        heads = form["unroll"](s) if kind == "for" and "unroll" in form else None
        if heads is not None:
            for head in heads:  # a loop the printer unrolls: each pass a block
                lines += [f"{pad}{{ {head}", *c_like_block(s[4], indent + 1, expr, need, form), pad + "}"]
            continue
        if kind == "for":
            lines.append(pad + form["for"](s[1], expr(s[2]), expr(s[3])))
        elif kind == "if":
            lines.append(f"{pad}if ({expr(s[1])}) {{")
        elif kind == "setlane":
            lines.append(pad + form["setlane"](s[1], expr(s[2]), expr(s[3])))
        elif kind == "let":
            lines.append(pad + form["let"](s[1], s[2].type, expr(s[2])))
        else:
            lines.append(pad + form[kind](s[1], expr(s[2])))
        if kind in ("for", "if"):
            lines += c_like_block(s[4] if kind == "for" else s[2], indent + 1, expr, need, form)
            lines.append(pad + "}")
    return lines


# ---- JavaScript: a vec4 is a Float64Array(4) allocated once a call; a vec4 statement is a loop over its lanes ----

_JS_FN = {"exp": "Math.exp", "log": "Math.log", "sqrt": "Math.sqrt", "abs": "Math.abs", "max": "Math.max",
          "min": "Math.min", "sign": "Math.sign", "pow": "Math.pow"}
_JS_CMP = {"lt": "<", "gt": ">", "le": "<=", "ge": ">=", "eq": "===", "ne": "!==", "and": "&&", "or": "||"}
_VEC = ("vec4", "bvec4")


def _js_num(v: float) -> str:
    r = repr(float(v))
    return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(r, r)


class _JS:
    """Prints a statement's expressions; what a statement needs first (the texel index of each load, the value of
    a scalar inside a vec4 expression, a vec4 that a cross-lane op reads) goes into `pre`, printed before it."""

    def __init__(self):
        self.pre: list[str] = []
        self.count = 0
        self.arrays: list[str] = []  # vec4 variables and scratch vectors, allocated once a call
        self.symbols: set[str] = set()  # the shape constants read (c.NAME)
        self.gradient = False  # whether it reads gradient() (from the input G)

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def scalar(self, e: X) -> str:
        op = e.op
        if op == "int":
            return str(e.value) if e.value >= 0 else f"({e.value})"
        if op == "float":
            return _js_num(e.value) if e.value >= 0 else f"({_js_num(e.value)})"
        if op == "sym":
            self.symbols.add(e.value[0])
            return f"c.{e.value[0]}"
        if op == "at":
            self.symbols.add(e.value[0])
            return f"c.{e.value[0]}[{self.scalar(e.args[0])}]"
        if op == "uint":
            return str(e.value)
        if op == "uint_of":
            return f"({self.scalar(e.args[0])} >>> 0)"
        if op == "var":
            return e.value
        if op == "uniform":
            return f"u.{e.value}"
        if op in ("row", "col"):
            return op
        if op == "lane":
            v, i = e.args
            if v.op == "load":  # read where it is
                t = self.fresh("t")
                self.pre.append(f"const {t} = ({self.scalar(v.args[0])} * {v.value}.width + {self.scalar(v.args[1])}) * 4;")
                return f"{v.value}.data[{t} + {self.scalar(i)}]"
            return f"{self.vec(v)}[{self.scalar(i)}]"
        if op == "dot":
            a, b = self.vec(e.args[0]), self.vec(e.args[1])
            return "(" + " + ".join(f"{a}[{j}] * {b}[{j}]" for j in range(4)) + ")"
        if op == "hmax":
            v = self.vec(e.args[0])
            return f"Math.max({v}[0], {v}[1], {v}[2], {v}[3])"
        if op == "hsum":
            v = self.vec(e.args[0])
            return f"({v}[0] + {v}[1] + {v}[2] + {v}[3])"
        if op == "float_of":
            return self.scalar(e.args[0])
        if op == "mix":
            a, b, t = (self.scalar(x) for x in e.args)
            return f"({a} * (1 - {t}) + {b} * {t})"
        if op == "int_of":
            return f"Math.trunc({self.scalar(e.args[0])})"
        return self._op(e, [self.scalar(x) for x in e.args])

    def _op(self, e: X, a: list[str]) -> str:
        op = e.op
        if op == "idiv":
            return f"(({a[0]} / {a[1]}) | 0)"
        if e.type == "uint":  # kept in [0, 2^32): wrapped as GLSL's uint arithmetic wraps
            return {"add": f"(({a[0]} + {a[1]}) >>> 0)", "mul": f"(Math.imul({a[0]}, {a[1]}) >>> 0)",
                    "xor": f"(({a[0]} ^ {a[1]}) >>> 0)", "shr": f"({a[0]} >>> {a[1]})"}[op]
        if op in _JS_FN:
            return f"{_JS_FN[op]}({', '.join(a)})"
        if op in ("eq", "ne"):  # strict: both sides are numbers
            return f"({a[0]} {'===' if op == 'eq' else '!=='} {a[1]})"
        if op in _ARITH or op in _JS_CMP or op == "neg":
            return _infix(op, a)
        if op == "select":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        raise AssertionError(f"kl js: {op}")

    def vec(self, e: X) -> str:
        """A vector holding e's lanes: its variable, or a scratch vector filled before the statement."""
        if e.op == "var":
            return e.value
        v = self.fresh("v")
        self.arrays.append(v)
        if e.op == "vec4_of":  # lane by lane
            lanes = [self.scalar(x) for x in e.args]
            self.pre.append(" ".join(f"{v}[{i}] = {t};" for i, t in enumerate(lanes)))
        else:
            self.pre.append(f"for (let l = 0; l < 4; l++) {v}[l] = {self.lanewise(e)};")
        return v

    def lanewise(self, e: X) -> str:
        """Lane l of e; a scalar part is computed once, before the lane loop."""
        op = e.op
        if e.type not in _VEC:
            if op in ("int", "float", "sym", "var", "uniform"):
                return self.scalar(e)
            t = self.fresh("f")
            self.pre.append(f"const {t} = {self.scalar(e)};")
            return t
        if op == "var":
            return f"{e.value}[l]"
        if op == "load":
            t = self.fresh("t")
            self.pre.append(f"const {t} = ({self.scalar(e.args[0])} * {e.value}.width + {self.scalar(e.args[1])}) * 4;")
            return f"{e.value}.data[{t} + l]"
        if op == "splat":
            return self.lanewise(e.args[0])
        if op == "at":  # a constant array of vec4s (KernelDef.table): its values are lists of 4
            self.symbols.add(e.value[0])
            return f"c.{e.value[0]}[{self.lanewise(e.args[0])}][l]"
        if op == "vec4_of":
            return f"{self.vec(e)}[l]"
        if op == "gradient":  # the scratch gradient (an input G of the output's shape: cpu.js, cpuOptimizer)
            self.gradient = True
            return "G.data[o + l]"
        if op == "mix":
            a, b, t = (self.lanewise(x) for x in e.args)
            return f"({a} * (1 - {t}) + {b} * {t})"
        if op in ("valid", "isvalid"):  # lane l of texel j holds channel 4 j + l
            held = f"({self.lanewise(e.args[0])} * 4 + l < {self.lanewise(e.args[1])})"
            return held if op == "isvalid" else f"({held} ? 1 : 0)"
        return self._op(e, [self.lanewise(x) for x in e.args])


def js(k, inputs: list[str], outputs: int) -> str:
    """`inputs`: the texture names in the order the pass binds them (the GLSL kernel's samplers)."""
    p = _JS()
    lines: list[str] = []

    def statement(pad: str, text_of) -> None:
        p.pre = []
        text = text_of()
        lines.extend(pad + t for t in p.pre)
        lines.append(pad + text)

    def block(body, indent):
        pad = "  " * indent
        for s in body:
            kind = s[0]
            if kind == "variant":  # run always (kl.py: KernelDef.variant; a kernel's names are unique: no block)
                block(s[2], indent)
                continue
            if kind == "for":
                statement(pad, lambda: f"for (let {s[1]} = {p.scalar(s[2])}; {s[1]} < {p.scalar(s[3])}; {s[1]}++) {{")
            elif kind == "if":
                statement(pad, lambda: f"if ({p.scalar(s[1])}) {{")
            elif kind == "setlane":
                statement(pad, lambda: f"{s[1]}[{p.scalar(s[2])}] = {p.scalar(s[3])};")
            elif s[2].type in _VEC:
                if kind == "let":
                    p.arrays.append(s[1])
                target = f"out{s[1]}.data[o + l]" if kind == "out" else f"{s[1]}[l]"
                statement(pad, lambda: f"for (let l = 0; l < 4; l++) {target} = {p.lanewise(s[2])};")
            else:
                statement(pad, lambda: f"{'let ' if kind == 'let' else ''}{s[1]} = {p.scalar(s[2])};")
            if kind in ("for", "if"):
                block(s[4] if kind == "for" else s[2], indent + 1)
                lines.append(pad + "}")

    block(k.body, 3)
    assert not p.gradient or "G" in inputs, "kl js: gradient() reads an input G"
    outs = ", ".join(f"out{i}" for i in range(outputs))
    head = [f"(c, [{', '.join(inputs)}], [{outs}], u, rows) => {{",
            *(f"  const {a} = new Float64Array(4);" for a in p.arrays),
            *(["  {", "    {", "      const row = 0, col = u.u_ring, o = col * 4;"] if k.ring else  # texel u_ring
              ["  for (let row = 0; row < rows; row++) {",
               "    for (let col = 0; col < out0.width; col++) {",
               "      const o = (row * out0.width + col) * 4;"])]
    return "\n".join(head + lines + ["    }", "  }", "}"])
