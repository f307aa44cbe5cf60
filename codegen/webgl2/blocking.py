"""The blocking rules of the WebGL2 layout: where a pass computes several samples, positions or input slices a
fragment, and the textures that takes (sample-blocked parts blk{t}:T, column-blocked parts col{k}:T, split-K
partials split:Y; layout.py's table). Each rule is a measurement on the software GPU (SwiftShader) this team
tunes for, given beside it; a WebGPU backend would have its own (workgroup tiles), the CPU backend computes the
generic kernels and deals their outputs into these parts (runtime/cpu.js: cpuBlocked; cpu_columns.js: cpuColumns)."""
from __future__ import annotations

from texelfit.prep.ir import Graph
from texelfit.prep.packing import ceil_div


# A dense or conv layer with at least this many multiply-adds per sample computes SAMPLE_BLOCK (8)
# samples a fragment in its forward and grad_input where the batch can be 8 or more: each weight
# texel fetched then serves 8 samples (dense: 12 fetches for 128 multiply-adds instead of 5 for
# 16). Such a pass writes 8 textures (blk0:T .. blk7:T, samples 8*r + t in row r of blk{t}: render
# targets are whole textures) and a second pass interleaves those into T (kernels/batch_main.glsl.j2).
# Its weight gradient computes 8 rows a fragment the same way (a dense one with outputs padded to
# a multiple of 8, a conv one with input channels a multiple of 8): each texel of X (dense) or dZ
# (conv) fetched then serves 8 rows. Below this size the extra pass costs more than the fetches
# saved. The blocked passes run at batches of at least BLOCK_MIN_BATCH, on devices that draw into
# SAMPLE_BLOCK targets at once (WebGL2 promises 4; SwiftShader and desktop GPUs have 8); elsewhere
# the layer's one-sample passes run (at batch 1 a blocked pass would fetch the one sample 8 times
# and the interleave would be a pass more). On SwiftShader a fragment computing 8 samples takes
# 1.16 times as long as one computing 4: the fetches of the weights and the per-fragment work
# dominate, so 8 halves the fragments for little more each.
SAMPLE_BLOCK_MIN_MACS = 16384
SAMPLE_BLOCK = 8
BLOCK_MIN_BATCH = 8

# A blocked part of few rows is folded: its texels, in row-major order, fill rows of `fold` texels, the
# layout of a texture past the size limit (textures.js; the kernels read it through fetchTiled and write it
# through outCoord). SwiftShader shares a draw between its threads by rows of 2x2 quads, so a draw one texel
# high runs on one thread with half of each quad idle: a dense layer's blocked forward at a max batch of 8 is
# one row of O/4 fragments. EfficientNet-Lite0's 1280->1000 head forward at batch 8 in a microbenchmark (its
# loop, 8 targets): 14.7 ms as 250x1 fragments, 11.3 as 125x2, 8.2 as 63x4, 7.7 as 32x8, 6.5 as 16x16.
# From FOLD_MIN_WIDTH texels on, a part of fewer than FOLD_ROWS rows is folded into FOLD_ROWS.
FOLD_ROWS = 8
FOLD_MIN_WIDTH = 64


def blocked_fold(width: int, rows: int) -> int:
    """The texels a row of a blocked part of width x rows texels is folded into (0: not folded)."""
    if rows >= FOLD_ROWS or width < FOLD_MIN_WIDTH:
        return 0
    return ceil_div(width * rows, FOLD_ROWS)


def sample_blocked(layer, graph: Graph, max_batch: int) -> bool:
    if layer.op not in ("dense", "conv") or max_batch < BLOCK_MIN_BATCH or layer.attrs.get("groups", 1) != 1:
        return False
    return graph.macs(layer) >= SAMPLE_BLOCK_MIN_MACS


# A token-wise matmul with a weight (a Linear on every token: matmul_forward, x @ B + b, and its input gradient
# matmul_grad_a, dY B^T) with at least ROW_BLOCK_MIN_MACS multiply-adds a sample computes ROW_BLOCK (8) rows (tokens)
# a fragment, at every batch, into 8 textures (blk0:T .. blk7:T, row 8*r + t of T in row r of blk{t}) and a second
# pass interleaves them into T (the sample-blocked dense layer's interleave, a row a sample): each weight texel
# fetched then serves 8 tokens (12 fetches for 128 multiply-adds instead of 5 for 16). Where a sample's rows are
# a multiple of 8 (a block is within one sample, so the parts are per-sample textures of R/8 rows a sample), on
# devices that draw into 8 targets at once (Pass.block_from: from batch 1); elsewhere the one-row pass (WebGPU
# runs it printed from the twin's kernel, its 8 rows an invocation written in place: Kernel.wgsl_kl). MiniLM's
# features of 16 sentences of 32 tokens (bench/minilm_profile.py, every draw synced): its token matmuls 5.9 s one
# row a fragment, 2.0 s 8 rows. The threshold (a 16-token 16 -> 16 Linear) is not a measurement: below it a layer is
# a small share of any step, and the pass more a small cost.
ROW_BLOCK = SAMPLE_BLOCK
ROW_BLOCK_MIN_MACS = 4096


def row_blocked(layer, graph: Graph) -> bool:
    if layer.op != "matmul" or "weight" not in layer.params or layer.attrs.get("weight_rows") == "out":
        return False
    if layer.attrs.get("groups", 1) != 1:
        return False
    return graph.shapes[layer.inputs[0]][0] % ROW_BLOCK == 0 and graph.macs(layer) >= ROW_BLOCK_MIN_MACS


# A dense layer's one-sample forward draws a row of ceil(O/4) fragments a sample, each looping over
# all ceil(I/4) input texels: at batch 1 that is one short row, which SwiftShader runs on one thread
# with half of each 2x2 quad idle. Split-K instead: S fragments a texel, each summing SPLIT_CHUNK
# input texels into split:Y (S rows a sample), and a pass summing those (dense_reduce). It pays from
# S = SPLIT_MIN_PARTS on: the MLP's 784->128 forward at batch 1 took 0.42 ms in one pass, 0.25 ms in 8
# slices and 0.17 ms in 16, plus 0.03 ms for the sum (a microbenchmark of both kernels).
SPLIT_CHUNK = 16
SPLIT_MIN_PARTS = 4
SPLIT_MAX_PARTS = 16


# A conv layer (groups 1, or depthwise) with at least COLUMN_BLOCK_MIN_MACS multiply-adds a sample computes
# COLUMN_BLOCK (4) neighbouring output positions ow = 4*b + t of a row a fragment in its forward, at every
# batch: each weight texel fetched then serves 4 positions (a 1x1 conv: 8 fetches for 64 multiply-adds instead
# of 5 for 16), and a depthwise conv fetches each input texel of the 4 outputs' windows once (3x3, stride 1:
# 18 + 9 fetches for 4 outputs instead of 72). And 2 channel texels a fragment, i and C4h + i of the two
# halves (COLUMN_HALVES): each input texel fetched then serves both (a 1x1: 12 fetches for 128 multiply-adds),
# into 8 textures, col{4g + t}:T holding position 4*b + t of half g, its channel texel i at column i*B + b
# (B = ceil(W/4) blocks: the 4 fragments of a 2x2 quad read one weight texel). Where the device draws fewer
# than 8 targets at once, two draws of 4, a half each (Pass.wide; WebGL2 promises 4). A second pass
# interleaves the parts into T (the interleave_cols kernel, codegen/ops/conv_kl.py; not always: column_only). Such a layer's
# forward is never sample-blocked (its backward still is): on SwiftShader the 4 positions, neighbours in the
# texture, beat 8 samples, rows far apart (EfficientNet-Lite0's features of 8 images: 18.6 s of synced draws
# sample-blocked, 10.2 s column-blocked; predict of 1 image 1826 -> 523 ms). Below this size (the small CNNs)
# the extra pass costs more than it saves.
# (On SwiftShader, 1x1 convs of EfficientNet-Lite0's shapes in a microbenchmark: 2 halves with that
# order took 0.70-0.80x the time of 1 texel a fragment; 2 halves with the blocks last 0.77-1.05x, 8
# positions a fragment 1.0-1.5x.)
COLUMN_BLOCK = 4
COLUMN_HALVES = 2
COLUMN_PARTS = COLUMN_BLOCK * COLUMN_HALVES
COLUMN_BLOCK_MIN_MACS = 1 << 18


def column_blocked(layer, graph: Graph) -> bool:
    if layer.op != "conv":
        return False
    ic, oc, g = graph.shapes[layer.inputs[0]][0], graph.shapes[layer.outputs[0]][0], layer.attrs["groups"]
    if g != 1 and not g == ic == oc:
        return False
    return graph.shapes[layer.outputs[0]][2] >= COLUMN_BLOCK and graph.macs(layer) >= COLUMN_BLOCK_MIN_MACS


# A column-blocked conv's output that only column-blocked convs read, each a 1x1 of stride 1 without padding
# (groups 1) or a depthwise one, is kept as its 8 parts alone: there is no interleave pass and no texture of the
# usual layout. Those convs read the parts themselves (conv_forward.glsl.j2: colin), position p of a row in
# block p / 4 of parts p % 4 and 4 + p % 4, which for their 4 positions a fragment is fixed at build time. That holds
# where nothing else reads the tensor: not the backward (it needs no gradient and its readers train no weight,
# which would read its samples-last copy), not the page (the model's output, the frozen trunk's cut). In
# EfficientNet-Lite0's frozen trunk that drops 34 of the 49 interleaves (the 15 others feed an add or the pooling).
def column_only(tensor: str, graph: Graph, needs: set[str]) -> bool:
    producer = next((layer for layer in graph.layers if tensor in layer.outputs), None)
    if producer is None or not column_blocked(producer, graph) or tensor in needs:
        return False
    if tensor in (*graph.outputs, *graph.loss_inputs(), graph.trunk()):
        return False
    readers = graph.consumers(tensor)
    return bool(readers) and all(reads_columns(layer, graph) and not graph.trains(layer) for layer in readers)


def reads_columns(layer, graph: Graph) -> bool:
    """Whether a column-blocked conv can read its input as the 8 parts (column_only)."""
    if not column_blocked(layer, graph):
        return False
    a, ic = layer.attrs, graph.shapes[layer.inputs[0]][0]
    if a["groups"] == ic == graph.shapes[layer.outputs[0]][0]:  # depthwise: any kernel, stride, padding
        return True
    return a["groups"] == 1 and tuple(a["kernel"]) == (1, 1) and tuple(a["strides"]) == (1, 1) and \
        not any(a["pads"]) and tuple(a["dilations"]) == (1, 1)


def weight_grad_blocked(layer, graph: Graph, max_batch: int) -> bool:
    """Whether the weight gradient of a sample-blocked layer is row-blocked too (blk{t}:pgrad:W, 8 rows
    of dW a fragment): where those rows come in whole 8s (a dense layer's outputs padded to 4, a conv's
    ICg: 8 rows of one kernel row kh, a row-blocked token matmul's inputs: then from batch 1)."""
    if layer.op == "matmul":  # a row-blocked token matmul's weight B [I, O]: 8 rows (inputs) of dB a fragment
        return row_blocked(layer, graph) and graph.shapes[layer.inputs[0]][1] % SAMPLE_BLOCK == 0
    if not sample_blocked(layer, graph, max_batch):
        return False
    if layer.op == "dense":
        return ceil_div(graph.shapes[layer.outputs[0]][0], 4) * 4 % SAMPLE_BLOCK == 0
    return graph.params[layer.params["weight"]].array.shape[1] % SAMPLE_BLOCK == 0


def split_k(layer, graph: Graph) -> int:
    """The parts S the one-sample forward of `layer` sums its inputs in, or 0 (one pass)."""
    if layer.op != "dense":
        return 0
    in4 = ceil_div(graph.shapes[layer.inputs[0]][0], 4)
    parts = min(SPLIT_MAX_PARTS, ceil_div(in4, SPLIT_CHUNK))
    return parts if parts >= SPLIT_MIN_PARTS else 0


# The gradients one pass of a sum reads (schedule.py: MAX_INPUTS, the texture units a pass may bind): with more
# terms (the steps of an unrolled recurrent layer, prep/recurrent.py), groups of them are summed into pgradsum{k}:P
# (gradsum{k}:T) first, and those into pgrad:P (grad:T). A tied parameter's last sum is computed in its optimizer's
# pass (ops/optim.py), which reads the anchor, the parameter and two moments beside it: that sum reads at most
# PARAM_SUM_LAST, so that ALBERT-base's 12 layers and a 16-step LSTM read no more than 15 textures in that pass.
GRAD_SUM_GROUP = 15
PARAM_SUM_LAST = GRAD_SUM_GROUP - 4


def sum_groups(terms: int, last: int = GRAD_SUM_GROUP) -> list[range]:
    """The groups of terms summed apart first: none where one pass, reading at most `last`, reads them all."""
    if terms <= last:
        return []
    groups = [range(j, min(j + GRAD_SUM_GROUP, terms)) for j in range(0, terms, GRAD_SUM_GROUP)]
    assert len(groups) <= last, f"{terms} gradients to sum: more than two rounds of partial sums"
    return groups
