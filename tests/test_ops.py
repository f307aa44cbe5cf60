"""Every op of the dense pipeline, forward and gradient, against PyTorch autograd on odd shapes.

One helper (`helpers.check_op`) drives every case of models.OP_CASES: it builds the bundle, runs
`predict` and `gradients` in Chromium, and compares with PyTorch.

Tolerances (float32 on both sides; only the summation order differs):
  forward    atol 2e-5 + rtol 2e-4 * |ref|
  gradients  atol 2e-6 + rtol 2e-4 * |ref|   (gradients here are of order 1e-3 .. 1e-1)
"""
from __future__ import annotations

import zlib

import pytest

from helpers import check_op
from models import OP_CASES

BATCH = 11


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_forward_and_gradients_cross_entropy(web, site, case):
    factory, shape = OP_CASES[case]
    check_op(web, site, case, factory, shape, "cross_entropy", batch=BATCH, seed=zlib.crc32(case.encode()) % 1000)


@pytest.mark.parametrize("case", ["linear_relu_linear", "sigmoid_output", "unfused_activations", "matmul_add"])
def test_forward_and_gradients_mse(web, site, case):
    factory, shape = OP_CASES[case]
    check_op(web, site, case, factory, shape, "mse", batch=BATCH, seed=zlib.crc32(case.encode()) % 1000)
