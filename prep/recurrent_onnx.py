"""An ONNX file's LSTM, GRU and RNN nodes, rewritten as the steps they compute (before onnxsim), as prep/recurrent.py
exports a module's nn.LSTM, nn.GRU and nn.RNN: one MatMul of the whole sequence by the input weights (with both
biases, for an LSTM or an RNN), then for each step a Gemm of the previous hidden state by the hidden weights, the
gates and the new state. Every step reads the same hidden weights: a tied parameter (SHARED_KEY), trained with the
sum of the steps' gradients, as backpropagation through time computes it.

The node's W, R and B hold the weights of every gate in ONNX's gate order (LSTM i, o, f, c; GRU z, r, h), which is not
PyTorch's (LSTM i, f, g, o; GRU r, z, n), concatenated per direction. They are split back into the tensors PyTorch
trains, under their state_dict names: `{scope}.weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}`
(`_reverse` for the second direction), where scope is the node's module path ('/rnn/LSTM_1' is in module `rnn`) and
k counts the recurrent nodes of that scope in graph order (PyTorch exports one node per layer). So an ONNX file's
recurrent layer trains the weights that its module's state_dict holds, under the same names, and getWeights gives
them in PyTorch's layout (the input weights are stored transposed, TRANSPOSED_KEY).

Supported as PyTorch exports them: forward, reverse or bidirectional; an initial state of zeros or given; Y, Y_h and
Y_c (an LSTM's). Refused with a build error naming the node: sequence_lens, peepholes, clip, input_forget, other
activations than the defaults (an RNN's Tanh or Relu), a GRU with linear_before_reset=0 (not what PyTorch
computes), and a sequence length the file does not fix.
"""
from __future__ import annotations

import json

import numpy as np

from .errors import BuildError
from .naming import SHARED_KEY, TRANSPOSED_KEY, set_meta

RECURRENT = ("LSTM", "GRU", "RNN")
# each gate's block of W, R and B in PyTorch's order, as indices of ONNX's blocks
_TO_TORCH = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2), "RNN": (0,)}
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _where(node) -> str:
    return f"{node.op_type} node {node.name or '(unnamed)'!r}"


def unroll_recurrent_nodes(model):
    """`model` with every LSTM, GRU and RNN node replaced by its steps (the module docstring); unchanged without one."""
    import onnx

    from .onnx_import.common import module_path

    g = model.graph
    if not any(n.op_type in RECURRENT for n in g.node):
        return model
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    inits = {i.name: i for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    counts: dict[str, int] = {}
    nodes, transposed, outs, shared = [], [], set(), []
    for node in g.node:
        if node.op_type not in RECURRENT:
            nodes.append(node)
            continue
        scope = module_path(node)
        k = counts[scope] = counts.get(scope, -1) + 1
        new, params, names_t = _Steps(node, scope, k, shapes, inits, producers).build()
        nodes.extend(new)
        outs.update(o for o in node.output if o)
        g.initializer.extend(params)
        shared.extend(p.name for p in params)
        transposed.extend(names_t)
    del g.node[:]
    g.node.extend(_concat_before_transpose(nodes, outs))
    used = {t for n in g.node for t in n.input}
    gone = {i.name for i in g.initializer if i.name not in used}  # the nodes' W, R and B
    keep = [i for i in g.initializer if i.name not in gone]
    del g.initializer[:]
    g.initializer.extend(keep)
    inputs = [i for i in g.input if i.name not in gone]  # (an export with keep_initializers_as_inputs)
    del g.input[:]
    g.input.extend(inputs)
    _add_transposed(model, transposed)
    set_meta(model, SHARED_KEY, sorted(shared))
    return model


def _concat_before_transpose(nodes, outs):
    """A Concat of unrolled states (PyTorch's h_n of several layers: Concat of the nodes' Y_h on axis 0), each the
    Transpose that puts the batch second: the Concat of what they transpose, then one Transpose, so that the batch
    axis is first where an op reads it (prep/batch_axis.py follows the Transpose as a view)."""
    from onnx import helper

    by_out = {n.output[0]: n for n in nodes if n.op_type == "Transpose" and n.output[0] in outs}
    done = []
    for n in nodes:
        srcs = [by_out.get(t) for t in n.input]
        perms = {tuple(helper.get_attribute_value(a)) for s in srcs if s is not None for a in s.attribute}
        if n.op_type != "Concat" or None in srcs or len(perms) != 1:
            done.append(n)
            continue
        perm = list(perms.pop())
        axis = helper.get_attribute_value(n.attribute[0]) % len(perm)
        inner = n.output[0] + "/before_transpose"
        done.append(helper.make_node("Concat", [s.input[0] for s in srcs], [inner], name=inner, axis=perm[axis]))
        done.append(helper.make_node("Transpose", [inner], list(n.output), name=n.name, perm=perm))
    return done


def _add_transposed(model, names):
    before = {p.key: p.value for p in model.metadata_props}.get(TRANSPOSED_KEY, "[]")
    set_meta(model, TRANSPOSED_KEY, sorted(set(json.loads(before)) | set(names)))


class _Steps:
    """The nodes and parameters of one recurrent node's unrolled form."""

    def __init__(self, node, scope, k, shapes, inits, producers):
        from onnx import helper

        self.node, self.op, self.helper = node, node.op_type, helper
        self.scope, self.k, self.inits, self.producers = scope, k, inits, producers
        self.nodes, self.params, self.transposed, self.n = [], [], [], 0
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        self.hidden = int(a.get("hidden_size", 0))
        direction = a.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        self.dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
        self.layout = int(a.get("layout", 0))
        self._check(a, shapes)

    def _fail(self, what):
        raise BuildError(f"{_where(self.node)}: {what}")

    def _check(self, a, shapes):
        ins = list(self.node.input) + [""] * 8
        if ins[4]:
            self._fail("sequence_lens (a PackedSequence) is not supported: give every sequence the build's length")
        if self.op == "LSTM" and ins[7]:
            self._fail("peepholes (input P) are not supported")
        if a.get("clip") is not None:
            self._fail(f"clip={a['clip']} is not supported")
        if a.get("input_forget", 0):
            self._fail("input_forget=1 is not supported")
        acts = [x.decode() if isinstance(x, bytes) else x for x in a.get("activations", [])]
        per_dir = acts[:len(acts) // len(self.dirs)] if acts else []
        if self.op == "RNN":
            self.act = per_dir[0] if per_dir else "Tanh"
            if self.act not in ("Tanh", "Relu") or len(set(acts)) > 1:
                self._fail(f"activations {acts} are not supported (nn.RNN's Tanh or Relu)")
        elif per_dir and per_dir != _DEFAULT_ACTS[self.op]:
            self._fail(f"activations {acts} are not supported (only {_DEFAULT_ACTS[self.op]}, as PyTorch exports)")
        if self.op == "GRU" and not a.get("linear_before_reset", 0):
            self._fail("linear_before_reset=0 is not supported (nn.GRU computes linear_before_reset=1)")
        for i, what in ((1, "W"), (2, "R"), (3, "B")):
            if ins[i] and ins[i] not in self.inits:
                self._fail(f"its {what} ({ins[i]!r}) is computed in the graph: only weights stored in the file are supported")
        shape = shapes.get(self.node.input[0])
        steps = None if not shape or len(shape) != 3 else shape[1 if self.layout else 0]
        if not steps:
            self._fail(f"the sequence length of its input {self.node.input[0]!r} is not fixed in the file "
                       f"(shape {shape}): export with a fixed sequence length")
        self.steps = steps

    def _t(self, hint):
        self.n += 1
        return f"{self.node.name}/unrolled/{hint}_{self.n}"

    def _add(self, op, inputs, hint=None, **attrs):
        out = self._t(hint or op)
        self.nodes.append(self.helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def _const(self, value, dtype=np.int64):
        from onnx import numpy_helper

        name = self._t("const")
        self.nodes.append(self.helper.make_node("Constant", [], [name], name=name,
                                                value=numpy_helper.from_array(np.asarray(value, dtype=dtype), name)))
        return name

    def _param(self, kind, d, value, transposed=False):
        from onnx import numpy_helper

        name = f"{self.scope + '.' if self.scope else ''}{kind}_l{self.k}{'_reverse' if d else ''}"
        self.params.append(numpy_helper.from_array(np.ascontiguousarray(value.T if transposed else value,
                                                                        dtype=np.float32), name))
        if transposed:
            self.transposed.append(name)
        return name

    def _torch_order(self, w):
        """[gates * H, ...] in ONNX's gate order -> PyTorch's."""
        blocks = np.split(w, len(_TO_TORCH[self.op]), axis=0)
        return np.concatenate([blocks[i] for i in _TO_TORCH[self.op]], axis=0)

    def _zeros(self, name) -> bool:
        """Whether an initial state is zeros: empty, or zeros made by ConstantOfShape (what PyTorch exports without
        hx), sliced, reshaped or expanded, or a constant of zeros."""
        from onnx import helper, numpy_helper

        while name:
            if name in self.inits:
                return not numpy_helper.to_array(self.inits[name]).any()
            p = self.producers.get(name)
            if p is None:
                return False
            if p.op_type in ("Slice", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Identity", "Cast"):
                name = p.input[0]
                continue
            if p.op_type in ("ConstantOfShape", "Constant"):
                v = {x.name: x for x in p.attribute}.get("value")
                return v is None or not numpy_helper.to_array(helper.get_attribute_value(v)).any()
            return False
        return True

    def build(self):
        from onnx import numpy_helper

        ins = list(self.node.input) + [""] * 8
        H, gates = self.hidden, len(_TO_TORCH[self.op])
        W, R = (numpy_helper.to_array(self.inits[ins[i]]) for i in (1, 2))
        B = numpy_helper.to_array(self.inits[ins[3]]) if ins[3] else np.zeros((len(self.dirs), 2 * gates * H), np.float32)
        x = ins[0] if self.layout else self._add("Transpose", [ins[0]], "batch_first", perm=[1, 0, 2])  # [N, T, I]
        h0 = None if self._zeros(ins[5]) else ins[5]
        c0 = None if self.op != "LSTM" or self._zeros(ins[6]) else ins[6]
        ys, hs, cs = [], [], []
        for d, reverse in enumerate(self.dirs):
            seq, h, c = self._direction(d, reverse, x, W[d], R[d], B[d], h0, c0)
            ys.append(self._add("Unsqueeze", [self._stack(seq, 1), self._const([2])]))  # [N, T, 1, H]
            hs.append(self._add("Unsqueeze", [h, self._const([1])]))
            if c is not None:
                cs.append(self._add("Unsqueeze", [c, self._const([1])]))
        outs = list(self.node.output) + [""] * 3
        y = ys[0] if len(ys) == 1 else self._add("Concat", ys, axis=2)  # [N, T, D, H]
        perm_y = [0, 1, 2, 3] if self.layout else [1, 2, 0, 3]  # ONNX's Y: [T, D, N, H] (layout 1: [N, T, D, H])
        for out, parts, perm in ((outs[0], [y], perm_y), (outs[1], hs, [1, 0, 2]), (outs[2], cs, [1, 0, 2])):
            if not out:
                continue
            t = parts[0] if len(parts) == 1 else self._add("Concat", parts, axis=1)  # [N, D, H]
            perm = perm if not self.layout or out == outs[0] else [0, 1, 2]  # (layout 1: Y_h is [N, D, H])
            self.nodes.append(self.helper.make_node("Transpose", [t], [out], name=self._t("out"), perm=perm))
        return self.nodes, self.params, self.transposed

    def _stack(self, seq, axis):
        return self._add("Concat", [self._add("Unsqueeze", [s, self._const([axis])]) for s in seq], axis=axis)

    def _initial(self, state, d):
        """Direction d's initial state [N, H] of a given [D, N, H] ([N, D, H] in layout 1)."""
        return self._add("Gather", [state, self._const(d)], axis=1 if self.layout else 0)

    def _direction(self, d, reverse, x, W, R, B, h0, c0):
        H, op = self.hidden, self.op
        w_ih = self._param("weight_ih", d, self._torch_order(W), transposed=True)  # stored [I, gates * H]
        w_hh = self._param("weight_hh", d, self._torch_order(R))
        b_ih = self._param("bias_ih", d, self._torch_order(B[:B.size // 2]))
        b_hh = self._param("bias_hh", d, self._torch_order(B[B.size // 2:]))
        gx = self._add("Add", [self._add("MatMul", [x, w_ih]), b_ih])  # [N, T, gates * H]: every step's input
        if op != "GRU":
            gx = self._add("Add", [gx, b_hh])
        h = self._initial(h0, d) if h0 is not None else None
        c = self._initial(c0, d) if c0 is not None else None
        seq = [None] * self.steps
        for t in (reversed(range(self.steps)) if reverse else range(self.steps)):
            g = self._add("Gather", [gx, self._const(t)], axis=1)  # [N, gates * H]
            if op == "GRU" and h is None:  # the hidden Linear (its bias) runs at the first step too: h of zeros
                h = self._add("Mul", [self._add("Slice", [g, self._const([0]), self._const([H]), self._const([1])]),
                                      self._const(0.0, np.float32)])
            if op == "LSTM":
                if h is not None:
                    g = self._add("Add", [g, self._add("Gemm", [h, w_hh], transB=1)])
                i, f, z, o = self._split(g, 4)
                i, f, z, o = (self._add(a, [v]) for a, v in zip(("Sigmoid", "Sigmoid", "Tanh", "Sigmoid"), (i, f, z, o)))
                iz = self._add("Mul", [i, z])
                c = iz if c is None else self._add("Add", [self._add("Mul", [f, c]), iz])
                h = self._add("Mul", [o, self._add("Tanh", [c])])
            elif op == "RNN":
                g = g if h is None else self._add("Add", [g, self._add("Gemm", [h, w_hh], transB=1)])
                h = self._add(self.act, [g])
            else:
                gh = self._add("Gemm", [h, w_hh, b_hh], transB=1)
                xr, xz, xn = self._split(g, 3)
                hr, hz, hn = self._split(gh, 3)
                r = self._add("Sigmoid", [self._add("Add", [xr, hr])])
                z = self._add("Sigmoid", [self._add("Add", [xz, hz])])
                n = self._add("Tanh", [self._add("Add", [xn, self._add("Mul", [r, hn])])])
                h = self._add("Add", [n, self._add("Mul", [z, self._add("Sub", [h, n])])])  # (1 - z) * n + z * h
            seq[t] = h
        return seq, h, c

    def _split(self, g, parts):
        outs = [self._t("gate") for _ in range(parts)]
        self.nodes.append(self.helper.make_node("Split", [g, self._const([self.hidden] * parts)], outs,
                                                name=self._t("Split"), axis=1))
        return outs
