"""Optimizers: one pass per parameter tensor, writing the parameter and its state
through multiple render targets into the other half of their ping-pong pairs.

sgd    P, G, M     -> P', M'        (torch.optim.SGD: momentum, dampening, nesterov, weight_decay)
adam   P, G, M, V  -> P', M', V'    (torch.optim.Adam; AdamW with u_decoupled = 1)
"""
from __future__ import annotations

from ..kernels import Kernel, Pass

OPTIMIZERS = ("sgd", "adam")

_SGD_UNIFORMS = ("u_lr", "u_momentum", "u_dampening", "u_nesterov", "u_first", "u_wd")
_ADAM_UNIFORMS = ("u_lr", "u_wd", "u_decoupled", "u_beta1", "u_beta2", "u_eps", "u_step_size", "u_bc2_sqrt")


def optimizer_pass(opt, name, textures):
    p, g, m, v = "param:" + name, "pgrad:" + name, "m:" + name, "v:" + name
    if opt == "sgd":
        k = Kernel("sgd", "sgd.glsl.j2", ("P", "G", "M"), outputs=2, uniforms=_SGD_UNIFORMS)
        return [Pass(k, [p, g, m], [p, m], "full", name)], [p, m]
    k = Kernel("adam", "adam.glsl.j2", ("P", "G", "M", "V"), outputs=3, uniforms=_ADAM_UNIFORMS)
    return [Pass(k, [p, g, m, v], [p, m, v], "full", name)], [p, m, v]
