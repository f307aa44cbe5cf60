"""Convert a simplified ONNX model into the IR (`prep.ir.Graph`).

Shape subgraphs that survive onnxsim because the batch is dynamic (what
``x.view(x.size(0), -1)`` exports: Shape -> Gather -> Unsqueeze -> Concat) are
evaluated here symbolically, with the batch as the symbol ``"N"``; they leave no
layer behind. Everything else maps one ONNX node to at most one IR layer.
"""
from __future__ import annotations

import json

import numpy as np

from .ir import Graph, Layer, Param
from .load import TRANSPOSED_KEY, BuildError, initializer_arrays

N = "N"  # the batch dimension in symbolic shape values

SUPPORTED_OPS = ("Gemm", "MatMul", "Add", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Flatten", "Reshape",
                 "Identity", "Dropout", "Constant", "Shape", "Gather", "Unsqueeze", "Squeeze", "Concat",
                 "Cast", "Slice")


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _where(node) -> str:
    return f"{node.op_type} node {node.name or '(unnamed)'!r}"


def to_ir(model, input_shape=None) -> Graph:
    from onnx import numpy_helper

    g = model.graph
    consts: dict[str, object] = dict(initializer_arrays(model))  # name -> np.ndarray | symbolic list
    inputs = [i for i in g.input if i.name not in consts]
    if len(inputs) != 1 or len(g.output) != 1:
        raise BuildError(f"the model must have exactly one input and one output "
                         f"(it has {len(inputs)} inputs and {len(g.output)} outputs)")
    inp = inputs[0]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
    if input_shape:
        shape = tuple(int(d) for d in input_shape)
        if any(d is not None and d != s for d, s in zip(dims[1:], shape)) or (len(dims) > 1 and len(dims) - 1 != len(shape)):
            raise BuildError(f"--input-shape {shape} does not match the model's input {inp.name!r} of shape {dims}")
    else:
        if len(dims) < 2 or any(d is None or d <= 0 for d in dims[1:]):
            raise BuildError(f"the model's input {inp.name!r} has shape {dims}: the per-sample dims must be "
                             "static (give --input-shape)")
        shape = tuple(dims[1:])

    shapes: dict[str, tuple[int, ...]] = {inp.name: shape}
    alias: dict[str, str] = {}
    layers: list[Layer] = []
    used: list[str] = []  # initializer names that became parameters, in order of use

    def act(name):  # an activation tensor (not a constant), following aliases
        name = alias.get(name, name)
        if name not in shapes:
            raise BuildError(f"tensor {name!r} is not an activation the IR knows")
        return name

    def const(node, i):
        name = node.input[i]
        if name not in consts:
            return None
        return consts[name]

    def param(node, i, transposed=False, expect_ndim=None) -> Param:
        name = node.input[i]
        arr = consts.get(name)
        if not isinstance(arr, np.ndarray) or name not in initializer_names:
            raise BuildError(f"{_where(node)}: input {i} ({name!r}) must be a weight initializer; "
                             "products of two activations are not supported")
        arr = np.asarray(arr, dtype=np.float32)
        if expect_ndim and arr.ndim != expect_ndim:
            raise BuildError(f"{_where(node)}: weight {name!r} has shape {arr.shape}, expected {expect_ndim}-D")
        if name in used:
            raise BuildError(f"{_where(node)}: weight {name!r} is shared by several layers (not supported)")
        used.append(name)
        # the source (state_dict) layout differs from the canonical one when exactly one of
        # "the kernel wants the initializer transposed" and "the initializer is the state_dict
        # tensor transposed" holds
        return Param(name, np.ascontiguousarray(arr.T if transposed else arr), transposed != (name in stored_transposed))

    initializer_names = {init.name for init in g.initializer}
    meta = {p.key: p.value for p in model.metadata_props}
    stored_transposed = set(json.loads(meta.get(TRANSPOSED_KEY, "[]")))
    params: dict[str, Param] = {}

    for node in g.node:
        op, a = node.op_type, _attrs(node)
        ins = list(node.input)
        out = node.output[0] if node.output else None
        if op not in SUPPORTED_OPS:
            raise BuildError(f"unsupported ONNX op {op} at node {node.name or '(unnamed)'!r}; "
                             f"supported ops: {', '.join(SUPPORTED_OPS)}")

        # ---- constants and symbolic shape values -------------------------------------------------
        if op == "Constant":
            consts[out] = numpy_helper.to_array(a["value"]) if "value" in a else np.asarray(
                a.get("value_ints", a.get("value_int", a.get("value_floats", a.get("value_float")))))
            continue
        if all(x in consts for x in ins if x):
            consts[out] = _fold(node, op, a, [consts[x] if x else None for x in ins])
            continue
        if op == "Shape":
            full = [N] + list(shapes[act(ins[0])])
            consts[out] = full[a.get("start", 0):a.get("end", len(full))]
            continue

        # ---- layers ------------------------------------------------------------------------------
        if op in ("Identity", "Dropout"):
            alias[out] = act(ins[0])
            continue
        if op == "Gemm":
            if a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 or a.get("transA", 0):
                bad = [k for k in ("alpha", "beta", "transA") if a.get(k, 0 if k == "transA" else 1.0) != (0 if k == "transA" else 1.0)]
                raise BuildError(f"{_where(node)}: unsupported attribute {', '.join(bad)} "
                                 "(only alpha=1, beta=1, transA=0 are supported)")
            x = act(ins[0])
            w = param(node, 1, transposed=not a.get("transB", 0), expect_ndim=2)
            layer = _dense(node, x, w, shapes, params)
            if len(ins) > 2 and ins[2]:
                b = param(node, 2)
                if b.array.size != w.array.shape[0]:
                    raise BuildError(f"{_where(node)}: bias {b.name!r} of shape {b.array.shape} is not per-output")
                b.array = b.array.reshape(-1)
                params[b.name] = b
                layer.params["bias"] = b.name
            layers.append(layer)
            continue
        if op == "MatMul":
            x = act(ins[0])
            if len(shapes[x]) != 1:
                raise BuildError(f"{_where(node)}: MatMul on a per-sample shape {shapes[x]} is not supported "
                                 "(only 2-D activations)")
            w = param(node, 1, transposed=True, expect_ndim=2)
            layers.append(_dense(node, x, w, shapes, params))
            continue
        if op == "Add":
            xs = [i for i in ins if i not in consts]
            cs = [i for i in ins if i in consts]
            if len(xs) == 1 and len(cs) == 1:
                x = act(xs[0])
                prod = next((l for l in layers if x in l.outputs), None)
                bias = consts[cs[0]]
                if (prod is not None and prod.op == "dense" and "bias" not in prod.params
                        and cs[0] in initializer_names and np.size(bias) == shapes[x][0]
                        and np.ndim(bias) <= 2 and len([n for n in g.node if x in n.input]) == 1):
                    b = param(node, ins.index(cs[0]))
                    b.array = b.array.reshape(-1)
                    params[b.name] = b
                    prod.params["bias"] = b.name
                    alias[out] = x
                    continue
            raise BuildError(f"{_where(node)}: only Add of a bias vector to a MatMul output is supported "
                             "for now (residual adds come with convolutional networks)")
        if op in ("Relu", "LeakyRelu", "Sigmoid", "Tanh"):
            x = act(ins[0])
            name = {"Relu": "relu", "LeakyRelu": "leaky_relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}[op]
            attrs = {"alpha": float(a.get("alpha", 0.01))} if op == "LeakyRelu" else {}
            layers.append(Layer(name, node.name, [x], [out], attrs))
            shapes[out] = shapes[x]
            continue
        if op in ("Flatten", "Reshape"):
            x = act(ins[0])
            if op == "Flatten":
                if a.get("axis", 1) != 1:
                    raise BuildError(f"{_where(node)}: unsupported attribute axis={a.get('axis')} "
                                     "(only axis=1 is supported)")
            else:
                target = consts.get(ins[1])
                if target is None:
                    raise BuildError(f"{_where(node)}: the target shape is not a constant")
                _check_reshape_2d(node, list(np.asarray(target, dtype=object).reshape(-1)), shapes[x])
            layers.append(Layer("flatten", node.name, [x], [out]))
            shapes[out] = (int(np.prod(shapes[x])),)
            continue
        raise BuildError(f"{_where(node)}: cannot be converted here (its inputs are not supported)")

    output = alias.get(g.output[0].name, g.output[0].name)
    if output not in shapes or output == inp.name:
        raise BuildError(f"the model output {g.output[0].name!r} is not computed by any supported layer")
    ordered = {name: params[name] for name in [i.name for i in g.initializer] if name in params}
    return Graph(inp.name, output, shapes, layers, ordered)


def _dense(node, x, w: Param, shapes, params) -> Layer:
    if len(shapes[x]) != 1:
        raise BuildError(f"{_where(node)}: dense layer on per-sample shape {shapes[x]}; flatten first")
    if w.array.shape[1] != shapes[x][0]:
        raise BuildError(f"{_where(node)}: weight {w.name!r} expects {w.array.shape[1]} inputs, got {shapes[x][0]}")
    params[w.name] = w
    out = node.output[0]
    shapes[out] = (int(w.array.shape[0]),)
    return Layer("dense", node.name, [x], [out], {}, {"weight": w.name})


def _check_reshape_2d(node, target, in_shape):
    size = int(np.prod(in_shape))
    if len(target) == 2 and target[0] in (N, -1, 0):
        rest = target[1]
        if rest == -1 and target[0] != -1 or rest == size:
            return
    raise BuildError(f"{_where(node)}: reshape to {target} is not supported (only to (batch, {size}))")


def _fold(node, op, a, vals):
    """Evaluate a node whose inputs are all constants; symbolic lists hold "N"."""
    def listify(v):
        return list(v) if isinstance(v, list) else np.asarray(v).reshape(-1).tolist() if np.ndim(v) else v

    try:
        if op == "Gather":
            data, idx = vals
            if isinstance(data, list):
                idx = np.asarray(idx)
                picked = [data[int(i)] for i in idx.reshape(-1)]
                return picked[0] if idx.ndim == 0 else picked
            return np.take(data, np.asarray(idx), axis=a.get("axis", 0))
        if op == "Unsqueeze":
            v = vals[0]
            return [v] if not isinstance(v, (list, np.ndarray)) or np.ndim(v) == 0 else (
                v if isinstance(v, list) else np.expand_dims(v, tuple(np.asarray(vals[1]).tolist())))
        if op == "Squeeze":
            v = vals[0]
            return v[0] if isinstance(v, list) and len(v) == 1 else np.squeeze(v)
        if op == "Concat":
            if any(isinstance(v, list) for v in vals):
                out = []
                for v in vals:
                    out += listify(v) if not isinstance(v, str) else [v]
                return out
            return np.concatenate(vals, axis=a.get("axis", 0))
        if op == "Cast":
            return vals[0]
        if op == "Slice":
            data = vals[0]
            starts, ends = (np.asarray(v).reshape(-1).tolist() for v in vals[1:3])
            if isinstance(data, list):
                return data[int(starts[0]):int(min(ends[0], len(data)))]
            sl = [slice(None)] * np.ndim(data)
            axes = np.asarray(vals[3]).tolist() if len(vals) > 3 and vals[3] is not None else list(range(len(starts)))
            for ax, s, e in zip(axes, starts, ends):
                sl[ax] = slice(int(s), int(e))
            return np.asarray(data)[tuple(sl)]
        if op in ("Identity", "Dropout"):
            return vals[0]
        if op == "Reshape" and not isinstance(vals[0], list):
            return np.reshape(vals[0], np.asarray(vals[1]).astype(int))
    except (IndexError, TypeError, ValueError) as e:
        raise BuildError(f"{_where(node)}: cannot evaluate constant subgraph: {e}") from None
    raise BuildError(f"{_where(node)}: {op} on constants only is not supported")
