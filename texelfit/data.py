"""The samples a build evaluates or fine-tunes on (build --eval-data, --finetune-data, the digits): read from an
.npz, checked against the model's input and output (one line naming the problem when they do not fit it)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from texelfit.prep.errors import BuildError
from texelfit.prep.ir import Graph


@dataclass
class Data:
    """Samples for evaluation or fine-tuning: x of shape (N,) + input shape, y labels or targets."""

    x: np.ndarray
    y: np.ndarray
    what: str  # e.g. "digits validation split (360 samples)"


def evaluate(graph: Graph, data: Data, stage: str) -> dict:
    from texelfit.prep.torch_ir import evaluate

    (metric, value), = evaluate(graph, data.x, data.y).items()
    return {"metric": metric, stage: value}


def check_data(d: Data, graph: Graph, loss: str, what: str) -> Data:
    """The samples shaped for the model; one line naming the problem when they do not fit it."""
    n, shape = len(d.x), graph.input_shape
    if n == 0:
        raise BuildError(f"{what}: x holds no samples")
    if d.x.size != n * int(np.prod(shape)):
        raise BuildError(f"{what}: x has shape {d.x.shape}, which does not hold samples of the model's input "
                         f"shape {shape}")
    x = np.asarray(d.x, dtype=np.float32).reshape((n,) + tuple(shape))
    if not np.all(np.isfinite(x)):
        raise BuildError(f"{what}: x has non-finite values")
    if graph.input_dtype != "float32":
        rows = graph.id_range(graph.input)
        if np.any(x != np.round(x)) or x.min() < 0 or (rows is not None and x.max() >= rows):
            raise BuildError(f"{what}: x must hold token ids, integers in [0, {rows if rows is not None else '2^24'})")
    y = np.asarray(d.y)
    if len(y) != n:
        raise BuildError(f"{what}: y has {len(y)} entries for {n} samples")
    out = graph.output_shape
    if np.issubdtype(y.dtype, np.integer):
        if len(out) != 1 or y.ndim != 1:
            raise BuildError(f"{what}: integer labels y need a model whose output is class logits; it is {out}")
        if y.min() < 0 or y.max() >= out[0]:
            raise BuildError(f"{what}: labels must be class indices in [0, {out[0]}), found "
                             f"{int(y.min())} .. {int(y.max())}")
        if loss != "cross_entropy" and what == "--finetune-data":
            raise BuildError(f"{what}: integer labels need --loss cross_entropy")
    else:
        if y.size != n * int(np.prod(out)):
            raise BuildError(f"{what}: y has {y.size} values, expected {n} x {int(np.prod(out))} (the output "
                             "shape); for accuracy give integer class labels")
        if loss == "cross_entropy" and what == "--finetune-data":
            raise BuildError(f"{what}: cross_entropy needs integer class labels y")
    return Data(x, y, d.what)


def load_data(path: str, what: str) -> Data:
    """An .npz with arrays x (samples; reshaped to the model's input shape) and y (labels or targets)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if "x" not in f or "y" not in f:
                raise BuildError(f"{what} {path} must hold arrays named x and y (it has {', '.join(f.files) or 'none'})")
            x, y = f["x"], f["y"]
    except BuildError:
        raise
    except Exception as e:
        raise BuildError(f"cannot read {what} {path} as an .npz file: {' '.join(str(e).split())}") from None
    if not (np.issubdtype(x.dtype, np.number) and np.issubdtype(y.dtype, np.number)) or x.ndim == 0:
        raise BuildError(f"{what} {path}: x and y must be numeric arrays, x with one sample per row")
    return Data(x, y, f"{os.path.basename(path)} ({len(y)} samples)")


def digits_data(input_shape) -> tuple[Data, Data]:
    """(training split, validation split) of the digits, shaped for the model."""
    from texelfit.examples import digits_split

    (xt, yt), (xv, yv) = digits_split(input_shape)
    return (Data(xt, yt, f"digits training split ({len(yt)} samples)"),
            Data(xv, yv, f"digits validation split ({len(yv)} samples)"))
