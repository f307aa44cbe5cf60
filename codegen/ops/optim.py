"""Optimizers: one pass per parameter tensor, writing the parameter and its state
through multiple render targets into the other half of their ping-pong pairs.

sgd    (gradient inputs), P0, P, M     -> P', M'      (torch.optim.SGD: momentum, dampening, nesterov, weight_decay)
sgd0   (gradient inputs), P0, P        -> P'          (the same with momentum 0: torch neither reads nor
                                                       writes the buffer then, so the pass fetches and
                                                       writes a third less; the runtime picks it by momentum)
adam   (gradient inputs), P0, P, M, V  -> P', M', V'  (torch.optim.Adam; AdamW with u_decoupled = 1)

P0 is the anchor of fit's proximal term (FedProx), the weights the fit started from: the gradient gets
u_mu * (P - P0), that of mu / 2 * ||w - w_start||^2, in the program compiled with PROXIMAL defined. The schedule
binds the parameter itself there, and its programs leave P0 unread; a fit with `proximal` runs the PROXIMAL
variants (runtime/runner.js: variant) with a texture of its starting weights bound as P0 (runtime/optimizer.js:
optimizerOf). So a fit without one runs the programs it ran before and takes no memory. (P0: a name no gradient
kernel gives an input of its own; matmul_grad_weight reads an A.)

The pass also computes the gradient it applies: it includes the parameter's gradient kernel
(dense_grad_weight, conv_grad_bias, ...), the optimizer's `gradient` (codegen/kernels.py), and reads that kernel's
inputs. So a training step runs the backward without the passes that write pgrad: textures (the schedule's
train_backward) and never writes nor reads a parameter gradient on WebGL2: one pass and one round trip
through memory fewer per parameter. `gradients()` runs those passes and reads pgrad:.

The updates are written once in the kernel language (codegen/kl.py), reading the gradient as kl.gradient(): on
WebGL2 that is valueAt(_p), the gradient kernel's function placed before main (its template included with
`optimizer` set, or, for one of the kernel language, its GLSL printed as valueAt: codegen/kernels.py: render_kernel);
on the CPU the printed update reads a scratch texture G that the gradient kernel's function fills first
(runtime/cpu.js: cpuOptimizer); in WGSL an input G likewise. The proximal term is a KernelDef.variant, PROXIMAL:
#ifdef PROXIMAL in the GLSL, so the program without it leaves P0 unread; the CPU and WGSL compute it always (u_mu
is 0 and P0 the parameter itself there without a proximal fit). u_first, u_nesterov and u_decoupled (0 or 1)
choose by mix and products, not by a branch, which SwiftShader pays for even when the whole draw takes the same
side (adam interleave 1.37 -> 1.09 ms).
"""
from __future__ import annotations

from .. import kl
from ..kernels import Kernel, Pass

OPTIMIZERS = ("sgd", "sgd0", "adam")

_SGD_UNIFORMS = ("u_lr", "u_momentum", "u_dampening", "u_nesterov", "u_first", "u_wd", "u_mu")
_ADAM_UNIFORMS = ("u_lr", "u_wd", "u_decoupled", "u_beta1", "u_beta2", "u_eps", "u_step_size", "u_bc2_sqrt", "u_mu")


def _u(name: str) -> kl.X:
    return kl.uniform(name, "float")


def _gradient_of(k: kl.KernelDef, p: kl.X, decay) -> kl.X:
    """g = grad + decay * p, and + u_mu * (p - p0) in the PROXIMAL variant (fit's proximal term)."""
    g = k.let("g", kl.gradient() + decay * p)
    with k.variant("PROXIMAL"):
        k.set(g, g + _u("u_mu") * (p - kl.load("P0", kl.ROW, kl.COL)))
    return g


def sgd_kl(stateless: bool) -> kl.KernelDef:
    """torch.optim.SGD, one element per lane:
         g = grad + wd * p (+ mu * (p - p0))
         buf = first ? g : momentum * buf + (1 - dampening) * g      (momentum != 0)
         g = nesterov ? g + momentum * buf : buf
         p = p - lr * g
    Stateless (sgd0), for momentum 0, it writes P alone: torch keeps no buffer then and leaves an earlier one as
    it was. Otherwise u_first and u_nesterov (0 or 1) select by mix."""
    k = kl.KernelDef()
    p = k.let("p", kl.load("P", kl.ROW, kl.COL))
    g = _gradient_of(k, p, _u("u_wd"))
    if stateless:
        k.out(p - _u("u_lr") * g)
        return k
    m = _u("u_momentum")
    buf = k.let("buf", kl.mix(m * kl.load("M", kl.ROW, kl.COL) + (1.0 - _u("u_dampening")) * g, g, _u("u_first")))
    k.out(p - _u("u_lr") * kl.mix(buf, g + m * buf, _u("u_nesterov")))
    k.out(buf, 1)
    return k


def adam_kl() -> kl.KernelDef:
    """torch.optim.Adam / AdamW, one element per lane (step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t)):
         Adam:  g = grad + wd * p           AdamW: p = p * (1 - lr * wd)       (g + mu * (p - p0))
         m = m + (1 - beta1) * (g - m)      (torch's lerp)
         v = beta2 * v + (1 - beta2) * g * g
         p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
    Adam or AdamW by u_decoupled (0 or 1), by products."""
    k = kl.KernelDef()
    p = k.let("p", kl.load("P", kl.ROW, kl.COL))
    dec, wd = _u("u_decoupled"), _u("u_wd")
    g = _gradient_of(k, p, (1.0 - dec) * wd)
    k.set(p, p * (1.0 - dec * _u("u_lr") * wd))
    m = k.let("m", kl.load("M", kl.ROW, kl.COL))
    k.set(m, m + (1.0 - _u("u_beta1")) * (g - m))
    beta2 = _u("u_beta2")
    v = k.let("v", beta2 * kl.load("V", kl.ROW, kl.COL) + (1.0 - beta2) * g * g)
    k.out(p - _u("u_step_size") * m / (kl.sqrt(v) / _u("u_bc2_sqrt") + _u("u_eps")))
    k.out(m, 1)
    k.out(v, 2)
    return k


def optimizer_pass(opt, name, grad: Pass):
    """The update of parameter `name` by `opt`, computing its gradient as `grad` (a backward pass
    that writes pgrad:name) does, where `grad` runs (the twin of a blocked pass, Pass.blocked)."""
    p, m, v = "param:" + name, "m:" + name, "v:" + name
    state = {"sgd": [p, m], "sgd0": [p], "adam": [p, m, v]}[opt]
    g = grad.kernel
    update = adam_kl() if opt == "adam" else sgd_kl(opt == "sgd0")
    # the gradient kernel goes in whole (Kernel.gradient): its template's constants are the optimizer's (the
    # template is included on WebGL2), and a kernel-language one is printed as valueAt
    k = Kernel(f"{opt} {g.name}", "kl", g.inputs + ("P0", "P", "M", "V")[: 1 + len(state)],
               outputs=len(state), uniforms=g.uniforms + (_ADAM_UNIFORMS if opt == "adam" else _SGD_UNIFORMS),
               consts=dict(g.consts), kl=update, gradient=g)
    return [Pass(k, grad.inputs + [p] + state, state, "full", name, grad.values, grad.blocked,
                 block_from=grad.block_from)], state
