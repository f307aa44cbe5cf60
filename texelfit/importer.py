"""`texelfit import-weights`: weights trained in the browser back into PyTorch.

FILE is what the page saved: JSON of `await m.getWeights()` with arrays as lists
(`{"conv1.weight": [...], ...}`, the demo's "Download weights"). SOURCE is the architecture the
bundle was built from, as for `texelfit build`; for a pruned bundle, the NAME.onnx that the demo
writes beside it (the architecture as built: pruned, batch-norm folded). The output is a
state_dict (`.pt`, keyed and shaped as getWeights) or an ONNX model of that architecture (`.onnx`).

With `partial`, FILE may hold only some of the tensors (the photo demo's "Download weights" is the
trained head alone: the frozen backbone never changes); the others are SOURCE's.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.graph import to_ir
from texelfit.prep.ir import Graph
from texelfit.prep.errors import BuildError
from texelfit.prep.load import load_onnx


def read_weights(path: str) -> dict[str, np.ndarray]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise BuildError(f"cannot read weights {path}: {e}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
        raise BuildError(f"{path} is not a JSON object of weight name -> list of numbers (what getWeights gives)")
    return {k: np.asarray(v, dtype=np.float32) for k, v in raw.items()}


def apply_weights(graph: Graph, weights: dict[str, np.ndarray], where: str, *, partial: bool = False) -> Graph:
    for alias, name in graph.aliases.items():  # a tied parameter's other key (getWeights gives both): the same values
        if alias in weights:
            w = weights.pop(alias)
            if name in weights and not np.array_equal(w.reshape(-1), weights[name].reshape(-1)):
                raise BuildError(f"{where}: {alias!r} and {name!r} are one tied parameter, but hold different values")
            weights.setdefault(name, w)
    missing = [n for n in graph.params if n not in weights]
    extra = [n for n in weights if n not in graph.params]
    if extra or (missing and not partial) or not weights:
        hint = " (a file of some tensors only, e.g. a trained head: give --partial)" if missing and not extra else ""
        raise BuildError(f"{where} does not fit the architecture: missing {missing or 'none'}, unknown "
                         f"{extra or 'none'}{hint}")
    params = {}
    for name, p in graph.params.items():
        if name not in weights:
            params[name] = p
            continue
        w = weights[name]
        if w.size != p.array.size or not np.isfinite(w).all():
            raise BuildError(f"{where}: {name!r} has {w.size} values (expected {p.array.size}, all finite)")
        params[name] = dataclasses.replace(p, array=w.reshape(p.array.shape))
    return dataclasses.replace(graph, params=params)


def import_weights(file: str, source: str, out: str, *, input_shape=None, inputs=None, weights: str | None = None,
                   trust_pickle: bool = False, partial: bool = False, input_dtype=None) -> Graph:
    if not (out.endswith(".pt") or out.endswith(".onnx")):
        raise BuildError(f"--out {out!r} must end in .pt (a state_dict) or .onnx")
    graph = fold_batchnorm(to_ir(load_onnx(source, weights=weights, input_shape=input_shape,
                                           trust_pickle=trust_pickle, inputs=inputs, input_dtype=input_dtype),
                                 input_shape, input_dtype))
    graph = apply_weights(graph, read_weights(file), file, partial=partial)
    if out.endswith(".pt"):
        import torch

        state = {n: torch.from_numpy(p.array.copy()) for n, p in graph.params.items()}
        state.update({a: state[n] for a, n in graph.aliases.items()})  # (a tied parameter under each of its keys)
        torch.save(state, out)
    else:
        from texelfit.prep.torch_ir import export_onnx

        with open(out, "wb") as f:
            f.write(export_onnx(graph).SerializeToString())
    return graph
