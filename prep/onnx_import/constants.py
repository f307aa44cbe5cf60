"""Import rules of constants and symbolic shape values: what the exporter computes from constants and from the
input's shape (the batch as the symbol "N") is evaluated here and leaves no layer behind; a parameter read
through a reshape is the parameter; the few ops that take an activation (an Expand broadcast anyway, an Equal
that a masked fill reads, a Cast of token ids) become what they are."""
from __future__ import annotations

import numpy as np

from .. import onnx_shape
from ..elementwise import BY_ONNX
from ..errors import BuildError
from ..ir import Layer
from .common import F32_MAX, N, batch_multiple, strip_ones, times_batch, where
from .fold import fold
from .layers import expand
from .registry import ANY, imports

# only on constants and shape values (Expand and ConstantOfShape also to a batch of one constant sample:
# an operand of Concat)
SHAPE_ONLY = ("Shape", "Gather", "Cast", "Equal", "Where", "Expand", "ConstantOfShape", "GatherElements", "Range",
              "Less", "LessOrEqual", "Greater", "GreaterOrEqual")  # (GPT-2's causal mask: kv_idx <= q_idx)


@imports("Constant")
def constant(cx, s) -> bool:
    from onnx import numpy_helper

    a = s.a
    cx.consts[s.out] = numpy_helper.to_array(a["value"]) if "value" in a else np.asarray(
        a.get("value_ints", a.get("value_int", a.get("value_floats", a.get("value_float")))))
    return True


@imports("Expand")
def expand_activation(cx, s) -> bool:
    node, ins, out = s.node, s.ins, s.out
    if ins[0] in cx.consts or ins[0] in cx.batch_consts:
        return False
    # an activation repeated to a larger shape (F.normalize expands its norm to the input's shape):
    # every consumer broadcasting it anyway, it is the activation itself
    users = cx.users(out)
    if users and all(n.op_type in BY_ONNX and BY_ONNX[n.op_type].arity == 2 for n in users):
        cx.alias[out] = cx.act(ins[0])
        return True
    # else (nn.MultiheadAttention's key padding mask [N, 1, 1, T] repeated over the heads, then
    # reshaped): to a constant shape, or [N, ...], with its batch dim 1, a broadcasting mul (expand)
    target = cx.consts.get(ins[1])
    if (rest := onnx_shape.batch_shape(target)) is not None:
        target = [1] + list(rest)
    elif target is None or isinstance(target, list):
        raise BuildError(f"{where(node)}: Expand of an activation is supported into elementwise ops that "
                         f"broadcast it, or to a constant shape; it feeds {sorted({n.op_type for n in users})}")
    cx.layers.append(expand(node, cx.act(ins[0]), out, np.asarray(target).reshape(-1).tolist(), cx.shapes))
    return True


@imports("Expand", "ConstantOfShape")
def batch_constant(cx, s) -> bool:
    """One constant sample repeated over the batch (to [N, ...]): only Concat takes it."""
    op, ins = s.op, s.ins
    if onnx_shape.batch_shape(cx.consts.get(ins[-1])) is None or any(i not in cx.consts for i in ins):
        return False
    cx.batch_consts[s.out] = onnx_shape.batch_constant(where(s.node), op, s.a, [cx.consts[i] for i in ins])
    if op == "Expand" and ins[0] in cx.trainable_names:  # a parameter repeated over the batch: a class token
        cx.expanded_params[s.out] = ins[0]
    return True


@imports("Reshape")
def merged_batch_constant(cx, s) -> bool:
    """A Reshape of a constant repeated over the batch to [N * windows, ...] (Swin's shifted-window mask, expanded
    over the batch and merged with it as the scores are): the sample's values as (windows, ...), which an
    elementwise op of the merged scores reads (onnx_import/elementwise.py: on_merged_batch)."""
    ins = s.ins
    if ins[0] not in cx.batch_consts or ins[1] not in cx.consts:
        return False
    target = list(cx.consts[ins[1]]) if isinstance(cx.consts[ins[1]], list) else \
        np.asarray(cx.consts[ins[1]]).reshape(-1).tolist()
    per_sample, rest = cx.batch_consts[ins[0]], target[1:]
    if any(isinstance(d, str) or d <= 0 for d in rest):
        return False
    k = batch_multiple(target[0]) if isinstance(target[0], str) else \
        per_sample.size // int(np.prod(rest)) if target[0] == -1 and per_sample.size % int(np.prod(rest)) == 0 else None
    if k is None or k == 1 or k * int(np.prod(rest)) != per_sample.size:
        return False
    cx.merged_consts[s.out] = per_sample.reshape([k] + [int(d) for d in rest])
    return True


@imports("GatherElements", "Expand")
def uniform_batch_constant(cx, s) -> bool:
    """A gather of one value, however computed its indices (RoBERTa's token types, a buffer of zeros read at the
    position ids), or that one value expanded: a batch of that value, in the indices' (the target's) shape."""
    ins = s.ins
    value = _one_constant(cx, ins[0])
    if value is None:
        return False
    if s.op == "GatherElements" and ins[1] not in cx.consts and ins[1] not in cx.batch_consts:
        shape = cx.shapes[cx.act(ins[1])]
    elif s.op == "Expand" and ins[0] in cx.batch_consts and onnx_shape.batch_shape(cx.consts.get(ins[1])) is not None:
        shape = tuple(onnx_shape.batch_shape(cx.consts[ins[1]]))
    else:
        return False
    cx.batch_consts[s.out] = np.full(shape, value, dtype=np.asarray(cx.batch_consts.get(ins[0], cx.consts.get(ins[0]))).dtype)
    return True


@imports("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice")
def parameter_view(cx, s) -> bool:
    """A parameter in another shape, read as the parameter. Falls through (having folded the value) where the
    view is not one."""
    ins, consts, out = s.ins, cx.consts, s.out
    if not (ins[0] in cx.trainable_names and ins[0] in cx.initializer_names and all(t in consts for t in ins[1:] if t)):
        return False
    value = fold(s.node, s.op, s.a, [consts[x] if x else None for x in ins])
    users = cx.users(out)
    if strip_ones(np.shape(value)) == strip_ones(np.shape(consts[ins[0]])) or (
            np.squeeze(value).shape == np.squeeze(consts[ins[0]]).shape and users and
            all(n.op_type in BY_ONNX and BY_ONNX[n.op_type].arity == 2 for n in users)):
        # every value, in the same order, broadcasting as the parameter does (leading 1s aside), or a
        # per-channel [C, 1, 1] view of a [C] parameter that only elementwise ops read (with its shape)
        cx.param_views[out] = ins[0]
        consts[out] = value
        return True
    return False


@imports(ANY)
def constant_fold(cx, s) -> bool:
    """A node whose inputs are all constants: its value."""
    consts = cx.consts
    if not all(x in consts for x in s.ins if x):
        return False
    consts[s.out] = fold(s.node, s.op, s.a, [consts[x] if x else None for x in s.ins])
    return True


@imports("Equal")
def equal_constant(cx, s) -> bool:
    """An activation compared with a constant: only a Where of constants reads it (select_eq)."""
    ins, consts = s.ins, cx.consts
    if ins[0] not in consts and ins[1] in consts and np.size(consts[ins[1]]) == 1 \
            and not isinstance(consts[ins[1]], list):
        cx.equals[s.out] = (cx.act(ins[0]), float(np.asarray(consts[ins[1]]).reshape(-1)[0]))
        return True
    return False


@imports("Where")
def where_equal(cx, s) -> bool:
    node, ins = s.node, s.ins
    if ins[0] not in cx.equals:
        return False
    x, value = cx.equals[ins[0]]
    picked = [_one_constant(cx, t) for t in ins[1:3]]
    if None in picked:
        t = ins[1 + picked.index(None)]
        raise BuildError(f"{where(node)}: Where of a comparison picks {t!r}, which is not one constant "
                         "(a masked_fill by a constant is supported)")
    return _select_eq(cx, node, x, s.out, value, picked)


def _one_constant(cx, t) -> float | None:
    """The one value of constant `t` (a scalar, or a tensor or batch of one value throughout), clipped to
    float32's range; None if `t` is not such a constant."""
    v = cx.consts.get(t, cx.batch_consts.get(t))
    vals = None if v is None or isinstance(v, list) else np.unique(np.asarray(v, dtype=np.float64))
    return None if vals is None or vals.size != 1 else float(np.clip(vals[0], -F32_MAX, F32_MAX))


def _select_eq(cx, node, x, out, value, picked) -> bool:
    """out = picked[0] where x == value, else picked[1] (the select_eq op of prep/elementwise.py)."""
    cx.layers.append(Layer("select_eq", node.name, [x], [out], {"value": value, "fill": picked[0], "other": picked[1]}))
    cx.shapes[out] = cx.shapes[x]
    return True


@imports("Shape")
def shape(cx, s) -> bool:
    a, ins = s.a, s.ins
    src = cx.alias.get(ins[0], ins[0])
    if src in cx.equals:
        src = cx.equals[src][0]
    if src in cx.lazy:  # a tensor whose batch axis moved: its ONNX shape, the batch "N" where it is alone
        # (the batch merged with windows, [N * 4, ...]: "N*4", which shape arithmetic and Reshape take)
        full = [times_batch(d[1]) if isinstance(d, tuple) else d for d in cx.lazy[src].sizes()]
    else:
        full = [N] + list(cx.shapes[cx.act(src)])
    cx.consts[s.out] = full[a.get("start", 0):a.get("end", len(full))]
    return True


@imports("Cast")
def cast_ids(cx, s) -> bool:
    """Token ids are exact floats in every tier: a Cast of them to int32, int64, float or double is the same
    values (to bool or to a narrower type would not be: those fail in shape_only)."""
    a, ins = s.a, s.ins
    integer = cx.alias.get(ins[0], ins[0]) in cx.integer
    if not ((integer and a.get("to") in (1, 6, 7, 11)) or (a.get("to") in (1, 11) and _view_of_integers(cx, ins[0]))):
        return False
    cx.alias[s.out] = cx.act(ins[0])
    if a.get("to") in (6, 7):  # to int32, int64
        cx.integer.add(s.out)
    return True


_VIEWS = ("Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Identity")


def _view_of_integers(cx, name) -> bool:
    """Whether activation `name` is integers seen in another shape (`attention_mask[:, :, None]`): cast to float,
    it is those values (a view keeps them, in the tier's precision as every float activation)."""
    while name not in cx.consts and cx.alias.get(name, name) not in cx.integer:
        node = next((n for n in cx.g.node if name in n.output), None)
        if node is None or node.op_type not in _VIEWS:
            return False
        name = node.input[0]
    return name not in cx.consts


@imports("Cast")
def cast_bool(cx, s) -> bool:
    """An activation cast to bool (transformers' attention mask): x != 0, as 1 or 0 (select_eq). Every boolean
    activation is so, 1 or 0, as the ops that read one take it (where_boolean; And, Or and Not lowered to
    arithmetic: prep/lower_masks.py)."""
    if s.a.get("to") != 9 or s.ins[0] in cx.consts or s.ins[0] in cx.batch_consts:
        return False
    return _select_eq(cx, s.node, cx.act(s.ins[0]), s.out, 0.0, [0.0, 1.0])


@imports("Where")
def where_boolean(cx, s) -> bool:
    """Where(c, x, y) of a boolean activation c (1 or 0: cast_bool) between two constants (transformers' additive
    attention mask, 0 where a token is attended and float32's lowest where not): select_eq(c, 1, x, y)."""
    ins = s.ins
    if ins[0] in cx.consts or ins[0] in cx.batch_consts or ins[0] in cx.equals:
        return False
    picked = [_one_constant(cx, t) for t in ins[1:3]]
    if None in picked:
        return False
    return _select_eq(cx, s.node, cx.act(ins[0]), s.out, 1.0, picked)


@imports("IsNaN")
def is_nan(cx, s) -> bool:
    """IsNaN of an activation: only a Where that puts a constant where it is NaN reads it (where_nan)."""
    if s.ins[0] in cx.consts:
        return False
    cx.nans[s.out] = s.ins[0]
    return True


@imports("Where")
def where_nan(cx, s) -> bool:
    """Where(IsNaN(x), c, x): x with the constant c where it is NaN (nan_to, prep/elementwise.py)."""
    ins = s.ins
    if ins[0] not in cx.nans:
        return False
    fill = _one_constant(cx, ins[1])
    if ins[2] != cx.nans[ins[0]] or fill is None:
        raise BuildError(f"{where(s.node)}: a Where of IsNaN is supported as Where(IsNaN(x), constant, x)")
    x = cx.act(ins[2])
    cx.layers.append(Layer("nan_to", s.node.name, [x], [s.out], {"fill": fill}))
    cx.shapes[s.out] = cx.shapes[x]
    return True


@imports(*SHAPE_ONLY)
def shape_only(cx, s) -> bool:
    """The ops on constants and shape values only, on an activation that no rule before took: an error."""
    raise BuildError(f"{where(s.node)}: {s.op} on activations is not supported (only on constant shapes)")
