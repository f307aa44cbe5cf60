"""What the import rules share that holds no importer state: the batch symbol, node attributes and the
name a BuildError gives a node, window arithmetic of convs and pools, the per-sample input shapes and dtypes."""
from __future__ import annotations

import numpy as np

from ..errors import BuildError
from ..load import INPUT_DTYPES

N = "N"  # the batch dimension in symbolic shape values; "N*4": the batch times 4 (windows folded into the batch)


def collapse_broadcast(out: tuple, operands: list[tuple]) -> tuple[tuple, list[tuple]]:
    """`out` and the operand shapes (each of out's rank, broadcasting where a dim is 1) with the adjacent axes merged
    where every operand broadcasts alike (all of the axes, or none of them): the same elementwise op of fewer axes
    ((1, h, n, n) + (A, 1, n, n) -> (1, h, n * n) + (A, 1, n * n))."""
    pattern = [tuple(s[i] == out[i] for s in operands) for i in range(len(out))]
    groups: list[list[int]] = []
    for i in range(len(out)):
        if groups and pattern[i] == pattern[groups[-1][-1]]:
            groups[-1].append(i)
        else:
            groups.append([i])

    def merge(shape):
        return tuple(int(np.prod([shape[i] for i in g])) for g in groups)

    return merge(out), [merge(s) for s in operands]


def batch_multiple(d) -> int | None:
    """k of a symbolic dim N*k ("N" is N*1); None for a number."""
    if d == N:
        return 1
    if isinstance(d, str) and d.startswith(N + "*") and d[len(N) + 1:].isdigit():
        return int(d[len(N) + 1:])
    return None


def times_batch(k: int) -> str:
    return N if k == 1 else f"{N}*{k}"
F32_MAX = float(np.finfo(np.float32).max)  # an infinite constant that a kernel bakes in (select_eq's -inf fill)


def node_attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# the role of a node's input in the state_dict name of its module's parameter (nn.Conv2d's weight, ...)
_ROLES = {"Conv": {1: "weight", 2: "bias"}, "ConvTranspose": {1: "weight", 2: "bias"}, "Gemm": {1: "weight", 2: "bias"},
          "LayerNormalization": {1: "weight", 2: "bias"}, "BatchNormalization": {1: "weight", 2: "bias"}, "MatMul": {1: "weight"}, "Add": {0: "bias", 1: "bias"}}


def scope_name(node, i, source: str) -> str | None:
    """The state_dict name that the exporter's scope of `node` gives its input `i` (node '/features/features.11/
    fc2/Conv', input 2 -> 'features.11.fc2.bias'), where the op says the role and it is the role `source` ends
    with; else None."""
    role = _ROLES.get(node.op_type, {}).get(i)
    if role is None or not source.endswith("." + role) or not node.name.startswith("/"):
        return None
    path = module_path(node)
    return path + "." + role if path else None


def module_path(node) -> str:
    """The module path the exporter's scope of `node` gives ('/features/features.11/fc2/Conv' -> 'features.11.fc2';
    '' for a node of the top module or without a scope)."""
    parts: list[str] = []
    for seg in node.name.strip("/").split("/")[:-1] if node.name.startswith("/") else []:
        if parts and seg.startswith(parts[-1] + "."):
            parts[-1] = seg  # ('features', 'features.11'): the child's scope repeats its parent's
        else:
            parts.append(seg)
    return ".".join(parts)


def where(node) -> str:
    return f"{node.op_type} node {node.name or '(unnamed)'!r}"


def unsupported_attr(node, attr, value, what):
    raise BuildError(f"{where(node)}: unsupported attribute {attr}={value!r} ({what})")


def pool_out(size, k, s, p0, p1, d, ceil_mode):
    """Output length of a window sweep, as PyTorch computes it (the last window of
    ceil_mode must start inside the input or its left padding)."""
    num = size + p0 + p1 - (d * (k - 1) + 1)
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p0:
        out -= 1
    return out


def window(node, a, shape, kernel, *, allow_dilation: bool):
    """kernel, strides, pads (t, l, b, r), dilations of a conv or pool on a (C, H, W) input."""
    strides = tuple(a.get("strides", [1, 1]))
    dil = tuple(a.get("dilations", [1, 1]))
    if not allow_dilation and dil != (1, 1):
        unsupported_attr(node, "dilations", list(dil), "pooling with dilation is not supported")
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
        unsupported_attr(node, "auto_pad", auto, "use NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    if len(kernel) != 2 or len(strides) != 2 or len(pads) != 4:
        raise BuildError(f"{where(node)}: only 2-D windows are supported (kernel {list(kernel)})")
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


def strip_ones(shape) -> tuple[int, ...]:
    """A shape without its leading 1s (which broadcasting adds anyway)."""
    shape = tuple(int(d) for d in shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def same_rows_each_sample(a, idx, rank: int = 1) -> bool:
    """Whether a Gather's indices `idx` pick rows (axis 0) of a table, the same rows for every sample: a
    constant [T] or [1, T] (the batch axis broadcast); with `rank` 2, a constant [T1, T2] (T1 > 1)."""
    if int(a.get("axis", 0)) != 0 or not isinstance(idx, np.ndarray) or not np.issubdtype(idx.dtype, np.integer):
        return False
    if rank == 2:
        return idx.ndim == 2 and idx.shape[0] != 1
    return idx.ndim == 1 or (idx.ndim == 2 and idx.shape[0] == 1)


def as_2d(a: dict) -> dict:
    """The attributes of a 1-D conv or pool for the same op over (C, 1, T)."""
    out = dict(a)
    for k, one in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if k in a:
            out[k] = [one] + list(a[k])
    if "pads" in a:
        out["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
    return out
