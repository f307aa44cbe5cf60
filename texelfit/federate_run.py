"""`texelfit federate DIR`'s command: the federation and its bridge, the progress it prints, the
evaluation of the global model (--eval-data) and the model it writes at the end (--out)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from texelfit.federate import Bundle, Federation, Settings
from texelfit.prep.errors import BuildError

BAR = 24


def architecture(bundle: Bundle, source: str | None):
    """The bundle's graph (for --eval-data and an .onnx --out): from SOURCE, or DIR/NAME.onnx."""
    from texelfit.prep.fold import fold_batchnorm
    from texelfit.prep.graph import to_ir
    from texelfit.prep.load import load_onnx

    path = source or os.path.join(bundle.folder, bundle.name + ".onnx")
    if not os.path.exists(path):
        raise BuildError(f"no architecture for --eval-data or an .onnx --out: {path} is missing; give --source "
                         "(the ONNX file the bundle was built from, or the NAME.onnx written beside it)")
    graph = fold_batchnorm(to_ir(load_onnx(path), None, None))
    unknown = sorted(set(bundle.shapes) - set(graph.params))
    if unknown:
        raise BuildError(f"{path} is not the bundle's architecture: it has no {', '.join(unknown)}")
    return graph


def with_weights(graph, weights: dict[str, np.ndarray]):
    from texelfit.importer import apply_weights

    return apply_weights(graph, {k: np.asarray(v, np.float32) for k, v in weights.items()}, "the global model",
                         partial=True)


def evaluator(bundle: Bundle, graph, path: str):
    """weights (trainable ones) -> {loss, accuracy} of the global model on the .npz at `path`."""
    import torch
    import torch.nn.functional as F

    from texelfit.data import check_data, load_data
    from texelfit.prep.torch_ir import IRModule, one_thread

    data = check_data(load_data(path, "--eval-data"), graph, "cross_entropy", "--eval-data")
    x = torch.as_tensor(np.asarray(data.x, np.float32).reshape((len(data.x),) + tuple(graph.input_shape)))
    y = np.asarray(data.y)
    if not np.issubdtype(y.dtype, np.integer):
        raise BuildError("--eval-data: y must hold integer class labels (the global model's accuracy)")

    def evaluate(weights):
        module = IRModule(with_weights(graph, {**bundle.initial, **weights})).eval()
        with torch.no_grad(), one_thread():
            out = module(x)
        target = torch.as_tensor(y, dtype=torch.long)
        accuracy = float((out.argmax(1) == target).float().mean())
        return {"loss": float(F.cross_entropy(out, target)), "accuracy": accuracy}

    return evaluate


def write_model(fed: Federation, graph, out: str) -> None:
    weights = fed.full_weights()
    if out.endswith(".pt"):
        import torch

        torch.save({n: torch.from_numpy(np.array(w, np.float32)) for n, w in weights.items()}, out)
    else:
        from texelfit.prep.torch_ir import export_onnx

        with open(out, "wb") as f:
            f.write(export_onnx(with_weights(graph, weights)).SerializeToString())


def progress_line(entry: dict, rounds: int, started: float) -> str:
    r = entry["round"]
    done = BAR * r // rounds
    bar = "#" * done + "-" * (BAR - done)
    who = ", ".join(f"#{c}" for c in sorted(entry["clients"])) or "none"
    m = entry["metrics"]
    score = f"; global loss {m['loss']:.4f}, accuracy {100 * m['accuracy']:.2f}%" if m else ""
    if r == 0:
        return f"round 0/{rounds} [{bar}] the initial model{score}"
    return f"round {r}/{rounds} [{bar}] {time.monotonic() - started:.1f}s; clients {who}{score}"


def run(args) -> None:
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise BuildError("texelfit federate needs Flower: pip install 'texelfit[federate]' (flwr==1.42.0)") from None
    from texelfit.bridge import Bridge

    if args.out and not (args.out.endswith(".pt") or args.out.endswith(".onnx")):
        raise BuildError(f"--out {args.out!r} must end in .pt (a state_dict) or .onnx")
    bundle = Bundle.load(args.dir)
    if args.batch_size > bundle.max_batch:
        raise BuildError(f"--batch-size {args.batch_size} is more than the bundle's maxBatch, {bundle.max_batch} "
                         "(build it with a larger --max-batch)")
    settings = Settings(strategy=args.strategy, rounds=args.rounds, min_clients=args.min_clients,
                        fraction=args.fraction, local_epochs=args.local_epochs, batch_size=args.batch_size,
                        optimizer=args.optimizer, lr=args.lr, shuffle=args.shuffle,
                        quantize_updates=args.quantize_updates, dp_clip=args.dp_clip, dp_noise=args.dp_noise,
                        max_update_norm=args.max_update_norm, round_timeout=args.round_timeout,
                        proximal_mu=args.proximal_mu, seed=args.seed)
    need_graph = args.eval_data or (args.out and args.out.endswith(".onnx"))
    graph = architecture(bundle, args.source) if need_graph else None
    evaluate = evaluator(bundle, graph, args.eval_data) if args.eval_data else None
    started = time.monotonic()
    fed = Federation(bundle, settings, evaluate=evaluate,
                     report=lambda e: print(progress_line(e, settings.rounds, started), flush=True))
    bridge = Bridge(fed, args.host, args.port).start()
    travel = sum(int(np.prod(bundle.shapes[n])) for n in fed.names)
    print(f"texelfit: federate: {bundle.name} on {bridge.url}/ (the page for people: {bridge.url}/federation.html); "
          f"{settings.strategy}, {settings.rounds} rounds of at least {settings.min_clients} clients; "
          f"{len(fed.names)} trainable tensors travel ({travel} values: {4 * travel} bytes float32)", flush=True)
    if settings.dp_clip is not None:
        print(f"texelfit: federate: differential privacy: updates clipped to L2 norm {settings.dp_clip:g} (Flower's "
              f"fixedclipping_mod), Gaussian noise of std {settings.dp_noise:g} * {settings.dp_clip:g} / "
              f"{settings.min_clients} on the aggregate (DifferentialPrivacyClientSideFixedClipping)", flush=True)
    fed.start()
    try:
        fed.wait()
        end = time.monotonic() + 3 * settings.heartbeat  # the pages waiting for a task learn that it is over
        while fed.sessions and time.monotonic() < end:
            time.sleep(0.1)
    finally:
        bridge.close()
    if args.out:
        write_model(fed, graph, args.out)
        print(f"texelfit: federate: wrote the global model to {args.out}", flush=True)


def check_host(host: str) -> None:
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"texelfit: federate: warning: listening on {host}: anyone who reaches it can join; put it behind TLS "
              "(README: Federated learning)", file=sys.stderr)
