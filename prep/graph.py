"""Convert a simplified ONNX model into the IR (`prep.ir.Graph`).

Shape subgraphs that survive onnxsim because the batch is dynamic (what
``x.view(x.size(0), -1)`` exports: Shape -> Gather -> Unsqueeze -> Concat) are
evaluated here symbolically, with the batch as the symbol ``"N"``; they leave no
layer behind. Everything else maps one ONNX node to at most one IR layer (a Split: one per
output), except that shape ops on activations (prep/onnx_shape.py) become gather layers, which
compose into one where one reads another, and that shape ops which move or merge the batch axis
(sequence models: nn.MultiheadAttention's [N, T, F] -> [T, N * h, d]) make no layer at all: they
are followed as views (prep/batch_axis.py) until an op reads the tensor.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from . import batch_axis as ba
from . import elementwise as ew
from .elementwise import BY_ONNX
from .errors import BuildError
from .ir import Graph, Layer, Param
from . import onnx_shape, resample
from .lower import LOWERINGS, lower
# the modules that register LOWERINGS entries: Einsum, DepthToSpace, SpaceToDepth, CumSum; InstanceNormalization
# (they import lower.py, which imports neither: no cycle)
from . import lower_ops, normalization  # noqa: F401
from .load import ALIASES_KEY, INPUT_DTYPES, PADDING_IDX_KEY, PARAMETERS_KEY, SOURCE_KEY, STATE_SHAPES_KEY, TIED_KEY, \
    TRANSPOSED_KEY, initializer_arrays
from .shape import Constant, chain_shape, part_shape

N = "N"  # the batch dimension in symbolic shape values
F32_MAX = float(np.finfo(np.float32).max)  # an infinite constant that a kernel bakes in (select_eq's -inf fill)

SUPPORTED_OPS = tuple(dict.fromkeys(
    ("Gemm", "MatMul", "Conv", "ConvTranspose", "BatchNormalization", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool",
     "ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "Resize", "Upsample", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Pad",
     "Split", "Softmax", "LogSoftmax", "Identity", "Dropout", "Constant", "Shape", "Gather", "Cast", "Expand",
     "ConstantOfShape", "Equal", "Where", "LayerNormalization") + tuple(BY_ONNX) + tuple(LOWERINGS)))
# ONNX ops that are not supported yet, with the PyTorch modules a user would know them by (a lowered op,
# prep/lower.py, is supported: its hint goes)
MODULE_HINTS = {k: v for k, v in {
    "InstanceNormalization": "nn.GroupNorm / nn.InstanceNorm2d", "GroupNormalization": "nn.GroupNorm",
    "LSTM": "nn.LSTM", "GRU": "nn.GRU", "RNN": "nn.RNN", "Gelu": "nn.GELU", "Einsum": "torch.einsum",
    "Attention": "nn.MultiheadAttention", "ReduceProd": "Tensor.prod", "ReduceMin": "Tensor.amin"}.items()
    if k not in LOWERINGS}
# ops refused by decision, not by omission: why, in the build error
_RECURRENT = ("recurrent layers are not supported yet (attention, nn.TransformerEncoderLayer, or a 1-D conv over "
              "the sequence builds)")
NOT_YET = {"GRU": _RECURRENT, "LSTM": _RECURRENT, "RNN": _RECURRENT}
# only on constants and shape values (Expand and ConstantOfShape also to a batch of one constant sample:
# an operand of Concat)
SHAPE_ONLY = ("Shape", "Gather", "Cast", "Equal", "Where", "Expand", "ConstantOfShape")


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# the role of a node's input in the state_dict name of its module's parameter (nn.Conv2d's weight, ...)
_ROLES = {"Conv": {1: "weight", 2: "bias"}, "ConvTranspose": {1: "weight", 2: "bias"}, "Gemm": {1: "weight", 2: "bias"},
          "LayerNormalization": {1: "weight", 2: "bias"}, "MatMul": {1: "weight"}, "Add": {0: "bias", 1: "bias"}}


def _scope_name(node, i, source: str) -> str | None:
    """The state_dict name that the exporter's scope of `node` gives its input `i` (node '/features/features.11/
    fc2/Conv', input 2 -> 'features.11.fc2.bias'), where the op says the role and it is the role `source` ends
    with; else None."""
    role = _ROLES.get(node.op_type, {}).get(i)
    if role is None or not source.endswith("." + role) or not node.name.startswith("/"):
        return None
    parts: list[str] = []
    for seg in node.name.strip("/").split("/")[:-1]:
        if parts and seg.startswith(parts[-1] + "."):
            parts[-1] = seg  # ('features', 'features.11'): the child's scope repeats its parent's
        else:
            parts.append(seg)
    return ".".join(parts) + "." + role if parts else None


def _where(node) -> str:
    return f"{node.op_type} node {node.name or '(unnamed)'!r}"


def _unsupported_attr(node, attr, value, what):
    raise BuildError(f"{_where(node)}: unsupported attribute {attr}={value!r} ({what})")


def pool_out(size, k, s, p0, p1, d, ceil_mode):
    """Output length of a window sweep, as PyTorch computes it (the last window of
    ceil_mode must start inside the input or its left padding)."""
    num = size + p0 + p1 - (d * (k - 1) + 1)
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p0:
        out -= 1
    return out


def _window(node, a, shape, kernel, *, allow_dilation: bool):
    """kernel, strides, pads (t, l, b, r), dilations of a conv or pool on a (C, H, W) input."""
    strides = tuple(a.get("strides", [1, 1]))
    dil = tuple(a.get("dilations", [1, 1]))
    if not allow_dilation and dil != (1, 1):
        _unsupported_attr(node, "dilations", list(dil), "pooling with dilation is not supported")
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", "VALID"):
        pads = tuple(a.get("pads", [0, 0, 0, 0])) if auto == "NOTSET" else (0, 0, 0, 0)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pads_b, pads_e = [], []
        for size, k, s, d in zip(shape[1:], kernel, strides, dil):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pads_b.append(small if auto == "SAME_UPPER" else big)
            pads_e.append(big if auto == "SAME_UPPER" else small)
        pads = tuple(pads_b + pads_e)
    else:
        _unsupported_attr(node, "auto_pad", auto, "use NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    if len(kernel) != 2 or len(strides) != 2 or len(pads) != 4:
        raise BuildError(f"{_where(node)}: only 2-D windows are supported (kernel {list(kernel)})")
    return tuple(kernel), strides, (pads[0], pads[1], pads[2], pads[3]), dil


def shape_list(input_shape) -> list[tuple[int, ...]] | None:
    """`input_shape` as one per-sample shape per input: None (none given), one shape (784 or (1, 28, 28):
    a single input) or a list of shapes (one per input, build --input-shape given once per input)."""
    if input_shape is None or len(input_shape) == 0:
        return None
    if all(isinstance(d, (int, np.integer)) for d in input_shape):
        return [tuple(int(d) for d in input_shape)]
    return [tuple(int(d) for d in s) for s in input_shape]


# ONNX element types of an input (TensorProto.DataType) -> prep/load.py: INPUT_DTYPES
_ONNX_DTYPES = {1: "float32", 7: "int64", 6: "int32"}
_ONNX_TYPE_NAMES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
                    9: "bool", 10: "float16", 11: "float64", 16: "bfloat16"}


def input_dtype_of(inp, given: str | None = None) -> str:
    """The INPUT_DTYPES name of an ONNX graph input's element type; `given` (build --input-dtype) must agree."""
    elem = inp.type.tensor_type.elem_type
    if elem not in _ONNX_DTYPES:
        raise BuildError(f"the model's input {inp.name!r} is of type {_ONNX_TYPE_NAMES.get(elem, elem)}: "
                         f"inputs of type {', '.join(INPUT_DTYPES)} are supported")
    dtype = _ONNX_DTYPES[elem]
    if given is not None and given != dtype:
        if given not in INPUT_DTYPES:
            raise BuildError(f"--input-dtype must be one of {', '.join(INPUT_DTYPES)}, got {given!r}")
        raise BuildError(f"--input-dtype {given} does not match the model's input {inp.name!r}, which is {dtype}")
    return dtype


def to_ir(model, input_shape=None, input_dtype=None, trains=None) -> Graph:
    """`input_dtype`: build --input-dtype, one for every input or a list of one per input (None: what the
    ONNX file declares). `trains(name)`: whether build --trainable selects parameter `name` (default: all); a
    frozen parameter read at constant indices of two axes is computed into a constant, as it always could be."""
    from onnx import numpy_helper

    _check_supported(model.graph)  # (every unsupported op at once, before a lowering names its own problem)
    # ops that are compositions of supported ones (Einsum, DepthToSpace, CumSum, ...) rewritten into them
    model = lower(model, shape_list(input_shape))
    g = model.graph
    consts: dict[str, object] = dict(initializer_arrays(model))  # name -> np.ndarray | symbolic list
    inputs = [i for i in g.input if i.name not in consts]
    if not inputs or len(g.output) != 1:
        raise BuildError(f"the model must have at least one input and exactly one output "
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
    alias: dict[str, str] = {}
    layers: list[Layer] = []
    params: dict[str, Param] = {}
    initializer_names = {init.name for init in g.initializer}
    meta = {p.key: p.value for p in model.metadata_props}
    stored_transposed = set(json.loads(meta.get(TRANSPOSED_KEY, "[]")))
    tied = json.loads(meta.get(TIED_KEY, "{}"))  # {NAME@tied: NAME}: a tied parameter's copy in another layout
    onnx_file = meta.get(SOURCE_KEY) == json.dumps("onnx") or PARAMETERS_KEY not in meta
    trainable_names = set(json.loads(meta.get(PARAMETERS_KEY, "[]")))
    state_shapes = json.loads(meta.get(STATE_SHAPES_KEY, "{}"))
    padding_idx = json.loads(meta.get(PADDING_IDX_KEY, "{}"))
    uses: dict[str, int] = {}

    # tensors that are one constant sample repeated over the batch (Expand or ConstantOfShape to
    # [N, ...]): per-sample array; only Concat takes them, as constant parts of a gather
    batch_consts: dict[str, np.ndarray] = {}
    expanded_params: dict[str, str] = {}  # those of them that are a trainable parameter expanded: -> its name
    used = {t for n in g.node for t in n.input} | {g.output[0].name}

    # the (C, T) output of a 1-D conv or pool -> the (C, 1, T) tensor it is computed as: a 2-D conv or
    # pool reads that twin directly; anything else gets the (C, T) tensor, a relayout of it, when it first
    # reads it (a gather)
    twin_2d: dict[str, str] = {}

    # tensors whose batch axis an export moved or merged (prep/batch_axis.py): ONNX name -> Lazy
    lazy: dict[str, ba.Lazy] = {}

    def act(name):  # an activation tensor (not a constant), following aliases
        name = alias.get(name, name)
        if name in lazy:  # the batch first again: one gather
            return materialise(name, "canonical", f"tensor {name!r} read by an op")[0]
        if name in twin_2d and name not in shapes:
            c, _, t = shapes[twin_2d[name]]
            gather(None, name, [{"input": 0, "const": None, "ops": [("reshape", (c, t))]}], [twin_2d[name]],
                   f"{twin_2d[name]}:as1d")
            name = alias.get(name, name)
        if name not in shapes:
            what = "a constant repeated over the batch (only Concat takes one)" if name in batch_consts else \
                f"parameter {table_views[name][4]!r} read at constant indices of two axes, which trains only added " \
                "to attention's scores (leave it out of --trainable to compute it into a constant)" \
                if name in table_views else "not an activation the IR knows"
            raise BuildError(f"tensor {name!r} is {what}")
        return name

    def gather(node, out, parts, tensors, name=None, params=None):
        """A gather layer (prep/shape.py) of `parts` ({input: slot, const, ops}, or a parameter's {param: role,
        shape, ops}) over `tensors`; a chain that changes nothing is an alias."""
        if len(parts) == 1 and parts[0]["input"] is not None and not parts[0]["ops"]:
            alias[out] = tensors[0]
            return
        layers.append(Layer("gather", name or node.name, list(tensors), [out], {"parts": parts}, dict(params or {})))
        p = parts[0]
        shapes[out] = chain_shape(part_shape(p, [shapes[t] for t in tensors]), p["ops"])

    def view(node, x, ops, out=None, name=None):
        gather(node, out or node.output[0], [{"input": 0, "const": None, "ops": list(ops)}], [x], name)

    def lz(name) -> ba.Lazy:
        name = alias.get(name, name)
        return lazy[name] if name in lazy else ba.trivial(act(name), shapes[act(name)])

    def set_lazy(out, v: ba.Lazy):
        if ba.is_trivial(v, shapes):
            alias[out] = v.src
        else:
            lazy[out] = v

    forms: dict[tuple[str, str], tuple] = {}
    equals: dict[str, tuple[str, float]] = {}  # Equal(activation, constant) -> (its IR tensor, the constant)

    def materialise(name, form, what, where=""):
        """(IR tensor, its extra) of `name` in `form` (batch_axis: canonical, rows or blocks)."""
        name = alias.get(name, name)
        if (name, form) in forms:
            return forms[(name, form)]
        v = lz(name)
        fn = {"canonical": ba.canonical_form, "rows": ba.rows_form, "blocks": ba.blocks_form}[form]
        ops, shape, *extra = fn(where or repr(name), v, what)
        if all(op[0] == "reshape" for op in ops) and tuple(shape) == tuple(shapes[v.src]):
            t = v.src
        else:
            t = name if form == "canonical" else f"{name}:{form}"
            view(None, v.src, ops, out=t, name=f"{t}:view" if form != "canonical" else f"{name}:batch_first")
            t = alias.get(t, t)
        if form == "canonical":
            lazy.pop(name, None)
            if t != name:
                alias[name] = t
        forms[(name, form)] = (t, *extra)
        return forms[(name, form)]

    def rows_out(out, v: ba.Lazy, features) -> str:
        """The IR tensor a row-wise op on `v` writes (its shape set), and the view of ONNX tensor
        `out` over it."""
        t = f"{out}:rows"
        w = ba.after_rows_op(t, v, features)
        shapes[t] = (int(np.prod(w.fine[:-1])), int(features))
        set_lazy(out, w)
        return t

    def token_wise(name) -> bool:
        """Whether a Gemm or MatMul with a weight reads `name` as rows of tokens (a matmul layer), not as
        one vector a sample (a dense layer)."""
        name = alias.get(name, name)
        return name in lazy or len(shapes[act(name)]) == 2

    def token_matmul(node, x, w, out, bias):
        v = lz(x)
        t_in = materialise(x, "rows", node.op_type, _where(node))[0]
        o, i = params[w].canonical().shape
        if shapes[t_in][1] != i:
            raise BuildError(f"{_where(node)}: weight {w!r} of shape {params[w].array.shape} does not fit "
                             f"{shapes[t_in][1]} input features")
        layer = Layer("matmul", node.name, [t_in], [rows_out(out, v, o)], {"groups": 1}, {"weight": w})
        if bias is not None:
            b = param(node, list(node.input).index(bias))
            if params[b].array.size != o:
                raise BuildError(f"{_where(node)}: bias {b!r} of shape {params[b].array.shape} is not per-output")
            params[b].array = params[b].array.reshape(-1)
            layer.params["bias"] = b
        layers.append(layer)

    def moves_batch(node, op, a, ins) -> ba.Lazy | None:
        """The lazy view of a shape op's output where its input is lazy or it moves the batch axis;
        None where the per-sample shape ops of onnx_shape serve (the batch stays first)."""
        x = alias.get(ins[0], ins[0])
        if x in consts or x in batch_consts:
            return None
        pending = x in lazy
        if op == "Transpose":
            perm = list(a.get("perm", []))
            if pending or (perm and perm[0] != 0):
                return ba.transpose(lz(x), perm or list(range(lz(x).rank()))[::-1])
        elif op == "Reshape" and ins[1] in consts:
            target = list(np.asarray(consts[ins[1]], dtype=object).reshape(-1))
            try:
                v = ba.reshape(_where(node), lz(x), target, bool(a.get("allowzero", 0)))
            except BuildError:
                if pending:
                    raise
                return None
            if pending or v.groups[0] != [ba.N]:
                return v
        elif op in ("Squeeze", "Unsqueeze") and pending:
            axes = a.get("axes")
            if axes is None and len(ins) > 1 and ins[1]:
                axes = np.asarray(consts[ins[1]]).reshape(-1).tolist()
            if op == "Unsqueeze":
                return ba.unsqueeze(lz(x), axes)
            v = lz(x)
            if axes is None:
                axes = [i for i, grp in enumerate(v.groups)
                        if ba.N not in grp and int(np.prod([v.fine[f] for f in grp])) == 1]
            return ba.squeeze(_where(node), v, axes)
        elif op == "Gather" and len(ins) > 1 and ins[1] in consts and np.ndim(consts[ins[1]]) == 0:
            return ba.select(_where(node), lz(x), int(a.get("axis", 0)), int(np.asarray(consts[ins[1]])))
        return None

    def weight(node, i) -> np.ndarray:
        name = param_views.get(node.input[i], node.input[i])
        arr = consts.get(name)
        if not isinstance(arr, np.ndarray) or name not in initializer_names:
            raise BuildError(f"{_where(node)}: input {i} ({name!r}) must be a weight initializer; "
                             "products of two activations are not supported")
        return np.asarray(arr, dtype=np.float32)

    def param(node, i, *, matmul_layout=False, source=None) -> str:
        """Register input i of node (or the initializer `source` it was computed from: a class token's
        Expand) as a trainable parameter; returns its name.

        matmul_layout: the kernel computes x @ B, so B is [in, out]: transposed against Linear's
        [out, in], unless the initializer is itself the state_dict tensor transposed (restored by
        prep.load after constant folding)."""
        if source is None:
            arr = weight(node, i)
            name = source = param_views.get(node.input[i], node.input[i])
        else:
            arr, name = np.asarray(consts[source], dtype=np.float32), source
        transposed = False
        if matmul_layout:
            transposed = source not in stored_transposed
            arr = arr if transposed else arr.T
        elif source in state_shapes:  # the state_dict tensor, exported in another shape (load.STATE_SHAPES_KEY)
            arr = arr.reshape(state_shapes[source])
        arr = np.ascontiguousarray(arr)
        uses[source] = uses.get(source, 0) + 1
        owner = tied.get(source, source)  # (a tied parameter's copy in another layout: the parameter)
        if not onnx_file and owner in params and params[owner].transposed == transposed and \
                np.array_equal(params[owner].array, arr):
            return owner  # a PyTorch source's tied parameter: one tensor (untie_unsupported splits it if need be)
        if not onnx_file and owner not in params:
            name = owner
        elif uses[source] > 1 or owner != source:
            # an initializer shared by several layers (an ONNX file may dedupe equal tensors): untied, under the
            # state_dict name its node's scope gives where that is free (a PyTorch source's: prep/trust.py fails)
            name = _scope_name(node, i if source == param_views.get(node.input[i], node.input[i]) else None, source)
            if name is None or name in params or name in initializer_names:
                name = f"{owner}@{node.name or len(params)}"
        params[name] = Param(name, arr, transposed, owner if name != owner else None)
        return name

    # tensors that are a parameter itself in another shape (a reshape, or a slice that keeps all of it; onnxsim
    # no longer folds them, prep.load): ONNX name -> the parameter's, which its readers read instead
    param_views: dict[str, str] = {}
    # a parameter table read at constant indices [T1, T2] (an embedding of constant ids, its IR tensor `src`, (T1*T2,
    # F) a sample), as the ONNX tensor it is: ONNX name -> (src, the view ops from src to it, its ONNX shape
    # without the batch axis, whether it has a leading batch axis of 1 yet, the parameter)
    table_views: dict[str, tuple[str, list, tuple[int, ...], bool, str]] = {}

    for node in g.node:
        op, a = node.op_type, _attrs(node)
        ins = [param_views.get(t, t) for t in node.input]
        out = node.output[0] if node.output else None
        if op in ("Conv", "MaxPool", "AveragePool") and ins and ins[0] not in consts and (
                alias.get(ins[0], ins[0]) in twin_2d or len(shapes.get(alias.get(ins[0], ins[0]), ())) == 2):
            # 1-D: computed as 2-D over (C, 1, T), a kernel of height 1
            src = alias.get(ins[0], ins[0])
            if src in twin_2d:
                ins[0] = twin_2d[src]
            else:
                c, t = shapes[act(src)]
                view(node, act(src), [("reshape", (c, 1, t))], out=f"{node.name}:in2d", name=f"{node.name}:as2d")
                ins[0] = alias.get(f"{node.name}:in2d", f"{node.name}:in2d")
            a = _as_2d(a)
            twin_2d[out] = out = f"{out}:2d"
        elif ins and alias.get(ins[0], ins[0]) in twin_2d and (op == "BatchNormalization" or (
                op in BY_ONNX and BY_ONNX[op].arity == 1)):
            # per channel or per element: computed on the (C, 1, T) twin too, so a Conv1d, its batch-norm and
            # its activation fuse and fold as 2-D ones do
            ins[0] = twin_2d[alias.get(ins[0], ins[0])]
            twin_2d[out] = out = f"{out}:2d"

        # ---- constants and symbolic shape values -------------------------------------------------
        if op == "Constant":
            consts[out] = numpy_helper.to_array(a["value"]) if "value" in a else np.asarray(
                a.get("value_ints", a.get("value_int", a.get("value_floats", a.get("value_float")))))
            continue
        if op == "Expand" and ins[0] not in consts and ins[0] not in batch_consts:
            # an activation repeated to a larger shape (F.normalize expands its norm to the input's shape):
            # every consumer broadcasting it anyway, it is the activation itself
            users = [n for n in g.node if out in n.input]
            if users and all(n.op_type in BY_ONNX and BY_ONNX[n.op_type].arity == 2 for n in users):
                alias[out] = act(ins[0])
                continue
            # else (nn.MultiheadAttention's key padding mask [N, 1, 1, T] repeated over the heads, then
            # reshaped): to a constant shape, or [N, ...], with its batch dim 1, a broadcasting mul (_expand)
            target = consts.get(ins[1])
            if (rest := onnx_shape.batch_shape(target)) is not None:
                target = [1] + list(rest)
            elif target is None or isinstance(target, list):
                raise BuildError(f"{_where(node)}: Expand of an activation is supported into elementwise ops that "
                                 f"broadcast it, or to a constant shape; it feeds {sorted({n.op_type for n in users})}")
            layers.append(_expand(node, act(ins[0]), out, np.asarray(target).reshape(-1).tolist(), shapes))
            continue
        if op in ("Expand", "ConstantOfShape") and onnx_shape.batch_shape(consts.get(ins[-1])) is not None:
            batch_consts[out] = onnx_shape.batch_constant(_where(node), op, a, [consts[i] for i in ins])
            if op == "Expand" and ins[0] in trainable_names:  # a parameter repeated over the batch: a class token
                expanded_params[out] = ins[0]
            continue
        if op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice") and ins[0] in trainable_names and \
                ins[0] in initializer_names and all(t in consts for t in ins[1:] if t):
            value = _fold(node, op, a, [consts[x] if x else None for x in ins])
            users = [n for n in g.node if out in n.input]
            if _strip_ones(np.shape(value)) == _strip_ones(np.shape(consts[ins[0]])) or (
                    np.squeeze(value).shape == np.squeeze(consts[ins[0]]).shape and users and
                    all(n.op_type in BY_ONNX and BY_ONNX[n.op_type].arity == 2 for n in users)):
                # every value, in the same order, broadcasting as the parameter does (leading 1s aside), or a
                # per-channel [C, 1, 1] view of a [C] parameter that only elementwise ops read (with its shape)
                param_views[out] = ins[0]
                consts[out] = value
                continue
        if op == "Gather" and ins[0] in trainable_names and (trains is None or trains(ins[0])) and \
                _same_rows_each_sample(a, consts.get(ins[1]), rank=2):
            # a parameter table read at constant indices [T1, T2] (T5's relative-position bias: buckets of the
            # query-key distances), the same for every sample: an embedding of the T1 * T2 ids, (T1*T2, F) a sample,
            # seen as the ONNX tensor [T1, T2, F] without a batch axis until an Add puts it on attention's scores
            idx = consts[ins[1]]
            ids = f"{out}:ids"
            gather(node, ids, [{"input": None, "const": Constant(idx.reshape(-1)), "ops": []}], [],
                   name=f"{node.name}:ids")
            integer.add(ids)
            emb = _embedding(node, a, ids, param(node, 0), params, shapes, padding_idx)
            src = f"{out}:embedded"  # (not `out`: that is [T1, T2, F] without a batch axis, no activation)
            shapes[src] = shapes.pop(out)
            layers.append(dataclasses.replace(emb, outputs=[src]))
            table_views[out] = (src, [("reshape", tuple(idx.shape) + (shapes[src][1],))],
                                tuple(idx.shape) + (shapes[src][1],), False, emb.params["weight"])
            continue
        if op in ("Transpose", "Unsqueeze") and ins[0] in table_views:
            src, ops, shape, batched, table = table_views[ins[0]]
            if op == "Transpose":
                perm = list(a.get("perm", reversed(range(len(shape)))))
                table_views[out] = (src, ops + [("permute", tuple(perm))], tuple(shape[p] for p in perm), batched,
                                    table)
                continue
            axes = np.asarray(consts.get(ins[1]) if len(ins) > 1 else a.get("axes")).reshape(-1).tolist()
            if axes == [0] and not batched:  # the batch axis, of size 1: broadcast over the batch
                table_views[out] = (src, ops, shape, True, table)
                continue
        if op in BY_ONNX and len(ins) == 2 and any(i in table_views for i in ins):
            k = next(j for j, i in enumerate(ins) if i not in table_views)
            src, ops, shape, batched, table = table_views[ins[1 - k]]
            v = lz(ins[k])
            if not batched or ins[k] in table_views or [d for d in v.sizes()[1:]] != list(shape):
                raise BuildError(f"{_where(node)}: parameter {table!r} read at constant indices (ONNX shape "
                                 f"{list(shape)}) is supported added to a tensor of ONNX shape "
                                 f"[N, {', '.join(map(str, shape))}] (attention's scores), not to one of shape "
                                 f"{v.sizes()}")
            x = materialise(ins[k], "rows", op, _where(node))[0]
            bias = f"{out}:table"
            view(node, src, ops + [("reshape", shapes[x])], out=bias, name=f"{node.name}:table")
            t = f"{out}:rows"
            layers.append(_elementwise(node, t, a, [x, bias] if k == 0 else [bias, x], consts, shapes, act, param,
                                       initializer_names, trainable_names))
            set_lazy(out, ba.after_rows_op(t, v, shapes[x][1]))
            continue
        if any(i in table_views for i in ins):
            act(next(i for i in ins if i in table_views))  # (raises: what it is, and what takes it)
            raise AssertionError("act() of a table view")
        if op == "Gather" and ins[0] in trainable_names and _same_rows_each_sample(a, consts.get(ins[1])):
            # a parameter table read at constant rows, the same for every sample ([T] or [1, T] positions: a
            # position table): an embedding of constant ids, so that the table trains (prep.load never lets
            # onnxsim fold it, and this does not either)
            ids = f"{out}:ids"
            gather(node, ids, [{"input": None, "const": Constant(np.asarray(consts[ins[1]]).reshape(-1)), "ops": []}],
                   [], name=f"{node.name}:ids")
            integer.add(ids)
            layers.append(_embedding(node, a, ids, param(node, 0), params, shapes, padding_idx))
            continue
        if all(x in consts for x in ins if x):
            consts[out] = _fold(node, op, a, [consts[x] if x else None for x in ins])
            continue
        if op == "Equal" and ins[0] not in consts and ins[1] in consts and np.size(consts[ins[1]]) == 1 \
                and not isinstance(consts[ins[1]], list):
            # an activation compared with a constant: only a Where of constants reads it (select_eq)
            equals[out] = (act(ins[0]), float(np.asarray(consts[ins[1]]).reshape(-1)[0]))
            continue
        if op == "Where" and ins[0] in equals:
            x, value = equals[ins[0]]
            picked = []
            for t in ins[1:3]:
                v = consts.get(t, batch_consts.get(t))
                vals = None if v is None or isinstance(v, list) else np.unique(np.asarray(v, dtype=np.float64))
                if vals is None or vals.size != 1:
                    raise BuildError(f"{_where(node)}: Where of a comparison picks {t!r}, which is not one constant "
                                     "(a masked_fill by a constant is supported)")
                picked.append(float(np.clip(vals[0], -F32_MAX, F32_MAX)))
            layers.append(Layer("select_eq", node.name, [x], [out], {"value": value, "fill": picked[0], "other": picked[1]}))
            shapes[out] = shapes[x]
            continue
        if op == "Shape":
            src = alias.get(ins[0], ins[0])
            if src in equals:
                src = equals[src][0]
            if src in lazy:  # a tensor whose batch axis moved: its ONNX shape, the batch "N" where it is alone
                sizes = lazy[src].sizes()
                if any(isinstance(d, tuple) and d[1] != 1 for d in sizes):
                    raise BuildError(f"{_where(node)}: Shape of a tensor whose batch axis is merged with another "
                                     f"axis (ONNX shape {sizes})")
                full = [N if isinstance(d, tuple) else d for d in sizes]
            else:
                full = [N] + list(shapes[act(src)])
            consts[out] = full[a.get("start", 0):a.get("end", len(full))]
            continue
        if op in ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Gather") and (
                v := moves_batch(node, op, a, ins)) is not None:
            v.origin = getattr(lazy.get(alias.get(ins[0], ins[0])), "origin", "") or _where(node)
            set_lazy(out, v)
            continue
        if op == "Cast" and alias.get(ins[0], ins[0]) in integer and a.get("to") in (1, 6, 7, 11):
            # token ids are exact floats in every tier: a Cast of them to int32, int64, float or double is the
            # same values (to bool or to a narrower type would not be: those fail below)
            alias[out] = act(ins[0])
            if a.get("to") in (6, 7):  # to int32, int64
                integer.add(out)
            continue
        if op == "Gather" and ins[0] in initializer_names and len(ins) > 1 and alias.get(ins[1], ins[1]) in integer:
            layers.append(_embedding(node, a, act(ins[1]), param(node, 0), params, shapes, padding_idx))
            continue
        if op in SHAPE_ONLY:
            raise BuildError(f"{_where(node)}: {op} on activations is not supported (only on constant shapes)")

        # ---- layers ------------------------------------------------------------------------------
        if op == "Dropout" and len(ins) > 2 and ins[2] and bool(np.asarray(consts.get(ins[2], False))) and \
                float(np.asarray(consts.get(ins[1], 0.5))) > 0:
            # kept by the exporter (prep/load.py: export_module) in training mode: applied in fit
            layers.append(Layer("dropout", node.name, [act(ins[0])], [out],
                                {"ratio": float(np.asarray(consts[ins[1]]) if ins[1] in consts else 0.5)}))
            shapes[out] = shapes[layers[-1].inputs[0]]
            continue
        if op in ("Identity", "Dropout"):
            alias[out] = act(ins[0])
            continue
        if op == "Gemm":
            for k, default in (("alpha", 1.0), ("beta", 1.0), ("transA", 0)):
                if a.get(k, default) != default:
                    _unsupported_attr(node, k, a[k], "only alpha=1, beta=1, transA=0 are supported")
            if token_wise(ins[0]):  # Gemm on rows of tokens (a Linear on [N, T, F] reshaped to [N*T, F])
                token_matmul(node, ins[0], param(node, 1, matmul_layout=not a.get("transB", 0)), out,
                             ins[2] if len(ins) > 2 and ins[2] else None)
                continue
            x = act(ins[0])
            w = param(node, 1, matmul_layout=not a.get("transB", 0))
            layer = _dense(node, x, params[w], shapes)
            if len(ins) > 2 and ins[2]:
                b = param(node, 2)
                if params[b].array.size != shapes[out][0]:
                    raise BuildError(f"{_where(node)}: bias {b!r} of shape {params[b].array.shape} is not per-output")
                params[b].array = params[b].array.reshape(-1)
                layer.params["bias"] = b
            layers.append(layer)
            continue
        if op == "MatMul" and ins[1] not in consts:  # of two activations, batched over the leading axes
            (ta, ga, pa), (tb, gb, pb) = (materialise(t, "blocks", "MatMul", _where(node)) for t in ins[:2])
            if ga != gb or pa != pb or shapes[ta][1] * gb != shapes[tb][0]:
                raise BuildError(f"{_where(node)}: MatMul of {lz(ins[0]).sizes()} and {lz(ins[1]).sizes()}: the "
                                 "leading (batch) axes or the inner dims differ")
            m = shapes[ta][0] // ga
            t = f"{out}:rows"
            layers.append(Layer("matmul", node.name, [ta, tb], [t], {"groups": ga}))
            shapes[t] = (ga * m, shapes[tb][1])
            set_lazy(out, ba.after_blocks_op(t, lz(ins[0]), m, shapes[tb][1]))
            continue
        if op == "MatMul" and token_wise(ins[0]):
            token_matmul(node, ins[0], param(node, 1, matmul_layout=True), out, None)
            continue
        if op == "MatMul":
            x = act(ins[0])
            if len(shapes[x]) != 1:
                raise BuildError(f"{_where(node)}: MatMul on a per-sample shape {shapes[x]} is not supported "
                                 "(only 2-D activations)")
            w = param(node, 1, matmul_layout=True)
            layers.append(_dense(node, x, params[w], shapes))
            continue
        if op == "Conv":
            x = act(ins[0])
            if len(shapes[x]) != 3:
                raise BuildError(f"{_where(node)}: Conv needs a (C, H, W) input, got {shapes[x]}")
            warr = weight(node, 1)
            if warr.ndim == 3:  # Conv1d's [OC, ICg, K] (the parameter keeps that shape), as [OC, ICg, 1, K]
                warr = warr[:, :, None, :]
            if warr.ndim != 4:
                raise BuildError(f"{_where(node)}: only 2-D convolutions are supported (weight {warr.shape})")
            groups = int(a.get("group", 1))
            oc, icg, kh, kw = warr.shape
            c, h, w_ = shapes[x]
            if icg * groups != c or oc % groups:
                raise BuildError(f"{_where(node)}: weight {warr.shape} with group={groups} does not fit "
                                 f"{c} input channels")
            kernel, strides, pads, dil = _window(node, a, shapes[x], a.get("kernel_shape", [kh, kw]),
                                                 allow_dilation=True)
            oh = pool_out(h, kh, strides[0], pads[0], pads[2], dil[0], False)
            ow = pool_out(w_, kw, strides[1], pads[1], pads[3], dil[1], False)
            if oh < 1 or ow < 1:
                raise BuildError(f"{_where(node)}: output would be {oh}x{ow} for input {h}x{w_}")
            layer = Layer("conv", node.name, [x], [out],
                          {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dil, "groups": groups},
                          {"weight": param(node, 1)})
            if len(ins) > 2 and ins[2]:
                layer.params["bias"] = param(node, 2)
            shapes[out] = (oc, oh, ow)
            layers.append(layer)
            continue
        if op == "ConvTranspose":
            x = act(ins[0])
            if len(shapes[x]) != 3:
                raise BuildError(f"{_where(node)}: ConvTranspose needs a (C, H, W) input, got {shapes[x]}")
            warr = weight(node, 1)
            if warr.ndim != 4:
                raise BuildError(f"{_where(node)}: only 2-D transposed convolutions are supported "
                                 f"(weight {warr.shape})")
            groups = int(a.get("group", 1))
            ic, ocg, kh, kw = warr.shape
            c, h, w_ = shapes[x]
            if ic != c or c % groups:
                raise BuildError(f"{_where(node)}: weight {warr.shape} with group={groups} does not fit "
                                 f"{c} input channels")
            strides = tuple(a.get("strides", [1, 1]))
            dil = tuple(a.get("dilations", [1, 1]))
            extra = tuple(a.get("output_padding", [0, 0]))
            auto = a.get("auto_pad", b"NOTSET")
            if (auto.decode() if isinstance(auto, bytes) else auto) != "NOTSET":
                _unsupported_attr(node, "auto_pad", auto, "give explicit pads, as PyTorch exports")
            full = [(n - 1) * s + d * (k - 1) + 1 + e for n, s, d, k, e in zip((h, w_), strides, dil, (kh, kw), extra)]
            if "output_shape" in a:  # the pads that give it (ONNX: the extra goes at the end, SAME_UPPER)
                total = [f - o for f, o in zip(full, a["output_shape"][-2:])]
                pads = (total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2)
            else:
                pads = tuple(a.get("pads", [0, 0, 0, 0]))
            oh, ow = full[0] - pads[0] - pads[2], full[1] - pads[1] - pads[3]
            if oh < 1 or ow < 1 or min(pads) < 0:
                raise BuildError(f"{_where(node)}: output would be {oh}x{ow} (pads {list(pads)}) for input {h}x{w_}")
            layer = Layer("conv_transpose", node.name, [x], [out],
                          {"kernel": (kh, kw), "strides": strides, "pads": pads, "dilations": dil, "groups": groups,
                           "output_padding": extra}, {"weight": param(node, 1)})
            if len(ins) > 2 and ins[2]:
                layer.params["bias"] = param(node, 2)
            shapes[out] = (ocg * groups, oh, ow)
            layers.append(layer)
            continue
        if op == "BatchNormalization":
            if a.get("training_mode", 0):
                _unsupported_attr(node, "training_mode", 1, "only the inference form can be folded")
            x = act(ins[0])
            stats = {k: weight(node, i).reshape(-1) for i, k in enumerate(("scale", "bias", "mean", "var"), 1)}
            layers.append(Layer("batchnorm", node.name, [x], [out], dict(stats, eps=float(a.get("epsilon", 1e-5)),
                                                                         names=(ins[1], ins[2]))))
            shapes[out] = shapes[x]
            continue
        if op == "Add" and len([i for i in ins if i not in consts]) == 1:
            # a bias vector added to a MatMul output (Linear without Gemm): the dense layer's bias
            xo = alias.get(next(i for i in ins if i not in consts), next(i for i in ins if i not in consts))
            c = next(i for i in ins if i in consts)
            if xo in lazy or len(shapes.get(xo, ())) == 2:  # a bias added to a token-wise MatMul's rows
                v = lz(xo)
                prod = next((l for l in layers if v.src in l.outputs), None)
                if (prod is not None and prod.op == "matmul" and "weight" in prod.params and "bias" not in prod.params
                        and c in initializer_names and np.size(consts[c]) == shapes[v.src][1]
                        and np.ndim(consts[c]) <= 1 and len([n for n in g.node if xo in n.input]) == 1):
                    b = param(node, ins.index(c))
                    params[b].array = params[b].array.reshape(-1)
                    prod.params["bias"] = b
                    if xo in lazy:
                        lazy[out] = lazy[xo]
                    else:
                        alias[out] = xo
                    continue
            x = xo if xo in lazy else act(xo)
            prod = next((l for l in layers if x in l.outputs), None)
            bias = consts[c]
            if (prod is not None and prod.op == "dense" and "bias" not in prod.params
                    and c in initializer_names and np.size(bias) == shapes[x][0] and np.ndim(bias) <= 2
                    and len([n for n in g.node if x in n.input]) == 1):
                b = param(node, ins.index(c))
                params[b].array = params[b].array.reshape(-1)
                prod.params["bias"] = b
                alias[out] = x
                continue
        if op == "Mul" and _is_silu(node, ins, layers, g):  # x * sigmoid(x): nn.SiLU
            sig = next(l for l in layers if l.op == "sigmoid" and l.outputs[0] in (alias.get(t, t) for t in ins))
            layers.remove(sig)
            layers.append(Layer("silu", node.name, list(sig.inputs), [out]))
            shapes[out] = shapes[sig.inputs[0]]
            continue
        if op in BY_ONNX and BY_ONNX[op].arity == 2 and len(ins) == 2 and \
                sum(alias.get(i, i) in lazy for i in ins) == 1 \
                and any(i in consts and np.size(consts[i]) > 1 for i in ins):
            # a constant of several values (an attention mask added to the scores) on a lazy view: on its rows
            # form, the constant spread over those rows
            k = next(j for j, i in enumerate(ins) if alias.get(i, i) in lazy)
            v, cst = lazy[alias.get(ins[k], ins[k])], np.asarray(consts[ins[1 - k]], dtype=np.float32)
            nb = [j for j, grp in enumerate(v.groups) if ba.N in grp]
            if v.groups[nb[0]] != [ba.N] or cst.ndim > v.rank() or (cst.ndim == v.rank() and cst.shape[nb[0]] != 1):
                raise BuildError(f"{_where(node)}: {op} of a constant of shape {list(cst.shape)} and a tensor of "
                                 f"ONNX shape {v.sizes()}: not supported")
            full = [1 if j == nb[0] else d for j, d in enumerate(v.sizes())]
            x = materialise(ins[k], "rows", op, _where(node))[0]
            name = ins[1 - k]
            if not all(d == 1 for d in cst.shape[:-1]):  # not per feature alone: spread over the rows
                if name in initializer_names and name in trainable_names:
                    raise BuildError(f"{_where(node)}: a parameter of shape {list(cst.shape)} on tokens: only one "
                                     "per feature (the last axis) is supported")
                spread = np.broadcast_to(cst, full).reshape(shapes[x])
                name = f"{node.name}:const"
                consts[name] = np.maximum(np.minimum(spread, 3.4028234663852886e38), -3.4028234663852886e38)
            t = f"{out}:rows"
            operand_ins = [x, name] if k == 0 else [name, x]
            layers.append(_elementwise(node, t, a, operand_ins, consts, shapes, act, param, initializer_names,
                                       trainable_names))
            set_lazy(out, ba.after_rows_op(t, v, shapes[x][1]))
            continue
        if op in BY_ONNX and len(ins) == 2 and all(alias.get(i, i) in lazy for i in ins) and (
                va := lazy[alias.get(ins[0], ins[0])]).ops == (vb := lazy[alias.get(ins[1], ins[1])]).ops and \
                va.fine == vb.fine and va.groups == vb.groups and shapes[va.src] == shapes[vb.src]:
            # two activations seen through the same view (GELU's x * (erf(x / sqrt 2) + 1)): on their sources
            t = f"{out}:src"
            layers.append(_elementwise(node, t, a, [va.src, vb.src], consts, shapes, act, param,
                                       initializer_names, trainable_names))
            set_lazy(out, ba.Lazy(t, list(va.ops), va.fine, [list(grp) for grp in va.groups], va.origin))
            continue
        if op in BY_ONNX and any(alias.get(i, i) in lazy for i in ins) and all(
                alias.get(i, i) in lazy or (i in consts and np.size(consts[i]) == 1) for i in ins[:2]) and \
                sum(alias.get(i, i) in lazy for i in ins[:2]) == 1:
            # pointwise on a lazy view (an activation, a scale): computed on its source, the view kept
            k = next(j for j, i in enumerate(ins) if alias.get(i, i) in lazy)
            v = lazy[alias.get(ins[k], ins[k])]
            t = f"{out}:src"
            layers.append(_elementwise(node, t, a, ins[:k] + [v.src] + ins[k + 1:], consts, shapes, act, param,
                                       initializer_names, trainable_names))
            set_lazy(out, ba.Lazy(t, list(v.ops), v.fine, [list(grp) for grp in v.groups]))
            continue
        if op == "LayerNormalization":
            v = lz(ins[0])
            axis = int(a.get("axis", -1)) % v.rank()
            if axis != v.rank() - 1:
                _unsupported_attr(node, "axis", a.get("axis"), "only over the last axis")
            x = materialise(ins[0], "rows", op, _where(node))[0]
            f = shapes[x][1]
            layer = Layer("layernorm", node.name, [x], [rows_out(out, v, f)], {"eps": float(a.get("epsilon", 1e-5))})
            for role, i in (("weight", 1), ("bias", 2)):
                if len(ins) > i and ins[i]:
                    w = param(node, i)
                    if params[w].array.size != f:
                        raise BuildError(f"{_where(node)}: {role} {w!r} of shape {params[w].array.shape} is not per "
                                         "feature")
                    params[w].array = params[w].array.reshape(-1)
                    layer.params[role] = w
            if "weight" not in layer.params:
                raise BuildError(f"{_where(node)}: LayerNormalization without a scale is not supported")
            layers.append(layer)
            continue
        if op in ("Softmax", "LogSoftmax") and (v := lz(ins[0])).rank() >= 3 and \
                int(a.get("axis", -1)) % v.rank() == v.rank() - 1 and not (
                    alias.get(ins[0], ins[0]) not in lazy and len(shapes[act(ins[0])]) == 3 and v.rank() == 4
                    and int(a.get("axis", -1)) % 4 == 1):
            # over the last axis of tokens (attention's scores): the rows form, the last axis packed
            x = materialise(ins[0], "rows", op, _where(node))[0]
            layers.append(Layer("softmax" if op == "Softmax" else "log_softmax", node.name, [x],
                                [rows_out(out, v, shapes[x][1])]))
            continue
        if op in BY_ONNX:
            # a parameter read through a view broadcasts in the view's shape (a [C] scale as [C, 1, 1])
            view_shapes = {ins[k]: np.shape(consts[t]) for k, t in enumerate(node.input[:2]) if t in param_views}
            layers.append(_elementwise(node, out, a, ins, consts, shapes, act, param, initializer_names,
                                       trainable_names, view_shapes))
            continue
        if op == "Concat":
            operands = [batch_consts[i] if i in batch_consts else act(i) for i in ins]
            sample = [o.shape if isinstance(o, np.ndarray) else shapes[o] for o in operands]
            rank = len(sample[0])
            axis = onnx_shape.axis(_where(node), a.get("axis", 1), rank + 1)
            if axis == -1:
                raise BuildError(f"{_where(node)}: Concat on the batch axis is not supported")
            if any(len(s_) != rank or s_[:axis] + s_[axis + 1:] != sample[0][:axis] + sample[0][axis + 1:]
                   for s_ in sample):
                raise BuildError(f"{_where(node)}: Concat of per-sample shapes {sample} on axis {axis + 1}: the other "
                                 "dims differ")
            if axis == 0 and rank != 2 and not any(isinstance(o, np.ndarray) for o in operands):
                # the first per-sample axis (channels; of flat data: the stored order): its own kernel
                layers.append(Layer("concat", node.name, operands, [out]))
                shapes[out] = (sum(shapes[t][0] for t in operands),) + shapes[operands[0]][1:]
                continue
            # any other axis, or constant operands: a gather of the operands, each padded to its place
            # (a parameter expanded over the batch, a class token, is a part that reads it and trains)
            tokens = {k: param(node, k, source=expanded_params[i]) for k, i in enumerate(ins) if i in expanded_params}
            parts, tensors = onnx_shape.concat_parts(_where(node), axis, operands, sample,
                                                     {k: ("part:" + t, params[t].array) for k, t in tokens.items()})
            gather(node, out, parts, tensors, params={"part:" + t: t for t in tokens.values()})
            continue
        if op in ("Resize", "Upsample") or (op == "Pad" and resample.pad_mode(a) in ("edge", "reflect")):
            x = act(ins[0])
            if any(i and i not in consts for i in ins[1:]):
                raise BuildError(f"{_where(node)}: {op} with scales, sizes or pads computed from activations "
                                 "is not supported")
            kind, rows, cols, shapes[out] = resample.from_onnx(
                _where(node), op, a, [consts[i] if i else None for i in ins[1:]], shapes[x])
            layers.append(Layer("resample", node.name, [x], [out], {"kind": kind, "rows": rows, "cols": cols}))
            continue
        if op in ("Transpose", "Squeeze", "Unsqueeze", "Slice", "Pad"):
            x = act(ins[0])
            if any(i and i not in consts for i in ins[1:]):
                raise BuildError(f"{_where(node)}: {op} with axes or bounds computed from activations is not supported")
            view(node, x, onnx_shape.view_ops(_where(node), op, a, [consts[i] if i else None for i in ins[1:]],
                                              shapes[x]))
            continue
        if op == "Split":
            # One gather layer per output (a slice each), not one layer with several outputs: every IR
            # layer has one output tensor (layout, schedule and prune read Layer.outputs[0]), and the
            # gradient of the input is then the sum of the slices' gradients, as for any tensor read
            # by several layers. Outputs nothing reads get no layer; layer names key the gradient
            # routing, so each has its own.
            x = act(ins[0])
            sizes = consts.get(ins[1]) if len(ins) > 1 and ins[1] else None
            chains = onnx_shape.split_ops(_where(node), a, sizes, shapes[x], len(node.output))
            for i, (o, ops) in enumerate(zip(node.output, chains)):
                if o in used:
                    view(node, x, ops, o, f"{node.name}:{i}")
            continue
        if op in ("Softmax", "LogSoftmax"):
            x = act(ins[0])
            rank = len(shapes[x]) + 1
            axis = a.get("axis", -1)
            if rank not in (2, 4) or axis % rank != 1:
                raise BuildError(f"{_where(node)}: {op} over axis {axis} of a tensor of per-sample shape "
                                 f"{shapes[x]}: only over the channel (class) axis of (C,) or (C, H, W) data")
            layers.append(Layer("softmax" if op == "Softmax" else "log_softmax", node.name, [x], [out]))
            shapes[out] = shapes[x]
            continue
        if op in ("MaxPool", "AveragePool"):
            x = act(ins[0])
            if len(shapes[x]) != 3:
                raise BuildError(f"{_where(node)}: {op} needs a (C, H, W) input, got {shapes[x]}")
            if len(node.output) > 1 and node.output[1]:
                raise BuildError(f"{_where(node)}: MaxPool with an indices output is not supported")
            if a.get("storage_order", 0):
                _unsupported_attr(node, "storage_order", a["storage_order"], "only 0 is supported")
            kernel, strides, pads, _ = _window(node, a, shapes[x], a["kernel_shape"], allow_dilation=False)
            ceil_mode = bool(a.get("ceil_mode", 0))
            c, h, w_ = shapes[x]
            oh = pool_out(h, kernel[0], strides[0], pads[0], pads[2], 1, ceil_mode)
            ow = pool_out(w_, kernel[1], strides[1], pads[1], pads[3], 1, ceil_mode)
            attrs = {"kernel": kernel, "strides": strides, "pads": pads, "ceil_mode": ceil_mode}
            if op == "AveragePool":
                attrs["count_include_pad"] = bool(a.get("count_include_pad", 0))
            layers.append(Layer("maxpool" if op == "MaxPool" else "avgpool", node.name, [x], [out], attrs))
            shapes[out] = (c, oh, ow)
            continue
        if op in ("GlobalAveragePool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2"):
            x = act(ins[0])
            rank = len(shapes[x]) + 1
            final = out
            if op == "ReduceL2":  # sqrt(ReduceSum(x ** 2)): F.normalize's norm, in three declared ops
                layers.append(Layer("pow", f"{node.name}:square", [x], [f"{out}:square"], {"exponent": 2.0}))
                shapes[f"{out}:square"] = shapes[x]
                x, out = f"{out}:square", f"{out}:sumsq"
            if op == "GlobalAveragePool":
                axes = [2, 3]
            else:
                axes = a.get("axes")
                if axes is None and len(ins) > 1 and ins[1]:
                    axes = np.asarray(consts.get(ins[1])).reshape(-1).tolist()
                if not axes and a.get("noop_with_empty_axes", 0):
                    alias[out] = x
                    continue
                axes = sorted({int(v) % rank for v in axes}) if axes else list(range(rank))
            if 0 in axes:
                _unsupported_attr(node, "axes", axes, "a reduction over the batch axis is not supported")
            keep = bool(a.get("keepdims", 1)) or op == "GlobalAveragePool"
            if op in ("GlobalAveragePool", "ReduceMean") and rank == 4 and axes == [2, 3]:
                layers.append(Layer("global_avgpool", node.name, [x], [out], {"keepdims": keep}))
            else:
                layers.append(Layer("reduce", node.name, [x], [out],
                                    {"kind": "sum" if op == "ReduceL2" else op[len("Reduce"):].lower(),
                                     "axes": [v - 1 for v in axes],
                                     "keepdims": keep}))
            kept = [d if i + 1 not in axes else 1 for i, d in enumerate(shapes[x])]
            shapes[out] = tuple(kept) if keep else tuple(d for i, d in enumerate(shapes[x]) if i + 1 not in axes)
            if not shapes[out]:
                shapes[out] = (1,)
            if final != out:
                layers.append(Layer("sqrt", f"{node.name}:sqrt", [out], [final]))
                shapes[final] = shapes[out]
            continue
        if op in ("Flatten", "Reshape"):
            x = act(ins[0])
            if op == "Flatten":
                axis = onnx_shape.axis(_where(node), a.get("axis", 1), len(shapes[x]) + 1) + 1
                if axis == 0 or int(np.prod(shapes[x][:axis - 1])) != 1:
                    _unsupported_attr(node, "axis", a.get("axis"), f"on {[N] + list(shapes[x])} it does not give "
                                      "(batch, features)")
            else:
                target = consts.get(ins[1])
                if target is None:
                    raise BuildError(f"{_where(node)}: the target shape is not a constant")
                new = onnx_shape.reshape_target(_where(node), list(np.asarray(target, dtype=object).reshape(-1)),
                                                shapes[x], bool(a.get("allowzero", 0)), dims[0])
                if len(new) != 1:
                    view(node, x, [("reshape", new)])
                    continue
            size = int(np.prod(shapes[x]))
            if shapes[x] == (size,):
                alias[out] = x  # already (features,)
                continue
            if len(shapes[x]) == 2:  # tokens (R, F), stored F-packed: a gather into PyTorch's order
                view(node, x, [("reshape", (size,))])
                continue
            layers.append(Layer("flatten", node.name, [x], [out]))
            shapes[out] = (size,)
            continue
        raise BuildError(f"{_where(node)}: cannot be converted here (its inputs are not supported)")

    output = alias.get(g.output[0].name, g.output[0].name)
    if output in lazy:
        output = act(output)
    if output in twin_2d:
        output = act(output)
    if output not in shapes or output in {i.name for i in inputs}:
        raise BuildError(f"the model output {g.output[0].name!r} is not computed by any supported layer")
    layers = onnx_shape.compose_gathers(layers, output, shapes)
    layers = untie_unsupported(layers, params)
    order = [i.name for i in g.initializer]
    ordered = dict(sorted(params.items(), key=lambda kv: (order.index(kv[1].source or kv[0]), kv[0])))
    aliases = {k: v for k, v in json.loads(meta.get(ALIASES_KEY, "{}")).items() if v in ordered}
    return Graph(inp.name, output, shapes, layers, ordered, inputs=tuple(i.name for i in inputs),
                 dtypes={k: v for k, v in dtypes.items() if v != "float32"}, aliases=aliases)


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


def _strip_ones(shape) -> tuple[int, ...]:
    """A shape without its leading 1s (which broadcasting adds anyway)."""
    shape = tuple(int(d) for d in shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _same_rows_each_sample(a, idx, rank: int = 1) -> bool:
    """Whether a Gather's indices `idx` pick rows (axis 0) of a table, the same rows for every sample: a
    constant [T] or [1, T] (the batch axis broadcast); with `rank` 2, a constant [T1, T2] (T1 > 1)."""
    if int(a.get("axis", 0)) != 0 or not isinstance(idx, np.ndarray) or not np.issubdtype(idx.dtype, np.integer):
        return False
    if rank == 2:
        return idx.ndim == 2 and idx.shape[0] != 1
    return idx.ndim == 1 or (idx.ndim == 2 and idx.shape[0] == 1)


def _embedding(node, a, ids, table: str, params, shapes, padding_idx) -> Layer:
    """Gather(table, ids) on axis 0, what nn.Embedding exports: ids (T,) -> tokens (T, F). The table keeps
    its state_dict name; its padding_idx (prep/load.py: PADDING_IDX_KEY) is recorded, its row gets no
    gradient as in PyTorch."""
    w = params[table].array
    if int(a.get("axis", 0)) != 0 or w.ndim != 2:
        raise BuildError(f"{_where(node)}: Gather of integer ids is supported from a table [rows, features] on "
                         f"axis 0 (nn.Embedding), not axis {a.get('axis', 0)} of shape {list(w.shape)}")
    if len(shapes[ids]) != 1:
        raise BuildError(f"{_where(node)}: token ids of per-sample shape {list(shapes[ids])}: one sequence a sample "
                         "(ids of shape [batch, T]) is supported")
    pad = padding_idx.get(table)
    if pad is not None and pad < 0:
        pad += w.shape[0]
    out = node.output[0]
    shapes[out] = (int(shapes[ids][0]), int(w.shape[1]))
    return Layer("embedding", node.name, [ids], [out], {"padding_idx": pad}, {"weight": table})


def _dense(node, x, w: Param, shapes) -> Layer:
    if len(shapes[x]) != 1:
        raise BuildError(f"{_where(node)}: dense layer on per-sample shape {shapes[x]}; flatten first")
    o, i = w.canonical().shape
    if i != shapes[x][0]:
        raise BuildError(f"{_where(node)}: weight {w.name!r} expects {i} inputs, got {shapes[x][0]}")
    out = node.output[0]
    shapes[out] = (int(o),)
    return Layer("dense", node.name, [x], [out], {}, {"weight": w.name})


def numpy_helper_value(a) -> np.ndarray:
    from onnx import numpy_helper

    return numpy_helper.to_array(a["value"]).reshape(-1)[0] if "value" in a else np.float32(0.0)


def _int_div(x, y):
    return x // y if np.issubdtype(x.dtype, np.integer) and np.issubdtype(y.dtype, np.integer) else x / y


# elementwise ops on constants (of the exporter's shape arithmetic, or folded weights)
_NUMPY_FOLD = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _int_div, "Neg": np.negative,
               "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Abs": np.abs, "Reciprocal": np.reciprocal,
               "Pow": np.power}


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
        if op in ("Equal", "Where") and any(isinstance(v, list) for v in vals):  # on symbolic shape values
            vals = [listify(v) for v in vals]
            width = max(len(v) for v in vals)
            vals = [v * width if len(v) == 1 else v for v in vals]
            if op == "Equal":
                return [isinstance(x, str) == isinstance(y, str) and x == y for x, y in zip(*vals)]
            return [x if bool(c) else y for c, x, y in zip(*vals)]
        if op in ("Equal", "Where"):
            return np.equal(*vals) if op == "Equal" else np.where(*vals)
        if op == "ConstantOfShape":
            value = numpy_helper_value(a)
            return np.full(np.asarray(vals[0]).astype(int), value, dtype=value.dtype)
        if op == "Expand":
            return np.asarray(vals[0]) * np.ones(np.asarray(vals[1]).astype(int), dtype=np.asarray(vals[0]).dtype)
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
        if op in _NUMPY_FOLD and not any(isinstance(v, list) for v in vals):
            return _NUMPY_FOLD[op](*[np.asarray(v) for v in vals if v is not None])
        if op == "Reshape" and not isinstance(vals[0], list):
            return np.reshape(vals[0], np.asarray(vals[1]).astype(int))
        if op == "Transpose" and not isinstance(vals[0], list):  # (of a parameter: onnxsim no longer folds them)
            return np.transpose(vals[0], a.get("perm"))
    except (IndexError, TypeError, ValueError) as e:
        raise BuildError(f"{_where(node)}: cannot evaluate constant subgraph: {e}") from None
    raise BuildError(f"{_where(node)}: {op} on constants only is not supported")


def _as_2d(a: dict) -> dict:
    """The attributes of a 1-D conv or pool for the same op over (C, 1, T)."""
    out = dict(a)
    for k, one in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if k in a:
            out[k] = [one] + list(a[k])
    if "pads" in a:
        out["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
    return out


def _check_supported(g) -> None:
    """Fail on every ONNX op the IR cannot take, all of them in one message, each with its nodes and the
    PyTorch module it comes from where that is one a user would know."""
    bad: dict[str, list[str]] = {}
    for node in g.node:
        if node.op_type not in SUPPORTED_OPS:
            bad.setdefault(node.op_type, []).append(node.name or "(unnamed)")
    if not bad:
        return
    parts = []
    for op, nodes in bad.items():
        hint = f" (from {MODULE_HINTS[op]})" if op in MODULE_HINTS else ""
        shown = ", ".join(repr(n) for n in nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        why = f": {NOT_YET[op]}" if op in NOT_YET else ""
        parts.append(f"{op}{hint} at node{'s' if len(nodes) > 1 else ''} {shown}{why}")
    raise BuildError(f"unsupported ONNX op{'s' if len(bad) > 1 else ''} {'; '.join(parts)}; "
                     f"supported ops: {', '.join(SUPPORTED_OPS)}")


def _is_silu(node, ins, layers, g) -> bool:
    """Mul(x, Sigmoid(x)) where the sigmoid is read by nothing else: nn.SiLU's export."""
    if len(ins) != 2:
        return False
    for i, j in ((0, 1), (1, 0)):
        sig = next((l for l in layers if l.op == "sigmoid" and l.outputs[0] == ins[j]), None)
        if sig is not None and sig.inputs[0] == ins[i] and sum(ins[j] in n.input for n in g.node) == 1 \
                and sum(t == ins[j] for t in node.input) == 1:
            return True
    return False


def _expand(node, x, out, target, shapes) -> Layer:
    """Expand of an activation to a constant shape whose batch dim is 1 (the mask of nn.MultiheadAttention,
    [N, 1, 1, T] repeated over the heads): the activation times ones of the broadcast shape, an elementwise
    mul that repeats it (x * 1 is x exactly; no gradient reaches a mask input)."""
    full = (N,) + tuple(shapes[x])
    rank = max(len(full), len(target))
    padded_x = (1,) * (rank - len(full)) + full
    padded_t = (1,) * (rank - len(target)) + tuple(int(d) for d in target)
    if padded_x[0] != N or padded_t[0] != 1:
        raise BuildError(f"{_where(node)}: Expand of {list(full)} to {target} repeats the batch axis")
    out_full = _broadcast_shapes(node, [padded_x, padded_t])
    per_sample = tuple(int(d) for d in out_full[1:])
    if len(per_sample) not in (1, 2, 3):
        raise BuildError(f"{_where(node)}: Expand to a per-sample shape of rank {len(per_sample)} ({list(per_sample)})")
    if len(shapes[x]) != len(per_sample):
        x_shape = list(padded_x[1:])
    else:
        x_shape = list(shapes[x])
    if len(x_shape) != len(shapes[x]):
        raise BuildError(f"{_where(node)}: Expand of {list(full)} to {target} adds axes (broadcasting across ranks "
                         "is not supported)")
    ones = [int(d) for d in padded_t[1:]]
    shapes[out] = per_sample
    operands = [{"kind": "act", "input": 0, "shape": x_shape},
                {"kind": "const", "shape": ones, "values": [1.0] * int(np.prod(ones))}]
    return Layer("mul", node.name, [x], [out], dict(ew.layer_attrs(ew.OPS["mul"], {}), operands=operands))


def _broadcast_shapes(node, full: list[tuple]) -> tuple[int, ...]:
    """ONNX multidirectional broadcasting of full shapes (batch axis first, "N" for activations)."""
    rank = max(len(s) for s in full)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] if axis - rank + len(s) >= 0 else 1 for s in full} - {1}
        if len(dims) > 1:
            raise BuildError(f"{_where(node)}: shapes {[list(s) for s in full]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _elementwise(node, out, a, ins, consts, shapes, act, param, initializer_names, trainable_names,
                 view_shapes=None) -> Layer:
    """An elementwise layer (prep/elementwise.py) from its ONNX node: the declaration's attributes, its
    operands (activations, constants baked into the kernel, or trainable parameters: an initializer that
    is an nn.Parameter, such as a layer scale, or a PRelu slope) broadcast to the output's shape."""
    decl = BY_ONNX[node.op_type]
    attrs = {k: a[k] for k in decl.attrs if k in a}
    if decl.arity == 1:
        if decl.name == "clip" and len(ins) > 1:  # opset 11+: min and max are (optional) inputs
            for k, i in (("min", 1), ("max", 2)):
                if len(ins) > i and ins[i]:
                    if ins[i] not in consts:
                        raise BuildError(f"{_where(node)}: Clip with a {k} computed from activations is not supported")
                    attrs[k] = float(np.asarray(consts[ins[i]]).reshape(-1)[0])
        if decl.name == "pow":
            e = np.asarray(consts.get(ins[1], np.zeros(2)))
            if ins[1] not in consts or e.size != 1:
                raise BuildError(f"{_where(node)}: Pow is supported with a constant scalar exponent only")
            attrs["exponent"] = float(e.reshape(-1)[0])
        x = act(ins[0])
        shapes[out] = shapes[x]
        return Layer(decl.name, node.name, [x], [out], ew.layer_attrs(decl, attrs))

    operand_ins = ins[:2]
    full = []
    for t in operand_ins:
        if t in consts:
            full.append(tuple((view_shapes or {}).get(t, np.shape(consts[t]))))
        else:
            full.append((N,) + tuple(shapes[act(t)]))
    if all(t in consts for t in operand_ins):
        raise BuildError(f"{_where(node)}: {node.op_type} of two constants cannot be evaluated")
    out_full = _broadcast_shapes(node, full)
    if out_full[0] != N:
        raise BuildError(f"{_where(node)}: a constant operand of shape {[list(s) for s in full]} has a batch "
                         "axis of its own")
    out_shape = tuple(int(d) for d in out_full[1:])
    rank = len(out_shape)
    operands, inputs, roles = [], [], {}
    for slot, (t, s) in enumerate(zip(operand_ins, full)):
        padded = (1,) * (len(out_full) - len(s)) + tuple(s)
        per_sample = [int(d) if d != N else d for d in padded[1:]]
        if per_sample != list(out_shape) and rank not in (1, 2, 3):
            raise BuildError(f"{_where(node)}: broadcasting over a per-sample shape of rank {rank} "
                             f"({list(out_shape)} and {per_sample}) is not supported")
        if t not in consts:
            x = act(t)
            if len(shapes[x]) != rank:
                raise BuildError(f"{_where(node)}: {node.op_type} of activations of per-sample shapes "
                                 f"{list(shapes[x])} and {list(out_shape)}: broadcasting across ranks is not supported")
            operands.append({"kind": "act", "input": len(inputs), "shape": per_sample})
            inputs.append(x)
            continue
        trainable = t in initializer_names and (decl.name == "prelu" or t in trainable_names)
        if trainable:
            role = "slope" if decl.name == "prelu" else f"operand{slot}"
            roles[role] = param(node, slot)
            operands.append({"kind": "param", "role": role, "shape": per_sample})
        else:
            values = np.asarray(consts[t], dtype=np.float64).reshape(-1)
            if values.size > 4096:
                raise BuildError(f"{_where(node)}: a constant operand of {values.size} values; at most 4096 are "
                                 "baked into a kernel")
            operands.append({"kind": "const", "shape": per_sample,
                             "values": [float(np.float32(v)) for v in values]})
    if not inputs:
        raise BuildError(f"{_where(node)}: no activation operand")
    shapes[out] = out_shape
    return Layer(decl.name, node.name, inputs, [out], dict(ew.layer_attrs(decl, attrs), operands=operands), roles)
