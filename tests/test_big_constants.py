"""Constants too big to bake into a kernel (issue 32): a buffer of more than 4,096 values that the model adds,
multiplies or concatenates: the sinusoidal positional encoding of PyTorch's Transformer tutorial (a [1, T, F]
buffer sliced to the sequence), a mean image subtracted from the input, a constant coordinate image
concatenated to it (CoordConv). Each ships as a frozen texture of its own size, read where a small constant
would be baked in: it has no gradient and no optimizer state, and it is not a weight (getWeights, setWeights,
modelInfo.weights and the trainable set do not list it; a checkpoint holds it as it holds a frozen weight, so a
context restored has it back).

Forward, every gradient and SGD/Adam trajectories against PyTorch on WebGL2, rgba8 and the CPU backend.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import helpers
from helpers import TRAJ_LOSS, TRAJ_W, check_op, check_training, run_model
from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}
V, T, D = 40, 80, 64  # vocabulary, tokens, features: the encoding's slice is T * D = 5120 values


class PositionalEncoding(nn.Module):
    """The PyTorch tutorial's: a [1, max_len, D] buffer of sines and cosines, sliced to the sequence."""

    def __init__(self, d, max_len=200):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(1, max_len, d)
        pe[0, :, 0::2] = torch.sin(position * div)
        pe[0, :, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:, :x.size(1)]


class TokenClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.pos = PositionalEncoding(D)
        self.fc = nn.Linear(D, 24)
        self.head = nn.Linear(24, 5)

    def forward(self, ids):
        return self.head(torch.relu(self.fc(self.pos(self.emb(ids)))).mean(1))


class MeanImageNet(nn.Module):
    """A mean image (a buffer of 3 x 40 x 40 = 4800 values) subtracted from the input, then scaled by another
    buffer of the same size; a conv and a head."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("mean", torch.rand(1, 3, 40, 40, generator=g))
        self.register_buffer("scale", 0.5 + torch.rand(1, 3, 40, 40, generator=g))
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.conv((x - self.mean) * self.scale)).mean((2, 3)))


class CoordConv(nn.Module):
    """Two constant coordinate channels (2 x 48 x 48 = 4608 values) concatenated to the input."""

    def __init__(self):
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, 48), torch.linspace(-1, 1, 48), indexing="ij")
        self.register_buffer("coords", torch.stack([ys, xs]).unsqueeze(0))
        self.conv = nn.Conv2d(5, 6, 3, stride=2, padding=1)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        c = self.coords.expand(x.shape[0], -1, -1, -1)
        return self.head(torch.relu(self.conv(torch.cat([x, c], 1))).mean((2, 3)))


def perturbed(cls):
    return helpers.perturbed(cls, 0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_positional_encoding_buffer_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"posenc_{backend}", perturbed(TokenClassifier), (T,), "cross_entropy", batch=3, ids=V,
             options=BACKENDS[backend])


@pytest.mark.parametrize("backend", ["webgl", "rgba8"])
def test_mean_image_buffers_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"meanimage_{backend}", perturbed(MeanImageNet), (3, 40, 40), "cross_entropy", batch=3,
             options=BACKENDS[backend])


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_coordinate_channels_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"coordconv_{backend}", perturbed(CoordConv), (3, 48, 48), "mse", batch=3,
             options=BACKENDS[backend])


def test_positional_encoding_model_trains_as_pytorch_from_fresh_init(web, site):
    check_training(web, site, TokenClassifier, (T,), "adam", "cross_entropy", samples=6, batch_size=3, epochs=1,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, ids=V)


def test_mean_image_model_trains_as_pytorch_on_the_cpu_backend(web, site):
    check_training(web, site, MeanImageNet, (3, 40, 40), "sgd_momentum_wd", "cross_entropy", samples=6,
                   batch_size=3, epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options={"backend": "cpu"})


def test_a_big_constant_is_no_weight_and_survives_a_checkpoint(web, site):
    """The trainable set is named_parameters(); the report lists the constant apart, at its own size; the page's
    weights do not include it, setWeights refuses its name, and a checkpoint restored into a fresh model predicts
    what the saved one did."""
    torch.manual_seed(0)
    net = TokenClassifier()
    onnx_model = export_simplified(net, (T,), input_dtype="int64")
    result = compile_onnx(onnx_model, name="model", input_shape=(T,), max_batch=4, loss="cross_entropy")
    names = [n for n, _ in net.named_parameters()]
    assert sorted(result.report["trainable"]) == sorted(names)
    assert "constant:" not in str(result.report["trainable_set"])
    frozen = compile_onnx(onnx_model, name="model", input_shape=(T,), max_batch=4, loss="cross_entropy",
                          trainable="head.*").report
    assert frozen["trainable_set"]["frozen"] == ["emb.weight", "fc.bias", "fc.weight"]
    constants = result.report["constants"]
    assert [c["values"] for c in constants] == [T * D], constants
    url = site.add_files("bigconst_api", result.files) + "/model.js"
    ids = torch.randint(0, V, (2, T))
    got = run_model(web, url, """
        const x = Int32Array.from(args.ids);
        const w = await m.getWeights();
        let refused = null;
        try { await m.setWeights({ [args.constant]: new Float32Array(args.size) }); } catch (e) { refused = e.code; }
        const before = Array.from(await m.predict(x, 2));
        await m.fit(x, Int32Array.from([1, 3]), { epochs: 2, batchSize: 2, optimizer: { type: 'sgd', lr: 0.5 } });
        const trained = Array.from(await m.predict(x, 2));
        await m.save('bigconst');
        const fresh = await mod.createModel();
        await fresh.restore('bigconst');
        const restored = Array.from(await fresh.predict(x, 2));
        return { names: Object.keys(w), info: mod.modelInfo.weights.map((p) => p.name), refused, before, trained, restored };
    """, {"ids": ids.reshape(-1).tolist(), "constant": constants[0]["name"], "size": T * D})
    assert sorted(got["names"]) == sorted(names) and sorted(got["info"]) == sorted(names)
    assert got["refused"] == "unknown-weight"
    with torch.no_grad():
        ref = net(ids).numpy().reshape(-1)
    np.testing.assert_allclose(got["before"], ref, atol=2e-5, rtol=2e-4)
    assert not np.allclose(got["trained"], got["before"])
    np.testing.assert_array_equal(got["restored"], got["trained"])
