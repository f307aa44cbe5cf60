"""How every parameter keeps its state_dict name through the ONNX export and onnxsim, and the metadata the later
stages read about them (the keys below).

A PyTorch source is exported with each parameter replaced by its mark (marks_of; prep/load.py: export_simplified), and
claim_parameters finds the marks among the exported initializers and names them back; an initializer the exporter
renamed is named back by value (restore_state_dict_names). An ONNX file's parameters are the initializers that what
reads them says are parameters (onnx_parameters).
"""
from __future__ import annotations

import json

import numpy as np

from .gathered import unfold_gathers


def write_parameters(named: dict, values: dict) -> None:
    import torch

    with torch.no_grad():
        for n, p in named.items():
            p.copy_(torch.as_tensor(values[n]))


def marks_of(real: dict) -> dict[str, np.ndarray]:
    """Each parameter's export-time stand-in: its values plus noise of about 1e-3 of its scale (a zero
    tensor gets noise of 1e-3), from a fixed seed, so builds stay deterministic. Two parameters never
    share a mark, and a mark equals no buffer or constant, so nothing is merged or folded for its value."""
    rng = np.random.default_rng(20261204)
    out = {}
    for n, t in real.items():
        a = t.numpy().astype(np.float32)
        scale = float(np.abs(a).mean()) if a.size else 0.0
        noise = rng.standard_normal(a.shape).astype(np.float32) * np.float32(1e-3 * (scale if scale > 0 else 1.0))
        out[n] = (a + noise + np.float32(1e-3 * (scale if scale > 0 else 1.0))).astype(np.float32)
    return out


def claim_parameters(model, marks: dict[str, np.ndarray], values: dict[str, np.ndarray]):
    """Find each parameter among the exported model's initializers by its mark (as it is, transposed,
    or its values in another shape), rename the initializer to the state_dict name, and write the real
    values in. Returns (the claimed names, {parameter: why it is not among them}).

    A parameter found twice (tied weights read in two layouts: GPT-2's wte read by a Gather and,
    transposed, by the head's MatMul) keeps its name on the first and is named NAME@tied on the other
    (TIED_KEY), so the check of the trainable set can name it."""
    from onnx import numpy_helper

    g = model.graph
    renames: dict[str, str] = {}
    transposed: list[str] = []
    reshaped: dict[str, list[int]] = {}
    tied: dict[str, str] = {}
    found: set[str] = set()
    by_size: dict[int, list[str]] = {}
    for n, m in marks.items():
        by_size.setdefault(m.size, []).append(n)
    for init in g.initializer:
        if init.data_type != 1:  # FLOAT
            continue
        arr = numpy_helper.to_array(init)
        for n in by_size.get(arr.size, ()):
            mark = marks[n]
            if arr.shape == mark.shape and np.array_equal(arr, mark):
                how, real = "same", values[n]
            elif mark.ndim == 2 and arr.shape == mark.T.shape and np.array_equal(arr, mark.T):
                how, real = "transposed", values[n].T
            elif arr.size > 1 and np.array_equal(arr.reshape(-1), mark.reshape(-1)):
                how, real = "reshaped", values[n].reshape(arr.shape)
            else:
                continue
            name = n
            if n in found:
                name = f"{n}@tied"
                while name in renames.values():
                    name += "_"
                tied[name] = n
            found.add(n)
            renames[init.name] = name
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(real, dtype=np.float32), name))
            if how == "transposed":
                transposed.append(name)
            elif how == "reshaped":
                reshaped[name] = list(values[n].shape)
            break
    for node in g.node:
        for i, t in enumerate(node.input):
            if t in renames:
                node.input[i] = renames[t]
    for inp in g.input:
        if inp.name in renames:
            inp.name = renames[inp.name]
    recovered = unfold_gathers(model, marks, values, found)  # (a table read at constant indices, folded)
    found |= recovered
    folded: dict[str, str] = {}
    for n in marks:
        if n in found:
            continue
        where = [i.name for i in g.initializer if i.data_type == 1 and i.name not in renames.values()
                 and np.isin(numpy_helper.to_array(i).reshape(-1), marks[n].reshape(-1)).any()]
        folded[n] = "the ONNX exporter computed it into a constant" + (f" ({where[0]!r})" if where else "")
    if transposed:
        set_meta(model, TRANSPOSED_KEY, sorted(transposed))
    if reshaped:
        set_meta(model, STATE_SHAPES_KEY, dict(sorted(reshaped.items())))
    if tied:
        set_meta(model, TIED_KEY, dict(sorted(tied.items())))
    return set(renames.values()) | recovered, folded


# An ONNX file's initializers that are parameters by the input they feed: node type -> input slots
_PARAMETER_SLOTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (0, 1),
                    "LayerNormalization": (1, 2), "BatchNormalization": (1, 2), "PRelu": (1,), "Gather": (0,)}
# ... and by their name where they feed an elementwise op, an Expand or a Concat (a bias added after a MatMul, a
# layer scale, a position table, a class token) or an InstanceNormalization's scale and bias (nn.InstanceNorm2d's
# affine weight and bias; nn.GroupNorm exports constant ones and zeros there): any name but the exporters' own for
# constants
_PARAMETER_READERS = {"Add": None, "Sub": None, "Mul": None, "Div": None, "Expand": None, "Concat": None,
                      "InstanceNormalization": (1, 2)}


def onnx_parameters(model) -> list[str]:
    """The float initializers of an ONNX file that are parameters: weights, biases, scales, embeddings, tokens and
    position tables. An ONNX file does not say which of its initializers PyTorch trained, so: every float
    initializer that a conv, a Gemm, a MatMul, a norm's scale or bias, a PReLU slope or a Gather's table reads,
    and every one named as a state_dict entry is (not onnx::Op_N, /scope/..._output_0, _v_N or val_N) that an
    elementwise op, an Expand, a Concat or an InstanceNormalization (as its scale or bias) reads. A buffer of that kind (a registered sinusoidal table) is taken
    for a parameter: build --trainable leaves it out."""
    from onnx import TensorProto

    floats = {i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT}
    out = set()
    for node in model.graph.node:
        for k, t in enumerate(node.input):
            if t not in floats:
                continue
            named_slots = _PARAMETER_READERS.get(node.op_type, ())
            if k in _PARAMETER_SLOTS.get(node.op_type, ()) or (
                    node.op_type in _PARAMETER_READERS and (named_slots is None or k in named_slots) and _named(t)):
                out.add(t)
    return sorted(out)


def _named(t: str) -> bool:
    """Whether an initializer's name is a state_dict name rather than one an exporter made up for a constant."""
    return not ("::" in t or t.startswith(("/", "_v_", "val_")) or t.endswith("_output_0"))


def padding_indices(module) -> dict[str, int]:
    """{state_dict name of the table: padding_idx} of the nn.Embedding modules that have one: the ONNX
    export drops it (a Gather is all that is left), and PyTorch gives that row no gradient."""
    import torch

    if not isinstance(module, torch.nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return {}
    return {f"{name}.weight" if name else "weight": int(m.padding_idx) for name, m in module.named_modules()
            if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None}


def set_meta(model, key: str, value) -> None:
    import json

    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = json.dumps(value)
            return
    prop = model.metadata_props.add()
    prop.key, prop.value = key, json.dumps(value)


TRANSPOSED_KEY = "texelfit.transposed_initializers"
# The state_dict names that are nn.Parameters (not buffers): an initializer operand of an elementwise
# op (a layer scale) is trainable when it is one of them, a constant otherwise (prep/graph.py)
PARAMETERS_KEY = "texelfit.parameters"
# Initializers that hold their state_dict tensor in another shape of the same values (a PReLU slope
# [C] exported as [C, 1, 1]): name -> the state_dict shape, which getWeights reports
STATE_SHAPES_KEY = "texelfit.state_shapes"
# {table's state_dict name: padding_idx} of the model's nn.Embedding modules (export_simplified)
PADDING_IDX_KEY = "texelfit.padding_idx"
# {parameter: why}: the parameters of a PyTorch source that did not reach the exported graph as
# themselves (export_simplified); the build fails naming them unless --trainable freezes them
FOLDED_KEY = "texelfit.folded_parameters"
# "onnx" for an ONNX file, whose parameters (PARAMETERS_KEY) are onnx_parameters(); absent for a PyTorch source
SOURCE_KEY = "texelfit.source"
# an ONNX file's build --weights: the state_dict keys its initializers were named back to (the report lists the
# trainable tensors whose names are not among them)
STATE_KEYS_KEY = "texelfit.state_keys"
# the parameters of a PyTorch source that its output does not depend on (no gradient in PyTorch either)
UNUSED_KEY = "texelfit.unused_parameters"
# {state_dict key: parameter}: a tied parameter's other state_dict keys (GPT-2's lm_head.weight is
# transformer.wte.weight): getWeights and import-weights give it under each
ALIASES_KEY = "texelfit.aliases"
# {NAME@tied: NAME}: a parameter found twice among the initializers (tied weights in two layouts)
TIED_KEY = "texelfit.tied_parameters"
# [NAME]: an ONNX file's initializers that several nodes read as one parameter (an unrolled LSTM's hidden weights,
# read by every step: prep/recurrent_onnx.py); the file's other shared initializers are untied (an exporter may
# merge equal tensors)
SHARED_KEY = "texelfit.shared_parameters"


def restore_state_dict_names(model, state: dict[str, np.ndarray]):
    """Rename initializers that constant folding renamed (a Linear without bias exports
    MatMul with a folded transpose named like ``onnx::MatMul_8``) to the state_dict name they
    came from, found by value. Initializers that hold the transpose of their state_dict tensor
    are listed in the model's metadata under TRANSPOSED_KEY, so getWeights can undo it."""
    import json


    arrays = initializer_arrays(model)
    taken = {n for n in arrays if n in state}
    renames: dict[str, str] = {}
    transposed: list[str] = []
    reshaped: dict[str, list[int]] = {}
    for name, arr in arrays.items():
        if name in state or arr.dtype != np.float32 or arr.ndim == 0:
            continue
        for key, ref in state.items():
            if key in taken or ref.dtype != np.float32:
                continue
            if ref.shape == arr.shape and np.array_equal(ref, arr):
                renames[name] = key
            elif ref.ndim == 2 and ref.T.shape == arr.shape and np.array_equal(ref.T, arr):
                renames[name] = key
                transposed.append(key)
            elif ref.size == arr.size > 1 and [d for d in ref.shape if d != 1] == [d for d in arr.shape if d != 1] \
                    and np.array_equal(ref.reshape(-1), arr.reshape(-1)):
                renames[name] = key
                reshaped[key] = list(ref.shape)
            else:
                continue
            taken.add(key)
            break
    if not renames:
        return model
    for init in model.graph.initializer:
        if init.name in renames:
            init.name = renames[init.name]
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    for inp in model.graph.input:
        if inp.name in renames:
            inp.name = renames[inp.name]
    if transposed:
        before = {p.key: p.value for p in model.metadata_props}.get(TRANSPOSED_KEY, "[]")
        set_meta(model, TRANSPOSED_KEY, sorted(set(json.loads(before)) | set(transposed)))
    if reshaped:
        set_meta(model, STATE_SHAPES_KEY, dict(sorted(reshaped.items())))
    return model


def initializer_arrays(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
