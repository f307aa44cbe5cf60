"""Import rules of convolutions and batch-norm, and of 1-D convs and pools, computed as 2-D ones over a
(C, 1, T) twin of their (C, T) input."""
from __future__ import annotations

from ..elementwise import BY_ONNX
from ..errors import BuildError
from ..ir import Layer
from .common import as_2d, pool_out, scope_name, unsupported_attr, where, window
from .registry import imports

UNARY_ONNX = tuple(op for op, decl in BY_ONNX.items() if decl.arity == 1)


@imports("Conv", "MaxPool", "AveragePool", prepares=True)
def twin_1d(cx, s) -> bool:
    """A 1-D conv or pool: computed as 2-D over (C, 1, T), a kernel of height 1 (the node, rewritten so, goes on
    to the rules after this)."""
    ins, alias, shapes = s.ins, cx.alias, cx.shapes
    if ins and ins[0] not in cx.consts and (
            alias.get(ins[0], ins[0]) in cx.twin_2d or len(shapes.get(alias.get(ins[0], ins[0]), ())) == 2):
        src = alias.get(ins[0], ins[0])
        if src in cx.twin_2d:
            ins[0] = cx.twin_2d[src]
        else:
            c, t = shapes[cx.act(src)]
            name = s.node.name
            cx.view(s.node, cx.act(src), [("reshape", (c, 1, t))], out=f"{name}:in2d", name=f"{name}:as2d")
            ins[0] = alias.get(f"{name}:in2d", f"{name}:in2d")
        s.a = as_2d(s.a)
        cx.twin_2d[s.out] = s.out = f"{s.out}:2d"
    return False


@imports("BatchNormalization", *UNARY_ONNX, prepares=True)
def twin_per_channel(cx, s) -> bool:
    """Per channel or per element on a 1-D conv's output: computed on the (C, 1, T) twin too, so that a Conv1d,
    its batch-norm and its activation fuse and fold as 2-D ones do."""
    ins = s.ins
    if ins and cx.alias.get(ins[0], ins[0]) in cx.twin_2d:
        ins[0] = cx.twin_2d[cx.alias.get(ins[0], ins[0])]
        cx.twin_2d[s.out] = s.out = f"{s.out}:2d"
    return False


@imports("Conv")
def conv(cx, s) -> bool:
    node, a, ins, out, shapes = s.node, s.a, s.ins, s.out, cx.shapes
    x = cx.act(ins[0])
    if len(shapes[x]) != 3:
        raise BuildError(f"{where(node)}: Conv needs a (C, H, W) input, got {shapes[x]}")
    warr = cx.weight(node, 1)
    if warr.ndim == 3:  # Conv1d's [OC, ICg, K] (the parameter keeps that shape), as [OC, ICg, 1, K]
        warr = warr[:, :, None, :]
    if warr.ndim != 4:
        raise BuildError(f"{where(node)}: only 2-D convolutions are supported (weight {warr.shape})")
    groups = int(a.get("group", 1))
    oc, icg, kh, kw = warr.shape
    c, h, w_ = shapes[x]
    if icg * groups != c or oc % groups:
        raise BuildError(f"{where(node)}: weight {warr.shape} with group={groups} does not fit "
                         f"{c} input channels")
    kernel, strides, pads, dil = window(node, a, shapes[x], a.get("kernel_shape", [kh, kw]), allow_dilation=True)
    oh = pool_out(h, kh, strides[0], pads[0], pads[2], dil[0], False)
    ow = pool_out(w_, kw, strides[1], pads[1], pads[3], dil[1], False)
    if oh < 1 or ow < 1:
        raise BuildError(f"{where(node)}: output would be {oh}x{ow} for input {h}x{w_}")
    layer = Layer("conv", node.name, [x], [out],
                  {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dil, "groups": groups},
                  {"weight": cx.param(node, 1)})
    if len(ins) > 2 and ins[2]:
        layer.params["bias"] = cx.param(node, 2)
    shapes[out] = (oc, oh, ow)
    cx.layers.append(layer)
    return True


@imports("ConvTranspose")
def conv_transpose(cx, s) -> bool:
    node, a, ins, out, shapes = s.node, s.a, s.ins, s.out, cx.shapes
    x = cx.act(ins[0])
    if len(shapes[x]) != 3:
        raise BuildError(f"{where(node)}: ConvTranspose needs a (C, H, W) input, got {shapes[x]}")
    warr = cx.weight(node, 1)
    if warr.ndim != 4:
        raise BuildError(f"{where(node)}: only 2-D transposed convolutions are supported "
                         f"(weight {warr.shape})")
    groups = int(a.get("group", 1))
    ic, ocg, kh, kw = warr.shape
    c, h, w_ = shapes[x]
    if ic != c or c % groups:
        raise BuildError(f"{where(node)}: weight {warr.shape} with group={groups} does not fit "
                         f"{c} input channels")
    strides = tuple(a.get("strides", [1, 1]))
    dil = tuple(a.get("dilations", [1, 1]))
    extra = tuple(a.get("output_padding", [0, 0]))
    auto = a.get("auto_pad", b"NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else auto) != "NOTSET":
        unsupported_attr(node, "auto_pad", auto, "give explicit pads, as PyTorch exports")
    full = [(n - 1) * s_ + d * (k - 1) + 1 + e for n, s_, d, k, e in zip((h, w_), strides, dil, (kh, kw), extra)]
    if "output_shape" in a:  # the pads that give it (ONNX: the extra goes at the end, SAME_UPPER)
        total = [f - o for f, o in zip(full, a["output_shape"][-2:])]
        pads = (total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2)
    else:
        pads = tuple(a.get("pads", [0, 0, 0, 0]))
    oh, ow = full[0] - pads[0] - pads[2], full[1] - pads[1] - pads[3]
    if oh < 1 or ow < 1 or min(pads) < 0:
        raise BuildError(f"{where(node)}: output would be {oh}x{ow} (pads {list(pads)}) for input {h}x{w_}")
    layer = Layer("conv_transpose", node.name, [x], [out],
                  {"kernel": (kh, kw), "strides": strides, "pads": pads, "dilations": dil, "groups": groups,
                   "output_padding": extra}, {"weight": cx.param(node, 1)})
    if len(ins) > 2 and ins[2]:
        layer.params["bias"] = cx.param(node, 2)
    shapes[out] = (ocg * groups, oh, ow)
    cx.layers.append(layer)
    return True


def _batchnorm_names(cx, node, ins) -> tuple[str, str]:
    """The names of a batch-norm's scale and shift (if it cannot fold: prep/fold.py). An ONNX file's exporter may
    have merged equal tensors (a fresh DenseNet's zero shifts): the first reader keeps the name, the others take the
    state_dict name their scope gives, as Importer.param names a shared weight (their uses are counted together).
    A PyTorch source's are its own."""
    names = []
    for i in (1, 2):
        name = ins[i]
        if cx.onnx_file:
            cx.uses[name] = cx.uses.get(name, 0) + 1
            if cx.uses[name] > 1:
                name = scope_name(node, i, name)
                if name is None or name in cx.params or name in cx.initializer_names:
                    name = f"{ins[i]}@{node.name}"
        names.append(name)
    return names[0], names[1]


@imports("BatchNormalization")
def batchnorm(cx, s) -> bool:
    node, a, ins, out = s.node, s.a, s.ins, s.out
    if a.get("training_mode", 0):
        unsupported_attr(node, "training_mode", 1, "only the inference form can be folded")
    x = cx.act(ins[0])
    stats = {k: cx.weight(node, i).reshape(-1) for i, k in enumerate(("scale", "bias", "mean", "var"), 1)}
    cx.layers.append(Layer("batchnorm", node.name, [x], [out], dict(stats, eps=float(a.get("epsilon", 1e-5)),
                                                                    names=_batchnorm_names(cx, node, ins))))
    cx.shapes[out] = cx.shapes[x]
    return True
