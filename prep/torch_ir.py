"""Run an IR Graph in PyTorch: an nn.Module whose parameters are the IR's params.

    IRModule(graph)          forward with torch.nn.functional, layer by layer, as the bundle runs it (each op's
                             forward: its definition in prep/ops/)
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
from torch import nn

from .ir import Graph
from .ops import opdef
from .ops.torch_expr import AS_ONNX_OP, TORCH, evaluate_expr  # noqa: F401 (the torch reading of expressions)
from .ops.torch_expr import apply as apply_elementwise

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
        """One tensor per input of the graph (Graph.inputs), in order; its output, or a tuple of its outputs."""
        g = self.graph
        assert len(xs) == len(g.inputs), f"{len(xs)} tensors for the inputs {g.inputs}"
        env = dict(zip(g.inputs, xs))
        self._batch = xs[0].shape[0]  # (a gather of constants alone, a position table's ids, reads no tensor)
        for layer in g.layers:
            ins = [env[t] for t in layer.inputs]
            y = opdef(layer.op).torch(self, layer, ins)  # (prep/ops/: each op's forward)
            if layer.attrs.get("act", "none") != "none":  # fused by prep.fuse
                act, attrs = layer.attrs["act"], layer.attrs.get("act_attrs", {})
                y = apply_elementwise(act, [y], attrs)
            env[layer.outputs[0]] = y
        return env[g.output] if len(g.outputs) == 1 else tuple(env[o] for o in g.outputs)


def write_back(graph: Graph, module: IRModule) -> Graph:
    """The graph with the module's current parameter values (same names, layouts and order)."""
    params = {n: dataclasses.replace(p, array=module.p[key(n)].detach().cpu().numpy().astype(np.float32).copy())
              for n, p in graph.params.items()}
    return dataclasses.replace(graph, params=params)


def export_onnx(graph: Graph):
    """Export the graph's IRModule to a simplified ONNX model whose initializers carry the IR's
    param names (prep.load's exporter and onnxsim, as for any PyTorch source)."""
    import json

    from .load import export_simplified
    from .naming import TRANSPOSED_KEY

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
