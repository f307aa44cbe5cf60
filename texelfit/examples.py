"""The bundled example model and data: scikit-learn's 8x8 digits (shipped with it, no download)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


def digits_mlp() -> nn.Module:
    """64 -> 32 -> 10 MLP for 8x8 digits, with a fixed initialisation."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def digits() -> tuple[np.ndarray, np.ndarray]:
    """Pixel values 0..16 as uint8 of shape (1797, 64), labels as int64 of shape (1797,).

    Shuffled once with a fixed seed: the set is ordered by writer, so a split of the raw
    order would hold out writers never seen in training."""
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    return d.data[order].astype(np.uint8), d.target[order].astype(np.int64)
