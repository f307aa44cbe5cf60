"""The static schedule: which kernel runs on which textures, in what order.

The runtime is a small interpreter over what this module returns:

    predict                         forward passes
    trainStep(loss, optimizer)      forward + loss[k][loss of output k] for each output + train_backward + optimizer[optimizer].passes,
                                    then the optimizer's swaps (ping-pong pointer swaps); train_backward
                                    is backward without the parameter-gradient passes, which the
                                    optimizer passes compute themselves (ops/optim.py)
    gradients(loss)                 forward + the outputs' losses + backward
    features / cached trunk         forward[:trunkPasses] (the frozen trunk, Graph.trunk), and the head:
                                    forward[trunkPasses:]

A parameter several layers read (a tied one, layout.param_grad_parts) has each reader's gradient written apart
(pgrad0:P, pgrad1:P, ...: passes of train_backward too) and their sum last in the backward (pgrad:P), the
pass whose kernel its optimizer includes. Only trainable parameters (Graph.trainable) have optimizer passes;
with none, there is no loss either. The backward has passes only for tensors that depend on a trainable
parameter.

A pass is {kernel, inputs (texture per sampler, in the kernel's order),
outputs (textures, one per render target), rows}. `rows` says what part of the
output is drawn: "batch" (the rows of the first u_batch samples), "blocks" (of the first
ceil(u_batch / 8): a sample-blocked forward or grad_input, layout.py), "full" (the whole texture) or
"ring" (one texel of the loss ring). Double-buffered textures are read from
their current buffer and written to the other one. A pass with `blocked` is one of the twins of
a sample-blocked layer's pass (ops/common.py: blockable; each with its optimizer passes): the
blocked one (true) runs at batches of at least MODEL.blockMinBatch where the device draws
MODEL.sampleBlock targets at once, the one-sample one (false) otherwise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from texelfit.prep.ir import Graph
from texelfit.codegen.webgl2.layout import LayoutPlan
from texelfit.prep.errors import BuildError

from . import ops
from .kernels import Kernel, Pass, render_kernel, source_id
from .kl_print import js
from .kl_wgsl import struct_fields, wgsl
from .ops.conv_kl import deal_cols_kl, interleave_cols_kl


@dataclass
class Schedule:
    forward: list[Pass] = field(default_factory=list)
    backward: list[Pass] = field(default_factory=list)
    # each output's loss passes by loss kind, in the order of Graph.outputs (fit sums the outputs' losses)
    loss: list[dict[str, list[Pass]]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # the textures of the model's outputs, which the page reads
    optimizer: dict[str, list[Pass]] = field(default_factory=dict)
    swaps: dict[str, list[str]] = field(default_factory=dict)
    train_backward: list[int] = field(default_factory=list)  # indices into backward
    trunk_passes: int = 0  # forward[:trunk_passes] computes the frozen trunk's output (Graph.trunk), or 0: none

    def all_passes(self) -> list[Pass]:
        out = self.forward + self.backward
        for group in [g for kinds in self.loss for g in kinds.values()] + list(self.optimizer.values()):
            out += group
        return out


def build_schedule(graph: Graph, plan: LayoutPlan) -> Schedule:
    s = Schedule()
    tex = plan.textures
    trunk = graph.trunk()
    for layer in graph.layers:
        s.forward += ops.forward(layer, graph, plan)
        if trunk in layer.outputs:  # the frozen trunk's passes: a prefix of the forward
            s.trunk_passes = len(s.forward)
    for layer in reversed(graph.layers):
        out = layer.outputs[0]
        if out not in plan.needs_grad:  # nothing it reads needs a gradient (or the loss reads its input)
            continue
        if out in plan.grad_sums:  # every consumer has contributed: add them up
            s.backward += ops.grad_sum(out, plan.grad_sums[out], plan)
        s.backward += ops.backward(layer, graph, plan)

    for name, readers in plan.param_grad_parts.items():  # a tied parameter: the sum of its readers' gradients
        s.backward += ops.param_grad_sum(name, len(readers))

    s.outputs = [plan.tensor(o) for o in graph.outputs]
    # nothing trains (--trainable none): no loss, no backward, no optimizer
    trains = any(x in plan.needs_grad for x in graph.loss_inputs())
    for k, out in enumerate(graph.outputs):
        s.loss.append({})
        x = graph.loss_input(out)
        for loss in ops.LOSSES if trains else ():
            if loss == "cross_entropy" and len(graph.shapes[out]) != 1:
                continue  # class logits only
            if loss == "mse" and x != out:
                continue  # a softmax output trains on its logits, by cross_entropy
            # (an output no trainable parameter reaches: its loss's value alone, which the sum the page reads counts)
            grad = plan.grad_targets[("<loss>", k)] if x in plan.needs_grad else None
            s.loss[k][loss] = ops.loss_passes(loss, tex[plan.tensor(x)], grad, k, len(graph.outputs) > 1)

    # the passes writing each parameter's gradient: one, or a one-sample pass and a blocked twin's
    # interleave, each for its batch sizes
    grad_passes: dict[str, list[Pass]] = {}
    for p in s.backward:
        if p.outputs[0].startswith("pgrad:"):
            grad_passes.setdefault(p.outputs[0], []).append(p)
    s.train_backward = [i for i, p in enumerate(s.backward) if p.outputs[0] not in grad_passes]
    for opt in ops.OPTIMIZERS:
        s.optimizer[opt] = []
        s.swaps[opt] = []
        if not trains:
            continue
        for p in graph.params.values():
            if not graph.is_trainable(p.name):
                continue  # frozen: no optimizer pass, no state
            for grad in grad_passes["pgrad:" + p.name]:
                passes, swaps = ops.optimizer_pass(opt, p.name, grad)
                s.optimizer[opt] += passes
            s.swaps[opt] += swaps
    for p in s.all_passes():
        if len(p.inputs) > MAX_INPUTS:
            raise BuildError(f"layer {p.label!r}: its kernel {p.kernel.name!r} reads {len(p.inputs)} tensors; texelfit "
                             f"reads at most {MAX_INPUTS} in one pass (WebGL2 promises 16 texture units, and uploads keep one)")
    return s


# Textures one pass may read: WebGL2 promises 16 texture units; the runtime uploads through the last
# one (runtime/textures.js: UPLOAD_UNIT), so that the passes' bindings stay between draws.
MAX_INPUTS = 15


def serialize(schedule: Schedule, textures: list[str], webgpu: list[str] | None = None) -> tuple[list[dict], dict, list[dict]]:
    """Kernels deduplicated by source hash, and the schedule referring to them by index, and to
    the textures by their index in `textures` (the bundle's TEXTURES: names are long, and every
    pass lists several); and the CPU functions printed from the kernels (codegen/kl_print.py), once each, for
    CPU_GENERATED. `webgpu`: a list the kernels' WGSL modules are appended to, once each (the bundle's WGSL),
    a kernel's `wgsl` being [its index there, its uniform struct's fields, its outputs] (codegen/kl_wgsl.py); None: no WGSL."""
    kernels: list[dict] = []
    index: dict[str, int] = {}
    tex = {name: i for i, name in enumerate(textures)}
    generated: dict[str, str] = {}
    wgsl_index: dict[str, int] = {}

    def wgsl_ref(kdef, inputs: list[str], outputs: int, scatter: int = 0, cols: int = 1) -> list:
        """A kernel (kl.KernelDef) as WGSL reading `inputs` (the CPU function's, in its order) into `outputs` targets
        (with `scatter`, into one: kl_wgsl.wgsl; `cols` texels an invocation, a fourth item where not 1)."""
        code = wgsl(kdef, inputs, outputs, scatter, cols)
        if code not in wgsl_index:
            wgsl_index[code] = len(webgpu)
            webgpu.append(code)
        fields = [[n, t] for n, t in struct_fields(kdef, inputs)]
        return [wgsl_index[code], fields, outputs] + ([cols] if cols > 1 else [])

    def kernel_ref(k: Kernel) -> int:
        src = render_kernel(k)
        sid = source_id(src)
        if webgpu is not None:  # (one GLSL, two WGSL: a row-blocked matmul's one-row kernel is printed from its twin)
            sid += "".join(f"/{x.scatter}/{x.split[0] if x.split else 0}/{x.cols}" for x in (k, k.gradient)
                           if x is not None and (x.scatter or x.split))
        if sid not in index:
            index[sid] = len(kernels)
            # every kernel is written in the kernel language (a WebGL2 routine beside its generic one): the CPU backend
            # runs its printed function (`cpu`: its key in CPU_GENERATED), whose shape constants are its consts (one
            # function a structure); the template names the routine's GLSL
            assert k.kl is not None, f"kernel {k.name!r} has no generic kernel (Kernel.kl) for the CPU and WGSL"
            record = {"name": k.name, "source": src, "inputs": list(k.inputs),
                      "outputs": k.outputs, "uniforms": list(k.uniforms),
                      "template": k.template.removesuffix(".glsl.j2")}
            g = k.gradient  # an optimizer's gradient kernel (ops/optim.py): the update reads its output as G
            inputs = (["G"] + list(k.inputs[len(g.inputs):])) if g else _generic_inputs(k)
            outputs = len(k.kl.written) if k.routine else k.outputs
            fn = js(k.kl, inputs, outputs)
            record["cpu"] = source_id(fn)[:10]
            if webgpu is not None:  # the same generic kernel as a compute shader (runtime/webgpu.js runs it as the CPU its function)
                record["wgsl"] = wgsl_ref(k.wgsl_kl or k.kl, inputs, outputs, k.scatter, k.cols)
                if k.scatter:  # (a row-blocked matmul's, a conv's: several rows an invocation, written in place)
                    record["scatter"] = k.scatter
                if k.few:  # (a dense layer's: below `scatter` samples, the generic kernel)
                    record["few"] = wgsl_ref(k.kl, inputs, outputs)
                if k.split:  # (a conv's weight gradient: partial sums, then their sum)
                    record["split"] = [k.split[0], wgsl_ref(k.split[1], ["P"], 1)]
            record["consts"] = {n: v for n, v in sorted(k.kl.symbols.items()) if re.search(rf"\bc\.{n}\b", fn)}
            # a routine's sample blocking (webgl2/blocking.py): the CPU computes the generic kernel, then deals it out
            record["consts"].update({n: k.consts[n] for n in _LAID_OUT if n in k.consts and k.routine})
            if k.routine and k.consts.get("colblock"):  # (and the shapes cpuColumns deals it out by)
                record["consts"].update({n: k.consts[n] for n in _COLUMN_SHAPE})
                if webgpu is not None:  # WebGPU deals it out by deal_cols, and interleaves a column-blocked input first
                    b, nh = k.consts["colblock"], len(k.consts["halves"])
                    record["deal"] = wgsl_ref(deal_cols_kl(b, nh), ["Y"], 1)
                    if k.consts.get("colin"):
                        record["colin"] = wgsl_ref(interleave_cols_kl(b, nh), [f"T{t}" for t in range(b * nh)], 1)
            generated[record["cpu"]] = fn
            if g is not None:  # ... computed by its gradient's function first (runtime/cpu.js: cpuOptimizer)
                assert not k.kl.symbols and g.kl is not None, k.name  # (the update's consts are its gradient's)
                g_outputs = len(g.kl.written) if g.routine else g.outputs
                gfn = js(g.kl, list(g.inputs), g_outputs)
                record["gradient"] = {"inputs": len(g.inputs), "cpu": source_id(gfn)[:10]}
                record["consts"] = {n: v for n, v in sorted(g.kl.symbols.items()) if re.search(rf"\bc\.{n}\b", gfn)}
                record["consts"].update({n: g.consts[n] for n in _LAID_OUT if n in g.consts and g.routine})
                generated[record["gradient"]["cpu"]] = gfn
                if webgpu is not None:
                    record["gradient"]["wgsl"] = wgsl_ref(g.wgsl_kl or g.kl, list(g.inputs), g_outputs, g.scatter,
                                                          g.cols)
                    if g.scatter:
                        record["gradient"]["scatter"] = g.scatter
                    if g.split:
                        record["gradient"]["split"] = [g.split[0], wgsl_ref(g.split[1], ["P"], 1)]
            kernels.append(record)
        return index[sid]

    def kept(ps: list[Pass]) -> list[Pass]:
        """The passes the bundle holds: without WGSL, none of WebGPU's alone (Pass.webgpu)."""
        return [p for p in ps if webgpu is not None or p.webgpu is not True]

    def passes(ps: list[Pass]) -> list[dict]:
        return [{"kernel": kernel_ref(p.kernel), "inputs": [tex[n] for n in p.inputs],
                 "outputs": [tex[n] for n in p.outputs], "rows": p.rows,
                 "label": p.label, **({"values": p.values} if p.values else {}),
                 **({"blocked": p.blocked} if p.blocked is not None else {}),
                 **({"blockFrom": p.block_from} if p.block_from is not None else {}),
                 **({"wide": p.wide} if p.wide is not None else {}),
                 **({"webgpu": p.webgpu} if p.webgpu is not None and webgpu is not None else {})} for p in kept(ps)]

    at = {id(p): i for i, p in enumerate(kept(schedule.backward))}  # (a kept backward pass's index in the bundle's)
    data = {
        "forward": passes(schedule.forward),
        "backward": passes(schedule.backward),
        "loss": [{k: passes(v) for k, v in kinds.items()} for kinds in schedule.loss],
        "optimizer": {k: passes(v) for k, v in schedule.optimizer.items()},
        "swaps": {k: [tex[n] for n in v] for k, v in schedule.swaps.items()},
        "trainBackward": [at[id(schedule.backward[i])] for i in schedule.train_backward
                          if id(schedule.backward[i]) in at],
        "trunkPasses": len(kept(schedule.forward[:schedule.trunk_passes])),
    }
    return kernels, data, [{"id": i, "fn": f} for i, f in sorted(generated.items())]


# the constants of a routine's blocked output (runtime/cpu.js: cpuBlocked; cpu_columns.js: cpuColumns), kept beside its generic
# kernel's symbols for the CPU
_LAID_OUT = ("blocked", "block", "colblock", "halves", "colin")
_COLUMN_SHAPE = ("oh", "ow", "oc4", "ih", "iw", "ic4")


def _generic_inputs(k: Kernel) -> list[str]:
    """The textures a kernel's CPU function reads, in order: its samplers, but where a column-blocked conv routine
    reads its input as the column parts X0..X7 (c.colin), X: cpuColumns interleaves them for the generic kernel."""
    names = list(k.inputs)
    if k.routine and k.consts.get("colin"):
        parts = sum(1 for n in names if re.fullmatch(r"X[0-9]+", n))
        names = ["X"] + names[parts:]
    return names


__all__ = ["Pass", "Schedule", "build_schedule", "serialize"]
