"""The command line: `texelfit build ...` and `texelfit demo`.

Every error exits non-zero with a one-line reason.
"""
from __future__ import annotations

import argparse
import sys

from texelfit.prep.load import BuildError


def _shape(text: str):
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (use e.g. 784 or 1,28,28)") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (dims must be positive)")
    return dims


def _ratio(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prune must be a number in [0, 1), got {text!r}") from None
    if not 0 <= r < 1:
        raise argparse.ArgumentTypeError(f"--prune must be in [0, 1), got {text}")
    return r


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"texelfit: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="texelfit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    b = sub.add_parser("build", help="build a model into one JavaScript bundle")
    b.add_argument("source", help="an .onnx file, a TorchScript file, or package.module:Attr (with --weights)")
    b.add_argument("--out", required=True, help="output folder")
    b.add_argument("--name", help="bundle name (default: from the source)")
    b.add_argument("--weights", help="state_dict for a package.module:Attr source (loaded with weights_only=True)")
    b.add_argument("--input-shape", type=_shape, help="per-sample input shape without batch, e.g. 784 or 1,28,28")
    b.add_argument("--max-batch", type=int, default=64, help="largest batch predict and fit accept (default 64)")
    b.add_argument("--loss", choices=["cross_entropy", "mse"], default="cross_entropy")
    b.add_argument("--quantize", choices=["fp16", "int8", "none"], default="none")
    b.add_argument("--prune", type=_ratio, default=0.0)
    b.add_argument("--trust-pickle", action="store_true",
                   help="allow a fully pickled model file (unpickling runs code from the file)")

    d = sub.add_parser("demo", help="build the example model into dist/demo and serve a page that trains it")
    d.add_argument("--out", default="dist/demo")
    d.add_argument("--port", type=int, default=8737)
    d.add_argument("--no-serve", action="store_true", help="only build")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "build":
            from texelfit.build import build

            result = build(args.source, args.out, name=args.name, weights=args.weights,
                           input_shape=args.input_shape, max_batch=args.max_batch, loss=args.loss,
                           quantize=args.quantize, prune=args.prune, trust_pickle=args.trust_pickle)
            rep = result.report
            print(f"texelfit: built {args.out}/{rep['name']}.js: {rep['parameters']} parameters, "
                  f"{len(rep['layers'])} layers, {rep['kernels']} kernels, "
                  f"{rep['files'][rep['name'] + '.js']} bytes, {rep['texture_bytes']} bytes of textures")
        elif args.command == "demo":
            from texelfit.demo import run_demo

            run_demo(args.out, port=args.port, serve=not args.no_serve)
    except BuildError as e:
        print(f"texelfit: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
