"""Every op of the dense pipeline, forward and gradient, against PyTorch autograd on odd shapes.

One helper (`check_op`) drives every case of models.OP_CASES: it builds the bundle, runs
`predict` and `gradients` in Chromium, and compares with PyTorch.

Tolerances (float32 on both sides; only the summation order differs):
  forward    atol 2e-5 + rtol 2e-4 * |ref|
  gradients  atol 2e-6 + rtol 2e-4 * |ref|   (gradients here are of order 1e-3 .. 1e-1)
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, build_module, run_model
from models import OP_CASES

FWD = dict(atol=2e-5, rtol=2e-4)
GRAD = dict(atol=2e-6, rtol=2e-4)
BATCH = 11


def check_op(web, site, case: str, loss: str):
    factory, shape = OP_CASES[case]
    torch.manual_seed(hash(case) % 1000)
    module = factory().eval()
    url = build_module(site, f"op_{case}", module, shape)
    x = torch.randn((BATCH,) + tuple(shape))
    out_features = module(x).shape[1]
    if loss == "cross_entropy":
        y = torch.randint(0, out_features, (BATCH,))
        y_js = y.tolist()
    else:
        y = torch.randn(BATCH, out_features)
        y_js = y.reshape(-1).tolist()
    got = run_model(web, url, """
        const x = new Float32Array(args.x);
        const y = args.loss === 'cross_entropy' ? Int32Array.from(args.y) : new Float32Array(args.y);
        const out = Array.from(await m.predict(x, args.batch));
        const grads = arr(await m.gradients(x, y, { loss: args.loss }));
        return { out, grads };
    """, {"x": x.reshape(-1).tolist(), "y": y_js, "loss": loss, "batch": BATCH})

    module.zero_grad()
    out = module(x)
    ref_loss = F.cross_entropy(out, y) if loss == "cross_entropy" else F.mse_loss(out, y)
    ref_loss.backward()
    assert_close(f"{case} forward", got["out"], out.detach().numpy(), **FWD)
    named = dict(module.named_parameters())
    assert sorted(got["grads"]) == sorted(named), "gradients are keyed by the state_dict names"
    for name, p in named.items():
        assert_close(f"{case} d{loss}/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_forward_and_gradients_cross_entropy(web, site, case):
    check_op(web, site, case, "cross_entropy")


@pytest.mark.parametrize("case", ["linear_relu_linear", "sigmoid_output", "unfused_activations", "matmul_add"])
def test_forward_and_gradients_mse(web, site, case):
    check_op(web, site, case, "mse")
