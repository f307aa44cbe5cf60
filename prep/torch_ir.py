"""Run an IR Graph in PyTorch: an nn.Module whose parameters are the IR's params.

    IRModule(graph)          forward with torch.nn.functional, layer by layer, as the bundle runs it
    write_back(graph, m)     the graph with the module's (trained) parameter values
    export_onnx(graph)       the module exported to ONNX (and simplified) the way `texelfit build`
                             exports PyTorch sources, with the IR's param names as initializer names

Used to fine-tune a pruned graph in PyTorch, to evaluate a graph on data, and to check that a
transformed graph (pruned, quantised) still exports and converts back to the same model.

Parameters live in a ParameterDict keyed by `key(name)`: PyTorch refuses '.' in a parameter
name, so '%' and '.' are percent-escaped ('conv1.weight' -> 'conv1%2Eweight'); `name(key)`
undoes it. A dense weight stored [in, out] (`Param.transposed`) stays so: the forward computes
x @ W, which exports as MatMul on that initializer, as it came in.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import elementwise as ew
from . import resample as rs
from .graph import pool_out
from .ir import ELEMENTWISE, Graph, operands

PREFIX = "p."  # state_dict prefix of the ParameterDict


def key(name: str) -> str:
    return name.replace("%", "%25").replace(".", "%2E")


def name(key_: str) -> str:
    return key_.replace("%2E", ".").replace("%25", "%")


class IRModule(nn.Module):
    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph
        self.p = nn.ParameterDict()
        for n, p in graph.params.items():  # one by one: ParameterDict sorts a plain dict's keys
            self.p[key(n)] = nn.Parameter(torch.from_numpy(np.array(p.array, dtype=np.float32)))

    def param(self, layer, role):
        n = layer.params.get(role)
        return None if n is None else self.p[key(n)]

    def forward(self, *xs):
        """One tensor per input of the graph (Graph.inputs), in order."""
        g = self.graph
        assert len(xs) == len(g.inputs), f"{len(xs)} tensors for the inputs {g.inputs}"
        env = dict(zip(g.inputs, xs))
        self._batch = xs[0].shape[0]  # (a gather of constants alone, a position table's ids, reads no tensor)
        for layer in g.layers:
            ins = [env[t] for t in layer.inputs]
            y = self._layer(layer, ins)
            if layer.attrs.get("act", "none") != "none":  # fused by prep.fuse
                act, attrs = layer.attrs["act"], layer.attrs.get("act_attrs", {})
                y = AS_ONNX_OP[act](y, ew.layer_attrs(ew.OPS[act], attrs)) if act in AS_ONNX_OP else \
                    evaluate_expr(ew.forward_of(act, attrs), [y])
            env[layer.outputs[0]] = y
        return env[g.output]

    def _operands(self, layer, ins):
        """The operands of an elementwise layer as tensors that broadcast like the ONNX op's."""
        out = []
        for o in operands(layer, self.graph):
            if o["kind"] == "act":
                out.append(ins[o["input"]])
            elif o["kind"] == "param":
                out.append(self.param(layer, o["role"]).reshape((1,) + tuple(o["shape"])))
            else:
                out.append(torch.tensor(o["values"], dtype=torch.float32).reshape((1,) + tuple(o["shape"])))
        return out

    def _layer(self, layer, ins):
        op, a, x = layer.op, layer.attrs, ins[0] if ins else None
        if op == "dense":
            w, b = self.param(layer, "weight"), self.param(layer, "bias")
            if self.graph.params[layer.params["weight"]].transposed:
                y = x @ w
                return y + b if b is not None else y
            return F.linear(x, w, b)
        if op == "conv":
            t, l, bo, r = a["pads"]
            if (t, l) != (bo, r):
                x, t, l = F.pad(x, (l, r, t, bo)), 0, 0
            w = self.param(layer, "weight")
            w = w[:, :, None, :] if w.dim() == 3 else w  # a Conv1d's weight, run as 2-D (prep/graph.py)
            return F.conv2d(x, w, self.param(layer, "bias"), stride=a["strides"],
                            padding=(t, l), dilation=a["dilations"], groups=a["groups"])
        if op == "conv_transpose":  # the full output, then the pads cut from it (they may be uneven)
            y = F.conv_transpose2d(x, self.param(layer, "weight"), stride=a["strides"], dilation=a["dilations"],
                                   groups=a["groups"])
            t, l, _, _ = a["pads"]
            oh, ow = self.graph.shapes[layer.outputs[0]][1:]
            y = F.pad(y, (0, max(0, l + ow - y.shape[3]), 0, max(0, t + oh - y.shape[2])))  # output_padding
            y = y[:, :, t:t + oh, l:l + ow]
            b = self.param(layer, "bias")
            return y if b is None else y + b.reshape(1, -1, 1, 1)
        if op == "dropout":  # the inference form (a training step's mask: prep/dropout.py)
            return x
        if op == "resample":  # the axes' [out, in] matrices from the taps (prep/resample.py)
            h, w = self.graph.shapes[layer.inputs[0]][1:]
            rows = torch.tensor(rs.matrix(a["rows"], h), dtype=x.dtype)
            cols = torch.tensor(rs.matrix(a["cols"], w), dtype=x.dtype)
            return torch.einsum("yh,nchw,xw->ncyx", rows, x, cols)
        if op == "batchnorm":  # inference form (before prep.fold)
            c = lambda v: torch.tensor(np.asarray(v, dtype=np.float32))  # noqa: E731
            return F.batch_norm(x, c(a["mean"]), c(a["var"]), c(a["scale"]), c(a["bias"]), False, 0.0, a["eps"])
        if op in ("maxpool", "avgpool"):
            return _pool(op, x, a)
        if op == "global_avgpool":
            return x.mean(dim=(2, 3), keepdim=a.get("keepdims", True))
        if op in ELEMENTWISE:
            args = self._operands(layer, ins)
            if op in AS_ONNX_OP:
                return AS_ONNX_OP[op](*args, ew.layer_attrs(ew.OPS[op], a))
            return evaluate_expr(ew.forward_of(op, a), args)
        if op == "reduce":
            dims = [d + 1 for d in a["axes"]]
            y = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax}[a["kind"]](x, dim=dims, keepdim=True)
            return y.reshape((x.shape[0],) + tuple(self.graph.shapes[layer.outputs[0]]))
        if op == "matmul":  # token-wise x @ B (+ b), or a batched product of two activations
            if len(ins) == 2:
                g, n = a["groups"], x.shape[0]
                y = x.reshape(n, g, -1, x.shape[-1]) @ ins[1].reshape(n, g, -1, ins[1].shape[-1])
                return y.reshape(n, -1, y.shape[-1])
            w, b = self.param(layer, "weight"), self.param(layer, "bias")
            y = x @ w if self.graph.params[layer.params["weight"]].transposed else x @ w.T
            return y + b if b is not None else y
        if op == "embedding":  # ids (as integers or exact floats) -> rows of the table
            return F.embedding(x.long(), self.param(layer, "weight"), padding_idx=a.get("padding_idx"))
        if op == "layernorm":
            w = self.param(layer, "weight")  # its size, not x.shape[-1]: a traced export needs a constant shape
            return F.layer_norm(x, (int(w.shape[0]),), w, self.param(layer, "bias"), a["eps"])
        if op == "gather":
            return _gather(a["parts"], ins, lambda role: self.param(layer, role), self._batch)
        dim = -1 if x.dim() == 3 else 1  # tokens (R, F): over the features; else the channels (classes)
        if op == "softmax":
            return torch.softmax(x, dim=dim)
        if op == "log_softmax":
            return torch.log_softmax(x, dim=dim)
        if op == "concat":
            return torch.cat(ins, dim=1)
        if op == "flatten":
            return torch.flatten(x, 1)
        raise AssertionError(f"IRModule: no forward for op {op!r}")


def _view_op(t, op):
    """One view op of prep/shape.py on a batch (the per-sample axes are t's axes 1, 2, ...)."""
    kind = op[0]
    if kind == "reshape":
        return t.reshape((t.shape[0],) + tuple(op[1]))
    if kind == "permute":
        return t.permute(0, *[p + 1 for p in op[1]])
    if kind == "slice":
        _, a, b, e, s = op
        return t[(slice(None),) * (a + 1) + (slice(b, e, s),)]
    if kind == "flip":
        return torch.flip(t, [op[1] + 1])
    _, a, lo, hi = op  # pad with zeros
    return F.pad(t, [0, 0] * (t.dim() - a - 2) + [lo, hi])


def _gather(parts, ins, param, batch):
    """The sum of the parts, each its source (an input, a constant sample repeated over the batch, or a
    parameter so repeated: a class token, `param(role)`) through its chain; a plain concatenation (each
    chain one pad, tiling one axis in order) as torch.cat, which exports as Concat again."""

    def source(p):
        if p.get("param") is not None:
            return param(p["param"]).reshape((1,) + tuple(p["shape"])).expand((batch,) + tuple(p["shape"]))
        if p["input"] is not None:
            return ins[p["input"]]
        return torch.from_numpy(np.array(p["const"], dtype=np.float32))[None].expand((batch,) + p["const"].shape)

    srcs = [source(p) for p in parts]
    pads = [p["ops"][0] if len(p["ops"]) == 1 and p["ops"][0][0] == "pad" else None for p in parts]
    if all(pads) and len({q[1] for q in pads}) == 1:
        a, at = pads[0][1], 0
        for q, t in zip(pads, srcs):
            at = at if q[2] == at else -1
            at += int(t.shape[a + 1])
        if at >= 0 and pads[-1][3] == 0:
            return torch.cat(srcs, dim=a + 1)
    out = None
    for p, t in zip(parts, srcs):
        for op in p["ops"]:
            t = _view_op(t, op)
        out = t if out is None else out + t
    return out


# The torch reading of an elementwise expression (prep/elementwise.py): node kind -> function of the
# evaluated arguments
TORCH = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg, "exp": torch.exp,
    "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs, "sign": torch.sign, "tanh": torch.tanh, "erf": torch.erf,
    "sigmoid": torch.sigmoid, "max": torch.maximum, "min": torch.minimum, "pow": torch.pow, "where": torch.where,
    "gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le,
}


# Ops whose expression would export as primitives the importer does not take (Max, Where, Greater):
# the torch function that exports as the declaration's own ONNX op (export_onnx round-trips a graph)
AS_ONNX_OP = {
    "relu": lambda x, a: torch.relu(x),
    "leaky_relu": lambda x, a: F.leaky_relu(x, a["alpha"]),
    "clip": lambda x, a: torch.clamp(x, a["min"], a["max"]),
    "hardsigmoid": lambda x, a: torch.clamp(x * a["alpha"] + a["beta"], 0.0, 1.0),
    "hardswish": lambda x, a: F.hardswish(x),
    "elu": lambda x, a: F.elu(x, a["alpha"]),
    "selu": lambda x, a: a["gamma"] * F.elu(x, a["alpha"]),
    "softplus": lambda x, a: F.softplus(x),
    "prelu": lambda x, w, a: F.prelu(x, w.reshape(-1)),
}


def evaluate_expr(e: ew.E, args: list, y=None):
    """The expression on torch tensors: args[i] for operand i, y for the output."""
    def run(n):
        if n.op == "arg":
            return args[n.value]
        if n.op == "out":
            return y
        if n.op == "const":
            return torch.tensor(n.value, dtype=torch.float32)
        return TORCH[n.op](*(run(a) for a in n.args))
    return run(e)


def _pool(op, x, a):
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = a["kernel"], a["strides"], a["pads"]
    ceil = a["ceil_mode"]
    if (pt, pl) == (pb, pr) and pt <= kh // 2 and pl <= kw // 2:  # PyTorch's own form (exports as such)
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


def write_back(graph: Graph, module: IRModule) -> Graph:
    """The graph with the module's current parameter values (same names, layouts and order)."""
    params = {n: dataclasses.replace(p, array=module.p[key(n)].detach().cpu().numpy().astype(np.float32).copy())
              for n, p in graph.params.items()}
    return dataclasses.replace(graph, params=params)


def export_onnx(graph: Graph):
    """Export the graph's IRModule to a simplified ONNX model whose initializers carry the IR's
    param names (prep.load's exporter and onnxsim, as for any PyTorch source)."""
    import json

    from .load import TRANSPOSED_KEY, export_simplified

    multi = len(graph.inputs) > 1
    model = export_simplified(IRModule(graph).eval(), graph.input_shapes if multi else graph.input_shape,
                              list(graph.inputs) if multi else None, [graph.dtype(t) for t in graph.inputs])
    renames = {PREFIX + key(n): n for n in graph.params}
    g = model.graph
    for init in g.initializer:
        init.name = renames.get(init.name, init.name)
    for inp in g.input:
        inp.name = renames.get(inp.name, inp.name)
    for node in g.node:
        for i, t in enumerate(node.input):
            node.input[i] = renames.get(t, t)
    for prop in model.metadata_props:
        if prop.key == TRANSPOSED_KEY:
            prop.value = json.dumps(sorted(renames.get(t, t) for t in json.loads(prop.value)))
    return model


@contextlib.contextmanager
def one_thread():
    """Run torch on one CPU thread: the same numbers on any machine (reduction order depends on the
    thread count), and for these small models faster than threads that contend with other work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def evaluate(graph: Graph, x: np.ndarray, y: np.ndarray, *, batch: int = 512) -> dict:
    """{'accuracy': ...} for integer class labels y, else {'mse': ...}, of the graph's forward in PyTorch."""
    module = IRModule(graph).eval()
    outs = []
    with torch.no_grad(), one_thread():
        for s in range(0, len(x), batch):
            outs.append(module(torch.as_tensor(np.asarray(x[s:s + batch], dtype=np.float32))))
    out = torch.cat(outs).numpy() if outs else np.zeros((0,) + graph.output_shape, np.float32)
    if np.issubdtype(np.asarray(y).dtype, np.integer) and out.ndim == 2:
        return {"accuracy": float(np.mean(out.argmax(1) == np.asarray(y)))}
    return {"mse": float(np.mean((out - np.asarray(y, dtype=np.float32).reshape(out.shape)) ** 2))}
