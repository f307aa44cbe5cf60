"""Windowed attention (issue 32): the batch folded with windows, [N * windows, tokens, features], followed through
reshapes, transposes and splits as attention's heads are (prep/batch_axis.py), a relative-position table read at
constant indices that the exporter folded (prep/gathered.py: read again, so that it trains), and added to every
window's scores (onnx_import/tables.py). Forward, every gradient and an optimizer trajectory against PyTorch."""
from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import helpers
from helpers import TRAJ_LOSS, TRAJ_W, check_op, check_training

sys.path.insert(0, helpers.TESTS + "/../scripts")
from survey import Swin, SwinBlock  # noqa: E402  (the survey's Swin, written small: scripts/survey.py)

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}


def swin():
    return Swin(d=16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_swin_window_attention_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"swin_{backend}", helpers.perturbed(swin, 0.1), (3, 32, 32), "cross_entropy", batch=2,
             options=BACKENDS[backend])


def test_swin_trains_as_pytorch_from_a_fresh_init(web, site):
    """Adam from the module's own init: the relative-position tables train (the exporter folded their reads)."""
    check_training(web, site, swin, (3, 32, 32), "adam", "cross_entropy", samples=4, batch_size=2, epochs=1,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


class HFSwin(nn.Module):
    """transformers' SwinForImageClassification from a small config: a stage of two blocks on 8 x 8 patches, the
    second with shifted windows (a cyclic shift and the mask that keeps windows apart), then patch merging and a
    stage of one block."""

    def __init__(self):
        super().__init__()
        import transformers as tf

        self.m = tf.SwinForImageClassification(tf.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 2], window_size=4, num_labels=3,
            attn_implementation="eager"))

    def forward(self, x):
        return self.m(pixel_values=x).logits


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_hf_swin_with_shifted_windows_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"hf_swin_{backend}", helpers.perturbed(HFSwin, 0.1), (3, 32, 32), "cross_entropy", batch=2,
             options=BACKENDS[backend])


class HFMobileViT(nn.Module):
    """transformers' MobileViTForImageClassification from a small config: its transformer blocks unfold the feature
    map into patches folded into the batch ([N * 4, patches, d]) and fold them back. Its batch-norms, which fold into
    the convs (tests/test_cnn_ops.py), are taken out so that every parameter is PyTorch's own; no dropout."""

    def __init__(self):
        super().__init__()
        import transformers as tf

        self.m = tf.MobileViTForImageClassification(tf.MobileViTConfig(
            image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2,
            num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
            attn_implementation="eager"))
        for name, mod in list(self.m.named_modules()):
            if isinstance(mod, nn.BatchNorm2d):
                parent, _, child = name.rpartition(".")
                setattr(self.m.get_submodule(parent), child, nn.Identity())

    def forward(self, x):
        return self.m(pixel_values=x).logits


def test_hf_mobilevit_forward_and_every_gradient(web, site):
    check_op(web, site, "hf_mobilevit", helpers.perturbed(HFMobileViT, 0.05), (3, 64, 64), "cross_entropy", batch=2)
