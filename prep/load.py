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
import os
import pickle
import sys
import warnings
import zipfile


from .errors import BuildError  # noqa: F401 (every stage raises it; re-exported for older imports)
from .naming import (ALIASES_KEY, FOLDED_KEY, PADDING_IDX_KEY, PARAMETERS_KEY, UNUSED_KEY, claim_parameters, marks_of,
                     padding_indices, restore_state_dict_names, set_meta, write_parameters)
from .gathered import whole_reads
from .recurrent import unrolled
from .recurrent_onnx import unroll_recurrent_nodes
from .simplify import simplify, simplify_onnx_file

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
    marks = marks_of(real)
    write_parameters(named, marks)
    try:  # (not under no_grad: nn.TransformerEncoderLayer would take its fused fast path, which has no export)
        # (a TorchScript module's nn.LSTM exports as an LSTM node, which the build takes as the steps it computes)
        exported = unroll_recurrent_nodes(export_module(module, input_shape, inputs, input_dtype))
    finally:
        write_parameters(named, real)
    values = {n: t.numpy() for n, t in real.items()}
    claimed, folded = claim_parameters(exported, marks, values)
    unused = set(_without_gradient(module, input_shape, inputs, input_dtype, folded)) if folded else set()
    folded = {n: why for n, why in folded.items() if n not in unused}
    model = whole_reads(simplify(exported, protect=claimed))  # (prep/gathered.py)
    kept = {i.name.split("@")[0] for i in model.graph.initializer}
    unused |= {n.split("@")[0] for n in claimed} - kept  # read only by what onnxsim found dead
    buffer_names = set(dict(module.named_buffers()))  # (a tied parameter's second state_dict key is no buffer)
    buffers = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items() if k in buffer_names}
    model = restore_state_dict_names(model, buffers)
    set_meta(model, PARAMETERS_KEY, sorted(named))
    first = {id(p): n for n, p in named.items()}
    aliases = {k: first[id(v)] for k, v in module.state_dict(keep_vars=True).items()
               if k not in named and id(v) in first}
    if aliases:
        set_meta(model, ALIASES_KEY, dict(sorted(aliases.items())))
    if folded:
        set_meta(model, FOLDED_KEY, dict(sorted(folded.items())))
    if unused:
        set_meta(model, UNUSED_KEY, sorted(unused))
    padding = padding_indices(module)
    if padding:
        set_meta(model, PADDING_IDX_KEY, padding)
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
    outputs = output_names(module, examples)
    shown = tuple(input_shape) if not inputs else "; ".join(str(s) for s in shapes)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # keep_initializers_as_inputs: the exporter otherwise merges parameters of equal value
            # (two zero-initialised biases become one). PRESERVE (with the module in eval mode)
            # keeps BatchNormalization nodes, so prep.fold folds them under the conv's names.
            with unrolled(module):  # nn.LSTM and nn.GRU as the steps they compute (prep/recurrent.py)
                torch.onnx.export(
                    module, examples, buf, dynamo=False, opset_version=OPSET,
                    input_names=names, output_names=outputs,
                    dynamic_axes={n: {0: "batch"} for n in names + outputs},
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


def output_names(module, examples) -> list[str]:
    """The names of the module's outputs as the exporter flattens them (predict's keys where there are several):
    "output" for one tensor; a dict's keys (a Hugging Face ModelOutput's fields that are set), a named tuple's
    fields, or output0, output1, ... for a tuple, joined by "_" where nested."""
    import torch

    # (on the examples, as the export runs it; the random state as it was: dropout in training mode draws)
    with torch.no_grad(), torch.random.fork_rng(), unrolled(module):
        try:
            result = module(*examples)
        except Exception:  # (the export that follows fails and says why, as it always has)
            return ["output"]

    def walk(x, prefix):
        if isinstance(x, torch.Tensor):
            return [prefix]
        if isinstance(x, dict):
            items = [(str(k), v) for k, v in x.items() if v is not None]
        elif isinstance(x, tuple) and hasattr(x, "_fields"):
            items = list(zip(x._fields, x))
        elif isinstance(x, (tuple, list)):
            items = [(f"output{i}" if not prefix else str(i), v) for i, v in enumerate(x)]
        else:
            return []
        return [n for k, v in items for n in walk(v, f"{prefix}_{k}" if prefix else k)]

    names = walk(result, "")
    if len(names) <= 1:
        return ["output"]
    clean = ["".join(c if c.isalnum() or c == "_" else "_" for c in n) for n in names]
    return clean if len(set(clean)) == len(clean) else [f"output{i}" for i in range(len(names))]
