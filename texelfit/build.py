"""The build pipeline: each stage a pure function of the previous stage's value.

    prep.load -> ONNX (onnxsim) -> prep.graph (IR) -> prep.fold -> prep.fuse -> prep.layout
      -> codegen.schedule -> codegen.render -> files in DIR
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from texelfit.codegen.render import model_context, render_bundle, report
from texelfit.codegen.schedule import build_schedule
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.fuse import fuse_activations
from texelfit.prep.graph import to_ir
from texelfit.prep.ir import Graph
from texelfit.prep.layout import LayoutPlan, check_layout, plan_layout
from texelfit.prep.load import BuildError, load_onnx

LOSSES = ("cross_entropy", "mse")


@dataclass
class BuildResult:
    graph: Graph
    plan: LayoutPlan
    files: dict[str, str]  # file name -> text
    report: dict


def compile_onnx(model, *, name: str, input_shape=None, max_batch: int = 64,
                 loss: str = "cross_entropy") -> BuildResult:
    if not name.replace("_", "").replace("-", "").isalnum():
        raise BuildError(f"--name {name!r} must be letters, digits, '-' and '_' only")
    if not isinstance(max_batch, int) or not 1 <= max_batch <= 4096:
        raise BuildError(f"--max-batch must be an integer from 1 to 4096, got {max_batch}")
    if loss not in LOSSES:
        raise BuildError(f"--loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    graph = fuse_activations(fold_batchnorm(to_ir(model, input_shape)))
    if not graph.params:
        raise BuildError("the model has no trainable weights")
    plan = plan_layout(graph, max_batch)
    check_layout(plan)
    schedule = build_schedule(graph, plan)
    ctx = model_context(name, graph, plan, schedule, max_batch, loss)
    files = render_bundle(ctx)
    rep = report(name, graph, plan, ctx, files)
    files["report.json"] = json.dumps(rep, indent=2, sort_keys=True) + "\n"
    return BuildResult(graph, plan, files, rep)


def build(source: str, out: str, *, name: str | None = None, weights: str | None = None, input_shape=None,
          max_batch: int = 64, loss: str = "cross_entropy", quantize: str = "none", prune: float = 0.0,
          trust_pickle: bool = False) -> BuildResult:
    if quantize != "none":
        raise BuildError(f"--quantize {quantize} is not yet supported (only none)")
    if prune != 0:
        raise BuildError(f"--prune {prune} is not yet supported (only 0)")
    if name is None:
        base = os.path.basename(source.rstrip("/")).split(":")[-1]
        name = os.path.splitext(base)[0].replace(".", "_") or "model"
    model = load_onnx(source, weights=weights, input_shape=input_shape, trust_pickle=trust_pickle)
    result = compile_onnx(model, name=name, input_shape=input_shape, max_batch=max_batch, loss=loss)
    write_files(out, result.files)
    return result


def write_files(out: str, files: dict[str, str]) -> None:
    os.makedirs(out, exist_ok=True)
    for fname, text in files.items():
        with open(os.path.join(out, fname), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
