"""The kernel language (codegen/kl.py) printed as a WGSL compute shader: the third printer, beside GLSL and
JavaScript (codegen/kl_print.py), for the WebGPU backend.

    wgsl(k, inputs, outputs)   a whole WGSL module: one invocation an output texel
    wgsl(k, inputs, 1, scatter=b)   ... of a kernel computing b rows an invocation (a row-blocked matmul's twin,
                               a conv's vectorised kernel: codegen/kernels.py: Kernel.wgsl_kl): its output t is row
                               b * ROW + t of out0, the one binding, written in place (the dispatch covers 1 / b of
                               the rows, rounded up: a kernel whose rows need not be a multiple of b writes its
                               outputs under a `when`, ops/conv_vec.py)
    wgsl(k, inputs, 1, scatter=b, cols=c)   ... and c texels of each row (a token matmul's: ops/matmul.py), c
                               dividing the output's width: COL counts blocks of c texels, output t is texel
                               c * COL + t % c of row b * ROW + t / c (the dispatch covers 1 / c of the width too)

Storage is what WebGPU gives a compute shader: each texture of the plan is a storage buffer of vec4<f32> texels in
row-major order, logical width `w` (no folding, no rgba8: those are WebGL2's). Bindings, in group 0: the inputs
in the order the pass binds them (read-only), then out0, out1, ... (read-write), then one uniform buffer, `_d`, a
struct of i32 and f32 scalars:

    rows, width            the rows the pass draws and the output's width in texels
    w_NAME                 each input's width in texels (a load of NAME at (r, c) reads NAME[r * w_NAME + c])
    u_...                  the kernel's uniforms, as codegen/kernels.py: UNIFORM_TYPES types them

A loss-value kernel (KernelDef.ring) is one invocation writing texel u_ring (a field then) of the output.
`struct_fields(k, inputs)` lists those fields in order, with their types, for whoever fills the buffer (4 bytes
each; the struct is padded to 16). The dispatch covers rows * width invocations in workgroups of WORKGROUP, over
x and then y (a grid of at most 65,535 workgroups a side): `dispatch(rows, width)` gives the grid.

A kernel's variables are printed as v_NAME (WGSL reserves words a kernel may use). Shape constants (k.sym) are baked in as literals, as in GLSL; int `/` and `%` truncate as GLSL's do. WGSL has no
literal for an infinity: a kernel that needs one gets it by bitcast.
"""
from __future__ import annotations

import math

from .kernels import UNIFORM_TYPES
from .kl import X
from .kl_print import _const, c_like_block, helper_functions

WORKGROUP = 64
MAX_GROUPS = 65535

_TYPE = {"int": "i32", "float": "f32", "vec4": "vec4<f32>", "bool": "bool", "bvec4": "vec4<bool>", "uint": "u32"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "/", "mod": "%", "and": "&&", "or": "||",
          "lt": "<", "gt": ">", "le": "<=", "ge": ">=", "eq": "==", "ne": "!=", "xor": "^", "shr": ">>"}


def _float(v: float) -> str:
    if math.isinf(v):
        return "bitcast<f32>(0x7f800000u)" if v > 0 else "bitcast<f32>(0xff800000u)"
    if math.isnan(v):
        raise ValueError("kl wgsl: a NaN constant")
    r = repr(float(v))
    return r if ("." in r or "e" in r) else r + ".0"


def _name(n: str) -> str:
    """A kernel's variable (WGSL reserves many words a kernel may use: where, filter, ...)."""
    return "v_" + n


def _vec(e: X, text: str) -> str:
    """A float operand where WGSL wants a vec4 (it broadcasts a scalar in + - * / only)."""
    return text if e.type in ("vec4", "bvec4") else f"vec4<f32>({text})"


def _w(e: X) -> str:
    if e.op != "int" and e.type == "int" and _const(e) is not None:
        return _w(X("int", value=_const(e), type="int"))
    op, a = e.op, [_w(x) for x in e.args]
    if op == "int":
        return str(e.value) if e.value >= 0 else f"({e.value})"
    if op == "float":
        return _float(e.value) if e.value >= 0 else f"(-{_float(-e.value)})"
    if op == "sym":
        return _w(X("float", value=float(e.value[1])))
    if op == "uint":
        return f"{e.value}u"
    if op == "uint_of":
        return f"u32({a[0]})"
    if op == "at":
        return f"_t{e.value[0]}[{a[0]}]"
    if op == "var":
        return _name(e.value)
    if op == "uniform":
        return f"_d.{e.value}"
    if op in ("row", "col"):
        return f"_{op}"
    if op == "load":
        return f"{e.value}[({a[0]}) * _d.w_{e.value} + ({a[1]})]"
    if op == "lane":  # (a lane of no constant index: _lane's selects, where SwiftShader indexes through memory)
        return f"{a[0]}[{a[1]}]" if _const(e.args[1]) is not None or e.args[0].type != "vec4" else f"_lane({a[0]}, {a[1]})"
    if op == "splat":
        return f"vec4<f32>({a[0]})"
    if op == "vec4_of":
        return f"vec4<f32>({', '.join(a)})"
    if op == "float_of":
        return f"f32({a[0]})"
    if op == "int_of":
        return f"i32({a[0]})"
    if op == "neg":
        return f"(-{a[0]})"
    if op in ("max", "min"):  # WGSL's take two of one type
        if e.type == "vec4":
            a = [_vec(x, t) for x, t in zip(e.args, a)]
        return f"{op}({a[0]}, {a[1]})"
    if op in ("lt", "gt", "le", "ge", "eq", "ne") and e.type == "bvec4":
        return f"({_vec(e.args[0], a[0])} {_INFIX[op]} {_vec(e.args[1], a[1])})"
    if op in _INFIX:
        return f"({a[0]} {_INFIX[op]} {a[1]})"
    if op in ("exp", "log", "sqrt", "abs", "sign", "dot"):
        return f"{op}({', '.join(a)})"
    if op == "pow":  # WGSL's takes two of one type
        if e.type == "vec4":
            a = [_vec(x, t) for x, t in zip(e.args, a)]
        return f"pow({a[0]}, {a[1]})"
    if op == "mix":  # mix(vec4, vec4, f32) or of one type
        if e.type == "vec4":
            a = [_vec(x, t) for x, t in zip(e.args[:2], a[:2])] + [a[2]]
        return f"mix({', '.join(a)})"
    if op == "gradient":  # an optimizer's gradient: input G, of the output's shape (kl.py: gradient)
        return "G[_i]"
    if op == "hmax":
        return f"_hmax({a[0]})"
    if op == "hsum":
        return f"dot({a[0]}, vec4<f32>(1.0))"
    if op == "select":  # WGSL's select(false_value, true_value, condition)
        if e.type == "vec4":
            return f"select({_vec(e.args[2], a[2])}, {_vec(e.args[1], a[1])}, {a[0]})"
        return f"select({a[2]}, {a[1]}, {a[0]})"
    if op == "valid":
        return f"_valid{_const(e.args[1])}({a[0]})"
    if op == "isvalid":
        return f"(_valid{_const(e.args[1])}({a[0]}) > vec4<f32>(0.0))"
    raise AssertionError(f"kl wgsl: {op}")


def _uniforms(k) -> list[str]:
    found: set[str] = set()

    def walk(e):
        if isinstance(e, X):
            if e.op == "uniform":
                found.add(e.value)
            for x in e.args:
                walk(x)
        elif isinstance(e, (list, tuple)):
            for x in e:
                walk(x)

    walk(k.body)
    return sorted(found | ({"u_ring"} if k.ring else set()))


def struct_fields(k, inputs: list[str]) -> list[tuple[str, str]]:
    """The fields of the uniform struct `_d`, in order: (name, "i32" or "f32")."""
    return ([("rows", "i32"), ("width", "i32")] + [(f"w_{n}", "i32") for n in inputs]
            + [(u, "i32" if UNIFORM_TYPES[u] == "int" else "f32") for u in _uniforms(k)])


def dispatch(rows: int, width: int) -> tuple[int, int]:
    """The workgroup grid (x, y) covering rows * width invocations."""
    groups = -(-rows * width // WORKGROUP)
    y = -(-groups // MAX_GROUPS)
    return -(-groups // y), y


# A loop of at most UNROLL passes, of constant bounds, is unrolled where its variable indexes a vec4's lane (acc[j]
# += ..., lane(v, j)): the index is then a constant, which SwiftShader's compiler keeps in registers (measured: the
# MLP's dense forward, 4 lanes a texel, ran several times slower as a loop); any other such loop only where its
# unrolled body stays within UNROLL_BUDGET statements. Unrolled inside each other (a conv's taps, times its channel
# texels, times 8 rows an invocation), loops made a body SwiftShader ran 2-3x slower (bench of 2026-12-07 on 16
# samples: a 3x3 conv's input gradient of 16 -> 16 channels 15.0 -> 6.2 ms, its forward 11.3 -> 4.3 ms; 3x3 convs
# of 4 to 16 channels and 1x1 convs best between 150 and 350 statements, within noise of each other; a first
# layer's forward, 1 input channel, 270 statements, 5.1 ms on 32 samples rolled at 200, 3.8 ms unrolled).
UNROLL = 4
UNROLL_BUDGET = 300


def _indexes_lane(i: str, body) -> bool:
    """Whether loop variable `i` is (in) the index of a lane read or written in statements `body`."""
    def uses(e) -> bool:
        return isinstance(e, X) and ((e.op == "var" and e.value == i) or any(uses(x) for x in e.args))

    def lanes(e) -> bool:
        return isinstance(e, X) and ((e.op == "lane" and uses(e.args[1])) or any(lanes(x) for x in e.args))

    for s in body:
        if s[0] == "setlane" and uses(s[2]):
            return True
        if s[0] in ("for", "if", "variant"):
            if any(lanes(x) for x in s[1:-1]) or _indexes_lane(i, s[-1]):
                return True
        elif any(lanes(x) for x in s[1:]):
            return True
    return False


def _passes(s) -> int | None:
    """The passes of loop statement `s` where it may be unrolled (constant bounds, at most UNROLL), else None."""
    a, b = _const(s[2]), _const(s[3])
    return b - a if a is not None and b is not None and 0 < b - a <= UNROLL else None


def _unrolls(s) -> bool:
    """Whether loop statement `s` is unrolled: a short loop whose variable indexes a lane, or whose unrolled body
    stays within UNROLL_BUDGET statements."""
    n = _passes(s)
    return n is not None and (_indexes_lane(s[1], s[4]) or n * _size(s[4]) <= UNROLL_BUDGET)


def _size(body) -> int:
    """The statements `body` prints as, its loops unrolled where _unrolls says."""
    out = 0
    for s in body:
        if s[0] == "for":
            out += _passes(s) * _size(s[4]) if _unrolls(s) else 1 + _size(s[4])
        elif s[0] in ("if", "variant"):
            out += 1 + _size(s[-1])
        else:
            out += 1
    return out


def _unroll(s) -> list[str] | None:
    """The first line of each pass of loop statement `s` where it is unrolled, else None."""
    if not _unrolls(s):
        return None
    return [f"const {_name(s[1])}: i32 = {j};" for j in range(_const(s[2]), _const(s[3]))]


_LANE = ("fn _lane(v: vec4<f32>, i: i32) -> f32 { return select(select(select(v.w, v.z, i == 2), v.y, i == 1), v.x, "
         "i == 0); }")


def _with_lane(helpers: dict, need):
    """`need`, also adding _lane where an expression reads a vec4's lane at an index that is no constant."""
    def walk(e: X):
        if e.op == "lane" and _const(e.args[1]) is None and e.args[0].type == "vec4":
            helpers["_lane"] = _LANE
        for x in e.args:
            if isinstance(x, X):
                walk(x)

    def both(e: X):
        walk(e)
        need(e)
    return both


def _assigned(body) -> set[str]:
    """The variables a statement of `body` sets after their `let` (a WGSL `var`; the others are `let`s: values)."""
    out: set[str] = set()
    for s in body:
        if s[0] in ("set", "setlane"):
            out.add(s[1])
        for sub in (s[-1] if s[0] in ("for", "if", "variant") else ()):
            out |= _assigned([sub])
    return out


def _out(scatter: int, cols: int):
    """The statement writing output i of an invocation (see the module's docstring)."""
    if not scatter:
        return lambda i, e: f"out{i}[_i] = {e};"
    if cols == 1:
        return lambda i, e: f"out0[({scatter} * _row + {i}) * _d.width + _col] = {e};"
    return lambda i, e: f"out0[({scatter} * _row + {i // cols}) * _d.width + {cols} * _col + {i % cols}] = {e};"


def wgsl(k, inputs: list[str], outputs: int, scatter: int = 0, cols: int = 1) -> str:
    helpers, need = helper_functions(
        "fn _hmax(v: vec4<f32>) -> f32 { return max(max(v.x, v.y), max(v.z, v.w)); }",
        lambda n, last, mask: (f"fn _valid{n}(j: i32) -> vec4<f32> {{ return select(vec4<f32>({mask}), vec4<f32>(1.0), "
                               f"j < {last}); }}"),
        lambda name, type_, values: (f"var<private> _t{name}: array<{_TYPE[type_]}, {len(values)}> = "
                                     f"array<{_TYPE[type_]}, {len(values)}>("
                                     + ", ".join(str(v) if type_ == "int" else _float(v) if type_ == "float"
                                                 else f"vec4<f32>({', '.join(_float(x) for x in v)})" for v in values)
                                     + ");"))
    need = _with_lane(helpers, need)
    v = _name
    assigned = _assigned(k.body)
    lines = c_like_block(k.body, 1, _w, need, {
        "for": lambda i, start, stop: f"for (var {v(i)}: i32 = {start}; {v(i)} < {stop}; {v(i)}++) {{",
        "unroll": _unroll,
        "let": lambda name, type_, e: (f"var {v(name)}: {_TYPE[type_]} = {e};" if name in assigned else
                                       f"let {v(name)}: {_TYPE[type_]} = {e};"),
        "set": lambda name, e: f"{v(name)} = {e};",
        "setlane": lambda name, i, e: f"{v(name)}[{i}] = {e};",
        "out": _out(scatter, cols),
        "variant": lambda name: (f"{{ // {name}: run always (kl.py: KernelDef.variant)", "}")})
    fields = struct_fields(k, inputs)
    width = "u32(_d.width)" if cols == 1 else "_w"  # (the invocations of a row)
    # (runtime/webgpu.js sizes each runtime-sized array to the texels its binding holds: `array<vec4<f32>>` is theirs alone)
    decl = [f"@group(0) @binding({i}) var<storage, read> {n}: array<vec4<f32>>;" for i, n in enumerate(inputs)]
    decl += [f"@group(0) @binding({len(inputs) + i}) var<storage, read_write> out{i}: array<vec4<f32>>;"
             for i in range(outputs)]
    decl += ["struct _D { " + " ".join(f"{n}: {t}," for n, t in fields) + " }",
             f"@group(0) @binding({len(inputs) + outputs}) var<uniform> _d: _D;"]
    main = [f"@compute @workgroup_size({WORKGROUP})",
            "fn main(@builtin(global_invocation_id) _g: vec3<u32>, @builtin(num_workgroups) _n: vec3<u32>) {",
            *(["  if (_g.x + _g.y > 0u) { return; }",  # a loss value: one invocation writes texel u_ring
               "  let _i = _d.u_ring;",
               "  let _row = 0;",
               "  let _col = _i;"] if k.ring else
              # (the row and column by u32 division: SwiftShader's i32 division took half an elementwise kernel)
              # (`cols` texels an invocation: _col counts blocks of them, _w = width / cols of a row, cols dividing it)
              [f"  let _u = _g.x + _g.y * _n.x * {WORKGROUP}u;",
               *([f"  let _w = u32(_d.width) / {cols}u;"] if cols > 1 else []),
               f"  if (_u >= u32(_d.rows{' * _d.width)' if cols == 1 else ') * _w'}) {{ return; }}",
               "  let _i = i32(_u);",
               f"  let _row = i32(_u / {width});",
               f"  let _col = i32(_u % {width});"])]
    code = "\n".join([*decl, *sorted(helpers.values()), *main, *lines, "}"]) + "\n"
    assert code.count("array<vec4<f32>>") == len(inputs) + outputs, "a runtime-sized array that binds no buffer"
    return code
