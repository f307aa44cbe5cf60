"""Fold inference-form batch-norm into the conv or dense layer that feeds it.

    y = (conv(x, W) + b - mean) * s + beta,  s = gamma / sqrt(var + eps)
      = conv(x, W * s) + ((b - mean) * s + beta)

Training then trains the folded layer: getWeights returns the folded tensors under the
conv's (or dense layer's) names. A layer without a bias gets one, named after its weight
(`conv1.weight` -> `conv1.bias`). Takes and returns the IR.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .ir import WEIGHTED, Graph, Param
from .errors import BuildError


def fold_batchnorm(graph: Graph) -> Graph:
    layers = list(graph.layers)
    params = dict(graph.params)
    shapes = dict(graph.shapes)
    out = []
    for layer in layers:
        if layer.op != "batchnorm":
            out.append(layer)
            continue
        x = layer.inputs[0]
        prev = next((l for l in out if x in l.outputs), None)
        if prev is None or prev.op not in WEIGHTED or "act" in prev.attrs or \
                len(graph.consumers(x)) != 1 or x == graph.output:
            what = "the model input" if prev is None else f"a {prev.op} layer ({prev.name!r})"
            raise BuildError(f"BatchNormalization node {layer.name!r} follows {what}; only a batch-norm "
                             "right after a conv, transposed conv or dense layer (its only consumer) can be folded")
        a = layer.attrs
        s = (a["scale"] / np.sqrt(a["var"] + a["eps"])).astype(np.float64)
        w = params[prev.params["weight"]]
        arr = w.array.astype(np.float64)
        if prev.op == "conv":
            arr = arr * s.reshape((-1,) + (1,) * (arr.ndim - 1))  # [OC, ICg, KH, KW] (or a Conv1d's [OC, ICg, K])
        elif prev.op == "conv_transpose":  # [IC, OCg, KH, KW]: output channel g*OCg + j of group g
            g = prev.attrs["groups"]
            arr = (arr.reshape((g, -1) + arr.shape[1:]) * s.reshape(g, 1, -1, 1, 1)).reshape(arr.shape)
        else:
            arr = arr * (s[None, :] if w.transposed else s[:, None])
        params[w.name] = dataclasses.replace(w, array=arr.astype(np.float32))
        if "bias" in prev.params:
            b_name = prev.params["bias"]
            b = params[b_name].array.astype(np.float64)
        else:
            base = w.name[: -len("weight")] if w.name.endswith("weight") else w.name + "."
            b_name = base + "bias"
            while b_name in params:
                b_name += "_"
            b = np.zeros_like(s)
        params[b_name] = Param(b_name, ((b - a["mean"]) * s + a["bias"]).astype(np.float32))
        folded = dataclasses.replace(prev, outputs=list(layer.outputs), params=dict(prev.params, bias=b_name),
                                     name=f"{prev.name}+{layer.name}")
        out[out.index(prev)] = folded
        shapes.pop(x, None)
    order = list(graph.params)
    ordered = {k: params[k] for k in sorted(params, key=lambda k: order.index(k) if k in order else
                                              order.index(_weight_of(k, out)) + 0.5)}
    return dataclasses.replace(graph, layers=out, params=ordered, shapes=shapes)


def _weight_of(bias_name: str, layers) -> str:
    for layer in layers:
        if layer.params.get("bias") == bias_name:
            return layer.params["weight"]
    raise AssertionError(bias_name)
