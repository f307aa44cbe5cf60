"""Channel groups for structured pruning (prep/prune.py describes them): the segments of a tensor's channel
axis and the union-find over the groups. Apart from prep/prune.py so that each op's pruning rule (prep/ops/)
can build its output's axis without importing the pruning that dispatches to it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Layer


@dataclass(frozen=True)
class Seg:
    group: int
    n: int  # channels of the group
    rep: int  # consecutive entries of the axis per channel


class Groups:
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


def channels_of(shape) -> int:
    return int(shape[0]) if len(shape) in (2, 3) else int(np.prod(shape))  # the first axis, as apply_prune cuts


def channels(axis) -> int:
    return sum(s.n * s.rep for s in axis)
