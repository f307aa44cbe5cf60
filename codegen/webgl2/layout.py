"""The RGBA texture plan: where every tensor lives on the GPU.

One layout serves every tensor: the *channel-packed* layout. A tensor is viewed as
[rows, blocks, channels]; its texture is `blocks * C4` texels wide (C4 = ceil(channels/4))
and `rows` texels high, and texel (x = b*C4 + c4, y = r) holds channels 4*c4 .. 4*c4+3 of
(row r, block b). Channels are padded with zeros to a multiple of 4:

                 block 0 (w = 0)                      block 1 (w = 1)
               +---------------+-----+-------------+---------------+-----
  row (n, h)   | c0 c1 c2 c3   | ... | c.. pad 0   | c0 c1 c2 c3   | ...
               +---------------+-----+-------------+---------------+-----
                  texel c4 = 0         c4 = C4-1

  tensor                        rows            blocks          channels
  activation NCHW (and grads)   n * H + h       w               c            (4 channels of one (n, h, w))
  activation (N, F)             n               1               f            (the same with H = W = 1)
  activation (N, R, F)          n * R + r       1               f            (tokens by features: the last axis
                                                                             packed, one texture row a token;
                                                                             stored as (C, H, W) = (F, R, 1))
  matmul weight B[I, O]         i               1               o            (x @ B of a token-wise Linear)
  embedding table W[V, F]       v               1               f            (a row a token id)
  token ids (N, T)              n               1               t            (exact floats: an activation (T,))
  dense weight W[O, I]          o (padded to 4) 1               i
  conv weight W[OC, ICg, KH, KW] kh * ICg + j   kw              oc           (4 output channels of one (j, kh, kw))
  bias b[O]                     1               1               o
  class labels                  n               1               1
  softmax statistics (ce_stats) n               1               2            (max, sum of exp(z - max) of sample
                                                                             n's logits: ops/loss.py)
  loss ring                     1               1               4 * RING     (loss of step s in texel s % RING, .x)
  samples last (dzt:, xt:)      c * H + h       w               n            (4 samples of one (c, h, w);
                                                                             a dense output is (F, 1, 1);
                                                                             dzt: of a transposed conv's dZ)
  sample-blocked part (blk{t}:T) (n // 8) * H + h w              c            (the samples n = 8*r + t of T, an
                                                                             activation or gradient, see
                                                                             SAMPLE_BLOCK_MIN_MACS; or its token
                                                                             rows 8*r + t, row_blocked)
  split-K partials (split:Y)    n * S + s       1               o            (a dense output's partial sums
                                                                             over input slice s, see split_k)
  column-blocked part (col{k}:T) n * H + h       (see below)     c / 2        (the positions w = 4*b + t of a conv
                                                                             output T, half g of its channel
                                                                             texels, k = 4*g + t: texel column
                                                                             i*B + b holds channel texel g*C4h + i,
                                                                             B = ceil(W/4), C4h = ceil(C4/2); see
                                                                             column_blocked)

A weight's texel packs the axis that is wide in practice: a dense layer's inputs (its outputs
may be 10 classes or 1 value) and a conv's output channels (its inputs are often 1 or 3, grey or
RGB, which would leave 3/4 or 1/4 of every input-packed texel empty). The weight gradient sums
over the samples, so it reads the other factor with the samples as channels (4 samples a fetch):
X of a conv input (xt:X), and dZ of a dense output (dzt:Y, rows padded to 4 like the weight's) where
the weight gradient is row-blocked; a dense layer's one-sample weight gradient reads dZ as it is
(one pass fewer, which pays at the small batches it runs at).

Where each element comes from in the source (PyTorch row-major) array is given by a
`Packing`: element (r, b, c) sits at (r // r2) * s_r1 + (r % r2) * s_r2 + b * s_b + c * s_c.
That one rule packs NCHW images, [out, in] and [in, out] dense weights and conv weights alike.
It is implemented once in prep/packing.py (`pack`/`unpack`) and once in the runtime (`packTexels`/
`unpackTexels` in runtime_template/runtime/textures.js); the GLSL accessors read it. A
round-trip test pins them together.

Padding lanes and padding rows hold zeros, and the kernels keep them zero, so a padded lane
never leaks into a dot product.

Textures wider or higher than the device's texture limit are *folded* at createModel (the
limit is known only there): the texels, in row-major order, are laid into rows of `limit`
texels. The data order is unchanged, so uploads and readbacks are the same byte streams;
the GLSL accessors map (row, col) through the fold (see kernels/prelude.glsl.j2).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from texelfit.prep.elementwise import passes_gradient
from texelfit.prep.ir import ELEMENTWISE, WEIGHTED, Graph, operands
from texelfit.prep.ops import opdef
from .blocking import (COLUMN_BLOCK, COLUMN_HALVES, COLUMN_PARTS, PARAM_SUM_LAST, ROW_BLOCK, SAMPLE_BLOCK, blocked_fold,
                       column_blocked, column_only, row_blocked, sample_blocked, split_k, sum_groups,
                       weight_grad_blocked)
from texelfit.prep.packing import (Packing, activation_packing, ceil_div, chw, conv_weight_packing, conv_weight_shape,  # noqa: F401
                      matrix_packing, pack, samples_last_packing, unpack)

LOSS_RING = 64  # steps of mean loss kept on the GPU between asynchronous readbacks
CE_STATS = "ce_stats"  # a classifier's softmax max and sum a sample, for cross_entropy's passes (ops/loss.py)
WEBGL2_MIN_TEXTURE_SIZE = 2048  # every WebGL2 device supports at least this
LARGEST_TEXTURE_SIZE = 32768  # no WebGL2 device reports more


# A classifier with at least CE_STATS_MIN_C4 texels of classes a sample (29 classes or more) computes its
# softmax's max and sum once a sample, in a pass of their own (cross_entropy_stats.glsl.j2), which
# cross_entropy_grad and cross_entropy_value read: otherwise every fragment of the gradient loops over its
# sample's classes twice, and the value's one fragment over the batch's. Measured on SwiftShader at batch 64:
# 10 classes, 0.10 ms of gradient pass against 0.14 with the stats pass (no gain); 32 classes, 0.23 against
# 0.16; 128, 2.0 against 0.28. At batch 8 with 1000 classes (Lite0's head), 10 ms against 0.4.
CE_STATS_MIN_C4 = 8


def ce_stats(classes: int) -> bool:
    """Whether cross_entropy over `classes` logits has its softmax statistics pass (CE_STATS_MIN_C4)."""
    return ceil_div(classes, 4) >= CE_STATS_MIN_C4


def loss_texture(kind: str, k: int) -> str:
    """Output k's loss texture of `kind` ("targets", "labels", CE_STATS, "loss": its ring): "targets{k}" and so on,
    the first output's named `kind` alone."""
    return kind if k == 0 else f"{kind}{k}"


def flattens_in_place(layer, graph: Graph) -> bool:
    """A flatten whose input already has the texels of its output (not (C, H, W) with H*W > 1), or a
    gather that is a pure view (see gather_is_view): either shares its input's texture."""
    if layer.op == "gather":
        return gather_is_view(layer, graph)
    if layer.op != "flatten":
        return False
    return chw(graph.shapes[layer.inputs[0]])[1:] == (1, 1)


def storage_ops(shape: tuple[int, ...]) -> list:
    """The view ops (prep/shape.py) taking a tensor's stored dims, chw(shape), to its logical
    per-sample shape: for images and flat data the stored order is the logical row-major order, so
    one reshape; tokens (R, F), stored (F, R, 1) with F in the texel, permute."""
    if len(shape) == 2:
        return [("reshape", (shape[1], shape[0])), ("permute", (1, 0))]
    return [("reshape", tuple(shape))]


def to_storage_ops(shape: tuple[int, ...]) -> list:
    """The view ops taking a tensor's logical per-sample shape to its stored dims (storage_ops undone)."""
    if len(shape) == 2:
        return [("permute", (1, 0)), ("reshape", chw(shape))]
    return [("reshape", chw(shape))]


def gather_part_views(layer, graph: Graph, part: dict, *, backward: bool = False):
    """The views (prep/shape.py) of one part of a gather layer, over the texels' (c, h, w): forward,
    from the output's to the part's source's (an input's stored dims, or a constant's own shape);
    backward, from the input's to the output gradient's. None when the part reads nothing."""
    from texelfit.prep.shape import inverse_ops, part_views

    out = graph.shapes[layer.outputs[0]]
    if part.get("param") is not None:  # a class token: stored as one sample of its per-sample shape
        src = tuple(part["shape"])
        src_storage, to_logical = chw(src), storage_ops(src)
    elif part["input"] is None:
        src, src_storage, to_logical = part["const"].shape, part["const"].shape, []
    else:
        src = graph.shapes[layer.inputs[part["input"]]]
        src_storage, to_logical = chw(src), storage_ops(src)
    if backward:
        return part_views(chw(out), storage_ops(out), inverse_ops(src, part["ops"]), to_storage_ops(src))
    return part_views(src_storage, to_logical, part["ops"], to_storage_ops(out))


def gather_is_view(layer, graph: Graph) -> bool:
    """A gather of one input whose output has the texels of that input (a squeeze or unsqueeze of a
    size-1 axis, a flatten of (C, 1, 1), a reshape between flat shapes): no pass, the texture shared."""
    if layer.op != "gather" or len(layer.attrs["parts"]) != 1:
        return False
    part = layer.attrs["parts"][0]
    if part["input"] is None:
        return False
    src, out = graph.shapes[layer.inputs[part["input"]]], graph.shapes[layer.outputs[0]]
    return chw(src) == chw(out) and gather_part_views(layer, graph, part) == []


def storage_strides(shape: tuple[int, ...]) -> list[int]:
    """The stride of each logical axis of a per-sample shape in its stored order, the flat index
    (c * H + h) * W + w of chw(shape)."""
    shape = tuple(shape)
    if len(shape) == 2:
        return [1, int(shape[0])]
    return [int(np.prod(shape[i + 1:])) for i in range(len(shape))]


@dataclass(frozen=True)
class TextureSpec:
    name: str
    role: str  # activation | gradient | param | param_grad | state | labels | targets | loss
    shape: tuple[int, ...]  # logical shape (max_batch first, for per-sample tensors)
    packing: Packing
    height: int  # texture height in texels (>= packing.rows)
    sample_rows: int = 0  # texture rows per sample (per-sample tensors), else 0
    double: bool = False  # ping-pong pair (weights and optimizer state)
    fold: int = 0  # folded into rows of this many texels on every device (blocked_fold), else 0

    @property
    def width(self) -> int:
        return self.packing.width

    @property
    def bytes(self) -> int:
        return self.width * self.height * 16 * (2 if self.double else 1)

    def report(self) -> dict:
        d = asdict(self)
        del d["packing"]
        lim = WEBGL2_MIN_TEXTURE_SIZE
        texels = self.width * self.height
        fits = self.width <= lim and self.height <= lim
        d.update(texture=[self.width, self.height], pad_lanes=self.packing.c4 * 4 - self.packing.chans,
                 pad_rows=self.height - self.packing.rows, bytes=self.bytes,
                 tiles=1 if fits else ceil_div(texels, lim), folded_at_2048=not fits,
                 min_texture_size=max(1, int(np.ceil(np.sqrt(texels)))))
        return d


@dataclass
class LayoutPlan:
    textures: dict[str, TextureSpec]
    act_alias: dict[str, str]  # tensor -> the tensor whose texture it shares (a flatten in place, a view)
    grad_targets: dict[tuple[str, int], str]  # (layer name or "<loss>", input slot) -> texture its backward writes
    grad_sums: dict[str, list[str]]  # tensor -> contribution textures summed into grad:tensor
    grad_alias: dict[str, str]  # tensor -> gradient texture it shares (the only consumer is an add)
    needs_grad: set[str]
    # tensors X = act(Z) of a dense or conv layer with a fused activation whose one consumer is a dense
    # layer: its grad_input writes dz:X, the gradient before the activation, itself (times act'(X)),
    # and the producer has no activation_grad pass (one pass a step fewer). X -> (act, its attrs)
    act_grad_fused: dict[str, tuple[str, dict]] = field(default_factory=dict)
    # a trainable parameter read by several layers (a tied one, prep.graph) -> those layers' names: layer j's
    # gradient is written to pgrad{j}:P and their sum to pgrad:P (codegen/ops/common.py: param_grad)
    param_grad_parts: dict[str, list[str]] = field(default_factory=dict)

    def tensor(self, name: str) -> str:
        """The activation texture holding tensor `name`."""
        return "act:" + self.act_alias.get(name, name)

    def columns_only(self, name: str) -> bool:
        """Whether tensor `name` is kept as the 8 parts col0..7 of its column-blocked conv alone (column_only)."""
        t = self.tensor(name)
        return t not in self.textures and "col0:" + t in self.textures

    def grad(self, name: str) -> str:
        """The texture holding the gradient of tensor `name` (after any sum)."""
        return self.grad_alias.get(name, "grad:" + name)

    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.textures.values())


def operand_of_input(layer, k: int, graph: Graph) -> tuple[int, dict]:
    """(slot, operand) of an elementwise layer's input k."""
    return next((i, o) for i, o in enumerate(operands(layer, graph)) if o["kind"] == "act" and o["input"] == k)


def shares_gradient(layer, k: int, graph: Graph) -> bool:
    """Whether input k of `layer` has the gradient of its output as it is (an operand of an add or the
    first of a sub, of the output's shape): its backward writes nothing, the texture is shared."""
    if layer.op not in ELEMENTWISE:
        return False
    slot, o = operand_of_input(layer, k, graph)
    return passes_gradient(layer.op, slot) and tuple(o["shape"]) == tuple(graph.shapes[layer.outputs[0]])


def plan_layout(graph: Graph, max_batch: int) -> LayoutPlan:
    textures: dict[str, TextureSpec] = {}
    param_grad_parts: dict[str, list[str]] = {}

    def add(spec: TextureSpec):
        textures[spec.name] = spec

    def per_sample(name, role, tensor, shape=None):
        shape = shape or graph.shapes[tensor]
        p = activation_packing(shape, max_batch)
        add(TextureSpec(name, role, (max_batch,) + shape, p, p.rows, p.r2))

    def blocked_parts(name, role, tensor, tokens=False):  # 8 render targets: samples 8*r + t in blk{t}, or, tokens,
        shape, n = graph.shapes[tensor], ceil_div(max_batch, SAMPLE_BLOCK)  # each sample's rows 8*r + t (row_blocked)
        if tokens:
            shape, n = (shape[0] // ROW_BLOCK, shape[1]), max_batch
        p = activation_packing(shape, n)
        for t in range(SAMPLE_BLOCK):
            add(TextureSpec(f"blk{t}:{name}", role, (n,) + shape, p, p.rows, p.r2, fold=blocked_fold(p.width, p.rows)))

    def samples_last(name, role, tensor, rows_of=1):
        shape = graph.shapes[tensor]
        c, h, _ = chw(shape)
        add(TextureSpec(name, role, shape + (max_batch,), samples_last_packing(shape, max_batch),
                        ceil_div(c, rows_of) * rows_of * h))

    # (a loss reading the logits before the softmax: no gradient after them)
    needs = graph.needs_grad() - {o for o in graph.outputs if graph.loss_input(o) != o}
    act_alias: dict[str, str] = {}
    for tensor in graph.inputs:
        per_sample("act:" + tensor, "activation", tensor)
    for layer in graph.layers:
        out = layer.outputs[0]
        if flattens_in_place(layer, graph):  # same texels: share the texture
            act_alias[out] = act_alias.get(layer.inputs[0], layer.inputs[0])
            continue
        if not column_only(out, graph, needs):  # (else its 8 parts below alone)
            per_sample("act:" + out, "activation", out)
        # for its backward: a maxpool's argmax, a max's ties (of its output's shape), a layernorm's statistics
        for saved in opdef(layer.op).saves(layer, graph):
            prefix, role, shape = (saved, "argmax", None) if isinstance(saved, str) else saved
            per_sample(prefix + out, role, out, shape)
        if sample_blocked(layer, graph, max_batch) and not column_blocked(layer, graph):
            blocked_parts("act:" + out, "activation", out)  # 8 samples a fragment: its forward's 8 render targets
        if row_blocked(layer, graph):  # 8 tokens a fragment: its forward's 8 render targets
            blocked_parts("act:" + out, "activation", out, tokens=True)
        if column_blocked(layer, graph):  # 4 positions, 2 halves a fragment: its forward's 8 render targets
            c, h, w = graph.shapes[out]
            shape = (4 * ceil_div(ceil_div(c, 4), COLUMN_HALVES), h, ceil_div(w, COLUMN_BLOCK))
            p = activation_packing(shape, max_batch)  # (its size: the texels are in blocks-last order)
            for k in range(COLUMN_PARTS):
                add(TextureSpec(f"col{k}:act:{out}", "activation", (max_batch,) + shape, p, p.rows, p.r2))
        if parts := split_k(layer, graph):  # float32 in every tier: partial sums
            p = activation_packing((graph.shapes[out][0], parts, 1), max_batch)
            add(TextureSpec("split:" + out, "partial", (max_batch,) + graph.shapes[out], p, p.rows, p.r2))
        # below the lowest trainable layer (out needs no gradient) the backward has no pass, and a frozen
        # weight no gradient pass: neither needs the textures that follow
        if layer.op in WEIGHTED and layer.attrs.get("act", "none") != "none" and out in needs:
            per_sample("dz:" + out, "gradient", out)  # the gradient before its fused activation
        # the weight gradient's factor with the samples as channels (see above); a dense layer's one-sample
        # weight gradient reads dZ as it is, so only a blocked one needs dzt:
        trains_weight = layer.op in WEIGHTED and graph.is_trainable(layer.params["weight"])
        if layer.op == "dense" and trains_weight and weight_grad_blocked(layer, graph, max_batch):
            samples_last("dzt:" + out, "gradient", out, rows_of=4)
        if layer.op == "conv" and trains_weight:
            samples_last("xt:" + act_alias.get(layer.inputs[0], layer.inputs[0]), "activation", layer.inputs[0])
        if layer.op == "conv_transpose" and trains_weight:  # its weight gradient is a conv's, with dZ as its X
            samples_last("dzt:" + out, "gradient", out)

    # Gradients. A tensor with one consumer gets grad:T written by that consumer's backward;
    # with several, each writes grad:T@k and a sum pass adds them into grad:T. The backward of
    # `add` (and of a flatten in place) writes nothing: its contribution to each input is the
    # gradient of its output.
    grad_targets: dict[tuple[str, int], str] = {}
    grad_sums: dict[str, list[str]] = {}
    grad_alias: dict[str, str] = {}
    act_grad_fused: dict[str, tuple[str, dict]] = {}
    for layer in reversed(graph.layers):
        out = layer.outputs[0]
        if out not in needs:
            continue
        uses = [(c, i) for c in graph.layers for i, t in enumerate(c.inputs) if t == out and c.outputs[0] in needs]
        uses = [("<loss>", k) for k, x in enumerate(graph.loss_inputs()) if x == out] + uses  # (output k's loss)
        contributions = []
        for k, (consumer, slot) in enumerate(uses):
            cname = consumer if isinstance(consumer, str) else consumer.name
            if not isinstance(consumer, str) and (shares_gradient(consumer, slot, graph)
                                                  or flattens_in_place(consumer, graph)):
                contributions.append(grad_alias.get(consumer.outputs[0], "grad:" + consumer.outputs[0]))
                continue
            target = "grad:" + out if len(uses) == 1 else f"grad:{out}@{k}"
            if len(uses) == 1 and consumer != "<loss>" and consumer.op == "dense" and \
                    layer.op in WEIGHTED and layer.attrs.get("act", "none") != "none":
                target = "dz:" + out
                act_grad_fused[out] = (layer.attrs["act"], layer.attrs.get("act_attrs", {}))
            grad_targets[(cname, slot)] = target
            contributions.append(target)
            per_sample(target, "gradient", out)
        if len(uses) == 1 and contributions[0] != "grad:" + out and out not in act_grad_fused:
            grad_alias[out] = contributions[0]  # the single consumer is an add: share its output's gradient
        elif len(uses) > 1:
            grad_sums[out] = contributions
            for t in ["grad:" + out] + [f"gradsum{k}:{out}" for k in range(len(sum_groups(len(contributions))))]:
                per_sample(t, "gradient", out)  # (more than a pass reads: partial sums first, gradsum{k})

    for layer in graph.layers:  # a sample-blocked layer's grad_input is too: 8 render targets (a row-blocked one's too)
        if (sample_blocked(layer, graph, max_batch) or row_blocked(layer, graph)) and (layer.name, 0) in grad_targets:
            blocked_parts(grad_targets[(layer.name, 0)], "gradient", layer.inputs[0], row_blocked(layer, graph))

    for p in graph.params.values():
        layer = next(l for l in graph.layers if p.name in l.params.values())
        role = next(r for r, n in layer.params.items() if n == p.name)
        if role == "bias":  # per feature vectors: one row
            packing, height = matrix_packing(1, p.array.size), 1
        else:  # the op's rule (prep/ops/)
            packing, height = opdef(layer.op).weight_layout(layer, graph, p, role)
        if not graph.is_trainable(p.name):  # frozen: the weight alone, never written, so not double-buffered
            add(TextureSpec("param:" + p.name, "param", tuple(p.array.shape), packing, height))
            continue
        for role_name, prefix in (("param", "param:"), ("param_grad", "pgrad:"), ("state", "m:"), ("state", "v:")):
            add(TextureSpec(prefix + p.name, role_name, tuple(p.array.shape), packing, height,
                            double=role_name in ("param", "state")))
        readers = [l.name for l in graph.layers if p.name in l.params.values()]
        if len(readers) > 1:  # a tied parameter: each reader's gradient apart, then their sum (pgrad:)
            param_grad_parts[p.name] = readers
            for part in [f"pgrad{j}" for j in range(len(readers))] + \
                    [f"pgradsum{k}" for k in range(len(sum_groups(len(readers), PARAM_SUM_LAST)))]:  # (partial sums: more than a pass reads)
                add(TextureSpec(f"{part}:{p.name}", "param_grad", tuple(p.array.shape), packing, height))
        if role == "weight" and weight_grad_blocked(layer, graph, max_batch):
            # its gradient is blocked too: rows 8*r + t of dW in row r of blk{t}
            rows = height // SAMPLE_BLOCK
            part = Packing(rows, 1, packing.blocks, packing.chans, 0, 0, 0, 0)  # sizes only: never packed
            for t in range(SAMPLE_BLOCK):
                add(TextureSpec(f"blk{t}:pgrad:{p.name}", "param_grad", (rows, packing.chans), part, rows))

    labels, ring = matrix_packing(max_batch, 1), matrix_packing(1, 4 * LOSS_RING)
    for k, o in enumerate(graph.outputs):  # each output's loss: its labels or targets, and its ring of values
        add(TextureSpec(loss_texture("labels", k), "labels", (max_batch,), labels, max_batch, 1))
        if len(graph.shapes[o]) == 1 and ce_stats(graph.shapes[o][0]):  # (float32 in every tier)
            add(TextureSpec(loss_texture(CE_STATS, k), "loss", (max_batch, 2), matrix_packing(max_batch, 2), max_batch, 1))
        per_sample(loss_texture("targets", k), "targets", graph.loss_input(o))
        add(TextureSpec(loss_texture("loss", k), "loss", (LOSS_RING,), ring, 1))
    return LayoutPlan(textures, act_alias, grad_targets, grad_sums, grad_alias, needs, act_grad_fused,
                      param_grad_parts)
