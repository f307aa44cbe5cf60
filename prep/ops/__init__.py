"""The op registry: one definition (`OpDef`) per IR op (prep/ir.py: GROUPS names them), holding that op's rules.

    REGISTRY[name]   its OpDef; opdef(name) the same, with an error naming the op where there is none

An OpDef carries:

    flops(layer, graph) -> int                forward FLOPs a sample (texelfit/report.py: the build report)
    torch(module, layer, ins) -> Tensor       its forward in PyTorch (prep/torch_ir.py: IRModule, the reference);
                                              `module` the IRModule (its .graph, .param(layer, role)), `ins` the
                                              input tensors; torch is imported inside, so that importing the
                                              registry does not import torch
    prune(layer, graph, axes, gs) -> axis     its output's channel axis (prep/prune.py: plan_prune): a tuple of
                                              channel_groups.Seg, from its inputs' `axes`, joining or fixing
                                              groups in `gs` (channel_groups.Groups)
    cut(layer, graph, plan, cut_param) -> attrs
                                              its attrs once pruned (prep/prune.py: apply_prune), its parameters
                                              cut to the kept channels with cut_param(name, out_keep, in_keep)
    weight_layout(layer, graph, param, role) -> (Packing, height)
                                              how a parameter it reads other than a bias is laid out in its
                                              texture (codegen/webgl2/layout.py: plan_layout; a bias is always one row)
    saves(layer, graph) -> prefixes           the per-sample textures its forward writes beside its output for its
                                              backward: a prefix (of its output's shape, role "argmax"), e.g.
                                              ("argmax:",), or (prefix, role, a sample's shape), a layernorm's
                                              statistics (codegen/webgl2/layout.py: plan_layout)
    kernels                                   the codegen module declaring its passes (codegen/ops/<kernels>.py,
                                              codegen/ops/__init__.py: FAMILIES); None only for an op folded
                                              away before codegen

One module per op family registers its ops (registry.py: `register`) with every rule given: dense.py, conv.py
(conv, conv_transpose), tokens.py (matmul, layernorm, embedding), elementwise.py (each op of prep/elementwise.py,
in a loop; torch_expr.py is their torch reading), batchnorm.py, reduce.py (reduce, softmax, log_softmax), pool.py,
resample.py, dropout.py, reshape.py (concat, flatten, gather). Importing this package imports them all and checks
that every op of prep/ir.py has a definition.
"""
from __future__ import annotations

from ..ir import OPS
from . import batchnorm, conv, dense, dropout, elementwise, pool, reduce, reshape, resample, tokens  # noqa: F401
from .registry import OpDef, REGISTRY, RULES, UnknownOp, names, opdef

_missing = [op for op in OPS if op not in REGISTRY]
if _missing:
    raise UnknownOp(f"op registry: no definition for the IR ops {', '.join(_missing)} (prep/ir.py: GROUPS)")
for _op in OPS:  # in prep/ir.py's order
    REGISTRY[_op] = REGISTRY.pop(_op)

__all__ = ["REGISTRY", "RULES", "OpDef", "UnknownOp", "names", "opdef"]
