"""A parameter the ONNX exporter read at constant indices and computed into a constant, found and read again.

torch.onnx.export folds every op whose inputs are parameters and buffers: Swin's relative-position bias,
`table[index].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)` with `index` a buffer, reaches the graph as one
constant, and the table would not train. The export's parameters are their marks (prep/naming.py: marks_of), whose
values are all distinct, so each value of such a constant names the element of the table it was read from: the
indices are recovered, and the constant becomes what it computed,

    Gather(table, rows) -> Transpose (the table's columns to their axis) -> Unsqueeze (the axes of size 1)

which the build takes as a table read at constant indices (prep/onnx_import/tables.py), so the table trains.
Only a 2-D parameter read as it is (no arithmetic on it) is recovered; anything else stays a folded parameter
that the check of the trainable set names (prep/trust.py).
"""
from __future__ import annotations

import numpy as np


def unfold_gathers(model, marks: dict[str, np.ndarray], values: dict[str, np.ndarray], found: set[str]) -> set[str]:
    """Rewrite the constants of `model` that are a 2-D parameter's mark read at constant indices (the parameters
    not in `found`) as reads of the parameter, which gets its real values under its name. Returns the names of
    the parameters so recovered."""
    from onnx import numpy_helper

    g = model.graph
    recovered: set[str] = set()
    for name, mark in marks.items():
        if name in found or mark.ndim != 2 or mark.size < 2:
            continue
        where = {v: i for i, v in enumerate(mark.reshape(-1).tolist())}
        if len(where) != mark.size:
            continue
        for init in list(g.initializer):
            if init.data_type != 1 or init.name in found:
                continue
            arr = numpy_helper.to_array(init)
            pos = [where.get(v) for v in arr.reshape(-1).tolist()]
            if arr.size < 2 or None in pos:
                continue
            nodes = _reads(init.name, name, np.asarray(pos).reshape(arr.shape), mark.shape[1])
            if nodes is None:
                continue
            g.initializer.remove(init)
            for i in [i for i in g.input if i.name == init.name]:
                g.input.remove(i)
            for k, node in enumerate(nodes):
                g.node.insert(k, node)
            if name not in recovered:
                g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(values[name], dtype=np.float32), name))
            recovered.add(name)
    return recovered


def whole_reads(model):
    """After onnxsim (which makes the shapes constant): each read that unfold_gathers wrote, with the shape ops that
    alone read it after (Swin's view, permute and unsqueeze of the gathered table), rewritten as one read, whose
    index has the rank of the rows it reads: what the build takes as a table view (onnx_import/tables.py)."""
    from onnx import numpy_helper

    g = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for read in [n for n in g.node if n.op_type == "Gather" and n.name.endswith(_READ)]:
        table, idx = read.input
        if table not in consts or idx not in consts:
            continue
        cols = consts[table].shape[1]
        pos = consts[idx][..., None] * cols + np.arange(cols)
        out, pos, chain = _follow(g, read.output[0], pos)
        nodes = _reads(out, table, pos, cols)
        if nodes is None or not chain:
            continue
        for node in [read] + chain:
            g.node.remove(node)
        at = min(k for k, n in enumerate(g.node) if out in n.input)
        for k, node in enumerate(nodes):
            g.node.insert(at + k, node)
    return model


_READ = "/read_of_a_folded_parameter"
_SHAPE_OPS = ("Reshape", "Transpose", "Unsqueeze", "Squeeze", "Identity")


def _follow(g, name: str, pos: np.ndarray):
    """(tensor, its positions, the nodes on the way) at the end of the shape ops that alone read `name` one after
    the other (Swin's view, permute and unsqueeze of the gathered table), so that the read is rewritten whole."""
    from onnx import helper, numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    chain = []
    while True:
        readers = [n for n in g.node if name in n.input]
        if len(readers) != 1 or readers[0].op_type not in _SHAPE_OPS or readers[0].input[0] != name or \
                any(i not in consts for i in readers[0].input[1:] if i) or name in [o.name for o in g.output]:
            return name, pos, chain
        node = readers[0]
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        extra = [consts[i] for i in node.input[1:] if i]
        if node.op_type == "Reshape":
            target = [d if d != 0 or a.get("allowzero") else pos.shape[k] for k, d in enumerate(extra[0].tolist())]
            pos = pos.reshape(target)
        elif node.op_type == "Transpose":
            pos = pos.transpose(a.get("perm"))
        elif node.op_type in ("Unsqueeze", "Squeeze"):
            axes = extra[0].tolist() if extra else a.get("axes")
            pos = np.expand_dims(pos, tuple(axes)) if node.op_type == "Unsqueeze" else np.squeeze(
                pos, tuple(axes) if axes is not None else None)
        chain.append(node)
        name = node.output[0]


def _reads(out: str, table: str, pos: np.ndarray, cols: int):
    """The nodes computing `out` (of shape pos.shape, element k the table's flat element pos[k]) from `table`
    [rows, cols]: None where one axis of `out` is not the table's columns, in order, with the rows constant along it."""
    from onnx import helper, numpy_helper

    rows, col = np.divmod(pos, cols)
    axis = next((a for a in range(pos.ndim) if pos.shape[a] == cols and np.array_equal(
        col, np.broadcast_to(np.arange(cols).reshape([-1 if k == a else 1 for k in range(pos.ndim)]), pos.shape))), None)
    if axis is None:
        return None
    idx = np.take(rows, 0, axis=axis)
    if not np.array_equal(rows, np.broadcast_to(np.expand_dims(idx, axis), pos.shape)):
        return None
    kept = [k for k in range(pos.ndim) if k == axis or pos.shape[k] != 1]  # out's axes but those of size 1
    gathered = [k for k in kept if k != axis] + [axis]  # the Gather's axes: the index's, then the columns
    idx = idx.reshape([pos.shape[k] for k in kept if k != axis])
    idx_name, t = f"{out}/rows", f"{out}{_READ}"
    nodes = [helper.make_node("Constant", [], [idx_name], name=idx_name,
                              value=numpy_helper.from_array(idx.astype(np.int64), idx_name)),
             helper.make_node("Gather", [table, idx_name], [t], name=t, axis=0)]
    perm = [gathered.index(k) for k in kept]
    if perm != list(range(len(perm))):
        nodes.append(helper.make_node("Transpose", [t], [f"{t}/moved"], name=f"{t}/moved", perm=perm))
        t = f"{t}/moved"
    unit = [k for k in range(pos.ndim) if k not in kept]
    if unit:
        axes = f"{out}/axes"
        nodes.append(helper.make_node("Constant", [], [axes], name=axes,
                                      value=numpy_helper.from_array(np.asarray(unit, dtype=np.int64), axes)))
        nodes.append(helper.make_node("Unsqueeze", [t, axes], [out], name=out))
    else:
        nodes.append(helper.make_node("Identity", [t], [out], name=out))
    return nodes
