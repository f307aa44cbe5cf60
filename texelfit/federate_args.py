"""The options of `texelfit federate DIR` (texelfit/federate_run.py runs it)."""
from __future__ import annotations

import argparse


def add_federate_parser(sub, _count, _positive_float) -> None:
    """`texelfit federate`'s options (cli.py gives its number parsers)."""
    f = sub.add_parser("federate", help="federated learning of a built bundle between browsers, through Flower")
    f.add_argument("dir", help="a built bundle folder (texelfit build --out DIR); its files are served at /")
    f.add_argument("--strategy", choices=["fedavg", "fedadam", "fedprox"], default="fedavg",
                   help="Flower's strategy that aggregates (default fedavg)")
    f.add_argument("--rounds", type=_count(1), default=3, help="default 3")
    f.add_argument("--min-clients", type=_count(1), default=2, metavar="K",
                   help="browsers a round waits for, and trains with at least (default 2)")
    f.add_argument("--fraction", type=_fraction, default=1.0, metavar="F",
                   help="the fraction of connected browsers sampled each round (at least --min-clients; default 1)")
    f.add_argument("--local-epochs", type=_count(1), default=1, metavar="E", help="each client's epochs a round")
    f.add_argument("--batch-size", type=_count(1), default=32, metavar="B", help="default 32")
    f.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                   help="each client's optimizer, fresh every round (default sgd)")
    f.add_argument("--lr", type=_positive_float, default=0.01, help="default 0.01")
    f.add_argument("--shuffle", action="store_true", help="shuffle each client's samples (default: in order)")
    f.add_argument("--quantize-updates", choices=["float32", "int8"], default="float32",
                   help="what a client's weight delta travels as (int8: a scale per tensor)")
    f.add_argument("--dp-clip", type=_positive_float, metavar="C",
                   help="clip each client's update to L2 norm C (Flower's client-side fixed clipping); with --dp-noise")
    f.add_argument("--dp-noise", type=_non_negative, metavar="Z",
                   help="Gaussian noise of std Z * C / K on the aggregate (Flower's "
                        "DifferentialPrivacyClientSideFixedClipping); with --dp-clip")
    f.add_argument("--max-update-norm", type=_positive_float, metavar="BOUND",
                   help="refuse an update whose L2 norm exceeds BOUND")
    f.add_argument("--proximal-mu", type=_non_negative, default=0.1, metavar="MU", help="fedprox's mu (default 0.1)")
    f.add_argument("--round-timeout", type=_positive_float, default=120.0, metavar="SECONDS",
                   help="how long a round waits for its clients' updates (default 120)")
    f.add_argument("--eval-data", metavar="FILE.npz",
                   help="arrays x and y (class labels): the global model's loss and accuracy each round")
    f.add_argument("--source", metavar="MODEL.onnx",
                   help="the architecture, for --eval-data and an .onnx --out (default DIR/NAME.onnx)")
    f.add_argument("--out", metavar="PATH", help="at the end, the global model: PATH.pt (a state_dict) or PATH.onnx")
    f.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    f.add_argument("--port", type=int, default=8739, help="default 8739; 0 picks a free one")
    f.add_argument("--seed", type=int, help="seeds Flower's sampling of clients and its DP noise")


def float_in(ok, what: str):
    """An argparse type: a float for which ok(v) holds, else "must be {what}, got '...'" (NaN for text that is
    not a number, which no range holds)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return v
    return parse


_fraction = float_in(lambda v: 0 < v <= 1, "a number in (0, 1]")
_non_negative = float_in(lambda v: 0 <= v < float("inf"), "a number >= 0")
