"""Render the bundle: NAME.js (one ES module), NAME.d.ts and report.json.

Validate, build a typed context, render with jinja2 (StrictUndefined). The
templates lay out precomputed values; all arithmetic happens here.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re

import numpy as np

from texelfit.prep.ir import Graph
from texelfit.prep.shape import Constant
from texelfit.codegen.webgl2.blocking import BLOCK_MIN_BATCH, COLUMN_PARTS, SAMPLE_BLOCK
from texelfit.codegen.webgl2.layout import LOSS_RING, LayoutPlan
from texelfit.prep.quantize import ENTRY, HEADER, Quantized, quantize
from texelfit.prep.quantize import VERSION as WEIGHTS_VERSION

from .kernels import UNIFORM_TYPES, render_common, template_env
from .memory import plan_memory, plan_storage, planned_peak
from .kl_wgsl import WORKGROUP
from .schedule import Schedule, serialize

VERSION = "0.1.0"
# The most bytes the runtime moves in one upload or one pixel-pack buffer (runtime/textures.js:
# TRANSFER_PIECE): a snapshot, a restore or a readback of a large model goes in pieces of it.
TRANSFER_PIECE_BYTES = 64 << 20


def _js_json(obj) -> str:
    # Deterministic, compact, and safe inside a <script>/module (no "</" sequences).
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).replace("</", "<\\/")


# Characters a string literal of the bundle writes as \u escapes: line breaks of any kind (JavaScript's
# and Python's str.splitlines'), other controls, the backtick (compact_js counts template literals by
# it) and lone surrogates; the rest goes as UTF-8 (ES modules are UTF-8).
_ESCAPED = re.compile("[\x00-\x1f\x7f-\x9f`\u2028\u2029\ud800-\udfff]")


def _js_text(text: str) -> str:
    """A JavaScript string literal of `text`: JSON, UTF-8, safe inside a <script> (no "</")."""
    lit = json.dumps(text, ensure_ascii=False).replace("</", "<\\/")
    return _ESCAPED.sub(lambda m: f"\\u{ord(m.group()):04x}", lit)


def architecture_fingerprint(graph: Graph) -> str:
    """A hash of what a checkpoint's numbers mean: the input shape, and every layer's op, attributes
    (a fused activation included), wiring and parameter shapes. Two models with the same weight
    names and shapes but a ReLU and a Tanh differ; checkpoints are scoped by it (checkpoint.js)."""
    layers = [[layer.op, layer.attrs, layer.inputs, layer.outputs,
               {role: [n, list(graph.params[n].array.shape)] for role, n in sorted(layer.params.items())}]
              for layer in graph.layers]
    head = {"input": list(graph.input_shape)}
    if len(graph.inputs) > 1:  # (a single-input model's fingerprint is as it was before multi-input models)
        head["inputs"] = [[t, list(graph.shapes[t])] for t in graph.inputs]
    if len(graph.outputs) > 1:  # (likewise)
        head["outputs"] = list(graph.outputs)
    text = json.dumps({**head, "output": graph.output, "layers": layers,
                       **({"dtypes": graph.dtypes} if graph.dtypes else {})},
                      sort_keys=True, separators=(",", ":"), default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_context(name: str, graph: Graph, plan: LayoutPlan, schedule: Schedule, max_batch: int,
                  default_loss: str, weights: Quantized | None = None, storage: dict[str, int] | None = None,
                  image: dict | None = None, weights_file: bool = False, tokenizer: dict | None = None,
                  memory: dict | None = None, transfer_piece_bytes: int = TRANSFER_PIECE_BYTES,
                  webgpu: bool = False) -> dict:
    """`weights`: the encoded blob of graph's params (prep.quantize); float32 when not given. `storage`:
    the shared storage of each texture that shares one (codegen/memory.py); planned here when not given.
    `image`: the image input's preprocessing (texelfit.build.image_input), or None. `weights_file`: the
    blob goes into NAME.weights.bin (the bundle carries its name, length and CRC-32) instead of inline.
    `tokenizer`: {"record": MODEL.tokenizer, "vocab": the tokens} (texelfit/tokenizer.py), or None: no fromText.
    `memory`: the planned memory (codegen/memory.py: plan_memory); planned here when not given.
    `transfer_piece_bytes`: TRANSFER_PIECE_BYTES (tests make it small, so that small models go in pieces).
    `webgpu`: the bundle carries its kernels as WGSL too (build --webgpu), and runs on WebGPU (runtime/webgpu.js)."""
    if storage is None:
        storage = plan_storage(plan, schedule)
    if memory is None:
        memory = plan_memory(plan, storage, outputs=[plan.tensor(o) for o in graph.outputs],
                             inputs=[plan.tensor(t) for t in graph.inputs], parameters=graph.parameter_count(),
                             trains=bool(graph.trainable_params()))
    wgsl_modules: list[str] | None = [] if webgpu else None
    kernels, sched, generated = serialize(schedule, list(plan.textures), wgsl_modules)
    if weights is None:
        weights = quantize(graph, "none")
    assert [t.name for t in weights.tensors] == list(graph.params), "the blob must hold the graph's params in order"
    params, offset = [], 0
    for p in graph.params.values():
        # decodeWeights returns the tensors one after another in the state_dict layout; the packing reads it
        spec = plan.textures["param:" + p.name]
        params.append({"name": p.name, "texture": spec.name, "shape": list(p.array.shape),
                       "offset": offset, "length": int(p.array.size), "trainable": graph.is_trainable(p.name),
                       # a big constant (Param.constant): a frozen texture that is no weight (weights.js: WEIGHTS)
                       **({"constant": True} if p.constant else {})})
        offset += int(p.array.size)
    # packing: [rows, r2, blocks, chans, s_r1, s_r2, s_b, s_c] (codegen/webgl2/layout.py); for per-sample
    # textures it describes max_batch samples, and one sample is `sampleRows` rows of it
    textures = [{"name": t.name, "width": t.width, "height": t.height, "packing": t.packing.to_json(),
                 "sampleRows": t.sample_rows, "double": t.double, "role": t.role, "storage": storage.get(t.name, -1),
                 **({"fold": t.fold} if t.fold else {})}  # (blocking.blocked_fold)
                for t in plan.textures.values()]
    out_spec = plan.textures[plan.tensor(graph.output)]
    # a column-blocked conv forward's draws (Pass.wide): MODEL.columnParts, which the runtime chooses by, only then
    wide = any(p.wide is not None for p in schedule.forward)
    model = {
        "name": name,
        "version": VERSION,
        "inputShape": list(graph.input_shape),
        "outputShape": list(graph.output_shape),
        "inputSize": int(np.prod(graph.input_shape)),
        "outputSize": int(np.prod(graph.output_shape)),
        "maxBatch": max_batch,
        "fingerprint": architecture_fingerprint(graph),  # scopes checkpoints (checkpoint.js)
        "defaultLoss": default_loss,
        "parameters": graph.parameter_count(),
        **({"webgpu": True} if webgpu else {}),  # WGSL kernels (build --webgpu): createModel({ backend: 'webgpu' })
        "forwardMacs": sum(graph.macs(layer) for layer in graph.layers),  # per sample (predict reads by it)
        # sample-blocked passes (ops/common.py: blockable): samples a fragment, and the batch they run from
        "sampleBlock": SAMPLE_BLOCK,
        "blockMinBatch": BLOCK_MIN_BATCH,
        "lossRing": LOSS_RING,
        # column-blocked forwards (blocking.column_blocked): the targets their draw into all the parts needs
        **({"columnParts": COLUMN_PARTS} if wide else {}),
        "textures": {
            "input": plan.tensor(graph.input),
            "output": out_spec.name,
        },
        # every output: {name (predict's key where there are several), shape, size, texture, loss (fit's default)}
        "outputs": output_records(graph, plan, schedule, default_loss),
        "params": params,
        # the planned peak bytes (of a fit; of a predict where nothing trains) and the largest texture's name and
        # bytes: createModel's memoryBudget is checked against them (codegen/memory.py: plan_memory)
        "memory": [planned_peak(memory), memory["largest_texture"]["name"], memory["largest_texture"]["bytes"]],
        # the parameters that train (build --trainable), and the frozen trunk's cut (Graph.trunk): its tensor,
        # the texture holding it, and its per-sample shape and size; null when there is none
        "trainable": graph.trainable_params(),
        "trunk": _trunk(graph, plan),
        # fromImages (images.js): {mode, mean, std, channels, height, width}, or null: no image input
        "image": image,
        # an integer input (token ids): its dtype and the ids it may hold, [0, idRange) (the smallest embedding
        # table reading it; 2^24, where floats stop being exact, when none does); absent for a float32 input
        **({"inputName": graph.input, "inputDtype": graph.input_dtype, "idRange": graph.id_range(graph.input) or 1 << 24}
           if graph.input_dtype != "float32" else {}),
    }
    ints = [plan.tensor(t) for t in graph.inputs if graph.dtype(t) != "float32"]
    if ints:  # the textures of integer inputs (token ids): kept float32 in the float16 tier (ids must stay exact)
        model["textures"]["ints"] = ints
    multi = len(graph.inputs) > 1
    if multi:  # a multi-input model: predict, fit and features take an object keyed by these names
        model["inputs"] = input_records(graph, plan)
    if tokenizer is not None:  # fromText (tokenizer.js); absent otherwise (no bytes in other bundles)
        model["tokenizer"] = tokenizer["record"]
    if any("u_dropout" in k["uniforms"] for k in kernels):  # dropout layers: fit sets their step's mask (fit.js)
        model["dropout"] = True  # (absent otherwise: no bytes elsewhere)
    if graph.aliases:  # a tied parameter's other state_dict keys -> its name: getWeights gives it under each, and
        model["aliases"] = dict(sorted(graph.aliases.items()))  # setWeights takes each (absent: no bytes elsewhere)
    crc = int.from_bytes(weights.blob[-4:], "little")  # the blob's last 4 bytes: CRC-32 of the rest
    file = {"name": f"{name}.weights.bin", "bytes": len(weights.blob), "crc32": crc} if weights_file else None
    return {
        "name": name,
        "model_json": _js_json(model),
        "textures_json": _js_json(textures),
        "kernels_json": _js_json(kernels),
        # a column-blocked conv forward (blocking.column_blocked): the CPU deals its generic kernel out (cpuColumns)
        "cpu_columns": any(k["consts"].get("colblock") for k in kernels),
        "has_dropout": bool(model.get("dropout")),  # dropout layers: bundle.js.j2 adds dropout.js (each step's masks)
        # the CPU functions of the kernels written in the kernel language (codegen/kl_print.py)
        "cpu_generated": generated,
        # the WGSL modules (codegen/kl_wgsl.py) a kernel's `wgsl` indexes, and their workgroup size (build --webgpu)
        "webgpu": webgpu,
        "wgsl_json": _js_json(wgsl_modules or []),
        "wgsl_workgroup": WORKGROUP,
        "transfer_piece_bytes": transfer_piece_bytes,
        "aliases": bool(graph.aliases),
        "glsl_common_json": _js_json(render_common()),
        "schedule_json": _js_json(sched),
        "model_version": VERSION,
        "weights_b64": "" if file else base64.b64encode(weights.blob).decode("ascii"),
        "weights_note": (f"{weights.mode}, {len(weights.blob)} bytes, CRC-32 {crc:08x}"
                         + (f", in {file['name']} beside this file" if file else "")),
        "weights_file": file,
        "weights_file_json": _js_json(file),
        "weights_format_json": _js_json({"version": WEIGHTS_VERSION, "header": HEADER, "entry": ENTRY}),
        # the int uniforms this bundle's kernels take
        "int_uniforms_json": _js_json([u for u, t in UNIFORM_TYPES.items()
                                       if t == "int" and any(u in k["uniforms"] for k in kernels)]),
        "input_shape": list(graph.input_shape),
        "output_shape": list(graph.output_shape),
        "param_names": [p.name for p in graph.params.values()],
        "kernel_count": len(kernels),
        "has_trunk": model["trunk"] is not None,
        "multi_input": multi,  # the runtime's code for inputs keyed by name is rendered only then
        "multi_output": len(graph.outputs) > 1,  # (bundle.d.ts: predict's Outputs and fit's Targets, keyed by name)
        "output_names": list(graph.output_names),
        "input_names": list(graph.inputs),
        "input_dtypes": [graph.dtype(t) for t in graph.inputs],
        "has_image": image is not None,  # fromImages' code (images.js) is rendered only then
        # token ids: toIds (ids.js) is rendered only then
        "int_input": any(graph.dtype(t) != "float32" for t in graph.inputs),
        "has_tokenizer": tokenizer is not None,  # fromText's code (tokenizer.js) and VOCAB only then
        # fromText exists where the input is one sequence (T,): the tokenizer, or a stub that rejects
        # (no-tokenizer); an image model has none (its bundle stays as small as before)
        "sequence_input": len(graph.input_shape) == 1,
        "vocab_json": _js_text("\n".join(tokenizer["vocab"])) if tokenizer is not None else "",
    }


def output_records(graph: Graph, plan: LayoutPlan, schedule: Schedule, default_loss: str) -> list[dict]:
    """The model's outputs in order: {name, shape (per sample), size, texture, loss}. Output k's loss textures are
    layout.loss_texture's; its loss, fit's default for it: the build's --loss where the output takes it (the one
    output of a model always), else the other kind."""
    out = []
    for k, (tensor, name) in enumerate(zip(graph.outputs, graph.output_names)):
        kinds = list(schedule.loss[k])
        loss = default_loss if len(graph.outputs) == 1 or default_loss in kinds or not kinds else kinds[-1]
        shape = list(graph.shapes[tensor])
        out.append({"name": name, "shape": shape, "size": int(np.prod(shape)), "texture": plan.tensor(tensor),
                    "loss": loss})
    return out


def input_records(graph: Graph, plan: LayoutPlan) -> list[dict]:
    """The model's inputs in order: {name, shape (per sample), size, dtype, texture, and for token ids
    idRange: the ids they may hold, [0, idRange)}."""
    return [{"name": t, "shape": list(graph.shapes[t]), "size": int(np.prod(graph.shapes[t])), "dtype": graph.dtype(t),
             "texture": plan.tensor(t),
             **({"idRange": graph.id_range(t) or 1 << 24} if graph.dtype(t) != "float32" else {})} for t in graph.inputs]


def _trunk(graph: Graph, plan: LayoutPlan) -> dict | None:
    cut = graph.trunk()
    if cut is None:
        return None
    return {"tensor": cut, "texture": plan.tensor(cut), "shape": list(graph.shapes[cut]),
            "size": int(np.prod(graph.shapes[cut]))}


def compact_js(text: str) -> str:
    """The shipped form of the runtime: comment-only lines (after the file's opening comment),
    trailing ` // ` comments, indentation and blank lines dropped; the templates keep them for the
    reader. A trailing comment goes only where the code before it closes every quote it opens, so
    a `//` inside a string is never touched (the runtime has no regular expression holding one);
    lines inside a multi-line template literal are kept as they are."""
    out, header, literal = [], True, False
    for line in text.split("\n"):
        stripped = line.strip()
        if literal:
            out.append(line)
        elif header and stripped.startswith("//"):
            out.append(stripped)
            continue
        else:
            header = False
            if stripped and not stripped.startswith("//"):
                out.append(_without_trailing_comment(stripped))
        if line.count("`") % 2:
            literal = not literal
    return "\n".join(out) + "\n"


_DATA_LINE = re.compile(r"const (MODEL|TEXTURES|KERNELS|GLSL_COMMON|SCHEDULE|WEIGHTS|WEIGHTS_FILE|VOCAB) = ")  # JSON and base64


def _without_trailing_comment(line: str) -> str:
    at = line.find(" // ")
    if at < 0 or _DATA_LINE.match(line):
        return line
    code = line[:at]
    return code.rstrip() if all(code.count(q) % 2 == 0 for q in "'\"`") else line


def render_bundle(ctx: dict) -> dict[str, str]:
    env = template_env()
    return {
        f"{ctx['name']}.js": compact_js(env.get_template("bundle.js.j2").render(ctx)),
        f"{ctx['name']}.d.ts": env.get_template("bundle.d.ts.j2").render(ctx),
    }


def _report_value(v):
    """A layer attribute as JSON: a gather's constant parts by their shape (their values are in the kernel)."""
    if isinstance(v, Constant):
        return {"constant": list(v.shape)}
    if isinstance(v, dict):
        return {k: _report_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_report_value(x) for x in v]
    return v


def report(name: str, graph: Graph, plan: LayoutPlan, ctx: dict, files: dict[str, str]) -> dict:
    layers = []
    for layer in graph.layers:
        layers.append({
            "name": layer.name, "op": layer.op, "attrs": _report_value(layer.attrs),
            "inputs": layer.inputs, "outputs": layer.outputs,
            "output_shape": list(graph.shapes[layer.outputs[0]]),
            "params": {role: {"name": n, "shape": list(graph.params[n].array.shape),
                              "count": int(graph.params[n].array.size)} for role, n in layer.params.items()},
        })
    return {
        "name": name,
        "version": VERSION,
        "input_shape": list(graph.input_shape),
        "inputs": [{k: v for k, v in r.items() if k != "texture"} for r in input_records(graph, plan)],
        "input_dtype": graph.input_dtype,  # float32, or int64 / int32 token ids (build --input-dtype)
        "output_shape": list(graph.output_shape),
        "outputs": [{"name": n, "shape": list(graph.shapes[t])} for t, n in zip(graph.outputs, graph.output_names)],
        "parameters": graph.parameter_count(),
        "layers": layers,
        "textures": [t.report() for t in plan.textures.values()],
        "texture_bytes": plan.total_bytes(),
        "kernels": ctx["kernel_count"],
        "files": {k: len(v if isinstance(v, bytes) else v.encode()) for k, v in files.items()},
    }
