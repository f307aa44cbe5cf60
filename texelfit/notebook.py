"""The notebook API, for people who live in Python (issue 32): an nn.Module in, a bundle out, and the weights the
page trained back into the module.

    report = texelfit.export(model, torch.randn(1, 3, 32, 32), "dist/net", max_batch=32)
    ...  # the page fine-tunes it and saves JSON.stringify of getWeights() with arrays as lists
    texelfit.load_weights(model, "weights.json", torch.randn(1, 3, 32, 32))

`export` is `texelfit build` of the module itself (as torch.onnx.export takes it): the per-sample input shapes and
dtypes come from the examples (their first axis is the batch), the input names from the forward's parameters
(several inputs) or "input" (one). It leaves the module as it found it: parameters, buffers and each submodule's
train/eval mode.

`load_weights` is `texelfit import-weights` into the module: the JSON of getWeights (or a state_dict file) is
copied into the module's parameters, all or nothing. Where the bundle folded a batch-norm into the layer before
it (prep/fold.py), the file holds the folded layer; that is unfolded into the module so that the module in eval
mode computes what the page does: the layer's weight divided by the batch-norm's scale s = gamma / sqrt(var + eps)
per output channel, and the batch-norm's shift (or, without one, the layer's bias) solved for the folded bias.
Which layer a batch-norm folded into is read from the model's graph, so the examples are needed then.
"""
from __future__ import annotations

import inspect

import numpy as np

from texelfit.prep.errors import BuildError
from texelfit.prep.load import INPUT_DTYPES, check_input_names


def example_spec(model, example_inputs, inputs=None):
    """(input names or None for one input, per-sample shapes (one shape for one input), dtypes) of the examples:
    a tensor, a tuple or list of tensors (the forward's positional arguments), or a dict keyed by the forward's
    parameter names (in its order, from the first)."""
    import torch

    if isinstance(example_inputs, torch.Tensor):
        tensors, names = [example_inputs], None
    elif isinstance(example_inputs, dict):
        params = _forward_names(model)
        unknown = [k for k in example_inputs if k not in params]
        if unknown:
            raise BuildError(f"example_inputs: {', '.join(map(repr, unknown))} is not a parameter of "
                             f"{type(model).__name__}.forward ({', '.join(params) or 'none named'})")
        names = [p for p in params if p in example_inputs]
        if names != params[:len(names)]:
            skipped = [p for p in params[:params.index(names[-1])] if p not in names]
            raise BuildError(f"example_inputs: the forward takes its inputs by position, and the dict skips "
                             f"{', '.join(skipped)}; give every input up to {names[-1]!r}, or a tuple in the forward's order")
        tensors = [example_inputs[n] for n in names]
    elif isinstance(example_inputs, (tuple, list)) and example_inputs:
        tensors = list(example_inputs)
        names = None if len(tensors) == 1 else (_forward_names(model)[:len(tensors)] or None)
        if names is not None and len(names) < len(tensors):
            names = None
    else:
        raise BuildError("example_inputs must be a tensor, a tuple of tensors (the forward's arguments) or a dict "
                         f"of them keyed by the forward's parameter names, got {type(example_inputs).__name__}")
    if inputs is not None:
        names = check_input_names(inputs)
        if len(names) != len(tensors):
            raise BuildError(f"inputs names {len(names)} input(s) ({', '.join(names)}) for {len(tensors)} example(s)")
    elif len(tensors) > 1 and names is None:
        names = [f"input{i}" for i in range(len(tensors))]
    if names is not None:
        try:
            names = check_input_names(names)
        except BuildError:  # (forward(self, x, *rest) and the like: plain names instead)
            names = [f"input{i}" for i in range(len(tensors))]
    shapes, dtypes = [], []
    for i, t in enumerate(tensors):
        what = f"example input {names[i] if names else 'input'!r}"
        if not isinstance(t, torch.Tensor):
            raise BuildError(f"{what} is a {type(t).__name__}, not a tensor")
        if t.dim() < 1:
            raise BuildError(f"{what} is a scalar: its first axis is the batch (give a batch of one: x[None])")
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in INPUT_DTYPES:
            raise BuildError(f"{what} is {dtype}: inputs are {', '.join(INPUT_DTYPES)}")
        shapes.append(tuple(int(s) for s in t.shape[1:]))
        dtypes.append(dtype)
    if names is None:
        return None, shapes[0], dtypes[0]
    return names, shapes, dtypes


def _forward_names(model) -> list[str]:
    """The forward's positional parameter names, in order."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


class _Kept:
    """The module's parameters, buffers and train/eval modes, put back on exit (the export sets eval mode)."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.modes = [(m, m.training) for m in self.model.modules()]
        self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return self

    def __exit__(self, *exc):
        import torch

        for m, training in self.modes:
            m.training = training
        with torch.no_grad():
            for k, v in self.model.state_dict(keep_vars=True).items():
                v.copy_(self.state[k])
        return False


def _data(data, what):
    """A (x, y) pair of arrays or tensors as build's Data (None stays None)."""
    from texelfit.data import Data

    if data is None or isinstance(data, Data):
        return data
    try:
        x, y = data
    except (TypeError, ValueError):
        raise BuildError(f"{what} must be a pair (x, y) of arrays or tensors") from None
    x, y = (np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for v in (x, y))
    return Data(x, y, f"{what} ({len(x)} samples)")


def export(model, example_inputs, out_dir: str, *, name: str | None = None, inputs=None, **build_options) -> dict:
    """Build the bundle of `model` (an nn.Module) into `out_dir`, as `texelfit build` does; returns the report
    (what report.json holds). `example_inputs`: a tensor, a tuple or a dict of them, with a batch axis first
    (only their shapes and dtypes are read); `inputs`: the input names (default: the forward's parameter names
    for several inputs, "input" for one); `name`: the bundle's (default: the module's class name).
    `build_options`: texelfit.build.compile_onnx's, as the CLI's flags name them (max_batch, loss, quantize,
    prune, trainable, input_normalize, weights_file, tokenizer, memory_budget, finetune_epochs, finetune_lr,
    and finetune_data and eval_data as (x, y) pairs)."""
    import torch

    from texelfit.build import compile_onnx, write_files
    from texelfit.prep.load import export_simplified

    if not isinstance(model, torch.nn.Module):
        raise BuildError(f"texelfit.export takes an nn.Module, got {type(model).__name__} (for a file: texelfit build)")
    names, shapes, dtypes = example_spec(model, example_inputs, inputs)
    for key in ("finetune_data", "eval_data"):
        if key in build_options:
            build_options[key] = _data(build_options[key], key)
    with _Kept(model):
        onnx_model = export_simplified(model, shapes, names, dtypes)
    result = compile_onnx(onnx_model, name=name or type(model).__name__, input_shape=shapes, input_dtype=dtypes,
                          **build_options)
    write_files(out_dir, result.files)
    return result.report


def read_weights_file(path: str) -> dict[str, np.ndarray]:
    """The JSON of getWeights (arrays as lists), or a state_dict saved by torch.save (texelfit import-weights'
    .pt, or a checkpoint dict holding one under "state_dict")."""
    from texelfit.importer import read_weights

    if path.endswith(".json"):
        return read_weights(path)
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises many kinds for a file that is not a state_dict)
        raise BuildError(f"cannot read weights {path}: not the JSON of getWeights (.json) nor a state_dict "
                         f"(torch.save): {' '.join(str(e).split())[:200]}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BuildError(f"{path} is not a state_dict (a dict of tensor name -> tensor)")
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in state.items()}



def load_weights(model, path: str, example_inputs=None, *, partial: bool = False) -> dict:
    """Copy the weights in `path` (the JSON of getWeights, or a state_dict file) into `model`'s parameters, all
    or none (a file that does not fit changes nothing). A batch-norm the bundle folded into the layer before it
    is unfolded (see the module's docstring), which needs `example_inputs` (as given to export) to find that
    layer: a model with a batch-norm whose tensors the file lacks needs them. `partial`: the file may hold some
    of the parameters only (a trained head); the others keep their values. Returns {"loaded": the state_dict
    keys written, "unfolded": {layer weight: batch-norm}}."""
    import torch

    weights = read_weights_file(path)
    state = model.state_dict(keep_vars=True)
    norms = {p: m for p, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    absent = [p for p, m in norms.items() if not (m.affine and f"{p}.weight" in weights and f"{p}.bias" in weights)]
    new: dict[str, np.ndarray] = {}
    used, kept, unfolded = set(), set(), {}
    if absent:
        if example_inputs is None:
            raise BuildError(f"{path} lacks the tensors of batch-norm {', '.join(absent)}: the bundle folds a "
                             "batch-norm into the layer before it, so load_weights needs example_inputs (as given to "
                             "export) to find that layer and unfold the trained tensors into both")
        for fold in _folds(model, example_inputs):
            if fold["weight"] not in weights and fold["bias"] not in weights:
                continue  # (a frozen layer, not in a partial file: nothing trained there)
            new.update(_unfold(fold, weights, state, path))
            used |= {fold["weight"], fold["bias"]}
            kept |= {f"{fold['norm']}.weight", fold["bias"]}  # (unchanged: the fold's scale, the layer's own bias)
            unfolded[fold["weight"]] = fold["norm"]
    for key, w in weights.items():
        if key in used:
            continue
        if key not in state:
            raise BuildError(f"{path}: {key!r} is no tensor of {type(model).__name__} "
                             f"(its parameters: {', '.join(n for n, _ in model.named_parameters())})")
        if w.size != state[key].numel() or not np.isfinite(w).all():
            raise BuildError(f"{path}: {key!r} has {w.size} values (expected {state[key].numel()}, all finite)")
        new[key] = w.reshape(tuple(state[key].shape))
    ties = {}
    for key in new:  # a tied parameter comes under each of its keys (getWeights gives both): one value
        t = state[key]
        if id(t) in ties and not np.array_equal(new[ties[id(t)]], new[key]):
            raise BuildError(f"{path}: {ties[id(t)]!r} and {key!r} are one tied parameter, but hold different values")
        ties.setdefault(id(t), key)
    missing = [n for n, p in model.named_parameters() if id(p) not in ties and n not in kept]
    if missing and not partial:
        raise BuildError(f"{path} lacks {', '.join(missing)} (for a file of some tensors only, a trained head: "
                         "partial=True)")
    with torch.no_grad():
        for key, w in new.items():
            state[key].copy_(torch.from_numpy(np.ascontiguousarray(w)).to(state[key].dtype))
    return {"loaded": sorted(new), "unfolded": unfolded}


def _folds(model, example_inputs) -> list[dict]:
    """The batch-norms the build folds (prep/fold.py: fold_batchnorm, folds_into), each a dict: the layer's op,
    weight and bias (the bias the fold writes: the layer's own, or the one it gains), its weight's IR shape and
    transposed flag, its groups, and the batch-norm's module name (norm)."""
    import dataclasses

    from texelfit.prep.fold import folds_into
    from texelfit.prep.graph import to_ir
    from texelfit.prep.load import export_simplified

    names, shapes, dtypes = example_spec(model, example_inputs)
    with _Kept(model):
        graph = to_ir(export_simplified(model, shapes, names, dtypes), shapes, dtypes)
    modules = dict(model.named_modules())
    before, folds, params = [], [], set(graph.params)
    for layer in graph.layers:
        prev = folds_into(layer, before, graph) if layer.op == "batchnorm" else None
        if prev is None:
            before.append(layer)
            continue
        if any(f["layer"] is prev for f in folds):
            raise BuildError(f"batch-norm {layer.name!r} folds into {prev.name!r} after another one: two batch-norms "
                             "in a row cannot be unfolded; load the weights with texelfit import-weights instead")
        w = graph.params[prev.params["weight"]]
        bias = prev.params.get("bias")
        if bias is None:  # (prep/fold.py's name for the bias the layer gains)
            bias = (w.name[: -len("weight")] if w.name.endswith("weight") else w.name + ".") + "bias"
            while bias in params:
                bias += "_"
            params.add(bias)
        norm = _norm_module(layer, modules)
        folded = dataclasses.replace(prev, outputs=list(layer.outputs))
        before[before.index(prev)] = folded
        folds.append({"layer": folded, "op": prev.op, "weight": w.name, "bias": bias, "shape": w.array.shape,
                      "transposed": w.transposed, "groups": prev.attrs.get("groups", 1), "norm": norm,
                      "eps": float(modules[norm].eps),
                      "own_bias": "bias" in prev.params})
    return folds


def _norm_module(layer, modules) -> str:
    """The module name of the batch-norm an IR batchnorm layer came from: by its parameters' names, else by its
    running mean."""
    names = layer.attrs.get("names")
    if names:
        return names[0].rsplit(".", 1)[0]
    mean = np.asarray(layer.attrs["mean"], dtype=np.float32)
    hits = [p for p, m in modules.items() if getattr(m, "running_mean", None) is not None
            and m.running_mean.numel() == mean.size and np.array_equal(m.running_mean.detach().numpy(), mean)]
    if len(hits) != 1:
        raise BuildError(f"cannot tell which batch-norm module node {layer.name!r} is (its running mean matches "
                         f"{len(hits)} of them)")
    return hits[0]


def _unfold(fold, weights, state, path) -> dict[str, np.ndarray]:
    """The module's tensors for a folded layer's trained weight W' and bias b': W = W' / s per output channel, and
    the batch-norm's shift beta = b' - (b - mean) * s (b the layer's own bias, or 0); without a shift, the layer's
    bias b = b' / s + mean. The module then computes (W x + b - mean) * s + beta = W' x + b' in eval mode."""
    p = fold["norm"]
    gamma = state[f"{p}.weight"].detach().double().numpy() if f"{p}.weight" in state else 1.0
    mean = state[f"{p}.running_mean"].detach().double().numpy()
    var = state[f"{p}.running_var"].detach().double().numpy()
    s = gamma / np.sqrt(var + fold["eps"])
    if not np.all(s != 0):
        raise BuildError(f"batch-norm {p} has a zero scale (weight 0) on a channel: the layer before it cannot be "
                         "unfolded from the bundle's folded weights")
    for a, b in ((fold["weight"], fold["bias"]), (fold["bias"], fold["weight"])):
        if b not in weights:
            raise BuildError(f"{path} has {a!r} but not {b!r}: batch-norm {p} was folded into both, and they "
                             "unfold together")
    w = weights[fold["weight"]].astype(np.float64).reshape(fold["shape"])
    b_folded = weights[fold["bias"]].astype(np.float64).reshape(-1)
    if fold["op"] == "conv":
        w = w / s.reshape((-1,) + (1,) * (w.ndim - 1))
    elif fold["op"] == "conv_transpose":  # [IC, OCg, ...]: output channel g*OCg + j of group g
        g = fold["groups"]
        w = (w.reshape((g, -1) + w.shape[1:]) / s.reshape((g, 1, -1) + (1,) * (w.ndim - 2))).reshape(w.shape)
    else:
        w = w / (s[None, :] if fold["transposed"] else s[:, None])
    out = {fold["weight"]: w.reshape(tuple(state[fold["weight"]].shape)).astype(np.float32)}
    b = state[fold["bias"]].detach().double().numpy() if fold["own_bias"] else np.zeros_like(s)
    if f"{p}.bias" in state:
        out[f"{p}.bias"] = (b_folded - (b - mean) * s).astype(np.float32)
    elif fold["own_bias"]:
        out[fold["bias"]] = (b_folded / s + mean).astype(np.float32)
    else:
        raise BuildError(f"{fold['weight']!r} has no bias and batch-norm {p} no shift: the folded bias "
                         f"{fold['bias']!r} has no place in the module")
    return out
