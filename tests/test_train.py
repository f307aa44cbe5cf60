"""Training parity with PyTorch: one step of each optimizer, and whole trajectories.

Same initial weights, same batches in the same order (shuffle: false, the last batch
partial), same settings; compared tensor by tensor and loss by loss, driven from a list.

Tolerances (float32 on both sides, summation order differs; errors grow with steps):
  one step      weights atol 1e-6 + rtol 1e-5 * |ref|
  trajectory    weights atol 2e-5 + rtol 2e-4 * |ref|, losses atol 1e-5 + rtol 1e-4
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, build_module, run_model, torch_state
from models import mlp_45_31_7

ONE_STEP = dict(atol=1e-6, rtol=1e-5)
TRAJ_W = dict(atol=2e-5, rtol=2e-4)
TRAJ_LOSS = dict(atol=1e-5, rtol=1e-4)

OPTIMIZERS = {
    "sgd": {"type": "sgd", "lr": 0.1},
    "sgd_momentum_wd": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weightDecay": 1e-3},
    "sgd_nesterov": {"type": "sgd", "lr": 0.05, "momentum": 0.8, "nesterov": True, "weightDecay": 1e-2},
    "sgd_dampening": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.3},
    "adam": {"type": "adam", "lr": 1e-2, "weightDecay": 1e-2},
    "adam_betas": {"type": "adam", "lr": 3e-3, "betas": [0.8, 0.99], "eps": 1e-6},
    "adamw": {"type": "adamw", "lr": 1e-2, "weightDecay": 0.1},
}


def torch_optimizer(cfg, params):
    t = cfg["type"]
    if t == "sgd":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg.get("momentum", 0),
                               dampening=cfg.get("dampening", 0), nesterov=cfg.get("nesterov", False),
                               weight_decay=cfg.get("weightDecay", 0))
    kw = dict(lr=cfg["lr"], betas=tuple(cfg.get("betas", (0.9, 0.999))), eps=cfg.get("eps", 1e-8))
    if t == "adam":
        return torch.optim.Adam(params, weight_decay=cfg.get("weightDecay", 0), **kw)
    return torch.optim.AdamW(params, weight_decay=cfg.get("weightDecay", 1e-2), **kw)


def torch_fit(module, x, y, loss, cfg, batch_size, epochs):
    opt = torch_optimizer(cfg, module.parameters())
    losses = []
    for _ in range(epochs):
        for s in range(0, len(x), batch_size):
            xb, yb = x[s:s + batch_size], y[s:s + batch_size]
            opt.zero_grad()
            out = module(xb)
            value = F.cross_entropy(out, yb) if loss == "cross_entropy" else F.mse_loss(out, yb)
            value.backward()
            opt.step()
            losses.append(value.item())
    return losses


FIT = """
    const x = new Float32Array(args.x);
    const y = args.loss === 'cross_entropy' ? Int32Array.from(args.y) : new Float32Array(args.y);
    let calls = 0;
    const r = await m.fit(x, y, { batchSize: args.batchSize, epochs: args.epochs, shuffle: false,
                                  loss: args.loss, optimizer: args.optimizer, onStep: () => { calls++; } });
    return { loss: r.loss, weights: arr(await m.getWeights()), calls };
"""


def check_training(web, site, opt_name, loss, *, samples, batch_size, epochs, tol_w, tol_loss):
    torch.manual_seed(7)
    module = mlp_45_31_7()
    url = build_module(site, "train_mlp", module, (45,))
    x = torch.randn(samples, 45)
    if loss == "cross_entropy":
        y = torch.randint(0, 7, (samples,))
        y_js = y.tolist()
    else:
        y = torch.randn(samples, 7)
        y_js = y.reshape(-1).tolist()
    cfg = OPTIMIZERS[opt_name]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y_js, "loss": loss, "optimizer": cfg,
                                    "batchSize": batch_size, "epochs": epochs})
    ref_losses = torch_fit(module, x, y, loss, cfg, batch_size, epochs)
    steps = epochs * -(-samples // batch_size)
    assert len(got["loss"]) == steps and got["calls"] == steps
    assert_close(f"{opt_name}/{loss} losses", got["loss"], ref_losses, **tol_loss)
    for name, ref in torch_state(module).items():
        assert_close(f"{opt_name}/{loss} {name} after {steps} steps", got["weights"][name], ref, **tol_w)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_one_step(web, site, opt_name):
    check_training(web, site, opt_name, "cross_entropy", samples=13, batch_size=13, epochs=1,
                   tol_w=ONE_STEP, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("opt_name", ["sgd_momentum_wd", "sgd_nesterov", "adam", "adamw"])
def test_trajectory(web, site, opt_name, loss):
    # 50 samples in batches of 16: 16, 16, 16 and a partial 2, for 3 epochs = 12 steps
    check_training(web, site, opt_name, loss, samples=50, batch_size=16, epochs=3, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


def test_long_trajectory_reads_losses_across_the_ring(web, site):
    # 150 steps: more than two loss-ring readbacks (64 steps each) plus a partial one
    check_training(web, site, "adam", "cross_entropy", samples=50, batch_size=1, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)
