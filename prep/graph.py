"""Convert a simplified ONNX model into the IR (`prep.ir.Graph`).

Shape subgraphs that survive onnxsim because the batch is dynamic (what
``x.view(x.size(0), -1)`` exports: Shape -> Gather -> Unsqueeze -> Concat) are
evaluated here symbolically, with the batch as the symbol ``"N"``; they leave no
layer behind. Everything else maps one ONNX node to at most one IR layer (a Split: one per
output), except that shape ops on activations (prep/onnx_shape.py) become gather layers, which
compose into one where one reads another, and that shape ops which move or merge the batch axis
(sequence models: nn.MultiheadAttention's [N, T, F] -> [T, N * h, d]) make no layer at all: they
are followed as views (prep/batch_axis.py) until an op reads the tensor.

Each node goes to the import rules registered for its op type (prep/onnx_import/: rules.py declares their
order, registry.py dispatches), which share the importer's state (prep/onnx_import/ctx.py); this module checks
the inputs, runs the nodes through them and assembles the Graph.
"""
from __future__ import annotations

import dataclasses
import json

from . import onnx_shape
from .errors import BuildError
from .ir import Graph, Layer, Param
from .naming import ALIASES_KEY, initializer_arrays
from .lower import LOWERINGS, lower
# the modules that register LOWERINGS entries: Einsum, DepthToSpace, SpaceToDepth, CumSum; InstanceNormalization
# (they import lower.py, which imports neither: no cycle)
from . import lower_masks, lower_ops, normalization  # noqa: F401
from .onnx_import.common import input_dtype_of, node_attrs, pool_out, shape_list, where  # noqa: F401 (re-exported)
from .onnx_import.constants import SHAPE_ONLY  # noqa: F401 (re-exported)
from .onnx_import.ctx import Importer
from .onnx_import.rules import REGISTRY

# the order in which the build error lists the supported ops (which are those with an import rule,
# REGISTRY.ops, and the lowered ones: tests/test_import_registry.py checks that every one listed has a rule)
_LISTED = ("Gemm", "MatMul", "Conv", "ConvTranspose", "BatchNormalization", "Concat", "MaxPool", "AveragePool",
           "GlobalAveragePool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "Resize", "Upsample", "Flatten",
           "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Pad", "Split", "Softmax", "LogSoftmax",
           "Identity", "Dropout", "Constant", "Shape", "Gather", "Cast", "Expand", "ConstantOfShape", "Equal",
           "Where", "LayerNormalization")
SUPPORTED_OPS = tuple(dict.fromkeys([op for op in _LISTED if op in REGISTRY.ops] + list(REGISTRY.ops) +
                                    list(LOWERINGS)))
# ONNX ops that are not supported yet, with the PyTorch modules a user would know them by (a lowered op,
# prep/lower.py, is supported: its hint goes)
MODULE_HINTS = {k: v for k, v in {
    "InstanceNormalization": "nn.GroupNorm / nn.InstanceNorm2d", "GroupNormalization": "nn.GroupNorm",
    "LSTM": "nn.LSTM", "GRU": "nn.GRU", "RNN": "nn.RNN", "Gelu": "nn.GELU", "Einsum": "torch.einsum",
    "Attention": "nn.MultiheadAttention", "ReduceProd": "Tensor.prod", "ReduceMin": "Tensor.amin",
    "ReduceLogSumExp": "torch.logsumexp"}.items()
    if k not in LOWERINGS}
# ops refused by decision, not by omission: why, in the build error
_RECURRENT = ("recurrent nodes become the steps they compute when the model is loaded (prep.load.load_onnx: "
              "prep/recurrent_onnx.py); this graph did not go through it")
NOT_YET = {"GRU": _RECURRENT, "LSTM": _RECURRENT, "RNN": _RECURRENT}


def to_ir(model, input_shape=None, input_dtype=None, trains=None) -> Graph:
    """`input_dtype`: build --input-dtype, one for every input or a list of one per input (None: what the
    ONNX file declares). `trains(name)`: whether build --trainable selects parameter `name` (default: all); a
    frozen parameter read at constant indices of two axes is computed into a constant, as it always could be."""
    _check_supported(model.graph)  # (every unsupported op at once, before a lowering names its own problem)
    # ops that are compositions of supported ones (Einsum, DepthToSpace, CumSum, ...) rewritten into them
    model = lower(model, shape_list(input_shape))
    g = model.graph
    consts: dict[str, object] = dict(initializer_arrays(model))  # name -> np.ndarray | symbolic list
    inputs = [i for i in g.input if i.name not in consts]
    if not inputs or not g.output:
        raise BuildError(f"the model must have at least one input and one output "
                         f"(it has {len(inputs)} inputs and {len(g.output)} outputs)")
    given = shape_list(input_shape)
    if given is not None and len(given) != len(inputs):
        raise BuildError(f"{len(given)} input shape(s) given (--input-shape) for the model's {len(inputs)} inputs "
                         f"({', '.join(i.name for i in inputs)}): give one per input, in order")
    shapes: dict[str, tuple[int, ...]] = {}
    for k, inp in enumerate(inputs):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
        if given is not None:
            shape = given[k]
            if (len(dims) > 1 and len(dims) - 1 != len(shape)) or any(d is not None and d != s for d, s in zip(dims[1:], shape)):
                raise BuildError(f"--input-shape {shape} does not match the model's input {inp.name!r} of shape {dims}")
        else:
            if len(dims) < 2 or any(d is None or d <= 0 for d in dims[1:]):
                raise BuildError(f"the model's input {inp.name!r} has shape {dims}: the per-sample dims must be "
                                 "static (give --input-shape)")
            shape = tuple(dims[1:])
        shapes[inp.name] = shape
    inp = inputs[0]
    given_dtypes = list(input_dtype) if isinstance(input_dtype, (list, tuple)) else [input_dtype] * len(inputs)
    if len(given_dtypes) != len(inputs):
        raise BuildError(f"{len(given_dtypes)} input dtypes given (--input-dtype) for the model's {len(inputs)} inputs "
                         f"({', '.join(i.name for i in inputs)})")
    dtypes = {i.name: input_dtype_of(i, d) for i, d in zip(inputs, given_dtypes)}
    # the activations holding integers (token ids: the inputs and their Casts to integer types)
    integer = {n for n, d in dtypes.items() if d != "float32"}
    # (the batch dim the last input declares: a Reshape to it keeps the batch)
    cx = Importer(model, consts, shapes, integer, trains, dims[0] if dims else None)
    for node in g.node:
        if not REGISTRY.dispatch(cx, cx.step(node, node_attrs(node))):
            if node.op_type not in REGISTRY.ops:  # (no rule: what _check_supported says of it)
                _refuse({node.op_type: [node.name or "(unnamed)"]})
            raise BuildError(f"{where(node)}: cannot be converted here (its inputs are not supported)")
        cx.keep_integers(node)

    alias, lazy, twin_2d, act, layers, params = cx.alias, cx.lazy, cx.twin_2d, cx.act, cx.layers, cx.params
    meta = cx.meta
    outputs = []
    for o in g.output:
        output = alias.get(o.name, o.name)
        if output in lazy:
            output = act(output)
        if output in twin_2d:
            output = act(output)
        if output not in shapes or output in {i.name for i in inputs}:
            raise BuildError(f"the model output {o.name!r} is not computed by any supported layer")
        if output in outputs:
            raise BuildError(f"the model outputs {g.output[outputs.index(output)].name!r} and {o.name!r} are the same "
                             "tensor: return it once")
        outputs.append(output)
    output = outputs[0]
    layers = onnx_shape.compose_gathers(layers, outputs, shapes)
    layers = untie_unsupported(layers, params)
    order = [i.name for i in g.initializer]
    # (the big constants, Param.constant, after the parameters, as they were met)
    ordered = dict(sorted(params.items(), key=lambda kv: (1, list(params).index(kv[0])) if kv[1].constant else
                          (0, order.index(kv[1].source or kv[0]), kv[0])))
    aliases = {k: v for k, v in json.loads(meta.get(ALIASES_KEY, "{}")).items() if v in ordered}
    return Graph(inp.name, output, shapes, layers, ordered, inputs=tuple(i.name for i in inputs),
                 dtypes={k: v for k, v in dtypes.items() if v != "float32"}, aliases=aliases, outputs=tuple(outputs),
                 output_names=tuple(o.name for o in g.output))


def untie_unsupported(layers: list[Layer], params: dict[str, Param]) -> list[Layer]:
    """A PyTorch source's tied parameter (one tensor read by several layers) trains as one tensor with the sum of
    its gradients where its readers can share one texture: token embeddings and token-wise matmuls (GPT-2's
    wte and its head, which then reads the table's layout: matmul attrs["weight_rows"] = "out", [O rows, I
    packed], and has no bias). Other ties are split back into copies (PARAM@LAYER, Param.source), which the
    build's check of the trainable set (prep/trust.py) names unless --trainable freezes them."""
    readers: dict[str, list[int]] = {}
    for k, layer in enumerate(layers):
        for n in set(layer.params.values()):
            readers.setdefault(n, []).append(k)
    out = list(layers)
    for n, ks in readers.items():
        if len(ks) < 2:
            continue
        group = [out[k] for k in ks]
        roles = [next(r for r, m in l.params.items() if m == n) for l in group]
        if _one_layout(group, roles, params[n]):
            continue  # readers of one op reading it in one layout (a recurrent layer's steps): one texture
        mixed = {l.op for l in group} == {"embedding", "matmul"}
        if all(r == "weight" and (l.op == "embedding" or (l.op == "matmul" and "bias" not in l.params))
               for l, r in zip(group, roles)) and len({l.op for l in group}) <= 2:
            if mixed:
                for k in ks:
                    if out[k].op == "matmul":
                        out[k] = dataclasses.replace(out[k], attrs=dict(out[k].attrs, weight_rows="out"))
            continue
        for k, role in zip(ks[1:], roles[1:]):  # the first reader keeps the name
            copy = f"{n}@{out[k].name}"
            params[copy] = dataclasses.replace(params[n], name=copy, source=n)
            out[k] = dataclasses.replace(out[k], params=dict(out[k].params, **{role: copy}))
    return out


def _one_layout(group: list[Layer], roles: list[str], p: Param) -> bool:
    """Whether the layers of `group` read parameter `p` (each as roles[k]) in one texture layout: one op, one role,
    the op's weight_layout the same for each (the steps of an unrolled nn.LSTM reading weight_hh, prep/recurrent.py;
    ALBERT's layers, which all read one layer's parameters).
    Each reader's gradient is then written apart and summed (codegen/schedule.py)."""
    from .ops import opdef

    if len({l.op for l in group}) != 1 or len(set(roles)) != 1 or group[0].attrs.get("weight_rows"):
        return False
    if roles[0] == "bias":  # (one row, whatever the reader: codegen/webgl2/layout.py)
        return True
    graph = Graph(group[0].inputs[0], group[0].outputs[0], {}, group, {p.name: p})
    try:
        first = opdef(group[0].op).weight_layout(group[0], graph, p, roles[0])
        return all(opdef(l.op).weight_layout(l, graph, p, r) == first for l, r in zip(group[1:], roles[1:]))
    except (KeyError, AttributeError, StopIteration):  # (a rule that needs more of the graph than the readers)
        return False


def _check_supported(g) -> None:
    """Fail on every ONNX op the IR cannot take, all of them in one message, each with its nodes and the
    PyTorch module it comes from where that is one a user would know."""
    bad: dict[str, list[str]] = {}
    for node in g.node:
        if node.op_type not in SUPPORTED_OPS:
            bad.setdefault(node.op_type, []).append(node.name or "(unnamed)")
    if bad:
        _refuse(bad)


def _refuse(bad: dict[str, list[str]]):
    """The build error of unsupported ops {op: its nodes}."""
    parts = []
    for op, nodes in bad.items():
        hint = f" (from {MODULE_HINTS[op]})" if op in MODULE_HINTS else ""
        shown = ", ".join(repr(n) for n in nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        why = f": {NOT_YET[op]}" if op in NOT_YET else ""
        parts.append(f"{op}{hint} at node{'s' if len(nodes) > 1 else ''} {shown}{why}")
    raise BuildError(f"unsupported ONNX op{'s' if len(bad) > 1 else ''} {'; '.join(parts)}; "
                     f"supported ops: {', '.join(SUPPORTED_OPS)}")
