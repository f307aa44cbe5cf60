"""What trains: the build's check that the bundle trains exactly what PyTorch would.

For a PyTorch source (prep.load records its `named_parameters()` under PARAMETERS_KEY), every parameter
must reach the IR as a trainable tensor of its own, or be accounted for:

  * batch-norm's weight and bias, folded into the conv or dense layer before it (prep.fold): said once (a
    batch-norm that cannot fold trains its own weight and bias, prep.fold.free_batchnorm);
  * a parameter that forward does not use (PyTorch gives it no gradient either; UNUSED_KEY): listed;
  * a parameter that --trainable leaves out: frozen, a constant of the bundle; listed.

Anything else fails the build naming the parameter and why: a parameter that the ONNX exporter computed
into a constant (FOLDED_KEY), one that the importer reads as a constant (a table read in a way texelfit
does not train yet), or a tied parameter (one nn.Parameter read by two layers, TIED_KEY or an
initializer shared by two layers), which PyTorch trains as one tensor with the sum of its gradients, where
its readers cannot share one texture (prep.graph.untie_unsupported: a token embedding and token-wise matmuls,
GPT-2's tied embedding and head, can, and train so).

An ONNX file declares no parameters: prep.load takes its initializers that are parameters by what reads
them (naming.onnx_parameters), and the same check applies, except that an initializer several layers read is
untied (the exporter merged tensors of equal value), each copy named by its node's scope where it can be.
"""
from __future__ import annotations

import fnmatch
import json

from .ir import Graph
from .errors import BuildError
from .fold import fold_batchnorm
from .naming import FOLDED_KEY, PARAMETERS_KEY, SOURCE_KEY, STATE_KEYS_KEY, TIED_KEY, UNUSED_KEY


def declared_parameters(model) -> list[str] | None:
    """The parameter names prep.load declared (a PyTorch source's named_parameters(), an ONNX file's
    onnx_parameters()), or None for a model that did not come through prep.load."""
    meta = {p.key: p.value for p in model.metadata_props}
    return json.loads(meta[PARAMETERS_KEY]) if PARAMETERS_KEY in meta else None


def selected(patterns: str, name: str) -> bool:
    """Whether --trainable's patterns select `name` ("*": all, "none": none)."""
    if patterns.strip() == "none":
        return False
    return any(fnmatch.fnmatchcase(name, p.strip()) for p in patterns.split(",") if p.strip())


def check_trainable(model, graph: Graph, patterns: str) -> dict:
    """The trainable-set check of a build (see the module's docstring). `graph` is the IR as imported (before
    batch-norm folding); returns report.json's "trainable_set": {declared, batchnorm_folded, unused, frozen,
    untied, tied, unrecovered, consumers}; raises BuildError naming every parameter that would not train as
    PyTorch trains it."""
    meta = {p.key: p.value for p in model.metadata_props}
    declared = declared_parameters(model) or []
    onnx_file = meta.get(SOURCE_KEY) == json.dumps("onnx")
    consumers = _consumers(model)
    free = {n for layer in fold_batchnorm(graph).layers if layer.op == "batchnorm_affine" for n in layer.params.values()}
    bn = sorted({n.input[k] for n in model.graph.node if n.op_type == "BatchNormalization" for k in (1, 2)
                 if len(n.input) > k} - free)  # folded into the layer before them (a free one trains as itself)
    folded = json.loads(meta.get(FOLDED_KEY, "{}"))
    tied = json.loads(meta.get(TIED_KEY, "{}"))
    unused = json.loads(meta.get(UNUSED_KEY, "[]"))
    source = {n: p.source or tied.get(n) or n for n, p in graph.params.items()}
    problems: list[str] = []
    for name in declared:
        if name in graph.params or name in free or name in bn or name in unused or not selected(patterns, name):
            continue
        if name in folded:
            why = folded[name]
        elif consumers.get(name):
            why = "read by " + ", ".join(f"{op} node {node!r}" for op, node in consumers[name]) + \
                  ", which texelfit computes into a constant (this way of reading a parameter does not train yet)"
        else:
            why = "it does not reach the simplified graph"
        problems.append(f"{name!r}: {why}")
    untied = {n: source[n] for n in graph.params if source[n] != n}
    if not onnx_file:  # a PyTorch source's parameters are never merged for their values: a shared one is tied
        for copy, src in untied.items():
            if src in declared and not selected(patterns, src):
                continue
            readers = [f"{op} node {node!r}" for op, node in consumers.get(src, []) + consumers.get(copy, [])]
            problems.append(f"{src!r}: a tied parameter (one tensor read by {', '.join(readers) or 'two layers'}), "
                            "which PyTorch trains as one tensor with the sum of its gradients; texelfit trains a tied "
                            "parameter so only where token embeddings and token-wise matmuls read it (a language "
                            "model's tied embedding and head), not here")
    if problems:
        raise BuildError("these parameters would not train as they do in PyTorch: " + "; ".join(problems) +
                         ". Leave them out of --trainable to ship them frozen (as constants), or change the model")
    frozen = {source[n] for n in graph.weight_names() if not selected(patterns, source[n]) and not selected(patterns, n)}
    frozen |= {n for n in free if not selected(patterns, n)}
    frozen |= {n for n in declared if n not in graph.params and n not in free and n not in bn and n not in unused}
    keys = json.loads(meta[STATE_KEYS_KEY]) if STATE_KEYS_KEY in meta else None
    readers: dict[str, list[str]] = {}
    for layer in graph.layers:
        for n in set(layer.params.values()):
            readers.setdefault(n, []).append(layer.name)
    return {"declared": declared, "batchnorm_folded": [n for n in bn if n in declared], "unused": sorted(unused),
            "frozen": sorted(frozen), "untied": untied if onnx_file else {},
            # a tied parameter, one tensor several layers read (it trains on the sum of their gradients): its readers
            "tied": {n: r for n, r in readers.items() if len(r) > 1},
            # an ONNX file's trainable tensors whose names are no key of the state_dict given (--weights)
            "unrecovered": [n for n in graph.weight_names() if n not in keys] if keys is not None else None,
            "consumers": {n: [list(c) for c in consumers.get(source[n], [])] for n in graph.weight_names()}}


def _consumers(model) -> dict[str, list[tuple[str, str]]]:
    """initializer name -> [(op type, node name)] of the nodes that read it."""
    inits = {i.name for i in model.graph.initializer}
    out: dict[str, list[tuple[str, str]]] = {}
    for node in model.graph.node:
        for t in node.input:
            if t in inits:
                out.setdefault(t, []).append((node.op_type, node.name))
    return out
