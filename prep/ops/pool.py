"""maxpool, avgpool (attrs: kernel, strides, pads, ceil_mode, count_include_pad) and global_avgpool (mean over
H, W; attrs: keepdims). Their kernels: codegen/ops/pool.py."""
from __future__ import annotations

from .registry import no_params, out_size, passes_channels, register, same_attrs, saves_nothing


def window_flops(layer, graph) -> int:
    """1 a window element read."""
    kh, kw = layer.attrs["kernel"]
    return out_size(layer, graph) * kh * kw


def global_flops(layer, graph) -> int:
    c, h, w = graph.shapes[layer.inputs[0]]
    return c * h * w


def pool_forward(m, layer, ins):
    """PyTorch's own form where the pads are (exports as such); else padded explicitly to exactly the windows
    the IR's rules give."""
    import torch
    import torch.nn.functional as F

    from ..graph import pool_out

    op, x, a = layer.op, ins[0], layer.attrs
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = a["kernel"], a["strides"], a["pads"]
    ceil = a["ceil_mode"]
    if (pt, pl) == (pb, pr) and pt <= kh // 2 and pl <= kw // 2:
        if op == "maxpool":
            return F.max_pool2d(x, (kh, kw), (sh, sw), (pt, pl), ceil_mode=ceil)
        return F.avg_pool2d(x, (kh, kw), (sh, sw), (pt, pl), ceil_mode=ceil,
                            count_include_pad=a.get("count_include_pad", False))
    # Asymmetric or large pads: pad explicitly to exactly the windows the IR's rules give.
    h, w = x.shape[2:]
    oh = pool_out(h, kh, sh, pt, pb, 1, ceil)
    ow = pool_out(w, kw, sw, pl, pr, 1, ceil)
    eb, er = (oh - 1) * sh + kh - h - pt, (ow - 1) * sw + kw - w - pl  # padding at the end actually read
    fill = float("-inf") if op == "maxpool" else 0.0
    xp = F.pad(x, (pl, max(er, 0), pt, max(eb, 0)), value=fill)[:, :, : pt + h + eb, : pl + w + er]
    if op == "maxpool":
        return F.max_pool2d(xp, (kh, kw), (sh, sw))
    # average: sum over the window / count of positions that count (input, and declared pads if included)
    mask = torch.zeros((1, 1) + tuple(xp.shape[2:]), dtype=x.dtype)
    if a.get("count_include_pad", False):
        mask[:, :, : pt + h + pb, : pl + w + pr] = 1
    else:
        mask[:, :, pt: pt + h, pl: pl + w] = 1
    total = F.avg_pool2d(xp, (kh, kw), (sh, sw), divisor_override=1)
    count = F.avg_pool2d(mask, (kh, kw), (sh, sw), divisor_override=1)
    return total / count


def global_forward(m, layer, ins):
    return ins[0].mean(dim=(2, 3), keepdim=layer.attrs.get("keepdims", True))


def maxpool_saves(layer, graph) -> tuple[str, ...]:
    """Where each maximum came from, for the backward (codegen/ops/pool.py: argmax_texture)."""
    return ("argmax:",)


register("maxpool", flops=window_flops, torch=pool_forward, prune=passes_channels, cut=same_attrs,
         weight_layout=no_params, saves=maxpool_saves, kernels="pool")
register("avgpool", flops=window_flops, torch=pool_forward, prune=passes_channels, cut=same_attrs,
         weight_layout=no_params, saves=saves_nothing, kernels="pool")
register("global_avgpool", flops=global_flops, torch=global_forward, prune=passes_channels, cut=same_attrs,
         weight_layout=no_params, saves=saves_nothing, kernels="pool")
