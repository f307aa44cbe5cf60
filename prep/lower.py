"""ONNX ops that are compositions of ops the IR already has, rewritten into them at import.

`LOWERINGS` maps an ONNX op type to a function that rewrites one node into a list of ONNX nodes of
supported ops (which write the node's outputs under their names), plus new constant initializers;
`lower(model)` applies the table to every node, before prep/graph.py:to_ir reads the model. An op
lowered here has no kernel, no CPU twin and no torch reading of its own: its forward, every gradient,
pruning and layout are those of the ops it becomes. Supporting such an op is one entry:

    def _my_op(node, ctx: LowerCtx) -> list[onnx.NodeProto]: ...
    LOWERINGS["MyOp"] = _my_op

An entry may raise BuildError naming the op, the node and what is unsupported. An entry defined in
another module registers itself at that module's import; prep/graph.py imports it (beside lower_ops and
normalization), so that its SUPPORTED_OPS, which reads this table, sees it (tests/test_imports.py: no cycle).

An entry may also rewrite a pattern that starts at its node and ends at a later one: it writes the later
node's replacement with `ctx.replace(later, nodes)` (and `ctx.replace(n, [])` for the nodes between, read by
the pattern only), and `lower` writes those in the later node's place.

`ctx.shape(name)` is a tensor's shape from ONNX shape inference (of the model before any lowering, its
inputs given their per-sample shapes): the batch axis, the only dynamic one, is the string "N"; a Reshape
target written by a lowering keeps it as 0 (copy the input's) or -1.
"""
from __future__ import annotations

import json
from typing import Callable

import numpy as np

from .errors import BuildError

N = "N"  # the batch dim in ctx.shape (as prep/graph.py)


class LowerCtx:
    """What a lowering may ask of the model being lowered."""

    def __init__(self, model, input_shapes=None):
        import onnx
        from onnx import numpy_helper, shape_inference

        self.model = model
        self._parameters: set[str] | None = None
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self._consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.attribute:
                a = node.attribute[0]
                value = numpy_helper.to_array(a.t) if a.name == "value" else \
                    np.asarray(onnx.helper.get_attribute_value(a)) if a.name.startswith("value_") else None
                if value is not None:
                    self._consts[node.output[0]] = value
        self._taken = {t for n in model.graph.node for t in list(n.input) + list(n.output)} | \
            {n.name for n in model.graph.node} | set(self._consts) | {i.name for i in model.graph.input}
        self.new_initializers: list = []
        self.replaced: dict[str, list] = {}  # a later node (by its first output) -> the nodes written in its place
        self._producers = {o: n for n in model.graph.node for o in n.output}
        self._users: dict[str, list] = {}
        for n in model.graph.node:
            for i in n.input:
                self._users.setdefault(i, []).append(n)
        # shapes: every input's batch dim symbolic, its per-sample dims the given ones (build --input-shape)
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        del probe.graph.value_info[:]
        inputs = [i for i in probe.graph.input if i.name not in self._consts]
        for k, inp in enumerate(inputs):
            dims = inp.type.tensor_type.shape.dim
            if dims:
                dims[0].Clear()
                dims[0].dim_param = N
            if input_shapes is not None and k < len(input_shapes) and len(dims) == len(input_shapes[k]) + 1:
                for d, v in zip(list(dims)[1:], input_shapes[k]):
                    d.Clear()
                    d.dim_value = int(v)
        try:
            probe = shape_inference.infer_shapes(probe, data_prop=True)
        except Exception:  # noqa: BLE001 (an entry that needs a shape says so, naming its node)
            pass
        self._shapes: dict[str, tuple] = {}
        for vi in list(probe.graph.input) + list(probe.graph.value_info) + list(probe.graph.output):
            t = vi.type.tensor_type
            if t.HasField("shape"):
                self._shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else (
                    N if d.dim_param == N else None) for d in t.shape.dim)
        for name, arr in self._consts.items():
            self._shapes[name] = tuple(arr.shape)

    def shape(self, name: str, node=None) -> tuple:
        """The static shape of tensor `name`, the batch dim "N" (an unknown first dim is taken for it; a
        tensor whose batch an export merged with another axis, [T, N * h, d], is not known); a BuildError
        (naming `node`) where shape inference left another dim unknown."""
        s = self._shapes.get(name)
        if s and s[0] is None and N not in s and name not in self._consts:
            s = (N,) + tuple(s[1:])  # (inference loses the symbol through a Reshape to -1)
        if s is None or any(d is None for d in s):
            where = f" (input of {where_of(node)})" if node is not None else ""
            raise BuildError(f"the shape of tensor {name!r}{where} is not known at build time ({s})")
        return s

    def declare(self, name: str, shape: tuple) -> None:
        """The shape of a tensor a lowering writes, for a lowering it calls on it (ArgMax's CumSum)."""
        self._shapes[name] = tuple(shape)

    def const(self, name: str):
        """The value of an initializer or a Constant node's output, else None."""
        return self._consts.get(name)

    def producer(self, name: str):
        """The node writing tensor `name` (None: an input, an initializer)."""
        return self._producers.get(name)

    def users(self, name: str) -> list:
        """The nodes reading tensor `name`, in order; a graph output is read by None too."""
        outputs = [None] if any(o.name == name for o in self.model.graph.output) else []
        return self._users.get(name, []) + outputs

    def replace(self, node, nodes: list) -> None:
        """Write `nodes` in place of `node`, a node after the one being lowered (a pattern that ends there)."""
        self.replaced[node.output[0]] = list(nodes)

    def is_parameter(self, name: str) -> bool:
        """Whether `name` is a parameter (prep/load.py records them: naming.PARAMETERS_KEY), which trains whatever its
        values, as opposed to a constant of the exporter's."""
        from .naming import PARAMETERS_KEY

        if self._parameters is None:
            meta = {p.key: p.value for p in self.model.metadata_props}
            self._parameters = set(json.loads(meta.get(PARAMETERS_KEY, "[]")))
        return name in self._parameters

    def fresh(self, hint: str) -> str:
        """A tensor (or node) name used nowhere in the model: `hint`, or `hint_2`, `hint_3`, ..."""
        name, k = hint, 1
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name

    def initializer(self, name_hint: str, array) -> str:
        """A new constant initializer of `array`; returns its name."""
        from onnx import numpy_helper

        name = self.fresh(name_hint)
        arr = np.asarray(array)
        self.new_initializers.append(numpy_helper.from_array(arr, name))
        self._consts[name] = arr
        self._shapes[name] = tuple(arr.shape)
        return name

    # ---- helpers for entries: one node each, named after the node being lowered ------------------
    def node(self, src, op: str, inputs, out: str | None = None, **attrs):
        """A node `op` of `inputs` (names), named `{src.name}/{op}`, writing `out` (a fresh tensor if None)."""
        from onnx import helper

        base = src.name or src.op_type
        out = out or self.fresh(f"{base}/{op}_output")
        return helper.make_node(op, list(inputs), [out], name=self.fresh(f"{base}/{op}"), **attrs)

    def ints(self, src, hint: str, values) -> str:
        return self.initializer(f"{src.name or src.op_type}/{hint}", np.asarray(list(values), dtype=np.int64))

    def reshape(self, src, x: str, target, out=None):
        return self.node(src, "Reshape", [x, self.ints(src, "shape", target)], out)

    def transpose(self, src, x: str, perm, out=None):
        return self.node(src, "Transpose", [x], out, perm=[int(p) for p in perm])

    def reduce_sum(self, src, x: str, axes, out=None):
        if self.opset < 13:
            return self.node(src, "ReduceSum", [x], out, axes=[int(a) for a in axes], keepdims=0)
        return self.node(src, "ReduceSum", [x, self.ints(src, "axes", axes)], out, keepdims=0)


Lowering = Callable[["onnx.NodeProto", LowerCtx], list]  # noqa: F821
LOWERINGS: dict[str, Lowering] = {}


def where_of(node) -> str:
    return f"{node.op_type} node {node.name or '(unnamed)'!r}"


def attrs_of(node) -> dict:
    from onnx import helper

    out = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in out.items()}


def lower(model, input_shapes=None):
    """`model` with every node whose op is in LOWERINGS rewritten into supported ops: a new model (the
    node list in order, each lowered node replaced in place by its nodes; names derived from the node's
    name, so the same model lowers the same way), or `model` itself where no node is lowered.
    `input_shapes`: the per-sample shape of each input (build --input-shape), where the file leaves some
    dynamic."""
    import onnx

    if not any(n.op_type in LOWERINGS for n in model.graph.node):
        return model
    ctx = LowerCtx(model, input_shapes)
    nodes = []
    for node in model.graph.node:
        if node.output and node.output[0] in ctx.replaced:  # (an earlier entry's pattern ended here: ctx.replace)
            nodes.extend(ctx.replaced.pop(node.output[0]))
            continue
        fn = LOWERINGS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        nodes.extend(fn(node, ctx) if fn is not None else [node])
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(ctx.new_initializers)
    return out


