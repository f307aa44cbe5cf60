"""The torch reading of prep/elementwise.py's expressions, for the elementwise ops' forward (prep/ops/elementwise.py)
and a fused activation's (prep/torch_ir.py). Imports torch: only those two import this."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import elementwise as ew

# node kind -> function of the evaluated arguments
TORCH = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg, "exp": torch.exp,
    "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs, "sign": torch.sign, "tanh": torch.tanh, "erf": torch.erf,
    "sigmoid": torch.sigmoid, "max": torch.maximum, "min": torch.minimum, "pow": torch.pow, "where": torch.where,
    "gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le,
}


# Ops whose expression would export as primitives the importer does not take (Max, Where, Greater):
# the torch function that exports as the declaration's own ONNX op (export_onnx round-trips a graph)
AS_ONNX_OP = {
    "relu": lambda x, a: torch.relu(x),
    "leaky_relu": lambda x, a: F.leaky_relu(x, a["alpha"]),
    "clip": lambda x, a: torch.clamp(x, a["min"], a["max"]),
    "hardsigmoid": lambda x, a: torch.clamp(x * a["alpha"] + a["beta"], 0.0, 1.0),
    "hardswish": lambda x, a: F.hardswish(x),
    "elu": lambda x, a: F.elu(x, a["alpha"]),
    "selu": lambda x, a: a["gamma"] * F.elu(x, a["alpha"]),
    "softplus": lambda x, a: F.softplus(x),
    "prelu": lambda x, w, a: F.prelu(x, w.reshape(-1)),
}


def evaluate_expr(e: ew.E, args: list, y=None):
    """The expression on torch tensors: args[i] for operand i, y for the output."""
    def run(n):
        if n.op == "arg":
            return args[n.value]
        if n.op == "out":
            return y
        if n.op == "const":
            return torch.tensor(n.value, dtype=torch.float32)
        return TORCH[n.op](*(run(a) for a in n.args))
    return run(e)


def apply(op: str, args: list, attrs: dict):
    """Elementwise op `op` on its operands' tensors (its ONNX op's torch form where it has one)."""
    if op in AS_ONNX_OP:
        return AS_ONNX_OP[op](*args, ew.layer_attrs(ew.OPS[op], attrs))
    return evaluate_expr(ew.forward_of(op, attrs), args)
