"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN) exported unrolled over the build's fixed sequence length.

The ONNX `LSTM` and `GRU` nodes that PyTorch exports hold the weights reordered (ONNX's gate order is not
PyTorch's) and concatenated into new tensors: a parameter that reached the graph as a computed constant, which
would not train under its state_dict name. So prep.load exports a module's recurrent children as what
they compute, step by step, from the module's own parameters (`unrolled`): one token-wise matmul of the whole
sequence by `weight_ih_l{k}` (with both biases, for an LSTM or an RNN), then for each step a Linear of the previous hidden
state by `weight_hh_l{k}`, the gates and the new state. Every step's Linear reads the same `weight_hh_l{k}` (and a
GRU's `bias_hh_l{k}`): a tied parameter, which trains as one tensor with the sum of the steps' gradients, as
backpropagation through time computes it (prep/graph.py: untie_unsupported keeps such ties).

What they return is kept: (output, (h_n, c_n)) and (output, h_n), for batch_first or not, one or more layers, one or
two directions, tanh or relu (nn.RNN), with an initial state of zeros or given (hx). Not supported, with a build
error naming the module: dropout between layers (PyTorch applies it in training), an LSTM's proj_size, a
PackedSequence. An ONNX file's (or a TorchScript module's) LSTM, GRU and RNN nodes become the same steps when the file
is loaded, their weights split back into these parameters (prep/recurrent_onnx.py).
"""
from __future__ import annotations

import contextlib

from .errors import BuildError


def _check(name, m):
    import torch

    what = f"{type(m).__name__} {name!r}"
    if m.dropout:
        raise BuildError(f"{what}: dropout={m.dropout} between layers is not supported yet (PyTorch applies it "
                         "in training only; give the layers' dropout as an nn.Dropout between two modules)")
    if getattr(m, "proj_size", 0):
        raise BuildError(f"{what}: proj_size={m.proj_size} is not supported yet")


class _Unrolled:
    """What an nn.LSTM, nn.GRU or nn.RNN computes, in ops the build takes (see the module docstring)."""

    def __init__(self, m):
        import torch

        self.m = m
        self.lstm = isinstance(m, torch.nn.LSTM)
        self.kind = "lstm" if self.lstm else "gru" if isinstance(m, torch.nn.GRU) else m.nonlinearity

    def __call__(self, x, hx=None):
        import torch
        import torch.nn.functional as F

        m = self.m
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise BuildError(f"{type(m).__name__}: only a batched tensor input [N, T, F] (or [T, N, F]) is "
                             "supported (not a PackedSequence or an unbatched sequence)")
        if not m.batch_first:
            x = x.transpose(0, 1)
        steps, hidden = x.shape[1], m.hidden_size
        directions = 2 if m.bidirectional else 1
        h0, c0 = (hx if self.lstm else (hx, None)) if hx is not None else (None, None)
        h_n, c_n, layer_in = [], [], x
        for layer in range(m.num_layers):
            outs = []
            for d in range(directions):
                sfx = f"l{layer}" + ("_reverse" if d else "")
                w_ih, w_hh = getattr(m, "weight_ih_" + sfx), getattr(m, "weight_hh_" + sfx)
                b_ih = getattr(m, "bias_ih_" + sfx) if m.bias else None
                b_hh = getattr(m, "bias_hh_" + sfx) if m.bias else None
                gx = torch.matmul(layer_in, w_ih.t())  # [N, T, gates * H]: every step's input at once
                if b_ih is not None:
                    gx = gx + b_ih
                    if self.kind != "gru":
                        gx = gx + b_hh  # (an LSTM or RNN adds both biases as they are: once, to every step)
                h = h0[layer * directions + d] if h0 is not None else None
                c = c0[layer * directions + d] if c0 is not None else None
                if self.kind == "gru" and h is None:  # a GRU's hidden bias is gated: its Linear runs at the first step too
                    h = gx[:, 0, :hidden] * 0.0  # (zeros of [N, H]: torch.zeros_like exports a batch-sized constant)
                seq = [None] * steps
                for t in (reversed(range(steps)) if d else range(steps)):
                    g = gx[:, t]
                    if self.lstm:
                        if h is not None:
                            g = g + F.linear(h, w_hh)
                        i, f, z, o = g.chunk(4, 1)
                        i, f, z, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(z), torch.sigmoid(o)
                        c = i * z if c is None else f * c + i * z
                        h = o * torch.tanh(c)
                    elif self.kind != "gru":  # nn.RNN: tanh or relu
                        g = g if h is None else g + F.linear(h, w_hh)
                        h = torch.tanh(g) if self.kind == "tanh" else torch.relu(g)
                    else:
                        gh = F.linear(h, w_hh, b_hh)
                        xr, xz, xn = g.chunk(3, 1)
                        hr, hz, hn = gh.chunk(3, 1)
                        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                        n = torch.tanh(xn + r * hn)
                        h = n + z * (h - n)  # (1 - z) * n + z * h
                    seq[t] = h
                outs.append(torch.stack(seq, 1))
                h_n.append(h)
                c_n.append(c)
            layer_in = torch.cat(outs, 2) if directions == 2 else outs[0]
        out = layer_in if m.batch_first else layer_in.transpose(0, 1)
        # [layers * directions, N, H], as a transpose of a per-sample stack (a view the build follows: a stack on
        # axis 0 would put a new axis before the batch)
        h_n = torch.stack(h_n, 1).transpose(0, 1)
        return (out, (h_n, torch.stack(c_n, 1).transpose(0, 1))) if self.lstm else (out, h_n)


@contextlib.contextmanager
def unrolled(module):
    """While exporting `module`: its nn.LSTM, nn.GRU and nn.RNN children compute unrolled (their forward replaced on
    the instance, their parameters untouched), and put back after."""
    import torch

    found = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.RNNBase)] \
        if isinstance(module, torch.nn.Module) and not isinstance(module, torch.jit.ScriptModule) else []
    for name, m in found:
        _check(name, m)
    try:
        for _, m in found:
            m.forward = _Unrolled(m)
        yield
    finally:
        for _, m in found:
            m.__dict__.pop("forward", None)
