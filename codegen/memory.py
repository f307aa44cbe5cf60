"""Memory planning: textures whose lifetimes do not overlap share one storage.

Every way the runtime runs the schedule (predict: forward; a training step: forward, loss,
train_backward, optimizer; gradients(): forward, loss, backward; a cached fit: the head's forward
after the trunk's output is uploaded; features(): the trunk's forward) runs its passes in the
order of one sequence,

    forward + loss[each] + backward + optimizer[each]

or a part of it. A texture lives from the first pass of that sequence that touches it to the last;
two textures whose lives are disjoint never hold data that the other needs, in any of those runs,
so they can be one texture (its size the largest of both). The intervals are closed: a pass never
reads and writes one storage (a feedback loop in WebGL2).

What outlives a run, or is written from the page, keeps its own storage: weights and optimizer
state (double-buffered), parameter gradients (read back by gradients()), the input, labels and
targets (uploaded), the loss ring (read every few steps) and the softmax statistics beside it (a
texel a sample: float32 in every tier), and any texture whose first use in the sequence is a read.

The render targets of one pass (the sample-blocked parts blk0..7:T, the column-blocked parts
col0..7:T, a max-pool's output and arg-max) must be of one size in WebGL2: they are one unit,
which takes a slot of as many storages, all of one size, from units of as many textures before it.
(A column-blocked forward's draws of a half write 4 of its wide draw's 8: that unit.)

Storage is allocated greedily in the order of first use: a texture takes the free storage that
grows least (best fit), if it grows by less than the texture's own size, else a new one. The
runtime (textures.js, cpu.js) makes one texture per storage and format, as large as the
largest of its textures in each dimension (after folding), and gives each of them that one.
"""
from __future__ import annotations

from dataclasses import dataclass

from texelfit.codegen.webgl2.layout import LARGEST_TEXTURE_SIZE, LayoutPlan, loss_texture

from .schedule import Schedule

OWN_ROLES = ("param", "state", "param_grad", "labels", "targets", "loss")

# report.json's roles: what each texture role counts as
ROLE_GROUPS = {"param": "weights", "activation": "activations", "argmax": "activations", "partial": "activations",
               "gradient": "gradients", "param_grad": "gradients", "state": "optimizer_state",
               "labels": "other", "targets": "other", "loss": "other"}
GROUPS = ("weights", "activations", "gradients", "optimizer_state", "trunk_cache", "other")


@dataclass
class Slot:
    """k storages of one size, taken by units of k textures (one texture, or the k render targets of a pass)."""
    k: int
    width: int
    height: int
    end: int  # the last pass index using it
    units: list[tuple[str, ...]]


def sequence(schedule: Schedule) -> list:
    out = schedule.forward + [p for kinds in schedule.loss for ps in kinds.values() for p in ps] + schedule.backward
    return out + [p for ps in schedule.optimizer.values() for p in ps]


def plan_storage(plan: LayoutPlan, schedule: Schedule) -> dict[str, int]:
    """Texture name -> storage index, for the textures that share; the others keep their own."""
    tex = plan.textures
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    read_first: set[str] = set()
    units: dict[str, tuple[str, ...]] = {}  # texture -> the render targets it is drawn with
    for i, p in enumerate(sequence(schedule)):
        if len(p.outputs) > 1 and p.wide is not False:  # (a draw of a half: the wide draw's unit)
            for name in p.outputs:
                units[name] = tuple(p.outputs)
        for name in p.inputs:
            if name not in first:
                read_first.add(name)
        for name in list(p.inputs) + list(p.outputs):
            first.setdefault(name, i)
            last[name] = i

    def shares(n):  # (the outputs, which the page reads after the forward, keep their own)
        return n in first and n not in read_first and tex[n].role not in OWN_ROLES and not tex[n].double and \
            n not in schedule.outputs

    order = {n: i for i, n in enumerate(tex)}
    candidates = []
    for n in tex:
        unit = units.get(n, (n,))
        if n != unit[0] or not all(shares(m) for m in unit):
            continue
        if len({(tex[m].width, tex[m].height) for m in unit}) != 1 or len({units.get(m, (m,)) for m in unit}) != 1:
            continue  # (attachments of several sizes, or drawn with others elsewhere: keep their own)
        candidates.append(unit)
    candidates.sort(key=lambda u: (min(first[m] for m in u), order[u[0]]))
    slots: list[Slot] = []
    for unit in candidates:
        t, start = tex[unit[0]], min(first[m] for m in unit)
        best, growth = None, t.width * t.height
        for i, s in enumerate(slots):
            if s.k != len(unit) or s.end >= start:
                continue
            g = max(s.width, t.width) * max(s.height, t.height) - s.width * s.height
            if g < growth:
                best, growth = i, g
        end = max(last[m] for m in unit)
        if best is None:
            slots.append(Slot(len(unit), t.width, t.height, end, [unit]))
        else:
            s = slots[best]
            s.width, s.height, s.end = max(s.width, t.width), max(s.height, t.height), end
            s.units.append(unit)
    # storage j of a slot holds the j-th texture of each of its units; a slot of one unit is its own
    out: dict[str, int] = {}
    for s in slots:
        if len(s.units) == 1:
            continue
        base = len(set(out.values()))
        for unit in s.units:
            for j, n in enumerate(unit):
                out[n] = base + j
    return out


def role_bytes(plan: LayoutPlan, storage: dict[str, int], trunk_bytes_per_sample: int = 0) -> dict:
    """Texture bytes per role (report.json's roles, float32 texels unfolded) before and after sharing.
    A shared storage counts for the role of its largest texture. The trunk cache lives in the page's
    memory (runtime/trunk.js: trunkCache), not in a texture: its bytes per sample of a fit."""
    before = dict.fromkeys(GROUPS, 0)
    after = dict.fromkeys(GROUPS, 0)
    shared: dict[int, list] = {}
    for t in plan.textures.values():
        before[ROLE_GROUPS[t.role]] += t.bytes
        if t.name in storage:
            shared.setdefault(storage[t.name], []).append(t)
        else:
            after[ROLE_GROUPS[t.role]] += t.bytes
    for members in shared.values():
        biggest = max(members, key=lambda t: t.bytes)
        after[ROLE_GROUPS[biggest.role]] += max(t.width for t in members) * max(t.height for t in members) * 16
    return {"before": before, "after": after, "total_before": sum(before.values()), "total_after": sum(after.values()),
            "shared_textures": len(storage), "storages": len(shared),
            "trunk_cache_bytes_per_sample": trunk_bytes_per_sample}


# The memory a fit or a predict needs at its peak (report.json's "memory", MODEL.memory, createModel's
# memoryBudget), in bytes of float32 texels (the float32 tier; rgba8 takes as many, float16 fewer):
#   textures   every texture the runtime allocates at createModel (after sharing storage: role_bytes)
#   readback   the largest pixel-pack buffer of the run (runtime/gpu.js: read): a fit's block
#              readback (the loss ring and a half of every weight and optimizer state texture), a
#              predict's output at max_batch; the page holds a copy of it as it arrives
#   snapshots  the CPU-side copies of weights and optimizer state kept for a lost context
#              (runtime/fit.js): a fit keeps the latest and the last one confirmed good, otherwise
#              the one of createModel (or of the last setWeights, restore, fit) alone
#   upload     the page's staging of uploads: the decoded weights blob (createModel) and the batch's
#              input, labels and targets rows
#   peak       textures + 2 * readback + snapshots + upload
def state_textures(plan: LayoutPlan) -> list:
    """The textures a snapshot holds (runtime/gpu.js: stateTextureNames): every weight, and the
    optimizer state (m:, v:) of those that train."""
    return [t for t in plan.textures.values() if t.role in ("param", "state")]


def half_bytes(t) -> int:
    """The bytes of one half of a texture (a double-buffered one is read one half at a time)."""
    return t.width * t.height * 16


def plan_memory(plan: LayoutPlan, storage: dict[str, int], *, outputs: list[str], inputs: list[str], parameters: int,
                trains: bool) -> dict:
    """`outputs`, `inputs`: the texture names of the model's outputs and inputs; `parameters`: the float32
    values of the decoded weights; `trains`: whether the bundle trains (else fit_bytes is None)."""
    tex = plan.textures
    textures = role_bytes(plan, storage)["total_after"]
    snapshot = sum(half_bytes(t) for t in state_textures(plan))
    each = range(len(outputs))  # (each output's loss ring, labels and targets: layout.loss_texture)
    block = sum(half_bytes(tex[loss_texture("loss", k)]) for k in each) + snapshot
    predict_read = sum(half_bytes(tex[o]) for o in outputs)
    stages = sum(half_bytes(tex[n]) for n in [*inputs, *(loss_texture(kind, k) for k in each for kind in ("labels", "targets"))]
                 if n in tex)
    upload = 4 * parameters + stages
    largest = max(tex.values(), key=lambda t: t.bytes)  # (the first of the largest, in the plan's order)

    def run(readback: int, snapshots: int) -> dict:
        return {"textures": textures, "readback": readback, "snapshots": snapshots, "upload": upload,
                "peak": textures + 2 * readback + snapshots + upload}

    fit = run(block, 2 * snapshot) if trains else None
    predict = run(predict_read, snapshot)
    return {"fit": fit, "predict": predict, "fit_bytes": fit["peak"] if fit else None,
            "predict_bytes": predict["peak"], "largest_texture": {"name": largest.name, "bytes": largest.bytes}}


def planned_peak(memory: dict) -> int:
    """What a model needs at most: a fit's peak where it trains, else a predict's."""
    return memory["fit_bytes"] if memory["fit_bytes"] is not None else memory["predict_bytes"]


def check_layout(plan: LayoutPlan) -> None:
    """Fail at build time for a texture that no device could hold, even folded."""
    from texelfit.prep.errors import BuildError

    for t in plan.textures.values():
        if t.width * t.height > LARGEST_TEXTURE_SIZE ** 2:
            raise BuildError(f"texture {t.name!r} of {t.role} with shape {list(t.shape)} needs {t.width}x{t.height} "
                             f"texels: more than a texture of the largest size any device supports "
                             f"({LARGEST_TEXTURE_SIZE}x{LARGEST_TEXTURE_SIZE}) can hold; lower --max-batch or "
                             "the input size")
