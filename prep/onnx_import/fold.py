"""Evaluating a node whose inputs are all constants: the exporter's shape arithmetic (symbolic lists holding the
batch "N") and folded weights."""
from __future__ import annotations

import numpy as np

from ..errors import BuildError
from .common import batch_multiple, times_batch, where


def numpy_helper_value(a) -> np.ndarray:
    from onnx import numpy_helper

    return numpy_helper.to_array(a["value"]).reshape(-1)[0] if "value" in a else np.float32(0.0)


def _int_div(x, y):
    return x // y if np.issubdtype(x.dtype, np.integer) and np.issubdtype(y.dtype, np.integer) else x / y


# elementwise ops on constants (of the exporter's shape arithmetic, or folded weights)
_NUMPY_FOLD = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _int_div, "Neg": np.negative,
               "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Abs": np.abs, "Reciprocal": np.reciprocal,
               "Pow": np.power}


_COMPARE = {"Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater, "GreaterOrEqual": np.greater_equal}


def _batch_arithmetic(node, op, vals):
    """Mul and Div of shape values holding the batch: N * 4 is "N*4" (windows folded into the batch), "N*4" / 4 is
    N again, "N*4" / N is 4; anything else of the batch (N * N, N + 1, 4 / N) is an error naming the node."""
    def values(v):
        return v if isinstance(v, list) else [v] if isinstance(v, str) or not np.ndim(v) else np.asarray(v).reshape(-1).tolist()

    a, b = (values(v) for v in vals)
    width = max(len(a), len(b))
    a, b = (v * width if len(v) == 1 else v for v in (a, b))
    out = []
    for x, y in zip(a, b):
        kx, ky = batch_multiple(x), batch_multiple(y)
        if kx is None and ky is None:
            out.append(x * y if op == "Mul" else _int_div(np.asarray(x), np.asarray(y)).item())
        elif op == "Mul" and (kx is None) != (ky is None) and float(y if kx is not None else x).is_integer():
            out.append(times_batch((kx if kx is not None else ky) * int(y if kx is not None else x)))
        elif op == "Div" and kx is not None and ky is None and float(y).is_integer() and kx % int(y) == 0:
            out.append(times_batch(kx // int(y)))
        elif op == "Div" and kx is not None and ky is not None and kx % ky == 0:
            out.append(kx // ky)
        else:
            raise BuildError(f"{where(node)}: {op} of the shape values {x!r} and {y!r}: only the batch size N times "
                             "or divided by a number (windows or patches folded into the batch) is supported")
    return out if any(isinstance(v, list) for v in vals) or any(np.ndim(v) for v in vals if not isinstance(v, str)) \
        else out[0]


def fold(node, op, a, vals):
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
        if op == "GatherElements" and not any(isinstance(v, list) for v in vals):
            data, idx = (np.asarray(v) for v in vals)
            axis = int(a.get("axis", 0)) % data.ndim
            return np.take_along_axis(data, np.where(idx < 0, idx + data.shape[axis], idx).astype(np.int64), axis)
        if op == "Range" and not any(isinstance(v, (list, str)) for v in vals):
            start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in vals)
            return np.arange(start, limit, delta, dtype=np.result_type(start, limit, delta))
        if op in _COMPARE and not any(isinstance(v, list) for v in vals):
            return _COMPARE[op](*[np.asarray(v) for v in vals])
        if op in ("And", "Or", "Xor", "Not") and not any(isinstance(v, list) for v in vals):
            fn = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor, "Not": np.logical_not}[op]
            return fn(*[np.asarray(v, dtype=bool) for v in vals])
        if op in ("Mul", "Div") and any(isinstance(v, (str, list)) for v in vals):
            return _batch_arithmetic(node, op, vals)
        if op in _NUMPY_FOLD and any(isinstance(v, str) or (isinstance(v, np.ndarray) and v.dtype.kind in "OUS")
                                     for v in vals):
            raise BuildError(f"{where(node)}: {op} of the batch size N and {[v if isinstance(v, str) else np.asarray(v).tolist() for v in vals]}: the model "
                             "computes a shape that merges the batch with another axis (windows or patches folded "
                             "into the batch, as Swin's window attention and MobileViT's unfolding do), which is not "
                             "supported yet")
        if op in _NUMPY_FOLD and not any(isinstance(v, list) for v in vals):
            return _NUMPY_FOLD[op](*[np.asarray(v) for v in vals if v is not None])
        if op == "Reshape" and not isinstance(vals[0], list):
            return np.reshape(vals[0], np.asarray(vals[1]).astype(int))
        if op == "Transpose" and not isinstance(vals[0], list):  # (of a parameter: onnxsim no longer folds them)
            return np.transpose(vals[0], a.get("perm"))
    except (IndexError, TypeError, ValueError) as e:
        raise BuildError(f"{where(node)}: cannot evaluate constant subgraph: {e}") from None
    raise BuildError(f"{where(node)}: {op} on constants only is not supported")
