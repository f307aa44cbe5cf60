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

from .ir import ELEMENTWISE, POOLS, SOFTMAX, Graph, Layer, operands
from .errors import BuildError


@dataclass(frozen=True)
class Seg:
    group: int
    n: int  # channels of the group
    rep: int  # consecutive entries of the axis per channel


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


class _Groups:
    """Union-find over channel groups, each with its size, producers and a reason to stay whole."""

    def __init__(self):
        self.parent: list[int] = []
        self.n: list[int] = []
        self.producers: list[list[Layer]] = []
        self.reason: list[str | None] = []

    def new(self, n: int, producer: Layer | None = None, reason: str | None = None) -> int:
        self.parent.append(len(self.parent))
        self.n.append(n)
        self.producers.append([producer] if producer else [])
        self.reason.append(reason)
        return len(self.parent) - 1

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a == b:
            return
        assert self.n[a] == self.n[b]
        self.parent[b] = a
        self.producers[a] += self.producers[b]
        self.reason[a] = self.reason[a] or self.reason[b]

    def fix(self, g: int, reason: str) -> None:
        r = self.find(g)
        self.reason[r] = self.reason[r] or reason


def _channels_of(shape) -> int:
    return int(shape[0]) if len(shape) in (2, 3) else int(np.prod(shape))  # the first axis, as apply_prune cuts


def _channels(axis) -> int:
    return sum(s.n * s.rep for s in axis)


def _gather_axis(layer, graph: Graph, axes, gs: _Groups) -> tuple[Seg, ...]:
    """The channel axis of a gather's output (prep/shape.py). One that only slices or pads H and W of
    (C, H, W) inputs keeps their channels: it passes their selection through, joining those of several
    inputs as an add does. Any other (a reshape, a permutation, a slice or concatenation of channels, a
    constant part) moves channels where a selection cannot follow: its inputs stay whole, and its output
    is a new group that stays whole."""
    parts, out = layer.attrs["parts"], graph.shapes[layer.outputs[0]]
    ins = [axes[t] for t in layer.inputs]
    spatial = len(out) == 3 and all(len(graph.shapes[t]) == 3 for t in layer.inputs) and all(
        p["input"] is not None and all(op[0] in ("slice", "pad", "flip") and op[1] != 0 for op in p["ops"]) for p in parts)
    if spatial and all(len(x) == len(ins[0]) and all((a.n, a.rep) == (b.n, b.rep) for a, b in zip(x, ins[0]))
                       for x in ins):
        for x in ins[1:]:
            for a, b in zip(ins[0], x):
                gs.union(a.group, b.group)
        return ins[0]
    why = f"shape op {layer.name!r} moves channels"
    for x in ins:
        for seg in x:
            gs.fix(seg.group, why)
    n = out[0] if out else 1
    return (Seg(gs.new(n, reason=why), n, 1),)


def plan_prune(graph: Graph, ratio: float, *, round_to: int = 4) -> PrunePlan:
    ratio = check_ratio(ratio)
    if not isinstance(round_to, int) or round_to < 1:
        raise BuildError(f"round_to must be a positive integer, got {round_to!r}")
    gs = _Groups()
    axes: dict[str, tuple[Seg, ...]] = {t: (Seg(gs.new(graph.shapes[t][0], reason="model input"), graph.shapes[t][0], 1),)
                                        for t in graph.inputs}
    for layer in graph.layers:
        out = layer.outputs[0]
        if not layer.inputs:  # constants alone (a position table's ids): nothing to prune
            n = graph.shapes[out][0]
            axes[out] = (Seg(gs.new(n, reason="a constant"), n, 1),)
            continue
        x = axes[layer.inputs[0]]
        if layer.op == "dense":
            n = graph.shapes[out][0]
            axes[out] = (Seg(gs.new(n, layer), n, 1),)
        elif layer.op == "conv":
            groups, c_in, oc = layer.attrs["groups"], _channels(x), graph.shapes[out][0]
            if groups == 1:
                axes[out] = (Seg(gs.new(oc, layer), oc, 1),)
            elif groups == c_in:  # depthwise (channel multiplier oc / c_in): passes its input's selection
                m = oc // c_in
                axes[out] = tuple(Seg(s.group, s.n, s.rep * m) for s in x)
            else:
                why = f"grouped conv {layer.name!r} (groups={groups}) is not pruned"
                for s in x:
                    gs.fix(s.group, why)
                axes[out] = (Seg(gs.new(oc, layer, reason=why), oc, 1),)
        elif layer.op == "conv_transpose":  # neither its inputs nor its outputs are pruned (not written yet)
            why = f"transposed conv {layer.name!r} is not pruned"
            for s in x:
                gs.fix(s.group, why)
            oc = graph.shapes[out][0]
            axes[out] = (Seg(gs.new(oc, layer, reason=why), oc, 1),)
        elif layer.op == "flatten":
            hw = int(np.prod(graph.shapes[layer.inputs[0]][1:]))
            axes[out] = tuple(Seg(s.group, s.n, s.rep * hw) for s in x)
        elif layer.op in ELEMENTWISE and any(o["kind"] != "act" and o["shape"] and o["shape"][0] > 1
                                             for o in operands(layer, graph)):
            why = f"{layer.op} {layer.name!r} has a per-channel constant or parameter"
            for t in layer.inputs:
                for s in axes[t]:
                    gs.fix(s.group, why)
            axes[out] = x
        elif layer.op in ELEMENTWISE and len(layer.inputs) == 2:  # channels combined are pruned together
            y = axes[layer.inputs[1]]
            if len(x) == len(y) and all((a.n, a.rep) == (b.n, b.rep) for a, b in zip(x, y)):
                for a, b in zip(x, y):
                    gs.union(a.group, b.group)
            else:
                for s in x + y:
                    gs.fix(s.group, f"{layer.op} {layer.name!r} joins differently concatenated tensors")
            axes[out] = x if _channels(x) >= _channels(y) else y
        elif layer.op == "concat":
            axes[out] = tuple(s for t in layer.inputs for s in axes[t])
        elif layer.op == "gather":
            axes[out] = _gather_axis(layer, graph, axes, gs)
        elif layer.op == "reduce" and 0 in layer.attrs["axes"]:  # mixes the channels
            for s in x:
                gs.fix(s.group, f"reduce {layer.name!r} is over the channels")
            axes[out] = (Seg(gs.new(_channels_of(graph.shapes[out]), reason="a reduction over the channels"),
                             _channels_of(graph.shapes[out]), 1),)
        elif layer.op == "reduce" and len(graph.shapes[layer.inputs[0]]) != 3:
            for s in x:
                gs.fix(s.group, f"reduce {layer.name!r} is not over (C, H, W) data")
            axes[out] = (Seg(gs.new(_channels_of(graph.shapes[out]), reason="a reduction"),
                             _channels_of(graph.shapes[out]), 1),)
        elif layer.op in ("matmul", "layernorm", "embedding"):  # token ops (R, F): not pruned
            why = f"{layer.op} {layer.name!r} works on tokens, which are not pruned"
            for t in layer.inputs:
                for s in axes[t]:
                    gs.fix(s.group, why)
            n = _channels_of(graph.shapes[out])
            axes[out] = (Seg(gs.new(n, reason=why), n, 1),)
        elif layer.op in ELEMENTWISE + POOLS + SOFTMAX + ("batchnorm", "reduce", "resample", "dropout"):
            axes[out] = x
        else:
            raise AssertionError(f"prune: op {layer.op!r} is not handled")
    for s in axes[graph.output]:
        gs.fix(s.group, "it is the model output")

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

    for layer in graph.layers:
        x, out = (layer.inputs or [None])[0], layer.outputs[0]
        attrs = layer.attrs
        if layer.op in ("dense", "conv"):
            groups = attrs.get("groups", 1)
            c_in = graph.shapes[x][0]
            ok, ik = plan.kept(out), plan.kept(x)
            if layer.op == "conv" and groups == c_in and groups > 1:  # depthwise: weight [OC, 1, kh, kw]
                cut(layer.params["weight"], ok)
                attrs = dict(attrs, groups=len(ik))
            elif layer.op == "conv" and groups != 1:  # other grouped convs stay whole
                assert len(ok) == graph.shapes[out][0] and len(ik) == c_in
            else:
                cut(layer.params["weight"], ok, ik)
            if "bias" in layer.params:
                cut(layer.params["bias"], ok)
        elif layer.op == "batchnorm":
            k = plan.kept(x)
            attrs = dict(attrs, **{s: np.asarray(attrs[s])[k] for s in ("scale", "bias", "mean", "var")})
        elif "operands" in attrs:  # the activation operands' channels as kept
            attrs = dict(attrs, operands=[dict(o, shape=[len(plan.kept(layer.inputs[o["input"]]))] + o["shape"][1:])
                                          if o["kind"] == "act" else o for o in attrs["operands"]])
        layers.append(dataclasses.replace(layer, attrs=attrs))

    shapes = {}
    for t, s in graph.shapes.items():
        shapes[t] = (len(plan.kept(t)),) + tuple(s[1:]) if t in plan.axes else s
    assert shapes[graph.input] == graph.input_shape and shapes[graph.output] == graph.output_shape
    return dataclasses.replace(graph, shapes=shapes, layers=layers, params=params)


def prune(graph: Graph, ratio: float, *, round_to: int = 4) -> Graph:
    """The graph with the lowest-L1 channels of every prunable group removed (see the module doc)."""
    return apply_prune(graph, plan_prune(graph, ratio, round_to=round_to))
