"""The IR: a short list of typed layers in topological order.

Everything after `prep.graph` reads only this, never ONNX protos. Shapes are
per-sample (batch is the only dynamic dimension, bounded by `max_batch`).

Ops, grouped:

  parametric   dense        y = act(x @ W.T + b)       params: weight [O, I], bias [O] (optional)
  elementwise  relu, leaky_relu(alpha), sigmoid, tanh
  layout       flatten      per-sample shape -> (prod,) ; on dense data a no-op

`dense` may carry a fused activation (`attrs["act"]`), set by `prep.fuse`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh")
OPS = ("dense", "flatten") + ACTIVATIONS


@dataclass
class Param:
    """A trainable tensor, keyed by its ONNX initializer (= state_dict) name.

    `array` is in the canonical layout the kernels want (dense weight: [out, in]).
    `exported_transposed` says the source tensor was [in, out] (MatMul, or Gemm
    with transB=0): getWeights/setWeights transpose back to the source layout.
    """

    name: str
    array: np.ndarray
    exported_transposed: bool = False

    @property
    def source_shape(self) -> tuple[int, ...]:
        shape = tuple(self.array.shape)
        return shape[::-1] if self.exported_transposed else shape


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
    input: str
    output: str
    shapes: dict[str, tuple[int, ...]]  # tensor name -> per-sample shape
    layers: list[Layer]
    params: dict[str, Param]  # in a stable order (the ONNX initializer order)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shapes[self.input]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shapes[self.output]

    def consumers(self, tensor: str) -> list[Layer]:
        return [layer for layer in self.layers if tensor in layer.inputs]

    def producer(self, tensor: str) -> Layer | None:
        for layer in self.layers:
            if tensor in layer.outputs:
                return layer
        return None

    def parameter_count(self) -> int:
        return int(sum(p.array.size for p in self.params.values()))
