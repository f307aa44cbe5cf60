"""The command line: `texelfit build`, `train`, `prune-sweep`, `import-weights`, `federate` and `demo`.

Every error exits non-zero with a one-line reason.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from texelfit.federate_args import add_federate_parser, float_in
from texelfit.prep.errors import BuildError
from texelfit.prep.load import INPUT_DTYPES

DEFAULT_SOURCE = "texelfit.examples:digits_cnn"  # texelfit.examples.DEFAULT_SOURCE (not imported: torch is slow)
DEFAULT_CHECKPOINT = os.path.join("dist", "digits_cnn.pt")  # texelfit.train.DEFAULT_CHECKPOINT
SWEEP_RATIOS = "0,0.25,0.5,0.625,0.75,0.875"


def _shape(text: str):
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (use e.g. 784 or 1,28,28)") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (dims must be positive)")
    return dims


def _shapes(text: str):
    """One --input-shape value: a shape, or several separated by ';' (one per input of --inputs)."""
    return [_shape(part) for part in text.split(";")]


def _dtypes(text: str):
    """--input-dtype: one element type (every input), or one per input, comma-separated."""
    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if p not in INPUT_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"not an input dtype: {', '.join(map(repr, bad))} (use {', '.join(INPUT_DTYPES)})")
    return parts[0] if len(parts) == 1 else parts


def _input_shape(args):
    """--input-shape as build takes it: None, one shape (a single input), or with --inputs a list of one
    shape per input (--input-shape given once per input, or once with the shapes separated by ';')."""
    if not args.input_shape:
        return None
    shapes = [s for group in args.input_shape for s in group]
    if getattr(args, "inputs", None):
        return shapes
    if len(shapes) != 1:
        raise BuildError(f"{len(shapes)} input shapes (--input-shape) for one input: name the inputs with --inputs")
    return shapes[0]


def _ratio(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prune must be a number in [0, 1), got {text!r}") from None
    if not 0 <= r < 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"--prune must be in [0, 1), got {text}")
    return r


def _ratios(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            r = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--ratios must be numbers in [0, 1) separated by commas, "
                                             f"got {part!r}") from None
        if not 0 <= r < 1:
            raise argparse.ArgumentTypeError(f"--ratios must be in [0, 1), got {part}")
        out.append(r)
    return out


_positive_float = float_in(lambda v: 0 < v < float("inf"), "a positive number")


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = minimum - 1
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return v
    return parse


def _bytes(text: str) -> int:
    """--memory-budget: bytes, a whole number, or with a unit: 512MB, 1.5GB, 2GiB."""
    units = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30}
    t = text.strip().upper()
    number = t.rstrip("KMGIB")
    try:
        v = float(number) * units[t[len(number):]]
    except (ValueError, KeyError):
        v = float("nan")
    if not 1 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of bytes (e.g. 1000000000, 512MB, 2GB), got {text!r}")
    return int(v)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"texelfit: error: {message}\n")


def _model_options(b, *, sweep=False):
    b.add_argument("--weights", help="state_dict for a package.module:Attr source (loaded with weights_only=True)")
    b.add_argument("--input-shape", type=_shapes, action="append",
                   help="per-sample input shape without batch, e.g. 784 or 1,28,28; with --inputs one per input, in "
                        "order: --input-shape 128 --input-shape 128 (or '128;128')")
    b.add_argument("--inputs", metavar="NAMES",
                   help="a PyTorch source with several inputs: their names, comma-separated, in the order its forward "
                        "takes them (e.g. input_ids,attention_mask); predict and fit then take an object keyed by "
                        "these names. An ONNX file declares its inputs")
    b.add_argument("--input-dtype", type=_dtypes, default=None,
                   help="element type of the input: float32, or int64 / int32 token ids (an nn.Embedding's input); "
                        "with --inputs one for all of them or one per input, comma-separated (int64,int64); "
                        "default: float32 for PyTorch sources, what an ONNX file declares")
    b.add_argument("--max-batch", type=_count(1), default=None,
                   help="largest batch predict and fit accept (default 64, or the largest batch below it whose planned "
                        "memory fits --memory-budget)")
    b.add_argument("--memory-budget", type=_bytes, default=None, metavar="BYTES",
                   help="the memory (textures, readbacks, snapshots, uploads) that the default --max-batch must fit: "
                        "bytes, or 512MB, 2GB (default 1GB)")
    b.add_argument("--loss", choices=["cross_entropy", "mse"], default="cross_entropy")
    b.add_argument("--quantize", choices=["fp16", "int8", "none"], default="none",
                   help="how the weights are shipped: none = float32 (default: the bundle is your model, exactly), "
                        "fp16 = half (2x smaller), int8 = per-output-channel int8 (about 4x smaller)")
    if not sweep:
        b.add_argument("--prune", type=_ratio, default=0.0, metavar="RATIO",
                       help="remove this fraction of the channels of every conv and hidden dense layer, lowest "
                            "L1 norm first (0 <= RATIO < 1; default 0: no pruning)")
    b.add_argument("--no-round-channels", dest="round_channels", action="store_false",
                   help="keep exactly ceil((1 - RATIO) * C) channels instead of rounding up to a multiple of 4 "
                        "(a texel holds 4 channels, so 4k+1 cost as much as 4k+4)")
    b.add_argument("--finetune-epochs", type=_count(0), default=0, metavar="N",
                   help="recovery fine-tuning in PyTorch after pruning (default 0), on the digits for the example "
                        "models or on --finetune-data")
    b.add_argument("--finetune-data", metavar="FILE.npz", help="fine-tuning data: arrays x and y")
    b.add_argument("--finetune-lr", type=_positive_float, default=1e-3, metavar="LR",
                   help="Adam learning rate of the fine-tuning (default 1e-3)")
    b.add_argument("--eval-data", metavar="FILE.npz",
                   help="evaluation data (arrays x and y): the report gives accuracy before and after pruning and "
                        "quantisation (the example models evaluate on the digits validation split by default)")
    b.add_argument("--trust-pickle", action="store_true",
                   help="allow a fully pickled model file (unpickling runs code from the file)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="texelfit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    b = sub.add_parser("build", help="build a model into one JavaScript bundle")
    b.add_argument("source", help="an .onnx file, a TorchScript file, or package.module:Attr (with --weights); "
                                  f"{DEFAULT_SOURCE} is the default model (see `texelfit train`)")
    b.add_argument("--out", required=True, help="output folder")
    b.add_argument("--name", help="bundle name (default: from the source)")
    b.add_argument("--trainable", default="*", metavar="PATTERNS",
                   help="the parameters that train: comma-separated fnmatch patterns over their names (state_dict "
                        "names), e.g. 'classifier.*,features.18.*'; the others are frozen (no gradient, no optimizer "
                        "state, no passes). Default '*' (all); 'none' builds an inference-only bundle")
    b.add_argument("--input-normalize", default="none", metavar="MODE",
                   help="an image input (1 or 3 channels, C,H,W): what m.fromImages(sources) gives the model, recorded in "
                        "the bundle: imagenet (RGB in [0, 1], then the ImageNet mean/std), unit (RGB in [0, 1]), "
                        "MEAN1,MEAN2,MEAN3:STD1,STD2,STD3 (on [0, 1] values; MEAN:STD for 1 channel), or none "
                        "(default: no image input, no fromImages)")
    b.add_argument("--tokenizer", metavar="PATH",
                   help="a text model's WordPiece vocabulary: a vocab.txt, or a folder holding vocab.txt and "
                        "tokenizer_config.json (do_lower_case, strip_accents, tokenize_chinese_chars; BERT's defaults "
                        "without it): m.fromText(strings) then gives the token ids and attention mask of strings "
                        "exactly as Hugging Face's tokenizer, padded and truncated to the input's length T "
                        "(--input-shape T)")
    b.add_argument("--webgpu", action="store_true",
                   help="the kernels as WGSL too: createModel({ backend: 'webgpu' }) trains on WebGPU (float32)")
    w = b.add_mutually_exclusive_group()
    w.add_argument("--weights-file", dest="weights_file", action="store_true", default=None,
                   help="ship the weights in NAME.weights.bin beside NAME.js, which fetches it (default when they "
                        "exceed 4 MiB)")
    w.add_argument("--embed-weights", dest="weights_file", action="store_false",
                   help="embed the weights in NAME.js (default up to 4 MiB)")
    _model_options(b)

    t = sub.add_parser("train", help="train the default model (a small CNN) on scikit-learn's 8x8 digits")
    t.add_argument("--epochs", type=_count(1), default=20, help="default 20")
    t.add_argument("--lr", type=_positive_float, default=3e-3, help="Adam learning rate (default 3e-3)")
    t.add_argument("--batch-size", type=_count(1), default=32, help="default 32")
    t.add_argument("--seed", type=int, default=0, help="default 0")
    t.add_argument("--out", default=DEFAULT_CHECKPOINT, help=f"checkpoint (state_dict) path (default {DEFAULT_CHECKPOINT})")

    s = sub.add_parser("prune-sweep", help="accuracy and bundle size against the pruning ratio, as a plot (PNG)")
    s.add_argument("source", nargs="?", default=DEFAULT_SOURCE,
                   help=f"as for build (default {DEFAULT_SOURCE} with --weights {DEFAULT_CHECKPOINT})")
    s.add_argument("--ratios", type=_ratios, default=_ratios(SWEEP_RATIOS), help=f"default {SWEEP_RATIOS}")
    s.add_argument("--out", default=os.path.join("dist", "prune_sweep.png"),
                   help="the plot; the numbers go beside it as .json (default dist/prune_sweep.png)")
    _model_options(s, sweep=True)

    i = sub.add_parser("import-weights", help="weights saved from the browser back into PyTorch (.pt) or ONNX")
    i.add_argument("file", help="JSON of getWeights() (the demo's Download weights)")
    i.add_argument("--source", required=True,
                   help="the architecture: as for build, or the NAME.onnx written beside a pruned bundle")
    i.add_argument("--out", required=True, help="PATH.pt (a state_dict) or PATH.onnx")
    i.add_argument("--weights", help="state_dict for a package.module:Attr source")
    i.add_argument("--input-shape", type=_shapes, action="append",
                   help="per-sample input shape, for PyTorch sources (with --inputs one per input)")
    i.add_argument("--inputs", metavar="NAMES", help="the input names of a PyTorch source with several inputs")
    i.add_argument("--input-dtype", type=_dtypes, default=None,
                   help="element type of the input (int64 / int32: token ids), as given to build")
    i.add_argument("--trust-pickle", action="store_true")
    i.add_argument("--partial", action="store_true",
                   help="FILE may hold only some tensors (e.g. the photo demo's trained head); the others come from SOURCE")

    add_federate_parser(sub, _count, _positive_float)

    d = sub.add_parser("demo", help="build the demo page and serve it on 127.0.0.1: EfficientNet-Lite0 that you teach "
                                    "your own pictures (default), or --example digits")
    d.add_argument("--example", choices=["photos", "digits"], default="photos",
                   help="photos (default): EfficientNet-Lite0 with a new head that trains on your pictures and webcam; "
                        "digits: the 8x8-digits CNN, trained, pruned and quantised, fine-tuned on your handwriting")
    d.add_argument("--out", help="default dist/demo (photos) or dist/demo-digits (digits)")
    d.add_argument("--port", type=int, default=8737)
    d.add_argument("--no-serve", action="store_true", help="only build")
    return p


def _options(args) -> dict:
    budget = {} if args.memory_budget is None else {"memory_budget": args.memory_budget}
    return dict(**budget, weights=args.weights, input_shape=_input_shape(args), inputs=args.inputs,
                input_dtype=args.input_dtype,
                max_batch=args.max_batch, loss=args.loss,
                quantize=args.quantize, round_channels=args.round_channels, finetune_epochs=args.finetune_epochs,
                finetune_data=args.finetune_data, finetune_lr=args.finetune_lr, eval_data=args.eval_data,
                trust_pickle=args.trust_pickle, progress=True)


def _untrained_note(args):
    if args.source == DEFAULT_SOURCE and not args.weights:
        print(f"texelfit: note: {DEFAULT_SOURCE} without --weights is untrained; `texelfit train` writes "
              f"{DEFAULT_CHECKPOINT}", file=sys.stderr)


MEMORY_WARN_BYTES = 10 ** 9  # a build over this warns: GPU memory that a phone or a laptop may not have


def cmd_build(args) -> None:
    from texelfit.build import build
    from texelfit.codegen.memory import planned_peak
    from texelfit.report import format_memory, format_role_bytes, format_table

    _untrained_note(args)
    result = build(args.source, args.out, name=args.name, prune=args.prune, trainable=args.trainable,
                   input_normalize=args.input_normalize, weights_file=args.weights_file, tokenizer=args.tokenizer,
                   webgpu=args.webgpu, **_options(args))
    rep = result.report
    print(f"texelfit: built {args.out}/{rep['name']}.js: {rep['parameters']} parameters, "
          f"{len(rep['layers'])} layers, {rep['kernels']} kernels, "
          f"{rep['files'][rep['name'] + '.js']} bytes, {rep['texture_bytes']} bytes of textures")
    if rep["weights_file"]:
        wf = rep["weights_file"]
        print(f"texelfit: weights in {args.out}/{wf['name']} ({wf['bytes']} bytes, CRC-32 {wf['crc32']:08x}): serve it "
              f"beside {rep['name']}.js")
    if rep["tokenizer"]:
        t = rep["tokenizer"]
        how = ", ".join(what for what, on in (("lower-cased", t["lowercase"]), ("accents stripped", t["strip_accents"]),
                                              ("CJK split", t["chinese_chars"])) if on) or "as written"
        print(f"texelfit: tokenizer: {t['vocab_size']} tokens ({how}); fromText gives {t['length']} ids a text")
    print(format_table(rep["table"], rep["accuracy"], args.quantize))
    print(format_role_bytes(rep["texture_bytes_by_role"]))
    if rep["batchnorm_folded"]:
        print(f"texelfit: note: {rep['batchnorm_folded']} BatchNormalization layer(s) folded into the conv or dense "
              "layer before them: they stay folded (inference form) while training")
    print(format_memory(rep["memory"]))
    peak = planned_peak(rep["memory"])
    if peak > MEMORY_WARN_BYTES:
        what = "a fit" if rep["memory"]["fit"] else "a predict"
        textures = rep["texture_bytes_by_role"]["total_after"]
        print(f"texelfit: warning: {what} needs {peak / 1e9:.2f} GB at --max-batch {rep['max_batch']} (the textures "
              f"{textures / 1e9:.2f} GB), more than 1 GB: many devices cannot hold that; lower --max-batch (or freeze "
              "more with --trainable)")
    if rep["trainable"] != [r["name"] for layer in rep["layers"] for r in layer["params"].values()]:
        print(f"texelfit: trains {len(rep['trainable'])} of the parameter tensors ({', '.join(rep['trainable']) or 'none'}); "
              f"frozen trunk: {rep['trunk'] or 'none'}")
    for line in trainable_set_lines(rep["trainable_set"]):
        print(line)
    if args.prune:
        for g in rep["prune"]["groups"]:
            if g["unpruned_because"] and g["unpruned_because"] != "it is the model output":
                print(f"texelfit: note: left unpruned: {', '.join(g['producers'])}: {g['unpruned_because']}")
        if rep["table"]["totals"]["parameters_before"] == rep["parameters"]:
            print(f"texelfit: note: --prune {args.prune:g} removed no channel: channels that reach the model output "
                  "(also through adds) stay, and small layers keep a multiple of 4 (--no-round-channels)")
    print(f"texelfit: report: {os.path.join(args.out, 'report.json')}")


def trainable_set_lines(t: dict) -> list[str]:
    """What the build froze and why (prep/trust.py), by name."""
    lines = []
    if t["frozen"]:
        lines.append(f"texelfit: frozen by --trainable: {', '.join(t['frozen'])}")
    if t["untied"]:
        lines.append(f"texelfit: note: {len(t['untied'])} initializer(s) of the ONNX file read by several layers (the "
                     f"exporter merged tensors of equal value) train as tensors of their own: "
                     f"{', '.join(f'{k} (from {v})' for k, v in t['untied'].items())}")
    if t["unrecovered"]:
        lines.append(f"texelfit: note: trainable tensors whose names are no key of --weights' state_dict: "
                     f"{', '.join(t['unrecovered'])}")
    if t["unused"]:
        lines.append(f"texelfit: note: not used by the model's output, so not in the bundle (PyTorch gives them no "
                     f"gradient either): {', '.join(t['unused'])}")
    return lines


def cmd_train(args) -> None:
    from texelfit.train import save_checkpoint, train_default

    module, acc = train_default(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed)
    save_checkpoint(module, args.out)
    print(f"texelfit: trained {DEFAULT_SOURCE} for {args.epochs} epochs (seed {args.seed}): validation accuracy "
          f"{100 * acc:.2f}% on the digits validation split (360 samples)")
    print(f"texelfit: saved {args.out}; build it with: texelfit build {DEFAULT_SOURCE} --weights {args.out} "
          "--out dist/digits_cnn")


def cmd_prune_sweep(args) -> None:
    from texelfit.build import prune_sweep
    from texelfit.report import plot_sweep

    opts = _options(args)
    if args.source == DEFAULT_SOURCE and not args.weights:
        if not os.path.exists(DEFAULT_CHECKPOINT):
            raise BuildError(f"no trained weights for {DEFAULT_SOURCE}: run `texelfit train` first (it writes "
                             f"{DEFAULT_CHECKPOINT}) or give --weights")
        opts["weights"] = DEFAULT_CHECKPOINT
    points = prune_sweep(args.source, args.ratios, **opts)
    metric = points[0]["metric"]
    print(f"{'ratio':>6}  {'parameters':>10}  {metric:>9}  {'bundle bytes':>12}  {'weights bytes':>13}")
    for p in points:
        v = f"{100 * p['value']:.2f}%" if metric == "accuracy" else f"{p['value']:.4g}"
        print(f"{p['ratio']:>6g}  {p['parameters']:>10,}  {v:>9}  {p['bundle_bytes']:>12,}  {p['weights_bytes']:>13,}")
    folder = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(folder, exist_ok=True)
    title = (f"{args.source}: --quantize {args.quantize}"
             + (f", {args.finetune_epochs} fine-tuning epochs" if args.finetune_epochs else "")
             + f"\n{metric} on {points[0]['data']}")
    plot_sweep(points, args.out, title)
    data_path = os.path.splitext(args.out)[0] + ".json"
    with open(data_path, "w", encoding="utf-8") as f:
        json.dump({"source": args.source, "quantize": args.quantize, "finetune_epochs": args.finetune_epochs,
                   "points": points}, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"texelfit: wrote the plot to {args.out} and the numbers to {data_path}")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "build":
            cmd_build(args)
        elif args.command == "train":
            cmd_train(args)
        elif args.command == "prune-sweep":
            cmd_prune_sweep(args)
        elif args.command == "demo":
            from texelfit.demo import run_demo

            run_demo(args.out, port=args.port, serve_page=not args.no_serve, example=args.example)
        elif args.command == "federate":
            from texelfit.federate_run import check_host, run

            if (args.dp_clip is None) != (args.dp_noise is None):
                raise BuildError("differential privacy needs both --dp-clip and --dp-noise")
            check_host(args.host)
            run(args)
        elif args.command == "import-weights":
            from texelfit.importer import import_weights

            graph = import_weights(args.file, args.source, args.out, input_shape=_input_shape(args), inputs=args.inputs,
                                   weights=args.weights, trust_pickle=args.trust_pickle, partial=args.partial,
                                   input_dtype=args.input_dtype)
            print(f"texelfit: wrote {args.out}: {len(graph.params)} tensors, {graph.parameter_count()} parameters")
    except BuildError as e:
        print(f"texelfit: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
