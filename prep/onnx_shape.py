"""ONNX shape ops on activations -> chains of per-sample view ops (prep/shape.py) for gather layers.

prep.graph calls these for Reshape, Transpose, Squeeze, Unsqueeze, Slice, Split and Concat on
activations, and for Expand / ConstantOfShape of a constant to a batch (a Concat operand), then
`compose_gathers` folds consecutive gathers into one. Axes here are per-sample: ONNX's axis a of a
tensor with the batch is a - 1; what would move the batch axis fails, naming the node (`where`).
"""
from __future__ import annotations

import numpy as np

from .errors import BuildError
from .ir import Layer
from .shape import MAX_CONSTANT_FLOATS, Constant, chain_shape, part_views

N = "N"  # the batch dimension in symbolic shape values (as prep.graph)


def axis(where: str, value, rank) -> int:
    """A per-sample axis (-1: the batch) from an ONNX axis of a tensor of `rank` with the batch."""
    a = int(value) + (rank if int(value) < 0 else 0)
    if not 0 <= a < rank:
        raise BuildError(f"{where}: axis {value} of a tensor of rank {rank}")
    return a - 1


def batch_shape(value):
    """The per-sample dims of a shape value [N, d1, ...] (symbolic batch first), else None."""
    if isinstance(value, list) and value and value[0] == N:  # (not "N*4": windows merged into the batch)
        return value[1:] if N not in value[1:] else None
    return None


def reshape_target(where: str, target, in_shape, allowzero, batch_dim) -> tuple[int, ...]:
    """The per-sample shape of a Reshape to `target` (batch first: N, 0 or -1, or the model's static batch;
    the rest with ONNX's 0 = copy and one -1 = the rest)."""
    size = int(np.prod(in_shape))
    head, rest = target[0], list(target[1:])
    ok_head = head == N or (head == 0 and not allowzero) or head == -1 or (batch_dim and head == batch_dim)
    if not ok_head or any(isinstance(d, str) for d in rest):
        raise BuildError(f"{where}: Reshape to {target} moves the batch axis (only reshapes of the "
                         f"per-sample dims {list(in_shape)} are supported)")
    for i, d in enumerate(rest):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                raise BuildError(f"{where}: Reshape to {target}: a 0 past the input's dims")
            rest[i] = in_shape[i]
    rest = [int(d) for d in rest]
    if rest.count(-1) + (head == -1) > 1:
        raise BuildError(f"{where}: Reshape to {target} with two unknown dims")
    if -1 in rest:
        known = int(np.prod([d for d in rest if d != -1]))
        if known == 0 or size % known:
            raise BuildError(f"{where}: Reshape of {list(in_shape)} to {target}")
        rest[rest.index(-1)] = size // known
    if int(np.prod(rest)) != size or min(rest, default=1) <= 0:
        raise BuildError(f"{where}: Reshape of per-sample {list(in_shape)} to {target} does not keep the "
                         "batch axis")
    return tuple(rest)


def compose_gathers(layers: list[Layer], outputs, shapes) -> list[Layer]:
    """Fold a gather into the gather that reads it, where nothing else does (the model's `outputs` are read by
    the page): its parts become the reader's, each chain followed by the reader's. ShuffleNet's Reshape ->
    Transpose -> Reshape is then one pass, and rank-5 intermediates are never laid out. (The sum of parts
    commutes with any chain.)"""
    producer = {l.outputs[0]: l for l in layers}
    readers: dict[str, list[Layer]] = {}
    for l in layers:
        for t in l.inputs:
            readers.setdefault(t, []).append(l)
    # A flatten next to a gather is one too (a reshape to (features,)), and so is a concat that only a
    # gather reads (its operands padded to their place on axis 0), so that they compose: ShuffleNet's
    # chunk, concat and shuffle are then one pass.
    def as_gather(l):
        if l.op == "flatten" and (getattr(producer.get(l.inputs[0]), "op", None) == "gather" or (
                readers.get(l.outputs[0]) and all(r.op == "gather" for r in readers[l.outputs[0]]))):
            parts = [{"input": 0, "const": None, "ops": [("reshape", (int(np.prod(shapes[l.inputs[0]])),))]}]
        elif l.op == "concat" and l.outputs[0] not in outputs and len(readers.get(l.outputs[0], [])) == 1 and \
                readers[l.outputs[0]][0].op == "gather":
            sizes = [shapes[t][0] for t in l.inputs]
            parts = [{"input": i, "const": None, "ops": [("pad", 0, sum(sizes[:i]), sum(sizes[i + 1:]))]}
                     for i in range(len(sizes))]
        else:
            return l
        return Layer("gather", l.name, list(l.inputs), list(l.outputs), {"parts": parts})

    layers = [as_gather(l) for l in layers]
    kept: set[tuple[str, int]] = set()  # (outer, slot) left apart: composed, they would read too many tensors
    while True:
        producer = {l.outputs[0]: l for l in layers}
        reads = {}
        for l in layers:
            for t in l.inputs:
                reads[t] = reads.get(t, 0) + 1
        for outer in layers:
            if outer.op != "gather":
                continue
            slot = next((i for i, t in enumerate(outer.inputs) if t in producer and producer[t].op == "gather"
                         and reads[t] == 1 and t not in outputs and (outer.name, i) not in kept), None)
            if slot is not None:
                break
        else:
            return _without_dead_gathers(layers, outputs, shapes)
        inner = producer[outer.inputs[slot]]
        parts, tensors = [], []
        for p in outer.attrs["parts"]:
            srcs = [(q, inner.inputs) for q in inner.attrs["parts"]] if p["input"] == slot else [(None, outer.inputs)]
            for q, names in srcs:
                src = q if q is not None else p
                ops = list(src["ops"]) + (list(p["ops"]) if q is not None else [])
                if src.get("param") is not None:
                    parts.append({"input": None, "const": None, "param": src["param"], "shape": src["shape"],
                                  "ops": ops})
                elif src["input"] is None:
                    parts.append({"input": None, "const": src["const"], "ops": ops})
                elif part_views(shapes[names[src["input"]]], [], ops, []) is not None:  # (a part sliced away: none)
                    parts.append({"input": len(tensors), "const": None, "ops": ops})
                    tensors.append(names[src["input"]])
        if len(tensors) > MAX_GATHER_INPUTS:  # (a recurrent layer's output sequence, stacked in pieces)
            kept.add((outer.name, slot))
            continue
        merged = Layer("gather", outer.name, tensors, list(outer.outputs), {"parts": parts},
                       {**inner.params, **outer.params})
        layers = [merged if l is outer else l for l in layers if l is not inner]
        del shapes[inner.outputs[0]]  # never laid out


def _without_dead_gathers(layers: list[Layer], outputs, shapes) -> list[Layer]:
    """Less the gathers (of no parameter) that nothing reads any more: those whose only reader composed them into a
    part it slices away (an unrolled recurrent layer's output steps that the model does not use)."""
    while True:
        read = {t for l in layers for t in l.inputs} | set(outputs)
        dead = [l for l in layers if l.op == "gather" and not l.params and l.outputs[0] not in read]
        if not dead:
            return layers
        for l in dead:
            shapes.pop(l.outputs[0], None)
        layers = [l for l in layers if l not in dead]


# The tensors a composed gather may read: a pass reads at most 15 (codegen/schedule.py: MAX_INPUTS)
MAX_GATHER_INPUTS = 15


def batch_constant(where: str, op: str, a: dict, vals) -> np.ndarray:
    """One sample of Expand(constant, [N, ...]) or ConstantOfShape([N, ...]): the same for every sample."""
    target = batch_shape(vals[-1])
    if any(not isinstance(d, (int, np.integer)) for d in target):
        raise BuildError(f"{where}: shape {vals[-1]} is not a batch of static samples")
    if op == "ConstantOfShape":
        from onnx import numpy_helper

        fill = numpy_helper.to_array(a["value"]).reshape(-1)[0] if "value" in a else 0.0
        return np.full(target, fill, np.float32)
    data = np.asarray(vals[0], dtype=np.float32)
    if data.ndim == len(target) + 1 and data.shape[0] == 1:
        data = data[0]
    try:
        shape = np.broadcast_shapes(data.shape, tuple(int(d) for d in target))
    except ValueError as e:
        raise BuildError(f"{where}: cannot expand {data.shape} to {target}: {e}") from None
    return np.ascontiguousarray(np.broadcast_to(data, shape), dtype=np.float32)


def concat_parts(where: str, ax: int, operands, sample, params=None) -> tuple[list[dict], list[str]]:
    """The parts of a gather concatenating `operands` (tensor names, or per-sample constant arrays) of
    per-sample shapes `sample` on axis `ax`: each padded to its place; and the tensors they read.
    `params`: operand index -> (role, parameter array) of the constants that are a trainable parameter
    repeated over the batch (a class token): a part reading the parameter, its gradient the sum over the
    batch (codegen/ops/gather.py)."""
    total, start, parts, tensors = sum(s[ax] for s in sample), 0, [], []
    for k, (o, s) in enumerate(zip(operands, sample)):
        pad = [("pad", ax, start, total - start - s[ax])]
        if params and k in params:
            role, arr = params[k]
            if arr.size != o.size:
                raise BuildError(f"{where}: a parameter of shape {list(arr.shape)} expanded to {list(o.shape)} a "
                                 "sample: only a parameter repeated over the batch alone (a class token, "
                                 "[1, 1, F] expanded to [N, 1, F]) is supported")
            parts.append({"input": None, "const": None, "param": role, "shape": tuple(int(d) for d in o.shape),
                          "ops": pad})
        elif isinstance(o, np.ndarray):
            if o.size > MAX_CONSTANT_FLOATS:
                raise BuildError(f"{where}: a constant operand of {o.size} floats a sample (shape {list(o.shape)}); "
                                 f"at most {MAX_CONSTANT_FLOATS} are supported")
            parts.append({"input": None, "const": Constant(o), "ops": pad})
        else:
            parts.append({"input": len(tensors), "const": None, "ops": pad})
            tensors.append(o)
        start += s[ax]
    return parts, tensors


def _ints(v) -> list | None:
    return None if v is None else (list(v) if isinstance(v, list) else np.asarray(v).reshape(-1).tolist())


def view_ops(where: str, op: str, a: dict, vals: list, shape: tuple[int, ...]) -> list:
    """The chain of Transpose, Squeeze, Unsqueeze, Slice or Pad on a tensor of per-sample `shape`; `vals`: the
    node's constant inputs after the data (None where absent)."""
    shape = tuple(shape)
    vals = [_ints(v) for v in vals] + [None] * 4
    if op == "Transpose":
        perm = list(a.get("perm", range(len(shape), -1, -1)))
        if perm[0] != 0:
            raise BuildError(f"{where}: Transpose with perm {perm} moves the batch axis (only permutations of the "
                             "per-sample axes, perm[0] = 0, are supported)")
        return [] if perm == sorted(perm) else [("permute", tuple(p - 1 for p in perm[1:]))]
    if op in ("Squeeze", "Unsqueeze"):
        axes = a.get("axes", vals[0])
        if op == "Squeeze":
            axes = [i + 1 for i, d in enumerate(shape) if d == 1] if axes is None else \
                [axis(where, v, len(shape) + 1) + 1 for v in axes]
            if 0 in axes or any(shape[i - 1] != 1 for i in axes):
                raise BuildError(f"{where}: Squeeze of axes {axes} of {[N] + list(shape)}: only per-sample axes of "
                                 "size 1")
            return [("reshape", tuple(d for i, d in enumerate(shape) if i + 1 not in axes))]
        if axes is None:
            raise BuildError(f"{where}: Unsqueeze without axes")
        axes = sorted(axis(where, v, len(shape) + 1 + len(axes)) + 1 for v in axes)
        if 0 in axes:
            raise BuildError(f"{where}: Unsqueeze at axis 0 moves the batch axis")
        new = list(shape)
        for i in axes:
            new.insert(i - 1, 1)
        return [("reshape", tuple(new))]
    if op == "Pad":  # opset 11+: pads [begin of each axis..., end of each axis...], constant_value, axes
        mode = a.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        value = vals[1][0] if vals[1] else 0
        if mode != "constant" or value != 0:
            raise BuildError(f"{where}: Pad mode {mode!r} with value {value}: only zero padding (constant 0) "
                             "and the modes edge and reflect on H and W are supported")
        pads, rank = vals[0], len(shape) + 1
        axes = [axis(where, v, rank) + 1 for v in vals[2]] if vals[2] is not None else list(range(rank))
        if pads is None or any(isinstance(v, str) for v in pads) or len(pads) != 2 * len(axes):
            raise BuildError(f"{where}: Pad needs constant pads, two for each axis")
        ops = []
        for ax, lo, hi in zip(axes, pads[:len(axes)], pads[len(axes):]):
            if (lo or hi) and ax == 0:
                raise BuildError(f"{where}: Pad of the batch axis is not supported")
            if lo < 0 or hi < 0:  # a crop
                d = shape[ax - 1]
                ops.append(("slice", ax - 1, -min(lo, 0), d + min(hi, 0), 1))
                shape = chain_shape(shape, ops[-1:])
            if lo > 0 or hi > 0:
                ops.append(("pad", ax - 1, max(lo, 0), max(hi, 0)))
                shape = chain_shape(shape, ops[-1:])
        return ops
    # Slice (opset 10+): starts, ends, axes, steps; bounds past the ends clamp, negative ones count from the end
    starts, ends, axes, steps = vals[:4]
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    ops = []
    for ax, b, e, st in zip(axes, starts, ends, steps):
        ax = axis(where, ax, len(shape) + 1)
        if isinstance(b, str) or isinstance(e, str) or st == 0:
            raise BuildError(f"{where}: Slice with start {b}, end {e}, step {st}: only constant bounds and non-zero "
                             "steps are supported")
        if ax == -1:
            if b == 0 and e >= 2 ** 31 - 1 and st == 1:
                continue  # the whole batch
            raise BuildError(f"{where}: Slice on the batch axis is not supported")
        d, st = shape[ax], int(st)
        if st > 0:
            b, e = (min(max(v + d if v < 0 else v, 0), d) for v in (int(b), int(e)))
        else:  # ONNX clamps a negative step's start to [0, d - 1] and its end to [-1, d - 1]
            b, e = (min(max(v + d if v < 0 else v, lo), d - 1) for v, lo in ((int(b), 0), (int(e), -1)))
        if len(range(b, e, st)) == 0:
            raise BuildError(f"{where}: Slice [{b}:{e}:{st}] of axis {ax + 1} (size {d}) is empty")
        if st < 0:  # the axis reversed, then sliced forwards: element b + j * st is d - 1 - b - j * st reversed
            ops.append(("flip", ax))
            b, e, st = d - 1 - b, d - 1 - e, -st
        if (b, e, st) != (0, d, 1):
            ops.append(("slice", ax, b, e, st))
            shape = chain_shape(shape, ops[-1:])
    return ops


def split_ops(where: str, a: dict, sizes, shape: tuple[int, ...], outputs: int) -> list[list]:
    """The chain (a slice) of each output of a Split of a tensor of per-sample `shape`: sizes from the
    attribute, the input (`sizes`), or `num_outputs` (the last part the smaller, as ONNX)."""
    ax = axis(where, a.get("axis", 0), len(shape) + 1)
    if ax == -1:
        raise BuildError(f"{where}: Split on the batch axis is not supported")
    sizes = a.get("split", _ints(sizes))
    if sizes is None:
        k = int(a.get("num_outputs", outputs))
        each = -(-shape[ax] // k)
        sizes = [min(each, shape[ax] - i * each) for i in range(k)]
    sizes = [int(n) for n in sizes]
    if sum(sizes) != shape[ax] or len(sizes) != outputs or min(sizes) <= 0:
        raise BuildError(f"{where}: Split of axis size {shape[ax]} into {sizes}")
    chains, start = [], 0
    for n in sizes:
        chains.append([] if n == shape[ax] else [("slice", ax, start, start + n, 1)])
        start += n
    return chains
