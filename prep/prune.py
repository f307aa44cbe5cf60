"""Structured L1 channel pruning on the IR (after prep.fold, before prep.fuse).

    prune(graph, ratio, round_to=4)  ->  a smaller Graph computing the same kind of model

Whole output channels of convs and whole units of dense layers are removed, with the
matching input channels of every layer that reads them. The model's input and output
sizes never change.

Channel groups. Every conv or dense output starts a *group*: a set of channels that is
kept or dropped as one selection. Operations that do not mix channels (activations, pools,
a folded batch-norm, a depthwise conv) pass the selection through; an `add` joins the
groups of its two operands into one (channels that are added are pruned together); a
`concat` lays groups side by side at their channel offsets; a `flatten` of (C, H, W)
stretches channel c over the columns c*H*W .. (c+1)*H*W - 1. So the channel axis of every
tensor is a list of segments, each one group with `rep` consecutive entries per channel:

    tensor                                      axis segments (group, channels, rep)
    conv1 out      (16, 8, 8)                   (g1, 16, 1)
    maxpool(relu)  (16, 4, 4)                   (g1, 16, 1)
    flatten        (256,)                       (g1, 16, 16)    column j -> channel j // 16
    cat(a, b)      (3 + 5, H, W)                (ga, 3, 1), (gb, 5, 1)
    depthwise x2   (2C, H, W) from (C, H, W)    (g, C, 2)       output o -> input o // 2

Scoring: a channel's score is the L1 norm of the output slices of the weights that produce
it, summed over the group's producers. A group keeps ceil((1 - ratio) * C) channels, rounded
up to a multiple of `round_to` (4: a texel holds 4 channels, so 4k+1 channels cost as much
as 4k+4), never 0 and never more than C; the highest-scoring ones, in their original order.

Left unpruned (and listed with the reason in `PrunePlan.groups`): the groups of the model
input and output, groups read by a grouped conv whose groups are neither 1 nor its input
channels, groups joined by an `add` whose operands are concatenated differently, and the
groups into and out of a `gather` that moves channels (a reshape, permutation, channel slice or
concatenation with a constant: see _gather_axis; one that slices or pads only H and W passes
the selection through).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from .channel_groups import Groups, Seg
from .errors import BuildError
from .ir import Graph
from .ops import opdef


@dataclass
class Group:
    """One kept-or-dropped channel selection (after joining across adds)."""

    producers: list[str]  # names of the conv/dense layers whose output channels these are
    channels: int
    kept: list[int] = field(default_factory=list)  # indices kept, ascending
    reason: str | None = None  # why it is left unpruned, if it is

    def report(self) -> dict:
        return {"producers": self.producers, "channels": self.channels, "kept": len(self.kept),
                "unpruned_because": self.reason}


@dataclass
class PrunePlan:
    ratio: float
    round_to: int
    groups: list[Group]
    axes: dict[str, tuple[Seg, ...]]  # tensor -> its channel axis
    root: dict[int, int]  # segment group id -> index into `groups`

    def kept(self, tensor: str) -> np.ndarray:
        """Indices kept along the channel axis of `tensor`."""
        out, offset = [], 0
        for s in self.axes[tensor]:
            keep = np.asarray(self.groups[self.root[s.group]].kept, dtype=np.int64)
            out.append(offset + (keep[:, None] * s.rep + np.arange(s.rep)[None, :]).reshape(-1))
            offset += s.n * s.rep
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def report(self) -> dict:
        return {"ratio": self.ratio, "round_to": self.round_to,
                "groups": [g.report() for g in self.groups if g.producers]}


def keep_count(channels: int, ratio: float, round_to: int = 4) -> int:
    k = math.ceil((1 - ratio) * channels - 1e-9)
    if round_to > 1:
        k = -(-k // round_to) * round_to
    return min(max(k, 1), channels)


def check_ratio(ratio) -> float:
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        raise BuildError(f"--prune must be a number in [0, 1), got {ratio!r}") from None
    if not 0 <= r < 1:
        raise BuildError(f"--prune must be in [0, 1), got {ratio}")
    return r


def plan_prune(graph: Graph, ratio: float, *, round_to: int = 4) -> PrunePlan:
    ratio = check_ratio(ratio)
    if not isinstance(round_to, int) or round_to < 1:
        raise BuildError(f"round_to must be a positive integer, got {round_to!r}")
    gs = Groups()
    axes: dict[str, tuple[Seg, ...]] = {t: (Seg(gs.new(graph.shapes[t][0], reason="model input"), graph.shapes[t][0], 1),)
                                        for t in graph.inputs}
    for layer in graph.layers:
        out = layer.outputs[0]
        if not layer.inputs:  # constants alone (a position table's ids): nothing to prune
            n = graph.shapes[out][0]
            axes[out] = (Seg(gs.new(n, reason="a constant"), n, 1),)
            continue
        axes[out] = opdef(layer.op).prune(layer, graph, axes, gs)  # (prep/ops/: each op's rule)
    for s in (s for o in graph.outputs for s in axes[o]):
        gs.fix(s.group, "it is a model output")

    # One Group per root, in the order the roots first appear.
    root: dict[int, int] = {}
    groups: list[Group] = []
    order = {layer.name: i for i, layer in enumerate(graph.layers)}
    for g in range(len(gs.parent)):
        r = gs.find(g)
        if r not in root:
            root[r] = len(groups)
            names = sorted((p.name for p in gs.producers[r]), key=order.__getitem__)
            groups.append(Group(names, gs.n[r], reason=gs.reason[r]))
        root[g] = root[r]
    for r, i in list(root.items()):
        if gs.find(r) != r:
            continue
        group, n = groups[i], gs.n[r]
        k = n if group.reason else keep_count(n, ratio, round_to)
        if k == n:
            group.kept = list(range(n))
            continue
        score = np.zeros(n, np.float64)
        for p in gs.producers[r]:
            w = graph.params[p.params["weight"]].canonical().astype(np.float64)
            score += np.abs(w).reshape(n, -1).sum(axis=1)
        best = np.argsort(-score, kind="stable")[:k]
        group.kept = sorted(int(i) for i in best)
    return PrunePlan(ratio, round_to, groups, axes, root)


def apply_prune(graph: Graph, plan: PrunePlan) -> Graph:
    params = dict(graph.params)
    layers = []

    def cut(pname: str, out_keep=None, in_keep=None):
        p = params[pname]
        arr = p.canonical()
        if out_keep is not None:
            arr = arr[out_keep]
        if in_keep is not None:
            arr = arr[:, in_keep]
        arr = np.ascontiguousarray(arr.T if p.transposed else arr, dtype=np.float32)
        params[pname] = dataclasses.replace(p, array=arr)

    for layer in graph.layers:  # each op's rule (prep/ops/) cuts its weights and gives its attrs
        layers.append(dataclasses.replace(layer, attrs=opdef(layer.op).cut(layer, graph, plan, cut)))

    shapes = {}
    for t, s in graph.shapes.items():
        shapes[t] = (len(plan.kept(t)),) + tuple(s[1:]) if t in plan.axes else s
    assert shapes[graph.input] == graph.input_shape and all(shapes[o] == graph.shapes[o] for o in graph.outputs)
    return dataclasses.replace(graph, shapes=shapes, layers=layers, params=params)


def prune(graph: Graph, ratio: float, *, round_to: int = 4) -> Graph:
    """The graph with the lowest-L1 channels of every prunable group removed (see the module doc)."""
    return apply_prune(graph, plan_prune(graph, ratio, round_to=round_to))
