"""conv: y = act(conv2d(x, W) + b), weight [OC, IC/groups, KH, KW]; conv_transpose: y = act(conv_transpose2d(x, W)
+ b), weight [IC, OC/groups, KH, KW] (prep/ir.py's docstring has their attrs)."""
from __future__ import annotations

from ..channel_groups import Seg, channels
from ..packing import conv_weight_packing, conv_weight_shape
from .registry import bias_and_act, out_size, register, same_attrs, saves_nothing


def conv_flops(layer, graph) -> int:
    kh, kw = layer.attrs["kernel"]
    size = out_size(layer, graph)
    c_in = graph.shapes[layer.inputs[0]][0]
    return 2 * size * (c_in // layer.attrs["groups"]) * kh * kw + bias_and_act(layer, graph)


def conv_transpose_flops(layer, graph) -> int:
    return 2 * graph.macs(layer) + bias_and_act(layer, graph)


def conv_forward(m, layer, ins):
    import torch.nn.functional as F

    x, a = ins[0], layer.attrs
    t, l, bo, r = a["pads"]
    if (t, l) != (bo, r):
        x, t, l = F.pad(x, (l, r, t, bo)), 0, 0
    w = m.param(layer, "weight")
    w = w[:, :, None, :] if w.dim() == 3 else w  # a Conv1d's weight, run as 2-D (prep/graph.py)
    return F.conv2d(x, w, m.param(layer, "bias"), stride=a["strides"],
                    padding=(t, l), dilation=a["dilations"], groups=a["groups"])


def conv_transpose_forward(m, layer, ins):
    """The full output, then the pads cut from it (they may be uneven)."""
    import torch.nn.functional as F

    x, a = ins[0], layer.attrs
    y = F.conv_transpose2d(x, m.param(layer, "weight"), stride=a["strides"], dilation=a["dilations"],
                           groups=a["groups"])
    t, l, _, _ = a["pads"]
    oh, ow = m.graph.shapes[layer.outputs[0]][1:]
    y = F.pad(y, (0, max(0, l + ow - y.shape[3]), 0, max(0, t + oh - y.shape[2])))  # output_padding
    y = y[:, :, t:t + oh, l:l + ow]
    b = m.param(layer, "bias")
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def conv_prune(layer, graph, axes, gs):
    """groups 1: a new group; depthwise (channel multiplier oc / c_in): passes its input's selection; other
    grouped convs: unpruned, in and out."""
    x, out = axes[layer.inputs[0]], layer.outputs[0]
    groups, c_in, oc = layer.attrs["groups"], channels(x), graph.shapes[out][0]
    if groups == 1:
        return (Seg(gs.new(oc, layer), oc, 1),)
    if groups == c_in:
        m = oc // c_in
        return tuple(Seg(s.group, s.n, s.rep * m) for s in x)
    why = f"grouped conv {layer.name!r} (groups={groups}) is not pruned"
    for s in x:
        gs.fix(s.group, why)
    return (Seg(gs.new(oc, layer, reason=why), oc, 1),)


def conv_transpose_prune(layer, graph, axes, gs):
    """Neither its inputs nor its outputs are pruned (not written yet)."""
    why = f"transposed conv {layer.name!r} is not pruned"
    for s in axes[layer.inputs[0]]:
        gs.fix(s.group, why)
    oc = graph.shapes[layer.outputs[0]][0]
    return (Seg(gs.new(oc, layer, reason=why), oc, 1),)


def conv_cut(layer, graph, plan, cut_param) -> dict:
    attrs, x, out = layer.attrs, layer.inputs[0], layer.outputs[0]
    groups, c_in = attrs.get("groups", 1), graph.shapes[x][0]
    ok, ik = plan.kept(out), plan.kept(x)
    if groups == c_in and groups > 1:  # depthwise: weight [OC, 1, kh, kw]
        cut_param(layer.params["weight"], ok)
        attrs = dict(attrs, groups=len(ik))
    elif groups != 1:  # other grouped convs stay whole
        assert len(ok) == graph.shapes[out][0] and len(ik) == c_in
    else:
        cut_param(layer.params["weight"], ok, ik)
    if "bias" in layer.params:
        cut_param(layer.params["bias"], ok)
    return attrs


def weight_layout(layer, graph, p, role):
    """4 output channels of one (j, kh, kw) a texel; a transposed conv's [IC, OCg, KH, KW] as a conv's."""
    packing = conv_weight_packing(*conv_weight_shape(p.array))
    return packing, packing.rows


register("conv", flops=conv_flops, torch=conv_forward, prune=conv_prune, cut=conv_cut, weight_layout=weight_layout,
         saves=saves_nothing, kernels="conv")
register("conv_transpose", flops=conv_transpose_flops, torch=conv_transpose_forward, prune=conv_transpose_prune,
         cut=same_attrs, weight_layout=weight_layout, saves=saves_nothing, kernels="conv_transpose")
