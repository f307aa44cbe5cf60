"""ONNX import (prep/graph.py: to_ir): one ONNX node at a time, dispatched over a registry of import rules.

ctx.py       the importer's state (Importer: tensors, shapes, layers, aliases, lazy batch views, ...) and the
             operations the rules share (act, gather, view, materialise, param, ...); Step, the node at hand
registry.py  the @imports(op, ...) decorator and the dispatch (Registry)
rules.py     the declared order of every rule: for a node, the rules registered for its op type (and those
             for ANY op) are tried in that order, the first that returns True has converted it
the families of rules: constants.py (constants and symbolic shape values), tables.py (parameter tables read at
constant indices, embeddings), linear.py (Identity, Dropout, Gemm, MatMul), conv.py (Conv, ConvTranspose,
BatchNormalization, 1-D as 2-D), elementwise.py (elementwise ops, on views too), norm.py (LayerNormalization,
Softmax), shape_ops.py (Concat, views, Split, Reshape, Flatten, Resize, Pad), pool_reduce.py (pools, reductions);
common.py, layers.py and fold.py: helpers (window arithmetic, the layers some rules make, constant folding).
"""
