"""Small models used by the tests (and importable as package.module:Attr sources)."""
from __future__ import annotations

import torch
from torch import nn


class MatMulAdd(nn.Module):
    """x @ W + b with W stored [in, out]: exports MatMul + Add, weights transposed against Gemm."""

    def __init__(self, i=45, o=7):
        super().__init__()
        self.w = nn.Parameter(torch.randn(i, o) * 0.2)
        self.b = nn.Parameter(torch.randn(o) * 0.1)

    def forward(self, x):
        return torch.tanh(x @ self.w + self.b)


class ViewFlatten(nn.Module):
    """x.view(x.size(0), -1): a Shape/Gather/Concat subgraph in front of the Reshape."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(45, 7)

    def forward(self, x):
        return self.fc(x.view(x.size(0), -1))


def mlp_45_31_7():
    return nn.Sequential(nn.Linear(45, 31), nn.ReLU(), nn.Linear(31, 7))


# name -> (factory, per-sample input shape); every op of the dense pipeline appears here
OP_CASES = {
    "linear_relu_linear": (mlp_45_31_7, (45,)),
    "leaky_relu": (lambda: nn.Sequential(nn.Linear(45, 31), nn.LeakyReLU(0.2), nn.Linear(31, 7)), (45,)),
    "sigmoid": (lambda: nn.Sequential(nn.Linear(45, 31), nn.Sigmoid(), nn.Linear(31, 7)), (45,)),
    "tanh": (lambda: nn.Sequential(nn.Linear(45, 31), nn.Tanh(), nn.Linear(31, 7)), (45,)),
    "no_bias": (lambda: nn.Sequential(nn.Linear(45, 31, bias=False), nn.ReLU(), nn.Linear(31, 7, bias=False)), (45,)),
    # activations that cannot be fused: on the input, and a second one in a row
    "unfused_activations": (lambda: nn.Sequential(nn.Tanh(), nn.Linear(45, 31), nn.ReLU(), nn.Sigmoid(),
                                                  nn.Linear(31, 7), nn.LeakyReLU(0.1)), (45,)),
    "flatten_3d_input": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(45, 13), nn.Tanh(), nn.Linear(13, 7)), (3, 5, 3)),
    "view_flatten": (ViewFlatten, (3, 15)),
    "matmul_add": (MatMulAdd, (45,)),
    "dropout_identity": (lambda: nn.Sequential(nn.Linear(45, 31), nn.Dropout(0.5), nn.ReLU(), nn.Identity(),
                                               nn.Linear(31, 7)), (45,)),
    "sigmoid_output": (lambda: nn.Sequential(nn.Linear(45, 9), nn.Sigmoid()), (45,)),
}
