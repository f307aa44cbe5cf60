"""`texelfit demo`: build the example model into dist/demo and serve a page that trains it."""
from __future__ import annotations

import functools
import http.server
import json
import os
import socketserver

from texelfit.build import compile_onnx, write_files
from texelfit.codegen.kernels import template_env
from texelfit.examples import digits, digits_mlp
from texelfit.prep.load import export_simplified

NAME = "digits"


def build_demo(out: str) -> dict:
    module = digits_mlp()
    result = compile_onnx(export_simplified(module, (64,)), name=NAME, input_shape=(64,), max_batch=64)
    x, y = digits()
    files = dict(result.files)
    files["digits.json"] = json.dumps({"x": x.reshape(-1).tolist(), "y": y.tolist(), "features": 64,
                                       "scale": 16}, separators=(",", ":"))
    files["index.html"] = template_env().get_template("demo.html.j2").render(
        name=NAME, bundle_bytes=len(result.files[f"{NAME}.js"].encode()))
    write_files(out, files)
    print(f"texelfit: built {out}/ ({NAME}.js {len(files[NAME + '.js'].encode())} bytes, "
          f"{result.report['parameters']} parameters)")
    return result.report


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(folder: str, port: int) -> None:
    handler = functools.partial(_QuietHandler, directory=folder)
    with _Server(("127.0.0.1", port), handler) as httpd:
        print(f"texelfit: serving {folder} at http://127.0.0.1:{httpd.server_address[1]}/  (Ctrl-C stops)", flush=True)
        httpd.serve_forever()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def run_demo(out: str, *, port: int, serve: bool = True) -> None:
    build_demo(out)
    if serve:
        globals()["serve"](os.path.abspath(out), port)
