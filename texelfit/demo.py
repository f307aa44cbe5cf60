"""`texelfit demo`: build a demo page and serve it on 127.0.0.1.

The default example (texelfit/photos_demo.py) is EfficientNet-Lite0 with a new head that a person trains
on their own pictures. `--example digits`: train the default CNN on the bundled digits, prune and quantise
it, build dist/demo-digits/ (bundle, .d.ts, report, the built architecture as ONNX, index.html, the
digits) and serve the page where a person fine-tunes the model on their own handwriting."""
from __future__ import annotations

import functools
import http.server
import json
import os
import socketserver
import time

from texelfit.build import compile_onnx, write_files
from texelfit.data import Data
from texelfit.codegen.kernels import template_env
from texelfit.examples import digits, digits_split
from texelfit.prep.load import export_simplified
from texelfit.prep.torch_ir import export_onnx
from texelfit.train import train_default

NAME = "digits"
INPUT_SHAPE = (1, 8, 8)
# What the demo ships: half the channels (with recovery fine-tuning) and int8 weights. The
# build defaults stay exact (`--prune 0 --quantize none`); the demo shows the reductions.
SHIPPING = dict(prune=0.5, finetune_epochs=5, quantize="int8")


EXAMPLES = ("photos", "digits")
DEFAULT_OUT = {"photos": os.path.join("dist", "demo"), "digits": os.path.join("dist", "demo-digits")}


def build_demo(out: str, *, progress: bool = True) -> dict:
    """The digits demo (`texelfit demo --example digits`)."""
    start = time.perf_counter()
    module, val_acc = train_default(progress=progress)
    print(f"texelfit: trained the default CNN in PyTorch: validation accuracy {100 * val_acc:.2f}%", flush=True)
    (xt, yt), (xv, yv) = digits_split(INPUT_SHAPE)
    result = compile_onnx(export_simplified(module, INPUT_SHAPE), name=NAME, input_shape=INPUT_SHAPE, max_batch=64,
                          finetune_data=Data(xt, yt, "digits training split"),
                          eval_data=Data(xv, yv, f"digits validation split ({len(yv)} samples)"),
                          progress=progress, **SHIPPING)
    x, y = digits()
    files = dict(result.files)
    files["digits.json"] = json.dumps({"x": x.reshape(-1).tolist(), "y": y.tolist(), "scale": 16},
                                      separators=(",", ":"))
    bundle_bytes = len(files[NAME + ".js"].encode())
    files["index.html"] = template_env().get_template("demo.html.j2").render(
        name=NAME, classes=int(result.graph.output_shape[0]), side=INPUT_SHAPE[1],
        bundle_kb=f"{bundle_bytes / 1024:.0f}")
    write_files(out, files)
    # the architecture as built (pruned, batch-norm folded): `texelfit import-weights` takes it as SOURCE
    with open(os.path.join(out, NAME + ".onnx"), "wb") as f:
        f.write(export_onnx(result.graph).SerializeToString())
    acc = result.report.get("accuracy") or {}
    shipped = acc.get("after_quantize")
    print(f"texelfit: built {out}/ in {time.perf_counter() - start:.1f} s: {NAME}.js {bundle_bytes} bytes, {result.report['parameters']} parameters"
          + (f", validation accuracy as shipped {100 * shipped:.2f}%" if shipped is not None else ""), flush=True)
    return result.report


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, headers=None, **kwargs):
        self.extra_headers = headers or {}
        super().__init__(*args, **kwargs)

    def log_message(self, *args):
        pass

    def end_headers(self):
        for k, v in self.extra_headers.items():
            self.send_header(k, v)
        super().end_headers()


def serve(folder: str, port: int, headers: dict | None = None) -> None:
    handler = functools.partial(_QuietHandler, directory=folder, headers=headers)
    try:
        httpd = _Server(("127.0.0.1", port), handler)
    except OSError as e:
        from texelfit.prep.errors import BuildError

        raise BuildError(f"cannot serve on 127.0.0.1:{port} ({e.strerror}); choose another --port") from None
    with httpd:
        print(f"texelfit: serving {folder} at http://127.0.0.1:{httpd.server_address[1]}/  (Ctrl-C stops)", flush=True)
        httpd.serve_forever()


def run_demo(out: str | None, *, port: int, serve_page: bool = True, example: str = "photos") -> None:
    out = out or DEFAULT_OUT[example]
    headers = None
    if example == "photos":
        from texelfit.photos_demo import CSP, build_photos_demo

        build_photos_demo(out)
        headers = {"Content-Security-Policy": CSP}
    else:
        build_demo(out)
    if serve_page:
        serve(os.path.abspath(out), port, headers)
