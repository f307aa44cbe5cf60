"""Dropout trains as PyTorch's model.train() does: fit draws a fresh mask each step from its seed
(prep/dropout.py), with inverted scaling; predict and gradients do not apply it; fit({dropout: false})
turns it off. The reference is the PyTorch module with each nn.Dropout drawing the same masks (the mask
is the one thing taken from texelfit: it is a counter-based hash, not torch's generator)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import FWD, GRAD, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, build_module, run_model, torch_optimizer
from texelfit.prep import dropout as dp
from texelfit.prep.graph import to_ir
from texelfit.prep.load import export_simplified

SHAPE = (3, 6, 5)
SEED = 11


class DropoutNet(nn.Module):
    """Dropout on conv features (C, H, W) and on a hidden dense layer, each before a layer that trains."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)  # (6, 4, 3)
        self.drop_map = nn.Dropout(0.25)
        self.fc1 = nn.Linear(6 * 4 * 3, 16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        y = self.drop_map(torch.relu(self.conv(x)))
        return self.fc2(self.drop(torch.relu(self.fc1(y.flatten(1)))))


class Masked(nn.Module):
    """nn.Dropout with the masks of the bundle's layer `name` at step `self.step`."""

    def __init__(self, name: str, p: float):
        super().__init__()
        self.name, self.p, self.step = name, p, 0

    def forward(self, x):
        m = dp.mask(SEED, self.step, self.name, self.p, tuple(x.shape))
        return x * torch.from_numpy(m)


def _reference(module, names):
    ref = copy.deepcopy(module)
    ref.drop_map, ref.drop = Masked(names[0], 0.25), Masked(names[1], 0.5)
    return ref


@pytest.fixture(scope="module")
def case(site):
    torch.manual_seed(4)
    module = DropoutNet().eval()
    names = [l.name for l in to_ir(export_simplified(module, SHAPE), SHAPE).layers if l.op == "dropout"]
    assert len(names) == 2, "both nn.Dropout layers are kept by the export"
    url = build_module(site, "dropout_net", module, SHAPE)
    g = torch.Generator().manual_seed(2)
    x = torch.randn((10,) + SHAPE, generator=g)
    y = torch.randint(0, 5, (10,), generator=g)
    return module, names, url, x, y


FIT = """
    const x = new Float32Array(args.x), y = Int32Array.from(args.y);
    const before = Array.from(await m.predict(x, 10));
    const grads = arr(await m.gradients(x, y));
    const r = await m.fit(x, y, { batchSize: 4, epochs: 2, shuffle: false, seed: args.seed, optimizer: args.opt,
                                  dropout: args.dropout });
    return { before, grads, loss: r.loss, weights: arr(await m.getWeights()) };
"""


@pytest.mark.parametrize("backend", ["webgl", "cpu", "rgba8"])
def test_fit_applies_a_fresh_mask_each_step_and_predict_none(web, case, backend):
    module, names, url, x, y = case
    options = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}[backend]
    cfg = OPTIMIZERS["sgd_momentum_wd"]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "seed": SEED, "opt": cfg,
                                    "dropout": True}, options)
    # predict and gradients: the inference form
    assert_close("predict (no dropout)", got["before"], module(x).detach().numpy(), **FWD)
    m = copy.deepcopy(module)
    F.cross_entropy(m(x), y).backward()
    for name, p in m.named_parameters():
        assert_close(f"gradients d/d{name} (no dropout)", got["grads"][name], p.grad.numpy(), **GRAD)
    # fit: each step its own masks
    ref = _reference(module, names)
    opt = torch_optimizer(cfg, ref.parameters())
    losses, step = [], 0
    for _ in range(2):
        for s in range(0, 10, 4):
            ref.drop_map.step = ref.drop.step = step
            opt.zero_grad()
            loss = F.cross_entropy(ref(x[s:s + 4]), y[s:s + 4])
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
    assert_close("losses with dropout", got["loss"], losses, **TRAJ_LOSS)
    for name, p in ref.named_parameters():
        assert_close(f"{name} after 6 steps with dropout", got["weights"][name], p.detach().numpy(), **TRAJ_W)
    # the masks really differ from step to step and from layer to layer, and drop about p
    a, b = dp.mask(SEED, 0, names[1], 0.5, (4, 16)), dp.mask(SEED, 1, names[1], 0.5, (4, 16))
    assert (a != b).any() and 0.2 < (dp.mask(SEED, 0, names[0], 0.25, (64, 72)) == 0).mean() < 0.3


def test_dropout_false_trains_without_it(web, case):
    module, names, url, x, y = case
    cfg = OPTIMIZERS["adam"]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "seed": SEED, "opt": cfg,
                                    "dropout": False})
    ref = copy.deepcopy(module).eval()
    opt = torch_optimizer(cfg, ref.parameters())
    losses = []
    for _ in range(2):
        for s in range(0, 10, 4):
            opt.zero_grad()
            loss = F.cross_entropy(ref(x[s:s + 4]), y[s:s + 4])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert_close("losses without dropout", got["loss"], losses, **TRAJ_LOSS)
    for name, p in ref.named_parameters():
        assert_close(f"{name} after 6 steps without dropout", got["weights"][name], p.detach().numpy(), **TRAJ_W)
