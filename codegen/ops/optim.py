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
(dense_grad_weight, conv_grad_bias, ...) as a function and reads that kernel's inputs (one written in the kernel
language is printed as that function, valueAt, and its CPU function is the one the CPU optimizer calls). So a
training step runs the backward without the passes that write pgrad: textures (the schedule's
train_backward) and never writes nor reads a parameter gradient: one pass and one round trip
through memory fewer per parameter. `gradients()` runs those passes and reads pgrad:. A gradient kernel of the
kernel language (its `kl`) is included so too: the optimizer kernel's `gradient` (codegen/kernels.py), printed as
valueAt in its GLSL; its CPU function calls the gradient's printed one (c.gradient "kl", c.gradient_cpu).
"""
from __future__ import annotations

from ..kernels import Kernel, Pass

OPTIMIZERS = ("sgd", "sgd0", "adam")

_SGD_UNIFORMS = ("u_lr", "u_momentum", "u_dampening", "u_nesterov", "u_first", "u_wd", "u_mu")
_ADAM_UNIFORMS = ("u_lr", "u_wd", "u_decoupled", "u_beta1", "u_beta2", "u_eps", "u_step_size", "u_bc2_sqrt", "u_mu")


def optimizer_pass(opt, name, grad: Pass):
    """The update of parameter `name` by `opt`, computing its gradient as `grad` (a backward pass
    that writes pgrad:name) does, where `grad` runs (the twin of a blocked pass, Pass.blocked)."""
    p, m, v = "param:" + name, "m:" + name, "v:" + name
    state = {"sgd": [p, m], "sgd0": [p], "adam": [p, m, v]}[opt]
    g = grad.kernel
    # a gradient kernel written in the kernel language goes in whole (Kernel.gradient): its GLSL printed as valueAt,
    # its CPU function called by the optimizer's (codegen/schedule.py: serialize); a template's is included
    consts = dict(g.consts, gradient=g.template.removesuffix(".glsl.j2"), stateless=opt == "sgd0")
    k = Kernel(f"{opt} {g.name}", f"{opt.rstrip('0')}.glsl.j2", g.inputs + ("P0", "P", "M", "V")[: 1 + len(state)],
               outputs=len(state), uniforms=g.uniforms + (_ADAM_UNIFORMS if opt == "adam" else _SGD_UNIFORMS),
               consts=consts, gradient=g if g.kl is not None else None)
    return [Pass(k, grad.inputs + [p] + state, state, "full", name, grad.values, grad.blocked)], state
