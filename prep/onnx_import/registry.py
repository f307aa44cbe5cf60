"""The registry of ONNX import rules and its dispatch.

A rule is a function (ctx, step) -> bool (ctx: prep/onnx_import/ctx.py's Importer; step: the node at hand, a
Step): True when it has converted the node, False when the node is not its case, in which case the next rule is
tried. @imports(op, ...) names the ONNX op types a rule applies to; @imports(ANY) a rule tried for every node
(constant folding, the guard on parameter tables). A few rules only prepare a node for those after them and
always return False (prepares=True: a 1-D conv rewritten as a 2-D one over its (C, 1, T) twin); a rule may also
fall through having changed the importer's state (a tensor materialised as it looked at it), as the chain of
branches it replaces did.

Registry(order) takes every rule in the one global order in which they are tried: for a node, the rules
registered for its op type and those for ANY, in that order; the first that returns True wins."""
from __future__ import annotations

from typing import Callable

ANY = "*"  # a rule tried for every op type

Rule = Callable[..., bool]


def imports(*ops: str, prepares: bool = False):
    """Register the decorated rule for ONNX op types `ops` (or ANY). `prepares`: it only rewrites the node
    for the rules after it and never converts one (it returns False)."""
    if not ops:
        raise ValueError("a rule imports at least one op type (or ANY)")

    def register(fn: Rule) -> Rule:
        fn.onnx_ops = tuple(dict.fromkeys(ops))
        fn.prepares = prepares
        return fn
    return register


class Registry:
    def __init__(self, order):
        self.order: tuple[Rule, ...] = tuple(order)
        for rule in self.order:
            if not hasattr(rule, "onnx_ops"):
                raise ValueError(f"{rule.__module__}.{rule.__name__} is not an @imports rule")
        names = [f"{r.__module__}.{r.__name__}" for r in self.order]
        if len(set(names)) != len(names):
            raise ValueError(f"a rule is in the order twice: {names}")
        # the op types with a rule of their own, in the order their first rule comes
        self.ops: tuple[str, ...] = tuple(dict.fromkeys(op for r in self.order for op in r.onnx_ops if op != ANY))
        self._any = tuple(r for r in self.order if ANY in r.onnx_ops)
        self._table = {op: tuple(r for r in self.order if op in r.onnx_ops or ANY in r.onnx_ops) for op in self.ops}

    def rules_for(self, op: str) -> tuple[Rule, ...]:
        """The rules tried for a node of op type `op`, in order."""
        return self._table.get(op, self._any)

    def dispatch(self, ctx, step) -> bool:
        """Try the rules for the step's op type in order; whether one converted it."""
        for rule in self.rules_for(step.op):
            if rule(ctx, step):
                return True
        return False
