"""Printers of the kernel language (codegen/kl.py): one per target, each a table from node kind to snippet.

    glsl(k)              the body of a GLSL ES 3.00 fragment shader (after the prelude: kernels/prelude.glsl.j2
                         declares getX(row, col4), the uniforms and out0, out1, ...); a vec4 is a vec4
    js(k, inputs, n)     a JavaScript function (c, [X...], [Y...], u, rows) of the CPU backend
                         (runtime/cpu.js.j2: CpuRunner), drawing what the GPU draws: every texel of the first
                         `rows` rows; a vec4 is four numbers, one variable a lane, and each load of a statement
                         reads its texel's index once

A WGSL printer is one more of these.
"""
from __future__ import annotations

from .kernels import glsl_float
from .kl import X

_GLSL_TYPE = {"int": "int", "float": "float", "vec4": "vec4", "bool": "bool", "bvec4": "bvec4"}
_GLSL_CMP = {"lt": ("<", "lessThan"), "gt": (">", "greaterThan"), "le": ("<=", "lessThanEqual"),
             "ge": (">=", "greaterThanEqual")}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "/", "mod": "%"}


def _glsl(e: X) -> str:
    op, a = e.op, [_glsl(x) for x in e.args]
    if op == "int":
        return str(e.value) if e.value >= 0 else f"({e.value})"
    if op == "float":
        return glsl_float(e.value) if e.value >= 0 else f"({glsl_float(e.value)})"
    if op in ("var", "uniform"):
        return e.value
    if op == "row":
        return "_p.y"
    if op == "col":
        return "_p.x"
    if op == "load":
        return f"get{e.value}({a[0]}, {a[1]})"
    if op == "lane":
        return f"{a[0]}[{e.value}]"
    if op == "splat":
        return f"vec4({a[0]})"
    if op in _ARITH:
        return f"({a[0]} {_ARITH[op]} {a[1]})"
    if op == "neg":
        return f"(-{a[0]})"
    if op in ("exp", "log", "sqrt", "abs", "max", "min", "dot"):
        return f"{op}({', '.join(a)})"
    if op == "hmax":
        return f"_hmax({a[0]})"
    if op in _GLSL_CMP:
        scalar, vector = _GLSL_CMP[op]
        if e.type == "bvec4":
            return f"{vector}({_vec(e.args[0], a[0])}, {_vec(e.args[1], a[1])})"
        return f"({a[0]} {scalar} {a[1]})"
    if op == "select":  # mix(b, a, bvec4) takes a where the condition holds, exactly
        if e.args[0].type == "bvec4":
            return f"mix({_vec(e.args[2], a[2])}, {_vec(e.args[1], a[1])}, {a[0]})"
        if e.type == "vec4":
            return f"({a[0]} ? {_vec(e.args[1], a[1])} : {_vec(e.args[2], a[2])})"
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if op == "valid":
        return f"_valid{e.value}({a[0]})"
    if op == "isvalid":
        return f"greaterThan(_valid{e.value}({a[0]}), vec4(0.0))"
    raise AssertionError(f"kl glsl: {op}")


def _vec(e: X, text: str) -> str:
    """A float operand where GLSL wants a vec4 (mix, the vector comparisons, the branches of a select)."""
    return text if e.type == "vec4" else f"vec4({text})"


def glsl(k) -> str:
    helpers: dict[str, str] = {}

    def need(e: X):
        if e.op == "hmax":
            helpers["_hmax"] = "float _hmax(vec4 v) { return max(max(v.x, v.y), max(v.z, v.w)); }"
        if e.op in ("valid", "isvalid"):
            n, rem = e.value, e.value % 4 or 4
            mask = ", ".join("1.0" if i < rem else "0.0" for i in range(4))
            helpers[f"_valid{n}"] = (f"vec4 _valid{n}(int j) {{ return j < {(n + 3) // 4 - 1} ? vec4(1.0) : "
                                     f"vec4({mask}); }}")
        for x in e.args:
            need(x)

    lines: list[str] = []

    def block(body, indent):
        pad = "  " * indent
        for s in body:
            kind = s[0]
            if kind == "for":
                need(s[2]), need(s[3])
                lines.append(f"{pad}for (int {s[1]} = {_glsl(s[2])}; {s[1]} < {_glsl(s[3])}; {s[1]}++) {{")
                block(s[4], indent + 1)
                lines.append(pad + "}")
                continue
            need(s[2])
            if kind == "let":
                lines.append(f"{pad}{_GLSL_TYPE[s[2].type]} {s[1]} = {_glsl(s[2])};")
            elif kind == "set":
                lines.append(f"{pad}{s[1]} = {_glsl(s[2])};")
            else:
                lines.append(f"{pad}out{s[1]} = {_glsl(s[2])};")

    block(k.body, 1)
    return "\n".join([*sorted(helpers.values()), "void main() {", "  ivec2 _p = outCoord();", *lines, "}"]) + "\n"


# ---- JavaScript: scalar code, a vec4 written out lane by lane -------------------------------------------------

_JS_FN = {"exp": "Math.exp", "log": "Math.log", "sqrt": "Math.sqrt", "abs": "Math.abs", "max": "Math.max",
          "min": "Math.min"}
_JS_CMP = {"lt": "<", "gt": ">", "le": "<=", "ge": ">="}


def _js_num(v: float) -> str:
    r = repr(float(v))
    return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(r, r)


class _JS:
    def __init__(self):
        self.temps: dict[X, str] = {}  # a load of the statement being printed -> its texel index variable
        self.count = 0

    def e(self, e: X, k: int | None) -> str:
        """Lane k of e (None: e is not a vec4)."""
        op = e.op
        lane = k if e.type in ("vec4", "bvec4") else None
        if op == "int":
            return str(e.value) if e.value >= 0 else f"({e.value})"
        if op == "float":
            return f"({_js_num(e.value)})"
        if op == "var":
            return f"{e.value}_{lane}" if lane is not None else e.value
        if op == "uniform":
            return f"u.{e.value}"
        if op in ("row", "col"):
            return op
        if op == "load":
            t = self.temps[e]
            return f"{e.value}.data[{t} + {lane}]"
        if op == "lane":
            return self.e(e.args[0], e.value)
        if op == "splat":
            return self.e(e.args[0], None)
        if op == "dot":
            return "(" + " + ".join(f"{self.e(e.args[0], j)} * {self.e(e.args[1], j)}" for j in range(4)) + ")"
        if op == "hmax":
            return "Math.max(" + ", ".join(self.e(e.args[0], j) for j in range(4)) + ")"
        a = [self.e(x, lane) for x in e.args]
        if op == "idiv":
            return f"(({a[0]} / {a[1]}) | 0)"
        if op in _ARITH:
            return f"({a[0]} {_ARITH[op]} {a[1]})"
        if op == "neg":
            return f"(-{a[0]})"
        if op in _JS_FN:
            return f"{_JS_FN[op]}({', '.join(a)})"
        if op in _JS_CMP:
            return f"({a[0]} {_JS_CMP[op]} {a[1]})"
        if op == "select":
            return a[1] if a[0] == "true" else f"({a[0]} ? {a[1]} : {a[2]})"
        if op in ("valid", "isvalid"):  # lanes below the last texel's count hold a channel in every texel
            n = e.value
            last, rem = (n + 3) // 4 - 1, n % 4 or 4
            if op == "isvalid":
                return "true" if lane < rem else f"({a[0]} < {last})"
            return "1" if lane < rem else f"({a[0]} < {last} ? 1 : 0)"
        raise AssertionError(f"kl js: {op}")

    def hoist(self, e: X, pad: str, lines: list[str]) -> None:
        """Index variables of the loads in e, declared before the statement that reads them."""
        for x in e.args:
            self.hoist(x, pad, lines)
        if e.op == "load" and e not in self.temps:
            self.temps[e] = t = f"t{self.count}"
            self.count += 1
            row, col = self.e(e.args[0], None), self.e(e.args[1], None)
            lines.append(f"{pad}const {t} = ({row} * {e.value}.width + {col}) * 4;")

    def lanes(self, e: X):
        return [self.e(e, j) for j in range(4)] if e.type in ("vec4", "bvec4") else [self.e(e, None)]


def js(k, inputs: list[str], outputs: int) -> str:
    """`inputs`: the texture names in the order the pass binds them (the GLSL kernel's samplers)."""
    p = _JS()
    lines: list[str] = []
    names = {}  # variable -> its lane names, for a vec4

    def block(body, indent):
        pad = "  " * indent
        for s in body:
            kind = s[0]
            if kind == "for":
                lines.append(f"{pad}for (let {s[1]} = {p.e(s[2], None)}; {s[1]} < {p.e(s[3], None)}; {s[1]}++) {{")
                saved = dict(p.temps)
                block(s[4], indent + 1)
                p.temps = saved
                lines.append(pad + "}")
                continue
            p.temps = {}  # a load is read where its statement is (its row and column may have changed)
            p.hoist(s[2], pad, lines)
            vals = p.lanes(s[2])
            if kind == "let":
                if s[2].type in ("vec4", "bvec4"):
                    names[s[1]] = [f"{s[1]}_{j}" for j in range(4)]
                    lines.append(f"{pad}let " + ", ".join(f"{n} = {v}" for n, v in zip(names[s[1]], vals)) + ";")
                else:
                    lines.append(f"{pad}let {s[1]} = {vals[0]};")
            elif kind == "set":
                if s[2].type in ("vec4", "bvec4"):
                    tmp = [f"s{p.count}_{j}" for j in range(4)]
                    p.count += 1
                    lines.append(f"{pad}const " + ", ".join(f"{t} = {v}" for t, v in zip(tmp, vals)) + ";")
                    lines.append(pad + " ".join(f"{n} = {t};" for n, t in zip(names[s[1]], tmp)))
                else:
                    lines.append(f"{pad}{s[1]} = {vals[0]};")
            else:
                lines.extend(f"{pad}out{s[1]}.data[o + {j}] = {v};" for j, v in enumerate(vals))

    block(k.body, 3)
    outs = ", ".join(f"out{i}" for i in range(outputs))
    head = [f"(c, [{', '.join(inputs)}], [{outs}], u, rows) => {{",
            "  for (let row = 0; row < rows; row++) {",
            "    for (let col = 0; col < out0.width; col++) {",
            "      const o = (row * out0.width + col) * 4;"]
    return "\n".join(head + lines + ["    }", "  }", "}"])
