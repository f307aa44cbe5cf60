"""The IR: a short list of typed layers in topological order.

Everything after `prep.graph` reads only this, never ONNX protos. Shapes are
per-sample (batch is the only dynamic dimension, bounded by `max_batch`):
(F,) for dense data, (C, H, W) for images, (R, F) for tokens (rows by features: a sequence
(T, F), or attention's (heads * T, d), the leading axes merged by prep.graph).

Ops, grouped (GROUPS below; each op's rules, its FLOPs, torch forward, pruning, weight layout, saved textures
and kernel family, are its definition in the op registry, prep/ops/):

  parametric   dense        y = act(x @ W.T + b)               weight [O, I] (or [I, O], `transposed`), bias [O]
               conv         y = act(conv2d(x, W) + b)          weight [OC, IC/groups, KH, KW], bias [OC]
                            attrs: kernel, strides, pads (top, left, bottom, right), dilations, groups
               conv_transpose  y = act(conv_transpose2d(x, W) + b)   weight [IC, OC/groups, KH, KW], bias [OC]
                            attrs: those of conv (pads cut from the full output), output_padding
               matmul       y = x @ B (+ b), token-wise: x (R, I) -> (R, O); weight B [I, O] (or [O, I]:
                            `transposed` False, as a Linear's), bias [O]
                            or of two activations, batched: a (G*M, K) @ b (G*K, P) -> (G*M, P), each of
                            the G = attrs["groups"] blocks of rows a matrix (attention's Q K^T and A V)
               layernorm    y = (x - mean) / sqrt(var + eps) * w + b over the last (packed) axis;
                            weight [F], bias [F]; attrs: eps
               embedding    y[t] = W[ids[t]]: integer ids (T,) -> tokens (T, F); weight W [V, F] (the table,
                            nn.Embedding's weight); attrs: padding_idx (its row gets no gradient) or None
  folded away  batchnorm    inference form; `prep.fold` folds it into the conv/dense before it, or where it
                            cannot, turns it into a batchnorm_affine (below); attrs: its statistics, eps and
                            `names`, the ONNX names of its scale and shift
  elementwise  every op of prep/elementwise.py: unary (relu, clip, hardswish, exp, ...: ACTIVATIONS),
               binary (add, sub, mul, div, prelu: BINARY) and batchnorm_affine (a free batch-norm: NORMS),
               with ONNX broadcasting; attrs: the op's
               attributes, and `operands` (see below)
  reducing     reduce       attrs: kind (mean, sum, max), axes (per-sample axes), keepdims
  normalising  softmax, log_softmax   over the channel axis (the class axis of (F,) data)
  pooling      maxpool      attrs: kernel, strides, pads, ceil_mode
               avgpool      attrs: kernel, strides, pads, ceil_mode, count_include_pad
               global_avgpool   mean over H, W; attrs: keepdims
  resampling   resample     Resize/Upsample (nearest, bilinear), Pad (edge, reflect) over H and W: attrs: kind,
                            rows and cols, the taps (input index, weight) of each output row and column
                            (prep/resample.py)
  training     dropout      attrs: ratio; applied in fit's training steps only (prep/dropout.py)
  merging      concat       on the channel axis
  layout       flatten      (C, H, W) -> (C*H*W,) in PyTorch's order; on dense data a no-op
               gather       every other shape op on activations (Reshape, Transpose, Flatten on any axis,
                            Squeeze, Unsqueeze, Slice, Split, Concat off the channel axis or with constants):
                            attrs: parts, a list of {input: slot in `inputs` or None, const: per-sample
                            array or None, ops: chain of view ops} (or of {param: role in `params`, shape:
                            its per-sample shape, ops}: a parameter repeated over the batch, a class token,
                            whose gradient is the sum over the batch); the output is the sum of the parts,
                            each zero outside what it covers (prep/shape.py draws the ops and their maps).
                            Consecutive ones compose into one (prep.graph); one that keeps the texels
                            (layout.gather_is_view) is no pass

`dense`, `conv` and `conv_transpose` (WEIGHTED) may carry a fused activation (`attrs["act"]`, with its attributes in
`attrs["act_attrs"]`), set by `prep.fuse`.

An elementwise layer's `attrs["operands"]` lists, per operand of its expression, where it comes
from: {"kind": "act", "input": k} (layer.inputs[k]), {"kind": "const", "values": [...]} (baked into
the kernel) or {"kind": "param", "role": r} (layer.params[r], trainable), each with its per-sample
`shape` after ONNX broadcasting to the output's rank: (C, H, W) or (F,), each axis the output's or 1
(a const or param has no batch axis). Without `operands`, operand i is layer.inputs[i] at full shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .elementwise import BINARY, NORMS, UNARY

# Every IR op, by its group (above): the op lists below derive from it, and the op registry (prep/ops/) holds
# one definition, its rules, for each op named here (a missing one fails when prep/ops is imported)
GROUPS: dict[str, tuple[str, ...]] = {
    "parametric": ("dense", "conv", "conv_transpose", "matmul", "layernorm", "embedding"),
    "folded away": ("batchnorm",),
    "elementwise": tuple(UNARY) + tuple(BINARY) + tuple(NORMS),
    "reducing": ("reduce",),
    "normalising": ("softmax", "log_softmax"),
    "pooling": ("maxpool", "avgpool", "global_avgpool"),
    "resampling": ("resample",),
    "training": ("dropout",),
    "merging": ("concat",),
    "layout": ("flatten", "gather"),
}
GROUP_OF: dict[str, str] = {op: g for g, ops in GROUPS.items() for op in ops}
ACTIVATIONS = tuple(UNARY)
ELEMENTWISE = GROUPS["elementwise"]
POOLS = GROUPS["pooling"]
REDUCE = GROUPS["reducing"]
SOFTMAX = GROUPS["normalising"]
WEIGHTED = ("dense", "conv", "conv_transpose")  # a weight, a bias, a fused activation (prep/fuse.py)
OPS = tuple(GROUP_OF)


@dataclass
class Param:
    """A trainable tensor, keyed by its state_dict (ONNX initializer) name, in that layout.

    `transposed` marks a dense weight stored [in, out] (x @ W) rather than PyTorch's
    Linear layout [out, in]; the texture packing reads it either way. `source`: the ONNX initializer it
    is a copy of, where several layers read one initializer (prep.graph unties them; prep/trust.py
    tells a tie of a PyTorch source from an ONNX file's merge of equal values), else None. `constant`: not a
    parameter at all, a big constant (below).
    """

    name: str
    array: np.ndarray
    transposed: bool = False
    source: str | None = None
    # a constant of the model too big to bake into a kernel (more than prep/shape.py's MAX_CONSTANT_FLOATS values:
    # a positional encoding's buffer, a mean image), shipped as a frozen texture: never trainable, and no weight
    # (getWeights, the trainable set and --trainable's names leave it out)
    constant: bool = False

    def canonical(self) -> np.ndarray:
        """Dense weights as [out, in]; everything else as stored."""
        return self.array.T if self.transposed else self.array


@dataclass
class Layer:
    op: str
    name: str  # the ONNX node name it came from
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # role ("weight", "bias") -> Param name

    def __post_init__(self):
        assert self.op in OPS, self.op


@dataclass
class Graph:
    input: str  # the first input (all a single-input model has)
    output: str  # the first output (all a single-output model has)
    shapes: dict[str, tuple[int, ...]]  # tensor name -> per-sample shape
    layers: list[Layer]
    params: dict[str, Param]  # in a stable order (the ONNX initializer order)
    # the parameters that train (build --trainable); None: all of them. The others are frozen: shipped as
    # they are, with no gradient, no optimizer state and no pass that would need one
    trainable: frozenset[str] | None = None
    # every input, in the order the model takes them (build --inputs; an ONNX file's declared order): the
    # first is `input`. () means (input,)
    inputs: tuple[str, ...] = ()
    # the element type of each input that is not float32 (prep/load.py: INPUT_DTYPES): integer token ids,
    # stored as exact floats (< 2^24); an input not in it is float32
    dtypes: dict[str, str] = field(default_factory=dict)
    # a tied parameter's other state_dict keys -> its name (prep/naming.py: ALIASES_KEY)
    aliases: dict[str, str] = field(default_factory=dict)
    # every output, in the order the model returns them (its ONNX graph's outputs): the first is `output`.
    # () means (output,). Each has a loss of its own in fit (codegen/schedule.py), their weighted sum trains
    outputs: tuple[str, ...] = ()
    # the name the page knows each output by (the ONNX graph's output names: predict's keys); () means outputs
    output_names: tuple[str, ...] = ()

    def __post_init__(self):
        self.inputs = tuple(self.inputs) or (self.input,)
        assert self.inputs[0] == self.input, (self.inputs, self.input)
        self.outputs = tuple(self.outputs) or (self.output,)
        assert self.outputs[0] == self.output, (self.outputs, self.output)
        self.output_names = tuple(self.output_names) or self.outputs
        assert len(self.output_names) == len(self.outputs), (self.output_names, self.outputs)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shapes[self.input]

    def dtype(self, tensor: str) -> str:
        return self.dtypes.get(tensor, "float32")

    @property
    def input_dtype(self) -> str:
        return self.dtype(self.input)

    def id_range(self, tensor: str) -> int | None:
        """The ids an integer input may hold: [0, rows) of the smallest embedding table that reads it, or
        None where no embedding reads it."""
        rows = [self.params[layer.params["weight"]].array.shape[0] for layer in self.layers
                if layer.op == "embedding" and layer.inputs[0] == tensor]
        return min(rows) if rows else None

    @property
    def input_shapes(self) -> list[tuple[int, ...]]:
        return [self.shapes[t] for t in self.inputs]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shapes[self.output]

    def loss_input(self, output: str | None = None) -> str:
        """The tensor the losses of `output` (default: the first) read: the output, or for an output of
        softmax or log_softmax over its classes the logits entering it (cross_entropy of those is what
        CrossEntropyLoss of the logits, or NLLLoss of the log-probabilities, computes)."""
        output = output or self.output
        last = next((layer for layer in self.layers if output in layer.outputs), None)
        if last is not None and last.op in SOFTMAX and len(self.shapes[output]) == 1 and \
                len(self.consumers(output)) + list(self.outputs).count(output) == 1:
            return last.inputs[0]
        return output

    def loss_inputs(self) -> list[str]:
        """Each output's loss_input, in order."""
        return [self.loss_input(o) for o in self.outputs]

    def consumers(self, tensor: str) -> list[Layer]:
        return [layer for layer in self.layers if tensor in layer.inputs]

    def parameter_count(self) -> int:
        return int(sum(p.array.size for p in self.params.values() if not p.constant))

    def macs(self, layer: Layer) -> int:
        """Multiply-adds of one sample through a dense, conv, transposed conv or matmul layer (each weight once
        per output position); 0 for the other layers."""
        if layer.op == "matmul":
            r, k = self.shapes[layer.inputs[0]]
            return int(r * k * self.shapes[layer.outputs[0]][1])
        if layer.op not in WEIGHTED:
            return 0
        if layer.op == "conv_transpose":  # each weight once per input position
            return int(self.params[layer.params["weight"]].array.size * np.prod(self.shapes[layer.inputs[0]][1:]))
        out = self.shapes[layer.outputs[0]]
        spatial = int(np.prod(out[1:])) if len(out) == 3 else 1
        return int(self.params[layer.params["weight"]].array.size) * spatial

    def is_trainable(self, param: str) -> bool:
        p = self.params.get(param)
        return (p is None or not p.constant) and (self.trainable is None or param in self.trainable)

    def weight_names(self) -> list[str]:
        """The parameters, trainable or frozen, without the big constants (Param.constant): what getWeights
        lists."""
        return [n for n, p in self.params.items() if not p.constant]

    def constants(self) -> list[str]:
        """The big constants (Param.constant), shipped as frozen textures."""
        return [n for n, p in self.params.items() if p.constant]

    def trainable_params(self) -> list[str]:
        """The trainable parameters' names, in the graph's order."""
        return [n for n in self.params if self.is_trainable(n)]

    def trains(self, layer: Layer) -> bool:
        """Whether `layer` owns a trainable parameter."""
        return any(self.is_trainable(n) for n in layer.params.values())

    def needs_grad(self) -> set[str]:
        """Tensors whose gradient the backward pass must compute: those that depend on a trainable
        parameter. Below the lowest trainable layer the backward computes nothing."""
        out: set[str] = set()
        for layer in self.layers:
            if self.trains(layer) or any(t in out for t in layer.inputs):
                out.update(layer.outputs)
        return out

    def trunk(self) -> str | None:
        """The cut tensor of the frozen trunk: the latest tensor T such that every layer after T's
        producer reads only T and tensors produced after it, and no layer up to it trains (so the
        head, the layers after it, computes from T alone, and every output, and T does not change while the
        head trains; every IR op is deterministic). None when the first trainable layer reads the input
        (nothing to cache) or nothing trains."""
        first = next((i for i, layer in enumerate(self.layers) if self.trains(layer)), None)
        if first is None:
            return None
        for k in range(first - 1, -1, -1):
            cut = self.layers[k].outputs[0]
            later = {t for layer in self.layers[k + 1:] for t in layer.outputs}
            if all(t == cut or t in later for layer in self.layers[k + 1:] for t in layer.inputs) and \
                    all(t == cut or t in later for t in self.outputs):
                return cut
        return None


def operands(layer: Layer, graph: Graph) -> list[dict]:
    """The operands of an elementwise layer (see the module docstring)."""
    if "operands" in layer.attrs:
        return layer.attrs["operands"]
    return [{"kind": "act", "input": i, "shape": list(graph.shapes[t])} for i, t in enumerate(layer.inputs)]
