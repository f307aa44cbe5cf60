"""Quantised weight shipping: the weights blob that the bundle carries, and what it decodes to.

    quantize(graph, mode)  ->  Quantized(graph with the weights the bundle will hold, blob, per-tensor info)

Modes (`--quantize`):
  none   every tensor float32                                        4 bytes a value
  fp16   conv and dense weights as IEEE half (round to nearest even)   2 bytes a value
  int8   conv and dense weights symmetric per output channel:          1 byte a value + 4 bytes a channel
         scale_c = max|w_c| / 127 (float32), q = round(w / scale_c) in [-127, 127], w' = q * scale_c
Biases (and any 1-D tensor) stay float32 in every mode: they are few, and an error in them
shifts every output. The bundle decodes the blob at createModel into float32 textures;
training then runs in float32 on the device. The decoded values are exactly what `quantize`
returns as the graph's params (the same float32 products), so what PyTorch evaluates on the
Python side is what the page starts from.

Reconstruction error, per value: fp16 |w' - w| <= 2^-11 |w| + 2^-25 (half's rounding, subnormals
included; values beyond half's range, 65504, are refused); int8 |w' - w| <= scale_c / 2 (plus one
float32 rounding of the product).

The blob (little-endian; its base64 is `const WEIGHTS` in the bundle):

    offset        size        field
    0             4           magic "TXFW"
    4             1           format version (1)
    5             3           zero
    8             4  u32      T, the number of tensors (MODEL.params order)
    12            16 * T      table, per tensor: u8 dtype (0 float32, 1 float16, 2 int8), 3 zero bytes,
                              u32 values, u32 scales (int8: output channels, else 0),
                              u32 inner (int8: consecutive values per scale; value i has
                              scale (i / inner | 0) % scales)
    12 + 16T      ...         data, per tensor, each padded with zeros to a multiple of 4 bytes:
                              int8: float32 scales[scales], then int8 values; else the values
    end - 4       4  u32      CRC-32 (zlib's, IEEE 802.3) of every byte before it

A blob whose checksum, magic, version, lengths or table do not check out makes createModel
throw TexelfitError('corrupt-weights') (runtime_template/runtime/weights.js); `decode` here
is the same decoder in Python.
"""
from __future__ import annotations

import dataclasses
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from .ir import Graph
from .errors import BuildError

MODES = ("none", "fp16", "int8")
MAGIC = b"TXFW"
VERSION = 1
F32, F16, I8 = 0, 1, 2
DTYPE_NAMES = {F32: "float32", F16: "float16", I8: "int8"}
HEADER, ENTRY, TRAILER = 12, 16, 4
FP16_MAX = 65504.0


@dataclass
class TensorInfo:
    name: str
    dtype: str
    values: int
    scales: int
    bytes: int  # its table entry and its data (padded), in the blob
    max_abs_error: float

    def report(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Quantized:
    graph: Graph  # params replaced by the values the bundle decodes
    blob: bytes
    tensors: list[TensorInfo]
    mode: str

    def report(self) -> dict:
        return {"mode": self.mode, "blob_bytes": len(self.blob), "base64_bytes": base64_size(len(self.blob)),
                "tensors": [t.report() for t in self.tensors]}


def base64_size(n: int) -> int:
    return -(-n // 3) * 4


def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def _output_channels(graph: Graph, name: str) -> tuple[int, int] | None:
    """(scales, inner) of a conv or dense weight, None for a tensor that stays float32."""
    p = graph.params[name]
    layer = next(l for l in graph.layers if name in l.params.values())
    if layer.params.get("weight") != name or p.array.ndim < 2:
        return None
    if p.transposed:  # stored [in, out]: value i belongs to output i % out
        return p.array.shape[1], 1
    return p.array.shape[0], int(np.prod(p.array.shape[1:]))


def quantize(graph: Graph, mode: str = "none") -> Quantized:
    if mode not in MODES:
        raise BuildError(f"--quantize must be one of {', '.join(MODES)}, got {mode!r}")
    table, data, infos, params = b"", b"", [], {}
    for name, p in graph.params.items():
        w = np.ascontiguousarray(p.array, dtype=np.float32)
        if not np.all(np.isfinite(w)):
            raise BuildError(f"weight {name!r} has non-finite values (NaN or infinity)")
        chans = _output_channels(graph, name) if mode != "none" else None
        flat = w.reshape(-1)
        if chans is None:
            dtype, scales, inner, payload, back = F32, 0, 0, flat.astype("<f4").tobytes(), flat
        elif mode == "fp16":
            big = float(np.max(np.abs(flat), initial=0.0))
            if big > FP16_MAX:
                raise BuildError(f"weight {name!r} has a value of magnitude {big:g}, beyond float16's range "
                                 f"({FP16_MAX:g}): use --quantize int8 or none")
            half = flat.astype(np.float16)
            dtype, scales, inner, payload, back = F16, 0, 0, half.astype("<f2").tobytes(), half.astype(np.float32)
        else:
            scales, inner = chans
            channel = (np.arange(flat.size) // inner) % scales
            amax = np.zeros(scales, np.float32)
            np.maximum.at(amax, channel, np.abs(flat))
            scale = (amax / np.float32(127)).astype(np.float32)
            safe = np.where(scale > 0, scale, np.float32(1))
            q = np.clip(np.rint(flat / safe[channel]), -127, 127).astype(np.int8)
            back = (q.astype(np.float32) * scale[channel]).astype(np.float32)
            dtype, payload = I8, scale.astype("<f4").tobytes() + q.tobytes()
        payload = _pad4(payload)
        table += struct.pack("<B3xIII", dtype, flat.size, scales, inner)
        data += payload
        back = back.reshape(w.shape)
        params[name] = dataclasses.replace(p, array=back)
        infos.append(TensorInfo(name, DTYPE_NAMES[dtype], int(flat.size), scales, ENTRY + len(payload),
                                float(np.max(np.abs(back - w), initial=0.0))))
    body = MAGIC + struct.pack("<B3xI", VERSION, len(graph.params)) + table + data
    blob = body + struct.pack("<I", zlib.crc32(body))
    return Quantized(dataclasses.replace(graph, params=params), blob, infos, mode)


def decode(blob: bytes) -> list[np.ndarray]:
    """The blob's tensors as flat float32 arrays (what the bundle's decodeWeights computes)."""
    if len(blob) < HEADER + TRAILER:
        raise ValueError(f"corrupt weights: {len(blob)} bytes is too short")
    (stored,) = struct.unpack_from("<I", blob, len(blob) - TRAILER)
    if stored != zlib.crc32(blob[:-TRAILER]):
        raise ValueError("corrupt weights: checksum mismatch")
    if blob[:4] != MAGIC or blob[4] != VERSION:
        raise ValueError("corrupt weights: bad magic or version")
    (count,) = struct.unpack_from("<I", blob, 8)
    pos, out = HEADER + ENTRY * count, []
    for t in range(count):
        dtype, n, scales, inner = struct.unpack_from("<B3xIII", blob, HEADER + ENTRY * t)
        if dtype == F32:
            out.append(np.frombuffer(blob, "<f4", n, pos).astype(np.float32))
            size = 4 * n
        elif dtype == F16:
            out.append(np.frombuffer(blob, "<f2", n, pos).astype(np.float32))
            size = 2 * n
        elif dtype == I8:
            scale = np.frombuffer(blob, "<f4", scales, pos).astype(np.float32)
            q = np.frombuffer(blob, np.int8, n, pos + 4 * scales)
            out.append((q.astype(np.float32) * scale[(np.arange(n) // inner) % scales]).astype(np.float32))
            size = 4 * scales + n
        else:
            raise ValueError(f"corrupt weights: dtype {dtype}")
        pos += size + (-size % 4)
    if pos != len(blob) - TRAILER:
        raise ValueError("corrupt weights: the table does not match the data")
    return out
