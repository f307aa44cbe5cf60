"""The build pipeline: each stage a pure function of the previous stage's value.

    prep.load -> ONNX (onnxsim) -> prep.graph (IR) -> prep.fold -> prep.prune [-> fine-tune in PyTorch]
      -> prep.quantize -> prep.fuse -> codegen.webgl2.layout -> codegen.schedule -> codegen.render -> files in DIR

Defaults: `--quantize none` and `--prune 0`. A first bundle should be the user's model, exactly: its
predictions match PyTorch to float32 rounding, so the page can be checked against the model it came
from. Both reductions change the model and are one flag away: `--quantize fp16` halves the weights
(relative error <= 2^-11 a weight, rarely visible in accuracy), `--quantize int8` quarters them, and
`--prune R` removes channels (check the accuracy the build prints; `--finetune-epochs` recovers most
of it). Channel counts are rounded to multiples of 4 unless `round_channels=False`.

When evaluation data is known (the digits for the example models, or `eval_data`), the report
records the accuracy before pruning, after pruning, after fine-tuning and of the shipped weights.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from dataclasses import dataclass

from texelfit.codegen.render import model_context, render_bundle, report
from texelfit.codegen.memory import check_layout, plan_memory, plan_storage, planned_peak, role_bytes
from texelfit.codegen.schedule import build_schedule
from texelfit.data import Data, check_data, digits_data, evaluate, load_data
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.fuse import fuse_activations
from texelfit.prep.graph import to_ir
from texelfit.prep.ir import Graph
from texelfit.codegen.webgl2.layout import LayoutPlan, plan_layout
from texelfit.prep.errors import BuildError
from texelfit.prep.load import load_onnx
from texelfit.prep.trust import check_trainable, selected
from texelfit.prep.prune import apply_prune, check_ratio, plan_prune
from texelfit.prep.quantize import MODES, Quantized, quantize as quantize_weights
from texelfit.tokenizer import load_tokenizer, tokenizer_input

LOSSES = ("cross_entropy", "mse")
DEFAULT_QUANTIZE = "none"
DEFAULT_PRUNE = 0.0
FINETUNE_LR = 1e-3
WEIGHTS_FILE_BYTES = 4 * 1024 * 1024  # weights over 4 MiB go into NAME.weights.bin by default
DEFAULT_MAX_BATCH = 64
# The memory a default --max-batch must fit (codegen/memory.py: plan_memory's peak): GPU memory that a
# phone or a laptop can be expected to give one page. --max-batch given explicitly is kept as given.
DEFAULT_MEMORY_BUDGET = 10 ** 9


@dataclass
class BuildResult:
    graph: Graph
    plan: LayoutPlan
    files: dict[str, str | bytes]  # file name -> text (bytes: NAME.weights.bin)
    report: dict
    weights: Quantized | None = None


def compile_onnx(model, *, name: str, input_shape=None, max_batch: int | None = None, loss: str = "cross_entropy",
                 quantize: str = DEFAULT_QUANTIZE, prune: float = DEFAULT_PRUNE, round_channels: bool = True,
                 finetune_epochs: int = 0, finetune_data: Data | None = None, finetune_lr: float = FINETUNE_LR,
                 eval_data: Data | None = None, progress: bool = False, trainable: str = "*",
                 input_normalize: str = "none", weights_file: bool | None = None,
                 input_dtype: str | None = None, tokenizer: str | None = None,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, transfer_piece_bytes: int | None = None,
                 webgpu: bool = False) -> BuildResult:
    """`max_batch`: `--max-batch`; None (not given): DEFAULT_MAX_BATCH, or the largest batch below it whose
    planned memory (codegen/memory.py: plan_memory) fits `memory_budget` bytes (`--memory-budget`), the
    report saying so (report["memory"]["reduced_from"]). `input_normalize`: `--input-normalize`
    (texelfit/images.py); `weights_file`: ship the weights in NAME.weights.bin beside NAME.js (True),
    embedded (False), or the former when they exceed WEIGHTS_FILE_BYTES (None, the default); `input_dtype`:
    `--input-dtype` (prep/load.py: INPUT_DTYPES), which must be what the model declares (None: whatever it
    declares). `tokenizer`: `--tokenizer PATH` (texelfit/tokenizer.py), a vocab.txt or a folder holding one:
    the bundle gets m.fromText; the vocabulary always goes into NAME.js, also beside a weights file (text,
    a few hundred KB, needed before the weights are). `transfer_piece_bytes`: the most bytes the runtime
    moves in one upload or readback buffer (codegen/render.py: TRANSFER_PIECE_BYTES when None; for tests).
    `webgpu`: `--webgpu`, the kernels as WGSL too: the bundle runs on WebGPU (createModel({ backend: 'webgpu' }))."""
    if not name.replace("_", "").replace("-", "").isalnum():
        raise BuildError(f"--name {name!r} must be letters, digits, '-' and '_' only")
    if max_batch is not None and (not isinstance(max_batch, int) or not 1 <= max_batch <= 4096):
        raise BuildError(f"--max-batch must be an integer from 1 to 4096, got {max_batch}")
    if not isinstance(memory_budget, int) or memory_budget < 1:
        raise BuildError(f"--memory-budget must be a positive number of bytes, got {memory_budget!r}")
    if loss not in LOSSES:
        raise BuildError(f"--loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if quantize not in MODES:
        raise BuildError(f"--quantize must be one of {', '.join(MODES)}, got {quantize!r}")
    prune = check_ratio(prune)
    if not isinstance(finetune_epochs, int) or finetune_epochs < 0:
        raise BuildError(f"--finetune-epochs must be an integer >= 0, got {finetune_epochs!r}")
    if finetune_epochs and finetune_data is None:
        raise BuildError("--finetune-epochs needs data: give --finetune-data FILE.npz (arrays x and y); "
                         "only the example models know theirs")

    if weights_file not in (None, True, False):
        raise BuildError(f"weights_file must be True, False or None, got {weights_file!r}")
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    imported = to_ir(model, input_shape, input_dtype, trains=lambda n: selected(trainable, n))
    parameters = check_trainable(model, imported, trainable)  # what trains is what PyTorch trains (prep/trust.py)
    if len(imported.inputs) > 1:
        if input_normalize != "none":
            raise BuildError(f"--input-normalize is for a model with one image input; this one has "
                             f"{len(imported.inputs)} inputs ({', '.join(imported.inputs)})")
        if eval_data is not None or finetune_data is not None:
            raise BuildError("--eval-data and --finetune-data hold one array x: they are not supported yet for a "
                             f"model with several inputs ({', '.join(imported.inputs)})")
    if len(imported.outputs) > 1 and (eval_data is not None or finetune_data is not None):
        raise BuildError("--eval-data and --finetune-data hold one array y: they are not supported yet for a model "
                         f"with several outputs ({', '.join(imported.output_names)})")
    image = image_input(imported.input_shape, input_normalize)
    length = tokenizer_input(tok, imported.input_shape)
    full = fold_batchnorm(imported)
    if not full.weight_names():
        raise BuildError("the model has no trainable weights")
    trains = resolve_trainable(trainable, full.weight_names())
    if eval_data is not None:
        eval_data = check_data(eval_data, full, loss, "--eval-data")
    if finetune_data is not None:
        finetune_data = check_data(finetune_data, full, loss, "--finetune-data")

    acc: dict = {}
    if eval_data is not None:
        acc = {"data": eval_data.what, "samples": int(len(eval_data.y))}
        acc.update(evaluate(full, eval_data, "before"))
    prune_plan = plan_prune(full, prune, round_to=4 if round_channels else 1)
    graph = apply_prune(full, prune_plan)
    if eval_data is not None and prune:
        acc.update(evaluate(graph, eval_data, "after_prune"))
    if finetune_epochs:
        from texelfit.train import finetune_graph

        graph = finetune_graph(graph, finetune_data.x, finetune_data.y, epochs=finetune_epochs, lr=finetune_lr,
                               loss=loss, progress=progress)
        if eval_data is not None:
            acc.update(evaluate(graph, eval_data, "after_finetune"))
    weights = quantize_weights(graph, quantize)
    if eval_data is not None:
        acc.update(evaluate(weights.graph, eval_data, "after_quantize"))

    graph = dataclasses.replace(fuse_activations(weights.graph), trainable=trains)
    plan, schedule, storage, memory, max_batch = plan_batch(graph, max_batch, memory_budget)
    if weights_file is None:
        weights_file = len(weights.blob) > WEIGHTS_FILE_BYTES
    text = {"record": tok.record(length), "vocab": tok.vocab} if tok is not None else None
    ctx = model_context(name, graph, plan, schedule, max_batch, loss, weights, storage, image=image,
                        weights_file=weights_file, tokenizer=text, memory=memory, webgpu=webgpu,
                        **({} if transfer_piece_bytes is None else {"transfer_piece_bytes": transfer_piece_bytes}))
    files = render_bundle(ctx)
    if weights_file:
        files[ctx["weights_file"]["name"]] = weights.blob
    rep = report(name, graph, plan, ctx, files)
    trunk = graph.trunk()
    trunk_bytes = plan.textures[plan.tensor(trunk)].width * plan.textures[plan.tensor(trunk)].sample_rows * 16 if trunk else 0
    rep["texture_bytes_by_role"] = role_bytes(plan, storage, trunk_bytes)
    rep["trainable"] = graph.trainable_params()
    # constants too big to bake into a kernel, shipped as frozen textures (prep/ir.py: Param.constant)
    rep["constants"] = [{"name": n, "shape": list(graph.params[n].array.shape), "values": int(graph.params[n].array.size)}
                        for n in graph.constants()]
    rep["trainable_set"] = parameters
    rep["batchnorm_folded"] = sum(layer.op == "batchnorm" for layer in imported.layers) - \
        sum(layer.op == "batchnorm_affine" for layer in full.layers)
    rep["max_batch"] = max_batch
    rep["memory"] = memory
    rep["trunk"] = trunk
    rep["input_normalize"] = image  # fromImages' preprocessing (texelfit.images.preprocess takes it as is)
    rep["tokenizer"] = tok.report(length) if tok is not None else None  # fromText's tokenizer, or None
    rep["weights_file"] = ctx["weights_file"]  # {name, bytes, crc32} of NAME.weights.bin, or None: embedded

    from texelfit.report import layer_table

    rep["table"] = layer_table(fuse_activations(full), graph, plan, weights)
    rep["prune"] = prune_plan.report()
    rep["prune"]["finetune_epochs"] = finetune_epochs
    rep["quantize"] = weights.report()
    rep["accuracy"] = acc or None
    files["report.json"] = json.dumps(rep, indent=2, sort_keys=True) + "\n"
    return BuildResult(graph, plan, files, rep, weights)


def plan_batch(graph: Graph, max_batch: int | None, budget: int):
    """(plan, schedule, storage, memory, max_batch) at `max_batch`; when it is None, at DEFAULT_MAX_BATCH or,
    where that plans more than `budget` bytes, at the largest batch that fits (batch 1 when none does:
    memory["fits"] then says so). memory: plan_memory's, with the budget and the batch's story."""
    def at(batch):
        plan = plan_layout(graph, batch)
        check_layout(plan)
        schedule = build_schedule(graph, plan)
        storage = plan_storage(plan, schedule)
        memory = plan_memory(plan, storage, outputs=[plan.tensor(o) for o in graph.outputs],
                             inputs=[plan.tensor(t) for t in graph.inputs], parameters=graph.parameter_count(),
                             trains=bool(graph.trainable_params()))
        return plan, schedule, storage, memory

    batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
    planned = at(batch)
    reduced_from = None
    if max_batch is None and planned_peak(planned[3]) > budget:
        reduced_from = batch
        lo, hi, best = 1, batch - 1, None  # the largest batch that fits (memory grows with the batch)
        while lo <= hi:
            mid = (lo + hi) // 2
            trial = at(mid)
            if planned_peak(trial[3]) <= budget:
                lo, best, batch = mid + 1, trial, mid
            else:
                hi = mid - 1
        if best is None:
            batch, best = 1, at(1)
        planned = best
    plan, schedule, storage, memory = planned
    memory = {**memory, "budget": budget, "fits": planned_peak(memory) <= budget, "max_batch": batch,
              "max_batch_given": max_batch is not None, "reduced_from": reduced_from}
    return plan, schedule, storage, memory, batch


def image_input(shape, mode: str) -> dict | None:
    """What the bundle records of its image input (MODEL.image, report.json's input_normalize):
    {mode, mean, std} (one per channel) and (channels, height, width). `none`, the default, records
    nothing (None): such a bundle has no fromImages code. Any other mode needs a 1- or 3-channel
    (C, H, W) input."""
    from texelfit.images import ImageError, check_image_shape, normalization

    if mode == "none":
        return None
    try:
        c, h, w = check_image_shape(shape)
    except ImageError as e:
        raise BuildError(f"--input-normalize {mode}: {e}") from None
    try:
        norm = normalization(mode, c)
    except ImageError as e:
        raise BuildError(str(e)) from None
    return {**norm, "channels": c, "height": h, "width": w}


def resolve_trainable(patterns: str, names: list[str]) -> frozenset[str] | None:
    """`--trainable`: comma-separated fnmatch patterns over the parameter names (the state_dict names;
    a bias that batch-norm folding added is named after its weight, prep/fold.py), "*" (all: None) or
    "none" (an inference-only bundle). A pattern that matches no name fails, listing the names."""
    if not isinstance(patterns, str) or not patterns.strip():
        raise BuildError("--trainable needs comma-separated patterns over the parameter names, '*' or 'none'")
    if patterns.strip() == "none":
        return frozenset()
    chosen: set[str] = set()
    for pat in (p.strip() for p in patterns.split(",")):
        if not pat:
            raise BuildError(f"--trainable {patterns!r} has an empty pattern")
        hits = fnmatch.filter(names, pat)
        if not hits:
            raise BuildError(f"--trainable pattern {pat!r} matches no parameter; the parameters are: {', '.join(names)}")
        chosen.update(hits)
    return None if len(chosen) == len(names) else frozenset(chosen)


def build(source: str, out: str, *, name: str | None = None, weights: str | None = None, input_shape=None,
          max_batch: int | None = None, loss: str = "cross_entropy", quantize: str = DEFAULT_QUANTIZE,
          prune: float = DEFAULT_PRUNE, round_channels: bool = True, finetune_epochs: int = 0,
          finetune_data: str | None = None, finetune_lr: float = FINETUNE_LR, eval_data: str | None = None,
          trust_pickle: bool = False, progress: bool = False, trainable: str = "*", input_normalize: str = "none",
          weights_file: bool | None = None, inputs=None, input_dtype=None, tokenizer: str | None = None,
          memory_budget: int = DEFAULT_MEMORY_BUDGET, webgpu: bool = False) -> BuildResult:
    """`inputs`: the input names of a PyTorch source with several (--inputs), `input_shape` then one shape per
    input; `input_dtype`: --input-dtype (one for every input, or a list of one per input)."""
    result = compile_source(source, name=name, weights=weights, input_shape=input_shape, inputs=inputs,
                            input_dtype=input_dtype, max_batch=max_batch,
                            loss=loss, quantize=quantize, prune=prune, round_channels=round_channels,
                            finetune_epochs=finetune_epochs, finetune_data=finetune_data, finetune_lr=finetune_lr,
                            eval_data=eval_data, trust_pickle=trust_pickle, progress=progress, trainable=trainable,
                            input_normalize=input_normalize, weights_file=weights_file, tokenizer=tokenizer,
                            memory_budget=memory_budget, webgpu=webgpu)
    write_files(out, result.files)
    return result


def compile_source(source: str, *, name: str | None = None, weights: str | None = None, input_shape=None,
                   trust_pickle: bool = False, finetune_data: str | None = None, eval_data: str | None = None,
                   inputs=None, input_dtype=None, **options) -> BuildResult:
    """Load a source (and the data files named), and compile it; writes nothing."""
    from texelfit.examples import KNOWN_SOURCES

    if quantize := options.get("quantize"):
        if quantize not in MODES:
            raise BuildError(f"--quantize must be one of {', '.join(MODES)}, got {quantize!r}")
    check_ratio(options.get("prune", 0.0))
    if name is None:
        base = os.path.basename(source.rstrip("/")).split(":")[-1]
        name = os.path.splitext(base)[0].replace(".", "_") or "model"
    known = KNOWN_SOURCES.get(source)
    if known and input_shape is None:
        input_shape = known
    train = evaluate = None
    if known and not inputs and tuple(input_shape) == tuple(known):
        train, evaluate = digits_data(known)
    if finetune_data:
        train = load_data(finetune_data, "--finetune-data")
    if eval_data:
        evaluate = load_data(eval_data, "--eval-data")
    model = load_onnx(source, weights=weights, input_shape=input_shape, trust_pickle=trust_pickle, inputs=inputs,
                      input_dtype=input_dtype)
    if not options.get("finetune_epochs"):
        train = None
    return compile_onnx(model, name=name, input_shape=input_shape, finetune_data=train, eval_data=evaluate,
                        input_dtype=input_dtype, **options)


def write_files(out: str, files: dict[str, str | bytes]) -> None:
    """Text files as UTF-8 with \\n line ends; bytes (NAME.weights.bin) as they are."""
    os.makedirs(out, exist_ok=True)
    for fname, data in files.items():
        if isinstance(data, bytes):
            with open(os.path.join(out, fname), "wb") as f:
                f.write(data)
            continue
        with open(os.path.join(out, fname), "w", encoding="utf-8", newline="\n") as f:
            f.write(data)


def prune_sweep(source: str, ratios, *, weights: str | None = None, input_shape=None, trust_pickle: bool = False,
                finetune_data: str | None = None, eval_data: str | None = None, progress: bool = False,
                **options) -> list[dict]:
    """Build the source at every pruning ratio (in memory); one point per ratio: the accuracy of the
    shipped weights, the bundle's and the weights blob's bytes, and the parameter count."""
    from texelfit.examples import KNOWN_SOURCES

    if eval_data is None and source not in KNOWN_SOURCES:
        raise BuildError("prune-sweep needs evaluation data: give --eval-data FILE.npz (arrays x and y)")
    if not ratios:
        raise BuildError("--ratios is empty")
    points = []
    for r in ratios:
        res = compile_source(source, weights=weights, input_shape=input_shape, trust_pickle=trust_pickle,
                             finetune_data=finetune_data, eval_data=eval_data, prune=r, progress=progress, **options)
        acc = res.report["accuracy"]
        if acc is None:
            raise BuildError("prune-sweep needs evaluation data: give --eval-data FILE.npz (arrays x and y)")
        name = res.report["name"]
        points.append({"ratio": r, "metric": acc["metric"], "value": acc["after_quantize"],
                       "before": acc["before"], "parameters": res.report["parameters"],
                       "bundle_bytes": len(res.files[name + ".js"].encode()),
                       "weights_bytes": res.report["quantize"]["blob_bytes"], "data": acc["data"]})
    return points
