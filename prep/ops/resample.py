"""resample: Resize/Upsample (nearest, bilinear), Pad (edge, reflect) over H and W, as taps (input index, weight)
of each output row and column (prep/resample.py). Its kernels: codegen/ops/resample.py."""
from __future__ import annotations

from .. import resample as rs
from .registry import no_params, out_size, passes_channels, register, same_attrs, saves_nothing


def flops(layer, graph) -> int:
    """A multiply-add a tap."""
    a = layer.attrs
    return 2 * out_size(layer, graph) * max(len(t) for t in a["rows"]) * max(len(t) for t in a["cols"])


def forward(m, layer, ins):
    """The axes' [out, in] matrices from the taps."""
    import torch

    x, a = ins[0], layer.attrs
    h, w = m.graph.shapes[layer.inputs[0]][1:]
    rows = torch.tensor(rs.matrix(a["rows"], h), dtype=x.dtype)
    cols = torch.tensor(rs.matrix(a["cols"], w), dtype=x.dtype)
    return torch.einsum("yh,nchw,xw->ncyx", rows, x, cols)


register("resample", flops=flops, torch=forward, prune=passes_channels, cut=same_attrs, weight_layout=no_params,
         saves=saves_nothing, kernels="resample")
