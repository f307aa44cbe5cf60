"""onnxsim, kept from changing what a parameter is: the parameters hidden from it as graph inputs (simplify), and an
ONNX file's parameters declared for the IR and the build's check of the trainable set (simplify_onnx_file)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

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
