"""The bundled example models and data: scikit-learn's 8x8 digits (shipped with it, no download).

`digits_cnn` is the default model: `texelfit train` trains it, and a build of
`texelfit.examples:digits_cnn` knows its input shape and evaluates on the digits
validation split (the last 20% of `digits()`, the split the demo page uses too).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

DEFAULT_SOURCE = "texelfit.examples:digits_cnn"
VAL_FRACTION = 0.2


def digits_mlp() -> nn.Module:
    """64 -> 32 -> 10 MLP for 8x8 digits, with a fixed initialisation."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class DigitsCNN(nn.Module):
    """1x8x8 -> conv 16 -> conv 32 -> max-pool 2 -> conv 32 -> flatten (32*4*4) -> linear 10.

    About 19k parameters; 3x3 convolutions with padding 1 keep the size until the pool."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.conv3(x))
        return self.fc(torch.flatten(x, 1))


def digits_cnn() -> nn.Module:
    """The default model, with a fixed initialisation (train it with `texelfit train`)."""
    torch.manual_seed(0)
    return DigitsCNN()


# Sources whose input shape and evaluation data are known: spec -> per-sample input shape.
KNOWN_SOURCES = {
    DEFAULT_SOURCE: (1, 8, 8),
    "texelfit.examples:digits_mlp": (64,),
}


def digits() -> tuple[np.ndarray, np.ndarray]:
    """Pixel values 0..16 as uint8 of shape (1797, 64), labels as int64 of shape (1797,).

    Shuffled once with a fixed seed: the set is ordered by writer, so a split of the raw
    order would hold out writers never seen in training."""
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    return d.data[order].astype(np.uint8), d.target[order].astype(np.int64)


def digits_split(input_shape=(1, 8, 8)) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x_train, y_train), (x_val, y_val)): pixels scaled to [0, 1] as float32 of shape
    (N,) + input_shape; the first 80% of `digits()` train, the last 20% validate."""
    x, y = digits()
    x = (x.astype(np.float32) / 16.0).reshape((-1,) + tuple(input_shape))
    split = int(len(y) * (1 - VAL_FRACTION))
    return (x[:split], y[:split]), (x[split:], y[split:])
