"""Training in PyTorch: the default model on the digits (`texelfit train`) and recovery fine-tuning
of a pruned graph (`--finetune-epochs`).

Both use one loop (`fit`): Adam, mean cross-entropy (or mse), shuffled mini-batches drawn from a
seeded generator, and a text progress bar on stderr. Torch is seeded and runs on one CPU thread,
so the same command gives the same checkpoint and numbers, whatever the core count.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from texelfit.prep.errors import BuildError

DEFAULT_CHECKPOINT = os.path.join("dist", "digits_cnn.pt")
DEFAULTS = dict(epochs=20, lr=3e-3, batch_size=32, seed=0)


class Progress:
    """`label [#########...........] 45/90 loss 0.1234` rewritten in place on stderr."""

    def __init__(self, label: str, total: int, *, stream=None, width: int = 28):
        self.label, self.total, self.width = label, max(total, 1), width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.last = -1.0

    def update(self, done: int, note: str = "") -> None:
        now = time.monotonic()
        if done < self.total and now - self.last < 0.1:
            return
        if not self.tty and done < self.total and now - self.last < 5:  # a log file: a line now and then
            return
        self.last = now
        filled = self.width * done // self.total
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} {note}"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def fit(module, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch_size: int = 32,
        loss: str = "cross_entropy", seed: int = 0, label: str = "training", progress: bool = True) -> list[float]:
    """Train `module` in place (on one CPU thread: see prep.torch_ir.one_thread); returns the mean loss
    of each epoch."""
    from texelfit.prep.torch_ir import one_thread

    with one_thread():
        return _fit(module, x, y, epochs=epochs, lr=lr, batch_size=batch_size, loss=loss, seed=seed, label=label,
                    progress=progress)


def _fit(module, x, y, *, epochs, lr, batch_size, loss, seed, label, progress):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    xs = torch.as_tensor(np.asarray(x, dtype=np.float32))
    ys = torch.as_tensor(np.asarray(y)) if loss == "cross_entropy" else torch.as_tensor(np.asarray(y, np.float32))
    if loss == "cross_entropy":
        ys = ys.long()
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    steps = -(-len(xs) // batch_size)
    bar = Progress(label, epochs * steps) if progress else None
    history = []
    module.train()
    for epoch in range(epochs):
        order = torch.as_tensor(rng.permutation(len(xs)))
        total = 0.0
        for s in range(steps):
            idx = order[s * batch_size:(s + 1) * batch_size]
            opt.zero_grad()
            out = module(xs[idx])
            value = F.cross_entropy(out, ys[idx]) if loss == "cross_entropy" else \
                F.mse_loss(out, ys[idx].reshape(out.shape))
            value.backward()
            opt.step()
            total += value.item() * len(idx)
            if bar:
                bar.update(epoch * steps + s + 1, f"epoch {epoch + 1}/{epochs} loss {total / min(len(xs), (s + 1) * batch_size):.4f}")
        history.append(total / len(xs))
    module.eval()
    return history


def accuracy(module, x: np.ndarray, y: np.ndarray) -> float:
    import torch

    from texelfit.prep.torch_ir import one_thread

    module.eval()
    with torch.no_grad(), one_thread():
        out = module(torch.as_tensor(np.asarray(x, dtype=np.float32)))
    return float((out.argmax(1).numpy() == np.asarray(y)).mean())


def train_default(*, epochs: int = DEFAULTS["epochs"], lr: float = DEFAULTS["lr"],
                  batch_size: int = DEFAULTS["batch_size"], seed: int = DEFAULTS["seed"], progress: bool = True):
    """The default CNN trained on the digits' training split; returns (module, validation accuracy)."""
    from texelfit.examples import digits_cnn, digits_split

    check_training_options(epochs, lr, batch_size)
    (xt, yt), (xv, yv) = digits_split()
    module = digits_cnn()
    fit(module, xt, yt, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, label="train", progress=progress)
    return module, accuracy(module, xv, yv)


def check_training_options(epochs, lr, batch_size=32):
    if not isinstance(epochs, int) or epochs < 1:
        raise BuildError(f"--epochs must be an integer >= 1, got {epochs!r}")
    if not (isinstance(lr, (int, float)) and np.isfinite(lr) and lr > 0):
        raise BuildError(f"--lr must be a positive number, got {lr!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise BuildError(f"--batch-size must be a positive integer, got {batch_size!r}")


def finetune_graph(graph, x, y, *, epochs: int, lr: float, batch_size: int = 32, loss: str = "cross_entropy",
                   seed: int = 0, progress: bool = True):
    """Recovery fine-tuning: train the graph's weights in PyTorch (prep.torch_ir), return the graph with them."""
    from texelfit.prep.torch_ir import IRModule, write_back

    module = IRModule(graph)
    fit(module, x, y, epochs=epochs, lr=lr, batch_size=batch_size, loss=loss, seed=seed, label="fine-tune",
        progress=progress)
    return write_back(graph, module)


def save_checkpoint(module, path: str) -> None:
    import torch

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(module.state_dict(), path)
