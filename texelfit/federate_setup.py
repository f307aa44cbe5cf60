"""What a federation starts from (`texelfit federate DIR`): the built bundle's weights and which of them train
(Bundle), the settings of its rounds (Settings), and Flower's strategy for them (make_strategy)."""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import re

import numpy as np

from texelfit.prep.errors import BuildError

STRATEGIES = ("fedavg", "fedadam", "fedprox")


@dataclasses.dataclass
class Bundle:
    """A built bundle folder: its name, every weight (decoded from the shipped blob, shaped) and which
    of them train (only those travel)."""
    folder: str
    name: str
    shapes: dict[str, tuple[int, ...]]
    initial: dict[str, np.ndarray]
    trainable: list[str]
    max_batch: int

    @staticmethod
    def load(folder: str) -> "Bundle":
        from texelfit.prep.quantize import decode

        try:
            with open(os.path.join(folder, "report.json"), encoding="utf-8") as f:
                name = json.load(f)["name"]
            with open(os.path.join(folder, name + ".js"), encoding="utf-8") as f:
                js = f.read()
        except (OSError, ValueError, KeyError) as e:
            raise BuildError(f"{folder} is not a bundle folder (texelfit build --out): {e}") from None

        def const(key):
            m = re.search(rf"^const {key} = (.*);$", js, re.M)
            if not m:
                raise BuildError(f"{folder}/{name}.js is not a texelfit bundle (no {key})")
            return json.loads(m.group(1))

        model, file = const("MODEL"), const("WEIGHTS_FILE")
        if file:
            with open(os.path.join(folder, file["name"]), "rb") as f:
                blob = f.read()
        else:
            blob = base64.b64decode(const("WEIGHTS"))
        try:
            tensors = decode(blob)
        except ValueError as e:
            raise BuildError(f"{folder}: {e}") from None
        shapes = {p["name"]: tuple(p["shape"]) for p in model["params"]}
        initial = {p["name"]: t.reshape(p["shape"]) for p, t in zip(model["params"], tensors)}
        trainable = [p["name"] for p in model["params"] if p["trainable"]]
        if not trainable:
            raise BuildError(f"{folder}/{name}.js was built with --trainable none: nothing can train")
        return Bundle(folder, name, shapes, initial, trainable, int(model["maxBatch"]))


@dataclasses.dataclass
class Settings:
    strategy: str = "fedavg"
    rounds: int = 3
    min_clients: int = 2
    fraction: float = 1.0
    local_epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.01
    shuffle: bool = False
    quantize_updates: str = "float32"  # or "int8"
    dp_clip: float | None = None
    dp_noise: float | None = None
    max_update_norm: float | None = None
    round_timeout: float = 120.0
    heartbeat: float = 2.0  # seconds between a browser's heartbeats; offline after Flower's patience (2) of them
    proximal_mu: float = 0.1
    seed: int | None = None

    def fit_config(self) -> dict:
        """What each client's round runs, sent in Flower's fit config (a ConfigRecord)."""
        return {"local-epochs": self.local_epochs, "batch-size": self.batch_size, "optimizer": self.optimizer,
                "lr": float(self.lr), "shuffle": self.shuffle, "quantize": self.quantize_updates}


def make_strategy(s: Settings):
    from flwr.serverapp import strategy as st

    common = dict(fraction_train=s.fraction, fraction_evaluate=0.0, min_train_nodes=s.min_clients,
                  min_available_nodes=s.min_clients, min_evaluate_nodes=0)
    if s.strategy == "fedavg":
        inner = st.FedAvg(**common)
    elif s.strategy == "fedadam":
        inner = st.FedAdam(**common)
    elif s.strategy == "fedprox":
        inner = st.FedProx(proximal_mu=s.proximal_mu, **common)
    else:
        raise BuildError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {s.strategy!r}")
    if s.dp_clip is None and s.dp_noise is None:
        return inner
    if s.dp_clip is None or s.dp_noise is None:
        raise BuildError("differential privacy needs both --dp-clip and --dp-noise")
    return st.DifferentialPrivacyClientSideFixedClipping(inner, noise_multiplier=s.dp_noise, clipping_norm=s.dp_clip,
                                                         num_sampled_clients=s.min_clients)
