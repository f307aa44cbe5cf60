"""prep/ has no import cycle among its modules (issue 31: BuildError lives in prep/errors.py so that the stages
need not import each other for it). Module-level imports only: an import inside a function runs when called."""
from __future__ import annotations

import ast
import os

PREP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "prep")


def _modules() -> dict[str, str]:
    """prep's modules, subpackages' included ("ops" its __init__, "ops.conv"), to their files."""
    mods = {}
    for root, _, files in os.walk(PREP):
        pkg = os.path.relpath(root, PREP).replace(os.sep, ".")
        pkg = "" if pkg == "." else pkg
        for f in files:
            if f.endswith(".py"):
                name = pkg if f == "__init__.py" else (pkg + "." if pkg else "") + f[:-3]
                if name:
                    mods[name] = os.path.join(root, f)
    return mods


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {}
    for m, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        # the package a relative import starts from: a package's own for its __init__
        here = m.split(".") if path.endswith("__init__.py") else m.split(".")[:-1]
        out = set()
        for node in tree.body:  # module level only
            if isinstance(node, ast.ImportFrom):
                name = node.module or ""
                if node.level:  # from .x import y, from . import x, from ..x import y
                    base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                    target = ".".join(base + ([name] if name else []))
                elif name.startswith(("texelfit.prep.", "prep.")):
                    target = name.split(".", 2)[-1] if name.startswith("texelfit.") else name.split(".", 1)[-1]
                else:
                    continue
                out |= {target} if target in mods else set()
                out |= {f"{target}.{a.name}".lstrip(".") for a in node.names}  # from package import module
            elif isinstance(node, ast.Import):
                out |= {a.name.split(".", 2)[-1] for a in node.names if a.name.startswith("texelfit.prep.")}
                out |= {a.name.split(".", 1)[-1] for a in node.names if a.name.startswith("prep.")}
        edges[m] = (out & set(mods)) - {m}
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
    assert {"ir", "ops.registry", "ops.conv"} <= edges["ops"] and "packing" in edges["ops.conv"], \
        "subpackages are read"
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def test_a_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


ROOT = os.path.dirname(PREP)


def test_prep_does_not_import_a_backend():
    """prep/ ends with the IR and the packing rule every backend shares; a backend's storage plan (the WebGL2 texel
    layout and its blocking rules: codegen/webgl2/) is codegen's. No prep module imports codegen, at any level."""
    found = []
    for m, path in _modules().items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{m}: {n}" for n in names if n.startswith(("texelfit.codegen", "codegen"))]
    assert not found, found
    assert len(_modules()) > 30, "prep's modules were read"


def test_source_files_stay_under_400_lines():
    """Issue 31: files under about 400 lines. Every Python module of the build (prep/, codegen/, texelfit/) and
    every plain runtime module (runtime_template/runtime/*.js)."""
    files = [os.path.join(r, f) for top in ("prep", "codegen", "texelfit", os.path.join("runtime_template", "runtime"))
             for r, _, fs in os.walk(os.path.join(ROOT, top)) for f in fs if f.endswith((".py", ".js"))]
    assert len(files) > 80, len(files)
    long = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            n = len(f.read().splitlines())
        if n > 400:
            long[os.path.relpath(path, ROOT)] = n
    assert not long, long
