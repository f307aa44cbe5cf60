"""Kernel declarations and their rendering.

A kernel is a small declaration: its name, the template holding the body of
`main()`, the names of its input textures, how many render targets it writes,
its per-step uniforms, and the constants baked into its source. The shared
prelude (`runtime_template/kernels/prelude.glsl.j2`) generates from that the
samplers, uniforms, outputs and one accessor per input:

    uniform sampler2D X;   ->   vec4 getX(int row, int col4)

Programs are identified by the hash of their generated source, so layers of
the same shape share one compiled program.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from importlib import resources

import jinja2

# Per-step values: the only things a pass sets besides its input textures.
UNIFORM_TYPES = {
    "u_batch": "int",          # rows of the current batch
    "u_loss_scale": "float",   # loss scaling: 1, or (float16 tier) what keeps small gradients normal halves
    "u_ring": "int",           # texel of the loss ring this step writes
    "u_loss_weight": "float",  # an output's weight in the loss (fit's lossWeights; Pass.values of its gradient pass)
    "u_lr": "float",
    "u_momentum": "float", "u_dampening": "float", "u_nesterov": "float", "u_first": "float",
    "u_wd": "float", "u_decoupled": "float",
    "u_mu": "float",           # fit's proximal term (FedProx's mu; ops/optim.py), 0 without one
    "u_beta1": "float", "u_beta2": "float", "u_eps": "float", "u_step_size": "float", "u_bc2_sqrt": "float",
    "u_dropout": "float",      # 1 in a training step of fit (with dropout on), else 0: dropout applies its mask
    "u_dropseed": "int",       # the step's dropout seed (prep/dropout.py)
    "u_rows": "int",           # set by the pass (Pass.values): rows a sample of a blocked output (interleave)
    "u_c4": "int",             # set by the pass: texels a position of a column-blocked output (interleave_cols)
    "u_qb": "int",             # set by the pass: position blocks of a column-blocked output's row (interleave_cols)
    "u_part": "int",           # set by WebGPU's dispatch: the column-blocked part it writes (deal_cols)
    "u_ow": "int",             # set by WebGPU's dispatch: positions a row of a column-blocked output (deal_cols)
}


@dataclass(frozen=True)
class Kernel:
    name: str  # human-readable, appears in the source's first line and in compile errors
    template: str  # file under runtime_template/kernels/
    inputs: tuple[str, ...]  # sampler names, bound to texture units in this order
    outputs: int = 1
    uniforms: tuple[str, ...] = ()
    consts: dict = field(default_factory=dict, hash=False, compare=False)
    # a kernel written in the kernel language (codegen/kl.py: a KernelDef): its GLSL and its CPU function are
    # printed from it (codegen/kl_print.py; `template` is then "kl"), where the others fill a template.
    # A WebGL2 *routine* has both: `template` is a hand-written GLSL kernel tuned for that target (sample-blocked,
    # split-K, column-blocked), which WebGL2 runs; `kl` is the generic kernel of the same op, printed for every
    # other target (the CPU function, WGSL) and tested against the routine on the same inputs (Kernel.routine)
    kl: object = field(default=None, hash=False, compare=False)
    # an optimizer's (ops/optim.py; its `kl` reads kl.gradient()): the gradient kernel it includes. On WebGL2 its
    # GLSL goes before main as the function valueAt: its template with `optimizer` set (a template or a routine), or
    # printed from its `kl` (kl_print.glsl(value=True)); the CPU runs its function into a scratch texture first
    # (codegen/schedule.py: serialize; runtime/cpu.js: cpuOptimizer)
    gradient: Kernel | None = field(default=None, hash=False, compare=False)
    # the KernelDef WebGPU's WGSL is printed from instead of `kl`, computing `scatter` rows an invocation (0: one)
    # and writing them in place (codegen/kl_wgsl.py: wgsl's `scatter`; the dispatch covers 1 / scatter of the rows):
    # a row-blocked token matmul's one-row kernel's is its twin's (ops/matmul.py: _rows_twins), where WebGL2 draws
    # the twin's rows into parts and interleaves them, passes of their own; a conv's is vectorised (ops/conv_vec.py)
    wgsl_kl: object = field(default=None, hash=False, compare=False)
    scatter: int = field(default=0, hash=False, compare=False)
    # ... and `cols` texels of each of those rows (kl_wgsl.py: wgsl's `cols`; the dispatch covers 1 / cols of the
    # width): a token matmul's, where each texel of its input fetched then serves cols output texels (ops/matmul.py)
    cols: int = field(default=1, hash=False, compare=False)
    # True: `scatter`'s rows are samples (a dense layer's forward and input gradient, ops/dense.py), and below a block
    # of them (u_batch < scatter) WebGPU runs `kl` instead, a sample an invocation (784 -> 128 at batch 1 on
    # SwiftShader: 0.49 ms, the block computing its one sample behind branches 1.95)
    few: bool = field(default=False, hash=False, compare=False)
    # WebGPU: (parts, the KernelDef of their sum): `wgsl_kl` computes `parts` partial sums of the output (rows
    # p*R + r, R its rows) into a scratch buffer, which a second dispatch adds up (ops/conv_vec.py: split_sum_kl): a
    # conv's weight gradient of few texels; () none
    split: tuple = field(default=(), hash=False, compare=False)

    @property
    def routine(self) -> bool:
        """A hand-written WebGL2 routine standing beside its generic kernel `kl` (see `kl`)."""
        return self.kl is not None and self.template != "kl"

    def __post_init__(self):
        unknown = [u for u in self.uniforms if u not in UNIFORM_TYPES]
        assert not unknown, unknown


@dataclass
class Pass:
    """One draw: `kernel` reading `inputs` (a texture name per sampler) into `outputs`."""

    kernel: Kernel
    inputs: list[str]
    outputs: list[str]
    rows: str  # "batch" | "blocks" | "full" | "ring"
    label: str  # the IR layer (or loss, or parameter) it belongs to
    # uniforms the pass sets itself: a constant that differs between passes of one program (a
    # constant in the source would make one program per value; each costs a compile)
    values: dict = field(default_factory=dict)
    # which twin of a sample-blocked layer's pass it is (ops/common.py: blockable): True, the blocked
    # one, runs at batches of blocking.BLOCK_MIN_BATCH or more on a device drawing blocking.SAMPLE_BLOCK
    # targets at once; False, the one-sample one, runs otherwise; None: the pass always runs
    blocked: bool | None = None
    # the batch a blocked twin runs from where not BLOCK_MIN_BATCH: 1 for a row-blocked token matmul's
    # (blocking.row_blocked: its 8 rows a fragment are tokens of one sample)
    block_from: int | None = None
    # which draw of a column-blocked conv forward it is (ops/common.py; blocking.column_blocked): True, the
    # one into all blocking.COLUMN_PARTS parts, runs on a device drawing that many targets at once; False,
    # a draw of a half, runs otherwise; None: the pass always runs
    wide: bool | None = None
    # a pass of one backend's: True, it runs on WebGPU only (the one-pass forward of a split-K dense layer, whose
    # vectorised kernel computes several samples an invocation, and of a column-blocked conv whose output is kept
    # whole: ops/common.py), and a bundle built without WGSL leaves it out (schedule.py: serialize); False, it runs
    # everywhere but WebGPU (those layers' split-K passes, their column parts' draws and interleave); None: everywhere
    webgpu: bool | None = None


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    loader = jinja2.FunctionLoader(lambda name: (resources.files("texelfit.runtime_template")
                                                 .joinpath(name).read_text(encoding="utf-8"), None, lambda: True))
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["glsl_float"] = glsl_float
    # a plain-JavaScript module of the runtime (runtime_template/runtime/NAME.js), inserted as it is: no template
    env.globals["runtime_js"] = lambda name: (resources.files("texelfit.runtime_template").joinpath("runtime", name)
                                              .read_text(encoding="utf-8"))
    return env


def template_env() -> jinja2.Environment:
    return _env()


def render_kernel(kernel: Kernel) -> str:
    env = _env()
    ctx = dict(kernel.consts, kernel=kernel, inputs=kernel.inputs,
               uniforms=[(UNIFORM_TYPES[u], u) for u in kernel.uniforms], outputs=range(kernel.outputs))
    if kernel.kl is not None and not kernel.routine:
        from .kl_print import glsl

        body = glsl(kernel.kl)
        g = kernel.gradient
        if g is not None:  # an optimizer's gradient, valueAt, before its main (ops/optim.py)
            if g.kl is not None and not g.routine:
                body = glsl(g.kl, value=True) + body
            else:  # a template (a routine's included so too), rendered with its constants
                gctx = dict(g.consts, kernel=g, inputs=g.inputs, optimizer=True)
                body = env.get_template("kernels/" + g.template).render(gctx) + body
    else:
        body = env.get_template("kernels/" + kernel.template).render(ctx)
    return compact_glsl(env.get_template("kernels/prelude.glsl.j2").render(ctx, body=body))


@functools.lru_cache(maxsize=1)
def render_common() -> str:
    """The GLSL every kernel's source holds at its //!COMMON line (kernels/common.glsl.j2): the
    bundle ships it once, as GLSL_COMMON."""
    return compact_glsl(_env().get_template("kernels/common.glsl.j2").render())


# Lines of a generated shader that stay as they are: the runtime replaces the first two, and the
# third names the kernel in compile errors and in profiles.
_KEPT_GLSL_LINES = ("//!TILING", "//!COMMON", "// texelfit kernel: ")


def compact_glsl(source: str) -> str:
    """The shipped form of a shader: comments, indentation and blank lines dropped (the templates
    keep them for the reader). GLSL has no string literals, so any `//` starts a comment. Every
    line stays a line: preprocessor directives need theirs."""
    out = []
    for line in source.split("\n"):
        if line.startswith(_KEPT_GLSL_LINES):
            out.append(line)
            continue
        line = line.split("//", 1)[0].strip()
        if line:
            out.append(line)
    return "\n".join(out) + "\n"


def source_id(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def glsl_float(x: float) -> str:
    """A float literal GLSL ES 3.00 accepts (always with a point or exponent)."""
    r = repr(float(x))
    return r if ("." in r or "e" in r or "inf" in r or "nan" in r) else r + ".0"
