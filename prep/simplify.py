"""onnxsim, kept from changing what a parameter is: the parameters hidden from it as graph inputs (simplify), and an
ONNX file's parameters declared for the IR and the build's check of the trainable set (simplify_onnx_file)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

import numpy as np

from .errors import BuildError
from .recurrent_onnx import unroll_recurrent_nodes
from .naming import PARAMETERS_KEY, SOURCE_KEY, STATE_KEYS_KEY, TIED_KEY, onnx_parameters, restore_state_dict_names, set_meta


def simplify_onnx_file(model, state: dict | None = None):
    """An ONNX file: its parameters (onnx_parameters) hidden from onnxsim as a PyTorch source's are, and
    declared (PARAMETERS_KEY, SOURCE_KEY "onnx") for the IR and the build's check of the trainable set.
    `state`: the module's state_dict (build --weights), which names back by value the initializers the
    exporter renamed (a transposed Linear weight, `onnx::MatMul_N`); its keys are recorded (STATE_KEYS_KEY)
    so that the report can list the names that could not be recovered. Its values are not loaded: an ONNX
    file carries its own."""
    model = unroll_recurrent_nodes(model)  # LSTM, GRU and RNN nodes as their steps, weights under state_dict names
    if state is not None:
        model = restore_state_dict_names(model, {k: v.detach().cpu().numpy() for k, v in state.items()})
        set_meta(model, STATE_KEYS_KEY, sorted(state))
    meta = {p.key: p.value for p in model.metadata_props}
    if PARAMETERS_KEY in meta and SOURCE_KEY not in meta:  # written by export_simplified: a PyTorch source's still
        return simplify(model, protect=json.loads(meta[PARAMETERS_KEY]) + list(json.loads(meta.get(TIED_KEY, "{}"))))
    params = onnx_parameters(model)
    model = simplify(model, protect=params)
    kept = {i.name for i in model.graph.initializer}
    set_meta(model, PARAMETERS_KEY, sorted(p for p in params if p in kept))
    set_meta(model, SOURCE_KEY, "onnx")
    return model


# onnxsim's optimizers that would change what a parameter is: merging equal tensors, and folding a
# multiplication (or a product, or a sum) into a conv's weights
_KEPT_APART = ("eliminate_duplicate_initializer", "fuse_mul_into_conv", "fuse_preceding_mul_into_conv",
               "fuse_matmul_into_conv", "fuse_reduce_sum_into_conv", "fuse_consecutive_mul")


def simplify(model, protect=()):
    """onnxsim, with the initializers named in `protect` (parameters) hidden from it as graph inputs, so
    that it cannot fold, merge or remove them for their values; they are initializers again after."""
    import onnxsim

    model = _static_batch_reshapes(model)
    g = model.graph
    hidden = [init for init in g.initializer if init.name in set(protect)]
    if hidden:
        model = _as_inputs(model, hidden)
    try:
        # Batch-norm is folded by prep.fold (which keeps the conv's names), equal initializers stay
        # separate parameters, and no scale is multiplied into a conv's weights (its weights would no
        # longer be the state_dict's, nor train as they do in PyTorch).
        with _folding_warnings_dropped():
            simplified, ok = onnxsim.simplify(model, skip_fuse_bn=True, skipped_optimizers=list(_KEPT_APART))
    except Exception as e:
        raise BuildError(f"onnxsim failed: {' '.join(str(e).split())[:400]}") from None
    if not ok:
        raise BuildError("onnxsim could not validate the simplified model")
    if hidden:  # back as initializers; one that onnxsim's dead-code removal left unread goes
        used = {t for n in simplified.graph.node for t in n.input}
        simplified.graph.initializer.extend(h for h in hidden if h.name in used)
        unread = [i for i in simplified.graph.input if i.name in {h.name for h in hidden} - used]
        for i in unread:
            simplified.graph.input.remove(i)
    return _constants_as_initializers(simplified)


def _static_batch_reshapes(model):
    """A Reshape of a tensor to [batch size, ...] where the batch size is computed from the inputs' shapes
    (GPT-2's attention mask reshaped to [N, -1] by Gather(Shape(input_ids reshaped), 0)): to [-1, ...] with the rest
    static, the same reshape (every input's first axis is the batch) whose output shape inference knows, so that
    onnxsim folds what is computed from it (the keys' Range and the causal mask of transformers 5). Other Reshapes
    are left as they are."""
    import onnx
    from onnx import numpy_helper

    g = model.graph
    inputs = {i.name: i for i in g.input if i.name not in {t.name for t in g.initializer}}
    producer = {o: n for n in g.node for o in n.output}
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    shape_ops = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Constant", "Cast", "Slice"}

    def batch_size(t):  # computed from the inputs' shapes only, and the batch size at two batch sizes
        nodes, todo, seen = [], [t], set()
        while todo:
            name = todo.pop()
            if name in seen or name in inputs or name in consts and producer.get(name) is None:
                continue
            seen.add(name)
            n = producer.get(name)
            if n is None or n.op_type not in shape_ops:
                return False
            nodes.append(n)
            todo.extend(n.input)
        used = [i for i in inputs if any(i in n.input for n in nodes)]
        dims = {i: [d.dim_value for d in inputs[i].type.tensor_type.shape.dim][1:] for i in used}
        if not used or any(0 in d for d in dims.values()):
            return False
        sub = onnx.helper.make_model(onnx.helper.make_graph(
            [n for n in g.node if id(n) in {id(m) for m in nodes}], "batch", [inputs[i] for i in used],
            [onnx.helper.make_tensor_value_info(t, onnx.TensorProto.INT64, None)],
            [i for i in g.initializer if any(i.name in n.input for n in nodes)]), opset_imports=model.opset_import)
        try:
            from onnx.reference import ReferenceEvaluator
            run = ReferenceEvaluator(sub)
            for batch in (2, 3):
                feed = {i: np.zeros([batch] + dims[i], dtype=onnx.helper.tensor_dtype_to_np_dtype(
                    inputs[i].type.tensor_type.elem_type)) for i in used}
                if np.asarray(run.run(None, feed)[0]).reshape(-1).tolist() != [batch]:
                    return False
        except Exception:  # noqa: BLE001 (not a batch size it can tell)
            return False
        return True

    found = []
    for node in g.node:
        concat = producer.get(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None
        if concat is None or concat.op_type != "Concat" or any(i not in consts for i in concat.input[1:]) or \
                not batch_size(concat.input[0]):
            continue
        rest = [int(v) for i in concat.input[1:] for v in np.asarray(consts[i]).reshape(-1)]
        if rest.count(-1) <= 1 and 0 not in rest:
            found.append((node, rest))
    if not found:
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 (then onnxsim sees the model as it is)
        return model
    batch = {i.type.tensor_type.shape.dim[0].dim_param for i in inputs.values() if i.type.tensor_type.shape.dim}
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                       for d in v.type.tensor_type.shape.dim]
              for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    for node, rest in found:
        shape = shapes.get(node.input[0], [None])
        sample = shape[1:]  # (of a tensor whose first axis is the batch: not windows folded into it)
        if shape[0] not in batch - {""} or not sample or not all(isinstance(d, int) for d in sample):
            continue
        size, known = int(np.prod(sample)), int(np.prod([d for d in rest if d != -1]))
        if -1 in rest:
            if known == 0 or size % known:
                continue
            rest[rest.index(-1)] = size // known
        if int(np.prod(rest)) != size:
            continue
        name = f"{node.name or node.output[0]}/static_shape"
        g.initializer.append(numpy_helper.from_array(np.asarray([-1] + rest, dtype=np.int64), name))
        node.input[1] = name
    return model


@contextlib.contextmanager
def _folding_warnings_dropped():
    """onnxsim prints (to the process' stderr, from C++ and from the onnx reference evaluator it calls) a warning
    and a traceback for each node it could not fold, such as transformers' GatherElements of token types, which
    prep/onnx_import evaluates itself or names in its own error. What it printed goes to the user only when it
    is something else."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            text = f.read().decode("utf-8", "replace")
    if text and "WARNING: failed to run" not in text:
        sys.stderr.write(text)


def _as_inputs(model, hidden):
    """A copy of `model` whose `hidden` initializers are graph inputs of their shape instead."""
    import onnx
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = {h.name for h in hidden}
    kept = [i for i in out.graph.initializer if i.name not in names]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    declared = {i.name for i in out.graph.input}
    for h in hidden:
        if h.name not in declared:
            out.graph.input.append(helper.make_tensor_value_info(h.name, h.data_type, list(h.dims)))
    return out


def _constants_as_initializers(model):
    """Float tensors of Constant nodes become initializers. onnxsim sometimes leaves a folded weight as a
    Constant node (a conv's weight and bias, in some graphs with elementwise ops); as an initializer it is
    a weight the IR takes, and restore_state_dict_names gives it back its state_dict name."""
    from onnx import TensorProto

    keep = []
    for node in model.graph.node:
        attr = node.attribute[0] if node.op_type == "Constant" and len(node.attribute) == 1 else None
        if attr is not None and attr.name == "value" and attr.t.data_type == TensorProto.FLOAT and attr.t.dims:
            tensor = attr.t
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            continue
        keep.append(node)
    if len(keep) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return model
