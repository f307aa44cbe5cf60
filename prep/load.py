"""Load a model from any supported source and return a simplified ONNX model.

Sources:
  * an ONNX file (``*.onnx``): carries its own input shape;
  * a TorchScript file (``torch.jit.save``);
  * ``package.module:Attr`` naming an ``nn.Module`` class or zero-argument
    factory, with ``weights`` a ``state_dict`` loaded with ``weights_only=True``;
  * a fully pickled module (``torch.save(model)``) only with ``trust_pickle``,
    because unpickling runs arbitrary code from the file.

PyTorch sources are exported with the TorchScript-based exporter
(``dynamo=False``): it needs nothing beyond torch and keeps the ``state_dict``
names as ONNX initializer names, which is what ``getWeights`` is keyed by.
Every model then goes through onnxsim.
"""
from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import sys
import warnings
import zipfile

import numpy as np

from .errors import BuildError  # noqa: F401 (every stage raises it; re-exported for older imports)

OPSET = 17
# the element types an input may have (build --input-dtype): float32 values, or integer token ids (an
# nn.Embedding's input), which the bundle takes as an Int32Array and stores as exact floats (ids < 2^24)
INPUT_DTYPES = ("float32", "int64", "int32")


def load_onnx(source: str, *, weights: str | None = None, input_shape=None,
              trust_pickle: bool = False, inputs=None, input_dtype=None):
    """Return the simplified onnx.ModelProto. `inputs`: the names of a PyTorch source's inputs, in the
    order its forward takes them (build --inputs; default one input named "input"); `input_shape` then
    one per-sample shape per input (a list of shapes; one shape for a single input). `input_dtype`: the
    element type of the examples a PyTorch source is exported with (INPUT_DTYPES; one for every input
    or a list of one per input; float32 when None); an ONNX file declares its own (prep.graph checks
    that it is the one given)."""
    import onnx

    if inputs and source.endswith(".onnx") and os.path.exists(source):
        raise BuildError("--inputs is for PyTorch sources; an ONNX file declares its inputs")
    if ":" in source and not os.path.exists(source):
        module = _module_from_factory(source, weights)
        return export_simplified(module, _need_shape(input_shape, source, inputs), inputs, input_dtype or "float32")
    if not os.path.exists(source):
        raise BuildError(f"source not found: {source}")
    if source.endswith(".onnx"):
        try:
            model = onnx.load(source)
        except Exception as e:  # onnx raises DecodeError and friends
            raise BuildError(f"{source} is not a readable ONNX file: {e}") from None
        return simplify_onnx_file(model, _read_state_dict(weights) if weights else None)
    module = _module_from_file(source, trust_pickle)
    if weights:
        _load_state_dict(module, weights)
    return export_simplified(module, _need_shape(input_shape, source, inputs), inputs, input_dtype or "float32")


def export_simplified(module, input_shape, inputs=None, input_dtype="float32"):
    """Export and simplify a PyTorch module so that every parameter reaches the ONNX graph as itself.

    Nothing may change a parameter because of its value: the exporter merges initializers of equal
    value (two zero biases become one), and onnxsim removes the `Add` of a zero bias or folds a
    position table read at constant positions into a constant. So the module is exported with each
    parameter replaced by a *mark* (its values plus a small random perturbation: distinct from every
    other tensor, of the same scale), the initializers are matched back to the parameters by their marks
    (as they are, transposed, or reshaped), renamed to their state_dict names and given their real
    values, and onnxsim then sees them as graph inputs, which it cannot fold. Parameters that do not
    reach the graph as themselves are recorded (FOLDED_KEY) with the reason, for the build's check of
    the trainable set (prep/trust.py). Buffers keep the old rule: named back by value."""
    import torch

    named = dict(module.named_parameters())  # tied parameters (one nn.Parameter under two names) once
    real = {n: p.detach().clone() for n, p in named.items()}
    marks = _marks(real)
    _write(named, marks)
    try:  # (not under no_grad: nn.TransformerEncoderLayer would take its fused fast path, which has no export)
        exported = export_module(module, input_shape, inputs, input_dtype)
    finally:
        _write(named, real)
    values = {n: t.numpy() for n, t in real.items()}
    claimed, folded = claim_parameters(exported, marks, values)
    unused = set(_without_gradient(module, input_shape, inputs, input_dtype, folded)) if folded else set()
    folded = {n: why for n, why in folded.items() if n not in unused}
    model = simplify(exported, protect=claimed)
    kept = {i.name.split("@")[0] for i in model.graph.initializer}
    unused |= {n.split("@")[0] for n in claimed} - kept  # read only by what onnxsim found dead
    buffer_names = set(dict(module.named_buffers()))  # (a tied parameter's second state_dict key is no buffer)
    buffers = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items() if k in buffer_names}
    model = restore_state_dict_names(model, buffers)
    _set_meta(model, PARAMETERS_KEY, sorted(named))
    first = {id(p): n for n, p in named.items()}
    aliases = {k: first[id(v)] for k, v in module.state_dict(keep_vars=True).items()
               if k not in named and id(v) in first}
    if aliases:
        _set_meta(model, ALIASES_KEY, dict(sorted(aliases.items())))
    if folded:
        _set_meta(model, FOLDED_KEY, dict(sorted(folded.items())))
    if unused:
        _set_meta(model, UNUSED_KEY, sorted(unused))
    padding = _padding_indices(module)
    if padding:
        _set_meta(model, PADDING_IDX_KEY, padding)
    return model


def _without_gradient(module, input_shape, inputs, input_dtype, names) -> list[str]:
    """Those of `names` (parameters not found in the export) that the module's output does not depend on:
    PyTorch gives them no gradient (.grad stays None after a backward from the export's example)."""
    import torch

    shapes = [tuple(s) for s in input_shape] if inputs else [tuple(input_shape)]
    dtypes = list(input_dtype) if isinstance(input_dtype, (list, tuple)) else [input_dtype] * len(shapes)
    named = dict(module.named_parameters())
    saved = {n: p.grad for n, p in named.items()}
    try:
        for p in named.values():
            p.grad = None
        out = module(*(torch.zeros((2,) + s, dtype=getattr(torch, d)) for s, d in zip(shapes, dtypes)))
        out = out[0] if isinstance(out, (tuple, list)) else out
        out.float().sum().backward()
        return [n for n in names if named[n].grad is None]
    except Exception:  # noqa: BLE001 (a module that cannot run backward here: every one of them stays an error)
        return []
    finally:
        for n, p in named.items():
            p.grad = saved[n]


def _write(named: dict, values: dict) -> None:
    import torch

    with torch.no_grad():
        for n, p in named.items():
            p.copy_(torch.as_tensor(values[n]))


def _marks(real: dict) -> dict[str, np.ndarray]:
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
    folded: dict[str, str] = {}
    for n in marks:
        if n in found:
            continue
        where = [i.name for i in g.initializer if i.data_type == 1 and i.name not in renames.values()
                 and np.isin(numpy_helper.to_array(i).reshape(-1), marks[n].reshape(-1)).any()]
        folded[n] = "the ONNX exporter computed it into a constant" + (f" ({where[0]!r})" if where else "")
    if transposed:
        _set_meta(model, TRANSPOSED_KEY, sorted(transposed))
    if reshaped:
        _set_meta(model, STATE_SHAPES_KEY, dict(sorted(reshaped.items())))
    if tied:
        _set_meta(model, TIED_KEY, dict(sorted(tied.items())))
    return set(renames.values()), folded


def simplify_onnx_file(model, state: dict | None = None):
    """An ONNX file: its parameters (onnx_parameters) hidden from onnxsim as a PyTorch source's are, and
    declared (PARAMETERS_KEY, SOURCE_KEY "onnx") for the IR and the build's check of the trainable set.
    `state`: the module's state_dict (build --weights), which names back by value the initializers the
    exporter renamed (a transposed Linear weight, `onnx::MatMul_N`); its keys are recorded (STATE_KEYS_KEY)
    so that the report can list the names that could not be recovered. Its values are not loaded: an ONNX
    file carries its own."""
    if state is not None:
        model = restore_state_dict_names(model, {k: v.detach().cpu().numpy() for k, v in state.items()})
        _set_meta(model, STATE_KEYS_KEY, sorted(state))
    meta = {p.key: p.value for p in model.metadata_props}
    if PARAMETERS_KEY in meta and SOURCE_KEY not in meta:  # written by export_simplified: a PyTorch source's still
        return simplify(model, protect=json.loads(meta[PARAMETERS_KEY]) + list(json.loads(meta.get(TIED_KEY, "{}"))))
    params = onnx_parameters(model)
    model = simplify(model, protect=params)
    kept = {i.name for i in model.graph.initializer}
    _set_meta(model, PARAMETERS_KEY, sorted(p for p in params if p in kept))
    _set_meta(model, SOURCE_KEY, "onnx")
    return model


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


def _padding_indices(module) -> dict[str, int]:
    """{state_dict name of the table: padding_idx} of the nn.Embedding modules that have one: the ONNX
    export drops it (a Gather is all that is left), and PyTorch gives that row no gradient."""
    import torch

    if not isinstance(module, torch.nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return {}
    return {f"{name}.weight" if name else "weight": int(m.padding_idx) for name, m in module.named_modules()
            if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None}


def _set_meta(model, key: str, value) -> None:
    import json

    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = json.dumps(value)
            return
    prop = model.metadata_props.add()
    prop.key, prop.value = key, json.dumps(value)


def _need_shape(input_shape, source, inputs=None):
    """One per-sample shape (a single input) or, with `inputs`, a list of one per input."""
    from .graph import shape_list

    shapes = shape_list(input_shape)
    if not shapes:
        raise BuildError(f"--input-shape is needed for the PyTorch source {source} "
                         "(the per-sample shape without batch, e.g. 784 or 1,28,28"
                         + (", once per input of --inputs)" if inputs else ")"))
    names = check_input_names(inputs) if inputs else ["input"]
    if len(shapes) != len(names):
        raise BuildError(f"{len(shapes)} input shape(s) (--input-shape) for {len(names)} input(s) "
                         f"({', '.join(names)}): give --input-shape once per input, in the order of --inputs")
    return shapes[0] if not inputs else shapes


def check_input_names(inputs) -> list[str]:
    """--inputs: distinct names (letters, digits, '_'; not starting with a digit)."""
    names = [n.strip() for n in (inputs.split(",") if isinstance(inputs, str) else inputs)]
    for n in names:
        if not n or not (n.replace("_", "a").isalnum() and n.isascii()) or n[0].isdigit():
            raise BuildError(f"--inputs: {n!r} is not an input name (letters, digits and '_', not starting with a digit)")
    if len(set(names)) != len(names):
        raise BuildError(f"--inputs names an input twice: {', '.join(names)}")
    if "output" in names:
        raise BuildError("--inputs: 'output' is the name of the model's output")
    return names


def _module_from_factory(spec: str, weights: str | None):
    import torch

    mod_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise BuildError(f"cannot import module {mod_name!r} of source {spec!r}: {e}") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BuildError(f"module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    module = obj() if callable(obj) and not isinstance(obj, torch.nn.Module) else obj
    if not isinstance(module, torch.nn.Module):
        raise BuildError(f"{spec} gave a {type(module).__name__}, not a torch.nn.Module")
    if weights:
        _load_state_dict(module, weights)
    return module


def _load_state_dict(module, path: str):
    state = _read_state_dict(path)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise BuildError(f"--weights {path} does not fit the model: {' '.join(str(e).split())}") from None


def _read_state_dict(path: str) -> dict:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise BuildError(f"--weights {path} is not a plain state_dict (weights_only load refused it: "
                         f"{str(e).splitlines()[0]})") from None
    except Exception as e:
        raise BuildError(f"cannot read --weights {path}: {e}") from None
    if not isinstance(state, dict):
        raise BuildError(f"--weights {path} holds a {type(state).__name__}, not a state_dict")
    return state


def _module_from_file(path: str, trust_pickle: bool):
    import torch

    if _is_torchscript(path):
        return torch.jit.load(path, map_location="cpu")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not trust_pickle:
            raise BuildError(
                f"{path} is a fully pickled model: loading it runs arbitrary code from the file, so it is "
                "refused. Save a TorchScript file (torch.jit.save), an ONNX file, or a state_dict used with "
                "package.module:Attr --weights; or pass --trust-pickle if you trust where this file came from"
            ) from None
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise BuildError(f"cannot read {path} as a PyTorch file: {e}") from None
    if isinstance(obj, torch.nn.Module):
        return obj
    if isinstance(obj, dict):
        raise BuildError(f"{path} is a state_dict without its architecture: give the model as "
                         "package.module:Attr and this file as --weights")
    raise BuildError(f"{path} holds a {type(obj).__name__}, not a model")


def _is_torchscript(path: str) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("/constants.pkl") or n.startswith("code/") or "/code/" in n for n in z.namelist())


def export_module(module, input_shape, inputs=None, input_dtype="float32"):
    """Export an nn.Module (or ScriptModule) to ONNX with a dynamic batch dimension, from examples of zeros
    (zeros are valid token ids too). `inputs`: the names of its inputs (its forward takes them
    positionally), `input_shape` then a list of one shape per input; by default one input, "input", of
    shape `input_shape`. `input_dtype`: INPUT_DTYPES, one for every input or a list of one per input."""
    import onnx
    import torch

    module = module.eval()
    # nn.Dropout modules export in training mode (a Dropout node that prep.graph keeps), so that fit applies
    # them as model.train() does; everything else in eval mode (batch-norm in its inference form)
    dropouts = [m for m in module.modules() if type(m) is torch.nn.Dropout and m.p > 0] \
        if isinstance(module, torch.nn.Module) and not isinstance(module, torch.jit.ScriptModule) else []
    for m in dropouts:
        m.train()
    names = check_input_names(inputs) if inputs else ["input"]
    shapes = [tuple(s) for s in input_shape] if inputs else [tuple(input_shape)]
    dtypes = list(input_dtype) if isinstance(input_dtype, (list, tuple)) else [input_dtype] * len(shapes)
    if len(dtypes) != len(shapes):
        raise BuildError(f"{len(dtypes)} input dtypes (--input-dtype) for {len(shapes)} inputs ({', '.join(names)})")
    for d in dtypes:
        if d not in INPUT_DTYPES:
            raise BuildError(f"--input-dtype must be one of {', '.join(INPUT_DTYPES)}, got {d!r}")
    examples = tuple(torch.zeros((2,) + s, dtype=getattr(torch, d)) for s, d in zip(shapes, dtypes))
    shown = tuple(input_shape) if not inputs else "; ".join(str(s) for s in shapes)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # keep_initializers_as_inputs: the exporter otherwise merges parameters of equal value
            # (two zero-initialised biases become one). PRESERVE (with the module in eval mode)
            # keeps BatchNormalization nodes, so prep.fold folds them under the conv's names.
            torch.onnx.export(
                module, examples, buf, dynamo=False, opset_version=OPSET,
                input_names=names, output_names=["output"],
                dynamic_axes={**{n: {0: "batch"} for n in names}, "output": {0: "batch"}},
                do_constant_folding=True, keep_initializers_as_inputs=True,
                training=torch.onnx.TrainingMode.PRESERVE,
            )
        except Exception as e:
            hint = "; token ids (an nn.Embedding's input) need --input-dtype int64" if "float32" in dtypes and \
                "scalar types: Long, Int" in str(e) else ""
            raise BuildError(f"ONNX export failed for input shape {shown}: "
                             f"{' '.join(str(e).split())[:400]}{hint}") from None
        finally:
            for m in dropouts:
                m.eval()
    return onnx.load_from_string(buf.getvalue())


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
        prop = model.metadata_props.add()
        prop.key, prop.value = TRANSPOSED_KEY, json.dumps(sorted(transposed))
    if reshaped:
        _set_meta(model, STATE_SHAPES_KEY, dict(sorted(reshaped.items())))
    return model


def initializer_arrays(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
