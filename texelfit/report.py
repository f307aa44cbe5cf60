"""The build report: one row per layer of the bundle, its totals, and the accuracy record; and the
prune sweep's plot.

Per layer (the layers of the bundle, after fusing):
  channels    output channels (features of a dense layer) before -> after pruning
  parameters  weights and biases it owns
  flops       forward FLOPs per sample: a multiply-add counts 2, a bias or an activation 1 per output,
              a pool 1 per window element read, an add 1 per output
  texture     bytes of the textures that belong to it on the GPU (its output and its output's
              gradients, arg-max indices, and its weights with their gradients and optimizer state)
  shipped     bytes of its weights in the bundle's weights blob (table entries included)
The row "(other)" holds what belongs to no layer: the input, labels, targets and loss textures,
and the blob's header and checksum.
"""
from __future__ import annotations

from texelfit.prep.ir import Graph
from texelfit.codegen.webgl2.layout import LayoutPlan
from texelfit.prep.ops import opdef
from texelfit.prep.quantize import HEADER, TRAILER, Quantized


def flops(layer, graph: Graph) -> int:
    """Forward FLOPs of one sample through `layer`: its op's rule (prep/ops/)."""
    return opdef(layer.op).flops(layer, graph)


def _owner_textures(layer, plan: LayoutPlan, params) -> list[str]:
    """`params`: the layer's parameters that it owns (a tied one belongs to its first reader)."""
    out = layer.outputs[0]
    names = [n for n in plan.textures
             if n in ("act:" + out, "argmax:" + out, "ties:" + out, "grad:" + out) or n.startswith(f"grad:{out}@")]
    for p in params:
        names += [pre + p for pre in ("param:", "pgrad:", "m:", "v:") if pre + p in plan.textures]
        names += [f"pgrad{j}:{p}" for j in range(len(plan.param_grad_parts.get(p, ())))]
    return names


def layer_table(before: Graph, after: Graph, plan: LayoutPlan, weights: Quantized) -> dict:
    """{'rows': [...], 'totals': {...}}: `before` is the bundle's graph had it not been pruned."""
    shipped = {t.name: t.bytes for t in weights.tensors}
    rows, owned, counted = [], set(), set()
    for layer, old in zip(after.layers, before.layers):
        assert layer.name == old.name
        own = [p for p in dict.fromkeys(layer.params.values()) if p not in counted]  # (a tied one: its first reader)
        counted.update(own)
        tex = _owner_textures(layer, plan, own)
        owned.update(tex)
        rows.append({
            "layer": layer.name,
            "op": layer.op + (f"+{layer.attrs['act']}" if "act" in layer.attrs else ""),
            "channels_before": int(before.shapes[old.outputs[0]][0]),
            "channels_after": int(after.shapes[layer.outputs[0]][0]),
            "parameters": int(sum(after.params[p].array.size for p in own)),
            "flops": int(flops(layer, after)),
            "texture_bytes": int(sum(plan.textures[t].bytes for t in tex)),
            "shipped_bytes": int(sum(shipped[p] for p in own)),
        })
    rows.append({"layer": "(other)", "op": "", "channels_before": None, "channels_after": None, "parameters": 0,
                 "flops": 0, "texture_bytes": int(sum(t.bytes for n, t in plan.textures.items() if n not in owned)),
                 "shipped_bytes": HEADER + TRAILER})
    totals = {k: int(sum(r[k] for r in rows)) for k in ("parameters", "flops", "texture_bytes", "shipped_bytes")}
    totals["parameters_before"] = before.parameter_count()
    totals["flops_before"] = int(sum(flops(l, before) for l in before.layers))
    assert totals["texture_bytes"] == plan.total_bytes() and totals["shipped_bytes"] == len(weights.blob)
    return {"rows": rows, "totals": totals}


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 10 * 1024 else f"{n} B"


def format_table(table: dict, accuracy: dict | None, quantize: str) -> str:
    head = ("layer", "op", "channels", "params", "FLOPs/sample", "texture", f"shipped ({quantize})")
    lines = []
    for r in table["rows"]:
        ch = "" if r["channels_before"] is None else (
            f"{r['channels_before']}" if r["channels_before"] == r["channels_after"]
            else f"{r['channels_before']} -> {r['channels_after']}")
        lines.append((r["layer"], r["op"], ch, f"{r['parameters']:,}", f"{r['flops']:,}", _size(r["texture_bytes"]),
                      _size(r["shipped_bytes"])))
    t = table["totals"]
    lines.append(("total", "", "", f"{t['parameters']:,}", f"{t['flops']:,}", _size(t["texture_bytes"]),
                  _size(t["shipped_bytes"])))
    widths = [max(len(row[i]) for row in lines + [head]) for i in range(len(head))]
    widths[0] = min(widths[0], 40)

    def fmt(row):
        name = row[0] if len(row[0]) <= widths[0] else "..." + row[0][-(widths[0] - 3):]
        cells = [name.ljust(widths[0]), row[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(row[2:], widths[2:])]
        return "  ".join(cells).rstrip()

    out = [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in lines[:-1]]
    out += ["  ".join("-" * w for w in widths), fmt(lines[-1])]
    if t["parameters_before"] != t["parameters"]:
        out.append(f"pruning: {t['parameters_before']:,} -> {t['parameters']:,} parameters, "
                   f"{t['flops_before']:,} -> {t['flops']:,} FLOPs per sample")
    if accuracy:
        out.append(format_accuracy(accuracy))
    return "\n".join(out)


STAGES = (("before", "before"), ("after_prune", "pruned"), ("after_finetune", "fine-tuned"),
          ("after_quantize", "shipped"))


def format_accuracy(acc: dict) -> str:
    metric = acc["metric"]
    fmt = (lambda v: f"{100 * v:.2f}%") if metric == "accuracy" else (lambda v: f"{v:.4g}")
    parts = [f"{label} {fmt(acc[k])}" for k, label in STAGES if k in acc]
    return f"{metric} on {acc['data']}: " + ", ".join(parts)


def plot_sweep(points: list[dict], path: str, title: str) -> None:
    """Accuracy (left axis) and bundle size (right axis) against the pruning ratio, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [p["ratio"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    metric = points[0]["metric"]
    vals = [100 * p["value"] if metric == "accuracy" else p["value"] for p in points]
    ax.plot(ratios, vals, "o-", color="tab:blue", label=metric)
    ax.set_xlabel("pruning ratio (--prune)")
    ax.set_ylabel("validation accuracy (%)" if metric == "accuracy" else metric, color="tab:blue")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(ratios, [p["bundle_bytes"] / 1024 for p in points], "s-", color="tab:red", label="bundle (.js)")
    ax2.plot(ratios, [p["weights_bytes"] / 1024 for p in points], "^--", color="tab:orange", label="weights blob")
    ax2.set_ylabel("size (KiB)", color="tab:red")
    ax2.set_ylim(bottom=0)
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [l.get_label() for l in lines], loc="lower left")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def format_role_bytes(roles: dict) -> str:
    """The texture bytes per role before and after sharing storage (codegen/memory.py), as table lines."""
    lines = [f"{'texture bytes by role':<22}  {'planned':>12}  {'shared':>12}"]
    for k in roles["before"]:
        if k == "trunk_cache":
            continue
        lines.append(f"{k.replace('_', ' '):<22}  {_size(roles['before'][k]):>12}  {_size(roles['after'][k]):>12}")
    lines.append(f"{'total':<22}  {_size(roles['total_before']):>12}  {_size(roles['total_after']):>12}  "
                 f"({roles['shared_textures']} textures in {roles['storages']} shared storages)")
    if roles["trunk_cache_bytes_per_sample"]:
        lines.append(f"trunk cache (page memory, not a texture): {roles['trunk_cache_bytes_per_sample']} B a sample of a fit")
    return "\n".join(lines)


def _mb(n: int) -> str:
    for unit, size in (("GB", 10 ** 9), ("MB", 10 ** 6), ("KB", 10 ** 3)):
        if n >= size:
            return f"{n / size:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n} B"


def format_memory(memory: dict) -> str:
    """The planned memory (codegen/memory.py: plan_memory) as summary lines: a fit's and a predict's peak,
    what they are made of, the largest texture, and the batch the budget chose."""
    lines = []
    for what in ("fit", "predict"):
        m = memory[what]
        if m is None:
            continue
        lines.append(f"texelfit: memory: a {what} needs {_mb(m['peak'])} at its peak ({_mb(m['textures'])} of textures, "
                     f"{_mb(m['readback'])} readback, {_mb(m['snapshots'])} of snapshots, {_mb(m['upload'])} of uploads)")
    big = memory["largest_texture"]
    lines.append(f"texelfit: memory: the largest texture is \"{big['name']}\" ({_mb(big['bytes'])})")
    if memory["reduced_from"] is not None:
        lines.append(f"texelfit: --max-batch {memory['max_batch']}, not the default {memory['reduced_from']}: at "
                     f"{memory['reduced_from']} the model plans more than the memory budget of {_mb(memory['budget'])} "
                     "(--memory-budget); give --max-batch to choose")
    return "\n".join(lines)
