"""The op registry's parts (prep/ops/__init__.py describes it): OpDef, REGISTRY, register, opdef and the rules
several ops share. The family modules import this; prep/ops/__init__.py imports them."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from ..ir import GROUP_OF


class UnknownOp(LookupError):
    """An op with no definition in the registry."""


@dataclass(frozen=True)
class OpDef:
    name: str
    group: str  # its group in prep/ir.py's GROUPS
    flops: Callable
    torch: Callable
    prune: Callable
    cut: Callable
    weight_layout: Callable
    saves: Callable
    kernels: str | None


RULES = tuple(f.name for f in fields(OpDef) if f.name not in ("name", "group"))
REGISTRY: dict[str, OpDef] = {}


def register(name: str, **rules) -> OpDef:
    """Register IR op `name` with all its rules (RULES, each given: a missing one is an error here)."""
    if name not in GROUP_OF:
        raise UnknownOp(f"op registry: {name!r} is not an IR op (prep/ir.py: GROUPS lists them)")
    if name in REGISTRY:
        raise ValueError(f"op registry: {name!r} is registered twice")
    missing = [r for r in RULES if r not in rules]
    if missing:
        raise TypeError(f"op registry: IR op {name!r} has no {', '.join(missing)} rule")
    extra = set(rules) - set(RULES)
    if extra:
        raise TypeError(f"op registry: IR op {name!r}: unknown rules {sorted(extra)}")
    if rules["kernels"] is None and GROUP_OF[name] != "folded away":
        raise TypeError(f"op registry: IR op {name!r} has no kernels (only an op folded away before codegen may not)")
    for r in RULES:
        if r != "kernels" and not callable(rules[r]):
            raise TypeError(f"op registry: IR op {name!r}: its {r} rule is not a function")
    d = OpDef(name, GROUP_OF[name], **rules)
    REGISTRY[name] = d
    return d


def opdef(name: str) -> OpDef:
    """The definition of IR op `name`: an error naming it where it has none."""
    d = REGISTRY.get(name)
    if d is None:
        raise UnknownOp(f"no op definition for IR op {name!r}: register it with all its rules ({', '.join(RULES)}) "
                        "in its family's module under prep/ops/")
    return d


def names(group: str) -> tuple[str, ...]:
    """The registered ops of a group (prep/ir.py: GROUPS), in the registry's order."""
    return tuple(n for n, d in REGISTRY.items() if d.group == group)


# Rules several ops share.

def out_size(layer, graph) -> int:
    """The elements of one sample of the layer's output."""
    size = 1
    for d in graph.shapes[layer.outputs[0]]:
        size *= d
    return size


def per_output(layer, graph) -> int:
    """FLOPs of 1 an output element (an elementwise op, dropout's mask)."""
    return out_size(layer, graph)


def bias_and_act(layer, graph) -> int:
    """FLOPs of a weighted layer's bias and fused activation: 1 an output each."""
    return out_size(layer, graph) * (("bias" in layer.params) + ("act" in layer.attrs))


def moves_data(layer, graph) -> int:
    """FLOPs of data movement alone: 0."""
    return 0


def passes_channels(layer, graph, axes, gs):
    """Prune rule of an op that does not mix channels: its input's selection passes through."""
    return axes[layer.inputs[0]]


def same_attrs(layer, graph, plan, cut_param) -> dict:
    """Cut rule of an op whose attrs do not depend on the channels kept."""
    return layer.attrs


def saves_nothing(layer, graph) -> tuple[str, ...]:
    """Saves rule of an op whose backward reads no texture of its forward's but its inputs and output."""
    return ()


def no_params(layer, graph, param, role):
    """Weight-layout rule of an op without parameters."""
    raise AssertionError(f"IR op {layer.op!r} has no parameters, yet layer {layer.name!r} reads {param.name!r}")
