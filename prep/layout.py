"""The RGBA texture plan: where every tensor lives on the GPU.

One layout, the *row-packed matrix*, serves every tensor of a dense network.
A logical matrix M of `rows` x `cols` floats becomes a texture of
`ceil(cols/4)` texels per row; texel (x=c4, y=r) holds M[r, 4*c4 .. 4*c4+3]:

            texel col 0         texel col 1         ...  texel col C4-1
          +-------------------+-------------------+-----+------------------------+
  row 0   | M00 M01 M02 M03   | M04 M05 M06 M07   | ... | M0,4C4-4 .. (pad = 0)  |
  row 1   | M10 M11 M12 M13   | ...               |     |                        |
   ...    |                   |                   |     |                        |
  row R-1 | ...               |                   |     |                        |
          +-------------------+-------------------+-----+------------------------+
  (rows beyond the logical ones, if any, are zero: `pad_rows`)

  tensor                     logical matrix            texture rows
  activation / its gradient  [max_batch, features]     max_batch   (one row per sample)
  dense weight W[O, I]       [O, I]                    ceil4(O)    (4 output rows per fragment)
  bias b[O]                  [1, O]                    1
  class labels               [max_batch, 1]            max_batch
  loss ring                  [1, 4*RING]               1           (mean loss of step s in texel s % RING, .x)

Padding lanes and padding rows hold zeros, and the kernels keep them zero, so a
padded lane never leaks into a dot product. Packing is implemented once here
(`pack`/`unpack`, used for tests and for the embedded weights' order) and once
in the runtime (`pack2d`/`unpack2d` in runtime_template/textures.js.j2); the
GLSL accessors (`getX(r, c4)`) read it. The round-trip test pins them together.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .ir import Graph

LOSS_RING = 64  # steps of mean loss kept on the GPU between asynchronous readbacks


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TextureSpec:
    name: str
    role: str  # activation | gradient | param | param_grad | state | labels | targets | loss
    shape: tuple[int, ...]  # logical shape (batch included, as max_batch, for per-sample tensors)
    rows: int  # logical matrix rows
    cols: int  # logical matrix columns
    height: int  # texture height in texels (>= rows)
    double: bool = False  # ping-pong pair (weights and optimizer state)

    @property
    def width(self) -> int:
        return ceil_div(self.cols, 4)

    @property
    def pad_lanes(self) -> int:
        return self.width * 4 - self.cols

    @property
    def pad_rows(self) -> int:
        return self.height - self.rows

    @property
    def bytes(self) -> int:
        return self.width * self.height * 16 * (2 if self.double else 1)

    def report(self) -> dict:
        d = asdict(self)
        d.update(texture=[self.width, self.height], pad_lanes=self.pad_lanes, pad_rows=self.pad_rows,
                 bytes=self.bytes, tiles=1)
        return d


def pack(matrix: np.ndarray, spec: TextureSpec) -> np.ndarray:
    """Logical matrix -> RGBA float32 texture data of shape (height, width, 4)."""
    m = np.asarray(matrix, dtype=np.float32).reshape(spec.rows, spec.cols)
    out = np.zeros((spec.height, spec.width * 4), dtype=np.float32)
    out[: spec.rows, : spec.cols] = m
    return out.reshape(spec.height, spec.width, 4)


def unpack(texels: np.ndarray, spec: TextureSpec) -> np.ndarray:
    t = np.asarray(texels, dtype=np.float32).reshape(spec.height, spec.width * 4)
    return t[: spec.rows, : spec.cols].copy()


@dataclass
class LayoutPlan:
    textures: dict[str, TextureSpec]
    alias: dict[str, str]  # tensor -> the tensor whose texture it shares (flatten of dense data)

    def tensor(self, name: str) -> str:
        """The activation texture holding tensor `name`."""
        return "act:" + self.alias.get(name, name)

    def grad(self, name: str) -> str:
        return "grad:" + self.alias.get(name, name)

    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.textures.values())


def plan_layout(graph: Graph, max_batch: int) -> LayoutPlan:
    textures: dict[str, TextureSpec] = {}
    alias: dict[str, str] = {}

    def add(spec: TextureSpec):
        textures[spec.name] = spec

    def features(t):
        return int(np.prod(graph.shapes[t]))

    add(TextureSpec("act:" + graph.input, "activation", (max_batch,) + graph.input_shape, max_batch,
                    features(graph.input), max_batch))
    for layer in graph.layers:
        out = layer.outputs[0]
        if layer.op == "flatten":  # dense data is already flat: share the texture
            alias[out] = alias.get(layer.inputs[0], layer.inputs[0])
            continue
        shape = (max_batch,) + graph.shapes[out]
        add(TextureSpec("act:" + out, "activation", shape, max_batch, features(out), max_batch))
        add(TextureSpec("grad:" + out, "gradient", shape, max_batch, features(out), max_batch))
    # the gradient of every tensor a layer reads, except the model input's (never needed)
    for layer in graph.layers:
        x = alias.get(layer.inputs[0], layer.inputs[0])
        if x != graph.input and "grad:" + x not in textures:
            raise AssertionError(f"no gradient texture for {x}")

    for p in graph.params.values():
        rows, cols = (p.array.shape if p.array.ndim == 2 else (1, p.array.size))
        height = ceil_div(rows, 4) * 4 if p.array.ndim == 2 else rows
        for role, prefix in (("param", "param:"), ("param_grad", "pgrad:"), ("state", "m:"), ("state", "v:")):
            add(TextureSpec(prefix + p.name, role, tuple(p.array.shape), rows, cols, height,
                            double=role in ("param", "state")))

    out_features = features(graph.output)
    add(TextureSpec("labels", "labels", (max_batch,), max_batch, 1, max_batch))
    add(TextureSpec("targets", "targets", (max_batch,) + graph.output_shape, max_batch, out_features, max_batch))
    add(TextureSpec("loss", "loss", (LOSS_RING,), 1, 4 * LOSS_RING, 1))
    return LayoutPlan(textures, alias)
