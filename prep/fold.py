"""Fold inference-form batch-norm into the conv or dense layer that feeds it.

    y = (conv(x, W) + b - mean) * s + beta,  s = gamma / sqrt(var + eps)
      = conv(x, W * s) + ((b - mean) * s + beta)

Training then trains the folded layer: getWeights returns the folded tensors under the
conv's (or dense layer's) names. A layer without a bias gets one, named after its weight
(`conv1.weight` -> `conv1.bias`).

A batch-norm that cannot fold (it follows a pool, a concat, the input, or a layer whose output something
else reads too: DenseNet's BN-ReLU-conv) runs as what `model.eval()` computes, a per-channel affine op:

    y = (x - mean) * (1 / sqrt(var + eps)) * gamma + beta

an elementwise `batchnorm_affine` layer (prep/elementwise.py: NORMS) whose scale gamma and shift beta are
parameters under the batch-norm's own state_dict names (`norm1.weight`, `norm1.bias`) and train; the running
statistics are constants, as PyTorch's eval mode keeps them. Takes and returns the IR.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .ir import WEIGHTED, Graph, Layer, Param
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
        prev = folds_into(layer, out, graph)
        if prev is None:
            out.append(free_batchnorm(layer, graph, params))
            continue
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
        shapes.pop(layer.inputs[0], None)
    order = list(graph.params)
    ordered = {k: params[k] for k in sorted(params, key=lambda k: _position(k, order, out))}
    return dataclasses.replace(graph, layers=out, params=ordered, shapes=shapes)


def folds_into(layer: Layer, before: list[Layer], graph: Graph) -> Layer | None:
    """The layer among `before` that batch-norm `layer` folds into: the conv, transposed conv or dense layer
    (without a fused activation) that produces its input for it alone; None where there is none."""
    x = layer.inputs[0]
    prev = next((l for l in before if x in l.outputs), None)
    if prev is None or prev.op not in WEIGHTED or "act" in prev.attrs or len(graph.consumers(x)) != 1 or \
            x in graph.outputs:
        return None
    return prev


def free_batchnorm(layer: Layer, graph: Graph, params: dict[str, Param]) -> Layer:
    """Batch-norm `layer` as a batchnorm_affine layer (see the module's docstring); adds its scale and shift
    to `params` under their ONNX (state_dict) names."""
    a = layer.attrs
    c = a["scale"].size
    shape = list(graph.shapes[layer.inputs[0]])
    if shape[0] != c:
        raise BuildError(f"BatchNormalization node {layer.name!r}: {c} channels for an input of per-sample shape "
                         f"{shape}, whose channel axis has {shape[0]}")
    per_channel = [c] + [1] * (len(shape) - 1)
    names = a.get("names") or (f"{layer.name}.weight", f"{layer.name}.bias")
    for name, key in zip(names, ("scale", "bias")):
        if name in params:
            raise BuildError(f"BatchNormalization node {layer.name!r}: its {key} {name!r} is also read by another "
                             "layer (a tied batch-norm parameter is not supported)")
        params[name] = Param(name, np.asarray(a[key], dtype=np.float32))
    istd = 1.0 / np.sqrt(a["var"].astype(np.float64) + a["eps"])
    operands = [{"kind": "act", "input": 0, "shape": shape},
                {"kind": "param", "role": "weight", "shape": per_channel},
                {"kind": "param", "role": "bias", "shape": per_channel},
                {"kind": "const", "shape": per_channel, "values": a["mean"].astype(np.float32).tolist()},
                {"kind": "const", "shape": per_channel, "values": istd.astype(np.float32).tolist()}]
    return Layer("batchnorm_affine", layer.name, list(layer.inputs), list(layer.outputs), {"operands": operands},
                 {"weight": names[0], "bias": names[1]})


def _position(name: str, order: list[str], layers: list[Layer]) -> float:
    """Where a parameter goes among the imported ones (`order`): its own place; a folded layer's new bias right
    after its weight; a free batch-norm's scale and shift right after the last parameter of a layer before it."""
    if name in order:
        return order.index(name)
    at = next(i for i, layer in enumerate(layers) if name in layer.params.values())
    layer = layers[at]
    if layer.op != "batchnorm_affine":
        return order.index(layer.params["weight"]) + 0.5
    before = [order.index(p) for l in layers[:at] for p in l.params.values() if p in order]
    return max(before, default=-1) + (0.25 if name == layer.params["weight"] else 0.3)
