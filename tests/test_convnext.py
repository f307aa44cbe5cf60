"""A ConvNeXt block as torchvision writes it (issue 32; torchvision itself cannot be installed here), a Linear on
channels-last pixels and transformers' ConvNeXt V2. The block: a 7x7
depthwise conv, a permute to channels-last, LayerNorm, Linear 4x, GELU, Linear, a permute back, and the layer
scale, an nn.Parameter of shape [C, 1, 1], multiplying the block's output before the residual add.

The layer scale multiplies a channels-last view of tokens: it trains, under its state_dict name, on the view
(materialised as the residual add needs it), instead of failing as a parameter that is not one per feature; frozen
(a constant of C values) it is counted at its own size, not at the C * H * W it would spread to over the tokens
(72 * 8 * 8 = 4608 here, past the 4096 values a kernel holds). Forward, every gradient and Adam trajectories
against PyTorch on WebGL2, rgba8 and the CPU backend.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import TRAJ_LOSS, TRAJ_W, check_op, check_training

SHAPE = (3, 32, 32)
BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}


class CNBlock(nn.Module):
    def __init__(self, dim, layer_scale=1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)

    def forward(self, x):
        r = self.dwconv(x).permute(0, 2, 3, 1)
        r = self.fc2(F.gelu(self.fc1(self.norm(r)))).permute(0, 3, 1, 2)
        return x + self.layer_scale * r


class TinyConvNeXt(nn.Module):
    def __init__(self, dim=72, layer_scale=1e-6):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, stride=4)
        self.block = CNBlock(dim, layer_scale)
        self.head = nn.Linear(dim, 5)

    def forward(self, x):
        return self.head(self.block(self.stem(x)).mean((2, 3)))


def convnext_perturbed():
    """Every parameter moved off its init (a layer scale of 1e-6 would hide the block's gradients)."""
    m = TinyConvNeXt(layer_scale=0.5)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def convnext_fresh():
    return TinyConvNeXt(layer_scale=0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_convnext_block_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"convnext_{backend}", convnext_perturbed, SHAPE, "cross_entropy", batch=3,
             options=BACKENDS[backend])


def test_convnext_block_trains_its_layer_scale_as_pytorch(web, site):
    check_training(web, site, convnext_fresh, SHAPE, "adam", "cross_entropy", samples=6, batch_size=3, epochs=1,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


def test_a_frozen_layer_scale_is_a_constant_of_its_own_size(web, site):
    check_training(web, site, convnext_fresh, SHAPE, "sgd_momentum_wd", "cross_entropy", samples=6, batch_size=3,
                   epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, frozen=("block.layer_scale",))


class ChannelsLastLinear(nn.Module):
    """nn.Linear on an image-shaped activation [N, H, W, C] (an NHWC input here, a GRN's output in ConvNeXt V2):
    a MatMul over the last axis, every pixel a token."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x * 2.0 + 1.0))).mean((1, 2))


def channels_last_linear():
    return ChannelsLastLinear()


def hf_convnext_v2():
    """transformers' ConvNextV2ForImageClassification from a small config (its GRN gives pwconv2 an [N, H, W, C]
    activation of its own, not a view), perturbed."""
    import transformers as tf

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = tf.ConvNextV2ForImageClassification(tf.ConvNextV2Config(
                num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3, image_size=16))

        def forward(self, x):
            return self.m(pixel_values=x).logits

    m = Logits()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_a_linear_on_channels_last_pixels(web, site, backend):
    check_op(web, site, f"nhwc_linear_{backend}", channels_last_linear, (5, 7, 6), "cross_entropy",
             options=BACKENDS[backend])


@pytest.mark.parametrize("backend", ["webgl", "rgba8"])
def test_hf_convnext_v2_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"hf_convnextv2_{backend}", hf_convnext_v2, (3, 16, 16), "cross_entropy", batch=3,
             options=BACKENDS[backend])
