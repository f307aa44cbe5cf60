"""prep/ has no import cycle among its modules (issue 31: BuildError lives in prep/errors.py so that the stages
need not import each other for it). Module-level imports only: an import inside a function runs when called."""
from __future__ import annotations

import ast
import os

PREP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "prep")


def _graph() -> dict[str, set[str]]:
    mods = {f[:-3] for f in os.listdir(PREP) if f.endswith(".py")}
    edges: dict[str, set[str]] = {}
    for m in mods:
        with open(os.path.join(PREP, m + ".py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        out = set()
        for node in tree.body:  # module level only
            if isinstance(node, ast.ImportFrom):
                name = node.module or ""
                if node.level == 1:  # from .x import y, from . import x
                    out |= {name.split(".")[0]} if name else {a.name for a in node.names}
                elif name.startswith(("texelfit.prep.", "prep.")):
                    out.add(name.split(".")[-1])
            elif isinstance(node, ast.Import):
                out |= {a.name.split(".")[-1] for a in node.names if a.name.startswith(("texelfit.prep.", "prep."))}
        edges[m] = out & mods
    return edges


def _cycle(edges):
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return path + [m, n]
            if n not in state and (c := visit(n, path + [m])):
                return c
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (c := visit(m, [])):
            return c
    return None


def test_prep_has_no_import_cycle():
    edges = _graph()
    assert edges["graph"], "the import graph was read (graph.py imports other prep modules)"
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def test_a_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
