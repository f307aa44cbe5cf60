"""The importer's state while it converts one ONNX graph (Importer), the operations its rules share (what were
to_ir's closures), and the node at hand (Step)."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .. import batch_axis as ba
from ..errors import BuildError
from ..ir import Layer, Param
from ..naming import PADDING_IDX_KEY, PARAMETERS_KEY, SOURCE_KEY, SHARED_KEY, STATE_SHAPES_KEY, TIED_KEY, TRANSPOSED_KEY
from ..shape import chain_shape, part_shape
from .common import scope_name, where


@dataclass
class Step:
    """One ONNX node as the rules see it: its op type, attributes, inputs (a parameter's view read as the
    parameter) and first output. A rule that falls through may rewrite them for the rules after it (a 1-D conv
    reads its (C, 1, T) twin); `node` stays the ONNX node (its name, its inputs as exported)."""
    node: object
    op: str
    a: dict
    ins: list
    out: str | None


# ops that keep integers integers (Importer.keep_integers): op -> how many of its inputs are values (the others
# being shapes, axes, indices)
_KEEPS_INTEGERS = {"Add": 2, "Sub": 2, "Mul": 2, "Neg": 1, "Identity": 1, "Slice": 1, "Pad": 2, "Concat": 1 << 30,
                   "Reshape": 1, "Transpose": 1, "Squeeze": 1, "Unsqueeze": 1, "Flatten": 1, "Expand": 1}


class Importer:
    """What the import rules share: the tensors known so far and the layers made from them."""

    def __init__(self, model, consts: dict, shapes: dict, integer: set, trains, batch_dim):
        g = model.graph
        self.g = g
        self.trains = trains  # build --trainable's selection (None: all)
        self.batch_dim = batch_dim  # the batch dim the ONNX file declares (a Reshape to it keeps the batch)
        self.consts = consts  # name -> np.ndarray | symbolic list
        self.shapes = shapes  # IR tensor -> per-sample shape
        # the activations holding integers (token ids: the inputs and their Casts to integer types)
        self.integer = integer
        self.alias: dict[str, str] = {}
        self.layers: list[Layer] = []
        self.params: dict[str, Param] = {}
        self.initializer_names = {init.name for init in g.initializer}
        meta = {p.key: p.value for p in model.metadata_props}
        self.meta = meta
        self.stored_transposed = set(json.loads(meta.get(TRANSPOSED_KEY, "[]")))
        self.shared = set(json.loads(meta.get(SHARED_KEY, "[]")))
        self.tied = json.loads(meta.get(TIED_KEY, "{}"))  # {NAME@tied: NAME}: a tied parameter's copy in another layout
        self.onnx_file = meta.get(SOURCE_KEY) == json.dumps("onnx") or PARAMETERS_KEY not in meta
        self.trainable_names = set(json.loads(meta.get(PARAMETERS_KEY, "[]")))
        self.state_shapes = json.loads(meta.get(STATE_SHAPES_KEY, "{}"))
        self.padding_idx = json.loads(meta.get(PADDING_IDX_KEY, "{}"))
        self.uses: dict[str, int] = {}
        # tensors that are one constant sample repeated over the batch (Expand or ConstantOfShape to
        # [N, ...]): per-sample array; only Concat takes them, as constant parts of a gather
        self.batch_consts: dict[str, np.ndarray] = {}
        self.merged_consts: dict[str, np.ndarray] = {}  # a batch constant seen as [N * windows, ...]: (windows, ...)
        self.window_biases: dict[str, tuple[str, str]] = {}  # a table view plus a merged constant (tables.py)
        self.expanded_params: dict[str, str] = {}  # those of them that are a trainable parameter expanded: -> its name
        self.used = {t for n in g.node for t in n.input} | {o.name for o in g.output}
        # the (C, T) output of a 1-D conv or pool -> the (C, 1, T) tensor it is computed as: a 2-D conv or
        # pool reads that twin directly; anything else gets the (C, T) tensor, a relayout of it, when it first
        # reads it (a gather)
        self.twin_2d: dict[str, str] = {}
        # tensors whose batch axis an export moved or merged (prep/batch_axis.py): ONNX name -> Lazy
        self.lazy: dict[str, ba.Lazy] = {}
        self.forms: dict[tuple[str, str], tuple] = {}
        self.equals: dict[str, tuple[str, float]] = {}  # Equal(activation, constant) -> (its IR tensor, the constant)
        self.nans: dict[str, str] = {}  # IsNaN(activation) -> the activation's ONNX name (constants.where_nan)
        # tensors that are a parameter itself in another shape (a reshape, or a slice that keeps all of it; onnxsim
        # no longer folds them, prep.load): ONNX name -> the parameter's, which its readers read instead
        self.param_views: dict[str, str] = {}
        # a parameter table read at constant indices [T1, T2] (an embedding of constant ids, its IR tensor `src`,
        # (T1*T2, F) a sample), as the ONNX tensor it is: ONNX name -> (src, the view ops from src to it, its ONNX
        # shape without the batch axis, whether it has a leading batch axis of 1 yet, the parameter)
        self.table_views: dict[str, tuple[str, list, tuple[int, ...], bool, str]] = {}

    def step(self, node, attrs: dict) -> Step:
        return Step(node, node.op_type, attrs, [self.param_views.get(t, t) for t in node.input],
                    node.output[0] if node.output else None)

    def users(self, out) -> list:
        """The ONNX nodes that read `out`."""
        return [n for n in self.g.node if out in n.input]

    def act(self, name):  # an activation tensor (not a constant), following aliases
        alias, shapes = self.alias, self.shapes
        name = alias.get(name, name)
        if name in self.equals and name not in shapes:  # a comparison read as a value: 1 where equal, else 0
            x, value = self.equals[name]
            self.layers.append(Layer("select_eq", f"{name}:as_value", [x], [name], {"value": value, "fill": 1.0, "other": 0.0}))
            shapes[name] = shapes[x]
            self.integer.add(name)
        if name in self.lazy:  # the batch first again: one gather
            return self.materialise(name, "canonical", f"tensor {name!r} read by an op")[0]
        if name in self.twin_2d and name not in shapes:
            c, _, t = shapes[self.twin_2d[name]]
            self.gather(None, name, [{"input": 0, "const": None, "ops": [("reshape", (c, t))]}], [self.twin_2d[name]],
                        f"{self.twin_2d[name]}:as1d")
            name = alias.get(name, name)
        if name not in shapes:
            what = "a constant repeated over the batch (only Concat takes one)" if name in self.batch_consts else \
                f"parameter {self.table_views[name][4]!r} read at constant indices of two axes, which trains only " \
                "added to attention's scores (leave it out of --trainable to compute it into a constant)" \
                if name in self.table_views else "not an activation the IR knows"
            raise BuildError(f"tensor {name!r} is {what}")
        return name

    def keep_integers(self, node) -> None:
        """Mark node's output as integers (cx.integer) where its op keeps exact integers integers: arithmetic and
        moves of integer activations and integer constants (RoBERTa's position ids: a cumulative sum of a mask of
        the ids, times it, plus the padding id, which an embedding then reads)."""
        if node.op_type not in _KEEPS_INTEGERS or not node.output or node.output[0] in self.consts:
            return
        acts = [t for t in node.input[:_KEEPS_INTEGERS[node.op_type]] if t and t not in self.consts]
        consts = [self.consts[t] for t in node.input[:_KEEPS_INTEGERS[node.op_type]] if t in self.consts]
        if acts and all(self.alias.get(t, t) in self.integer for t in acts) and all(
                not isinstance(c, list) and np.all(np.abs(c) < 2 ** 24) and np.array_equal(c, np.round(c)) for c in consts):
            self.integer.add(node.output[0])

    def gather(self, node, out, parts, tensors, name=None, params=None):
        """A gather layer (prep/shape.py) of `parts` ({input: slot, const, ops}, or a parameter's {param: role,
        shape, ops}) over `tensors`; a chain that changes nothing is an alias."""
        if len(parts) == 1 and parts[0]["input"] is not None and not parts[0]["ops"]:
            self.alias[out] = tensors[0]
            return
        self.layers.append(Layer("gather", name or node.name, list(tensors), [out], {"parts": parts}, dict(params or {})))
        p = parts[0]
        self.shapes[out] = chain_shape(part_shape(p, [self.shapes[t] for t in tensors]), p["ops"])

    def view(self, node, x, ops, out=None, name=None):
        self.gather(node, out or node.output[0], [{"input": 0, "const": None, "ops": list(ops)}], [x], name)

    def lz(self, name) -> ba.Lazy:
        name = self.alias.get(name, name)
        return self.lazy[name] if name in self.lazy else ba.trivial(self.act(name), self.shapes[self.act(name)])

    def set_lazy(self, out, v: ba.Lazy):
        if ba.is_trivial(v, self.shapes):
            self.alias[out] = v.src
        else:
            self.lazy[out] = v

    def materialise(self, name, form, what, where=""):
        """(IR tensor, its extra) of `name` in `form` (batch_axis: canonical, rows or blocks)."""
        alias, forms = self.alias, self.forms
        name = alias.get(name, name)
        if (name, form) in forms:
            return forms[(name, form)]
        v = self.lz(name)
        fn = {"canonical": ba.canonical_form, "rows": ba.rows_form, "blocks": ba.blocks_form,
              "merged": ba.merged_form}[form]
        ops, shape, *extra = fn(where or repr(name), v, what)
        if all(op[0] == "reshape" for op in ops) and tuple(shape) == tuple(self.shapes[v.src]):
            t = v.src
        else:
            t = name if form == "canonical" else f"{name}:{form}"
            self.view(None, v.src, ops, out=t, name=f"{t}:view" if form != "canonical" else f"{name}:batch_first")
            t = alias.get(t, t)
        if form == "canonical":
            self.lazy.pop(name, None)
            if t != name:
                alias[name] = t
        forms[(name, form)] = (t, *extra)
        return forms[(name, form)]

    def rows_out(self, out, v: ba.Lazy, features) -> str:
        """The IR tensor a row-wise op on `v` writes (its shape set), and the view of ONNX tensor
        `out` over it."""
        t = f"{out}:rows"
        w = ba.after_rows_op(t, v, features)
        self.shapes[t] = (int(np.prod(w.fine[:-1])), int(features))
        self.set_lazy(out, w)
        return t

    def token_wise(self, name) -> bool:
        """Whether a Gemm or MatMul with a weight reads `name` as rows of tokens (a matmul layer), not as
        one vector a sample (a dense layer): tokens [T, F], or image-shaped [H, W, C] (a channels-last Linear,
        every pixel a token)."""
        name = self.alias.get(name, name)
        if name in self.lazy:  # (a view of one vector a sample, [N, F], the batch alone first: a Gather of one
            v = self.lazy[name]  # step of a sequence, as an unrolled RNN reads it: dense)
            return not (v.rank() == 2 and v.sizes()[0] == (ba.N, 1))
        return len(self.shapes[self.act(name)]) >= 2

    def token_matmul(self, node, x, w, out, bias):
        params, shapes = self.params, self.shapes
        v = self.lz(x)
        t_in = self.materialise(x, "rows", node.op_type, where(node))[0]
        o, i = params[w].canonical().shape
        if shapes[t_in][1] != i:
            raise BuildError(f"{where(node)}: weight {w!r} of shape {params[w].array.shape} does not fit "
                             f"{shapes[t_in][1]} input features")
        layer = Layer("matmul", node.name, [t_in], [self.rows_out(out, v, o)], {"groups": 1}, {"weight": w})
        if bias is not None:
            b = self.param(node, list(node.input).index(bias))
            if params[b].array.size != o:
                raise BuildError(f"{where(node)}: bias {b!r} of shape {params[b].array.shape} is not per-output")
            params[b].array = params[b].array.reshape(-1)
            layer.params["bias"] = b
        self.layers.append(layer)

    def moves_batch(self, node, op, a, ins) -> ba.Lazy | None:
        """The lazy view of a shape op's output where its input is lazy or it moves the batch axis;
        None where the per-sample shape ops of onnx_shape serve (the batch stays first)."""
        consts, lz = self.consts, self.lz
        x = self.alias.get(ins[0], ins[0])
        if x in consts or x in self.batch_consts:
            return None
        pending = x in self.lazy
        if op == "Transpose":
            perm = list(a.get("perm", []))
            if pending or (perm and perm[0] != 0):
                return ba.transpose(lz(x), perm or list(range(lz(x).rank()))[::-1])
        elif op == "Reshape" and ins[1] in consts:
            target = list(np.asarray(consts[ins[1]], dtype=object).reshape(-1))
            try:
                v = ba.reshape(where(node), lz(x), target, bool(a.get("allowzero", 0)))
            except BuildError:
                if pending:
                    raise
                return None
            if pending or v.groups[0] != [ba.N]:
                return v
        elif op in ("Squeeze", "Unsqueeze"):
            axes = a.get("axes")
            if axes is None and len(ins) > 1 and ins[1] in consts:
                axes = np.asarray(consts[ins[1]]).reshape(-1).tolist()
            if op == "Unsqueeze" and axes is not None and not pending:  # an axis before the batch (an RNN's h0)
                pending = 0 in [int(k) % (lz(x).rank() + len(axes)) for k in axes]
            if not pending:
                return None
            if op == "Unsqueeze":
                return ba.unsqueeze(lz(x), axes)
            v = lz(x)
            if axes is None:
                axes = [i for i, grp in enumerate(v.groups)
                        if ba.N not in grp and int(np.prod([v.fine[f] for f in grp])) == 1]
            return ba.squeeze(where(node), v, axes)
        elif op == "Gather" and len(ins) > 1 and ins[1] in consts and np.ndim(consts[ins[1]]) == 0:
            return ba.select(where(node), lz(x), int(a.get("axis", 0)), int(np.asarray(consts[ins[1]])))
        return None

    def weight(self, node, i) -> np.ndarray:
        name = self.param_views.get(node.input[i], node.input[i])
        arr = self.consts.get(name)
        if not isinstance(arr, np.ndarray) or name not in self.initializer_names:
            raise BuildError(f"{where(node)}: input {i} ({name!r}) must be a weight initializer; "
                             "products of two activations are not supported")
        return np.asarray(arr, dtype=np.float32)

    def constant(self, tensor: str, values) -> str:
        """Register a constant too big to bake into a kernel (a positional encoding's buffer, a mean image) as a
        frozen texture, Param.constant, named after the ONNX tensor it holds; returns its name. The same tensor
        read twice is one texture."""
        name = f"constant:{tensor}"
        if name not in self.params:
            self.params[name] = Param(name, np.ascontiguousarray(values, dtype=np.float32), constant=True)
        return name

    def param(self, node, i, *, matmul_layout=False, source=None) -> str:
        """Register input i of node (or the initializer `source` it was computed from: a class token's
        Expand) as a trainable parameter; returns its name.

        matmul_layout: the kernel computes x @ B, so B is [in, out]: transposed against Linear's
        [out, in], unless the initializer is itself the state_dict tensor transposed (restored by
        prep.load after constant folding)."""
        params, uses, param_views = self.params, self.uses, self.param_views
        if source is None:
            arr = self.weight(node, i)
            name = source = param_views.get(node.input[i], node.input[i])
        else:
            arr, name = np.asarray(self.consts[source], dtype=np.float32), source
        transposed = False
        if matmul_layout:
            transposed = source not in self.stored_transposed
            arr = arr if transposed else arr.T
        elif source in self.state_shapes:  # the state_dict tensor, exported in another shape (naming.STATE_SHAPES_KEY)
            arr = arr.reshape(self.state_shapes[source])
        arr = np.ascontiguousarray(arr)
        uses[source] = uses.get(source, 0) + 1
        owner = self.tied.get(source, source)  # (a tied parameter's copy in another layout: the parameter)
        if (not self.onnx_file or source in self.shared) and owner in params and params[owner].transposed == transposed and \
                np.array_equal(params[owner].array, arr):
            return owner  # a PyTorch source's tied parameter: one tensor (untie_unsupported splits it if need be)
        if not self.onnx_file and owner not in params:
            name = owner
        elif uses[source] > 1 or owner != source:
            # an initializer shared by several layers (an ONNX file may dedupe equal tensors): untied, under the
            # state_dict name its node's scope gives where that is free (a PyTorch source's: prep/trust.py fails)
            name = scope_name(node, i if source == param_views.get(node.input[i], node.input[i]) else None, source)
            if name is None or name in params or name in self.initializer_names:
                name = f"{owner}@{node.name or len(params)}"
        params[name] = Param(name, arr, transposed, owner if name != owner else None)
        return name
