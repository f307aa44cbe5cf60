"""layernorm over the F features of each row of tokens (R, F) (F packed, a texture row a token: ops/matmul.py), weight w
and bias b [F] (each a one-row texture):
forward    layernorm_stats          X             -> S          rows: batch   (mean, 1 / sqrt(var + eps)) a row
           layernorm_forward        X, S, W, B    -> Y          rows: batch   (x - mean) * rstd * w + b
backward   layernorm_grad_sums      DY, X, S, W   -> G          rows: batch   (sum g, sum g xhat) a row, g = dY * w
           layernorm_grad_input     DY, X, S, W, G -> dX        rows: batch   rstd * (g - mean(g) - xhat mean(g xhat))
           layernorm_grad_weight    DY, X, S      -> dw         rows: full    sum over rows of dY * xhat
           rows_sum                 DY            -> db         rows: full
S (lnstat:Y) and G (lnsum:Y) hold a texel a row, float32 in every tier (planned by its saves rule: prep/ops/tokens.py,
layernorm_saves). Each row's statistics and sums are computed once, by a fragment a row, where every texel's fragment
computed them again: a row of F features is ceil(F/4) texels, so that was 2 (3 in grad_input) loops over the row a
texel, O(F^2) fetches a row (MiniLM's 384 features: 96 texels, its layernorm_forward of 16 sentences 35 ms a call; see
bench/results/minilm_profile.json).
Every kernel is written in the kernel language (codegen/kl.py): its GLSL, CPU function and WGSL are printed from it.
"""
from __future__ import annotations

from texelfit.prep.packing import ceil_div

from .. import kl
from ..kernels import Kernel, Pass
from ..kl import COL, ROW, dot, hsum, lane, load, splat, sqrt, uniform, valid, vec4_of
from .common import grad_target, param_grad
from .matmul import rows_sum_pass

STATS, SUMS = "lnstat:", "lnsum:"  # (its saves rule, prep/ops/tokens.py, plans them)


def _consts(layer, graph):
    r, f = graph.shapes[layer.inputs[0]]
    return dict(rows=r, f=f, eps=float(layer.attrs["eps"]), has_bias="bias" in layer.params)


def _syms(k: kl.KernelDef, c: dict):
    """The shape constants of a layernorm kernel: f features, their count as a float, eps; and f4 texels a row."""
    return k.sym("f", c["f"]), k.sym("nf", float(c["f"])), k.sym("eps", c["eps"]), k.sym("f4", ceil_div(c["f"], 4))


def _stats_kl(c: dict) -> kl.KernelDef:
    """S[r] = (mean, 1 / sqrt(var + eps), 0, 0) of row r of X over its f features (padding lanes masked)."""
    k = kl.KernelDef()
    f, nf, eps, f4 = _syms(k, c)
    mean = k.let("mean", 0.0)
    with k.loop("j", f4) as j:
        k.set(mean, mean + dot(load("X", ROW, j), valid(f, j)))
    k.set(mean, mean / nf)
    var = k.let("variance", 0.0)
    with k.loop("j2", f4) as j:
        d = k.let("d", (load("X", ROW, j) - mean) * valid(f, j))
        k.set(var, var + dot(d, d))
    k.out(vec4_of(mean, 1.0 / sqrt(var / nf + eps), 0.0, 0.0))
    return k


def _xhat(k: kl.KernelDef, r, col) -> tuple[kl.X, kl.X]:
    """(X - mean) * rstd at texel (r, col), and the statistics read from S (row r's texel)."""
    s = k.let("s", load("S", r, 0))
    return (load("X", r, col) - lane(s, 0)) * lane(s, 1), s


def _forward_kl(c: dict) -> kl.KernelDef:
    """Y = (X - mean) * rstd * w (+ b) over the f features of each row."""
    k = kl.KernelDef()
    y = _xhat(k, ROW, COL)[0] * load("W", 0, COL)
    k.out((y + load("B", 0, COL) if c["has_bias"] else y) * valid(k.sym("f", c["f"]), COL))
    return k


def _grad_sums_kl(c: dict) -> kl.KernelDef:
    """G[r] = (sum g, sum g * xhat, 0, 0) over the f features of row r, g = dY * w."""
    k = kl.KernelDef()
    f, _, _, f4 = _syms(k, c)
    s = k.let("s", load("S", ROW, 0))
    sg, sgx = k.let("sg", 0.0), k.let("sgx", 0.0)
    with k.loop("j", f4) as j:
        g = k.let("g", load("DY", ROW, j) * load("W", 0, j) * valid(f, j))
        k.set(sg, sg + hsum(g))
        k.set(sgx, sgx + dot(g, (load("X", ROW, j) - lane(s, 0)) * lane(s, 1)))
    k.out(vec4_of(sg, sgx, 0.0, 0.0))
    return k


def _grad_input_kl(c: dict) -> kl.KernelDef:
    """dX = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dY * w, over the f features of each row."""
    k = kl.KernelDef()
    f, nf, _, _ = _syms(k, c)
    xhat, s = _xhat(k, ROW, COL)
    xhat = k.let("xhat", xhat)
    sums = k.let("sums", load("G", ROW, 0))
    g = load("DY", ROW, COL) * load("W", 0, COL)
    k.out(lane(s, 1) * (g - lane(sums, 0) / nf - xhat * (lane(sums, 1) / nf)) * valid(f, COL))
    return k


def _grad_weight_kl(c: dict) -> kl.KernelDef:
    """dw = sum over the rows of the batch (`rows` a sample) of dY * xhat; the loss gradient came scaled."""
    k = kl.KernelDef()
    acc = k.let("acc", splat(0.0))
    with k.loop("r", uniform("u_batch", "int") * k.sym("rows", c["rows"])) as r:
        k.set(acc, acc + load("DY", r, COL) * _xhat(k, r, COL)[0])
    k.out(acc * valid(k.sym("f", c["f"]), COL) / uniform("u_loss_scale", "float"))
    return k


def _kernel(c: dict, what: str, inputs: tuple[str, ...], k: kl.KernelDef, uniforms=()) -> Kernel:
    return Kernel(f"layernorm_{what} {c['rows']}x{c['f']}", "kl", inputs, uniforms=uniforms, kl=k)


def forward(layer, graph, plan):
    c = _consts(layer, graph)
    x, s = plan.tensor(layer.inputs[0]), STATS + layer.outputs[0]
    names = ("X", "S", "W") + (("B",) if c["has_bias"] else ())
    textures = [x, s, "param:" + layer.params["weight"]] + (["param:" + layer.params["bias"]] if c["has_bias"] else [])
    return [Pass(_kernel(c, "stats", ("X",), _stats_kl(c)), [x], [s], "batch", layer.name),
            Pass(_kernel(c, "forward", names, _forward_kl(c)), textures, [plan.tensor(layer.outputs[0])], "batch",
                 layer.name)]


def backward(layer, graph, plan):
    c = _consts(layer, graph)
    x, y, w = plan.tensor(layer.inputs[0]), layer.outputs[0], "param:" + layer.params["weight"]
    s, dy = STATS + y, plan.grad(y)
    passes = []
    target = grad_target(plan, layer, 0)
    if target:
        passes += [Pass(_kernel(c, "grad_sums", ("DY", "X", "S", "W"), _grad_sums_kl(c)), [dy, x, s, w], [SUMS + y],
                        "batch", layer.name),
                   Pass(_kernel(c, "grad_input", ("DY", "X", "S", "W", "G"), _grad_input_kl(c)),
                        [dy, x, s, w, SUMS + y], [target], "batch", layer.name)]
    if graph.is_trainable(layer.params["weight"]):
        k = _kernel(c, "grad_weight", ("DY", "X", "S"), _grad_weight_kl(c), ("u_batch", "u_loss_scale"))
        passes.append(Pass(k, [dy, x, s], [param_grad(plan, layer, "weight")], "full", layer.name))
    if c["has_bias"] and graph.is_trainable(layer.params["bias"]):
        passes.append(rows_sum_pass(layer, graph, plan, "bias"))
    return passes
