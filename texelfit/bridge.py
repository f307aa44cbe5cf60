"""The same-origin HTTP bridge of `texelfit federate`: DIR's files at `/`, the person's page at
`/federation.html`, and the endpoints that a bundle's `m.federate(url, ...)` calls.

Endpoints (JSON answers; a refusal is a 4xx with {"error": reason}, and a log line):

  POST /federation/join    -> {token, client, heartbeat}; 410 once the federation is over; body (optional):
                              JSON [[name, size], ...] of the page's weights, 409 if they lack the federation's
  POST /federation/task    -> {round, config, names, sizes, weights} (weights: base64 of little-endian
                              float32, the tensors `names` of `sizes` values one after the other), or
                              {wait: true} (nothing yet: ask again), or {done: true, names, sizes, weights}
  POST /federation/update  -> {ok: true}, or {ok: false, late: true} for a round that closed before it (its
                              --round-timeout passed, or the page missed its heartbeats): not aggregated;
                              header X-Texelfit-Update: JSON {round, samples, loss, format, names, sizes};
                              body: the weight delta, float32 (4 bytes a value) or int8 (a float32 scale
                              per tensor, then one signed byte a value: delta = q * scale)
  POST /federation/alive   -> {} (a heartbeat, while the browser trains)
  POST /federation/leave   -> {}
  GET  /federation/status  -> {round, rounds, clients, done, loss, accuracy}

Every POST but join carries `Authorization: Bearer TOKEN`, the token join gave.
"""
from __future__ import annotations

import http.server
import json
import mimetypes
import os
import socketserver
import threading
from urllib.parse import unquote, urlsplit

from texelfit.federate import Federation, Refused

MAX_BODY = 1 << 30
PAGE_CSP = "default-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:"


def page_files(bundle_name: str) -> dict[str, bytes]:
    """/federation.html and its script, rendered for the bundle."""
    from importlib import resources

    import jinja2

    folder = resources.files("texelfit.runtime_template")
    return {name: jinja2.Template(folder.joinpath(name + ".j2").read_text(encoding="utf-8")).render(name=bundle_name)
            .encode() for name in ("federation.html", "federation.js")}


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "texelfit-federate"
    fed: Federation
    root: str
    pages: dict[str, bytes]
    quiet = True

    def log_message(self, *args):  # refusals are logged by the federation; requests are not
        if not self.quiet:
            super().log_message(*args)

    def _send(self, status: int, body: bytes, kind: str = "application/json", extra=None):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj):
        self._send(status, json.dumps(obj).encode())

    def do_GET(self):  # noqa: N802 (http.server's names)
        path = unquote(urlsplit(self.path).path)
        if path == "/federation/status":
            return self._json(200, self.fed.status())
        name = path.lstrip("/") or "federation.html"
        if name in self.pages:
            kind = "text/html; charset=utf-8" if name.endswith(".html") else "text/javascript; charset=utf-8"
            return self._send(200, self.pages[name], kind, {"Content-Security-Policy": PAGE_CSP})
        full = os.path.realpath(os.path.join(self.root, name))
        if not full.startswith(self.root + os.sep) or not os.path.isfile(full):
            return self._json(404, {"error": f"not found: {path}"})
        with open(full, "rb") as f:
            data = f.read()
        kind = mimetypes.guess_type(full)[0] or "application/octet-stream"
        if full.endswith(".js"):
            kind = "text/javascript; charset=utf-8"
        self._send(200, data, kind)

    do_HEAD = do_GET

    def do_POST(self):  # noqa: N802
        path = urlsplit(self.path).path
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_BODY:
                raise Refused(413, f"a body of {length} bytes")
            body = self.rfile.read(length) if length else b""
            if path == "/federation/join":
                try:
                    weights = json.loads(body or b"null")
                except ValueError:
                    weights = None
                if weights is not None and not isinstance(weights, list):
                    raise Refused(400, "join's body must be a JSON list of [name, size]")
                return self._json(200, self.fed.join(weights))
            if path == "/federation/task":
                return self._json(200, self.fed.pull(token))
            if path == "/federation/alive":
                return self._json(200, self.fed.heartbeat(token))
            if path == "/federation/leave":
                self.fed.leave(token)
                return self._json(200, {})
            if path == "/federation/update":
                try:
                    meta = json.loads(self.headers.get("X-Texelfit-Update") or "null")
                except ValueError:
                    meta = None
                return self._json(200, self.fed.push(token, meta, body))
            return self._json(404, {"error": f"no endpoint {path}"})
        except Refused as e:
            if path != "/federation/update" or e.status == 401:  # (the federation logs the updates it refuses)
                self.fed.log(f"refused {path} from {self.client_address[0]} (HTTP {e.status}): {e}")
            return self._json(e.status, {"error": str(e)})
        except ValueError as e:
            return self._json(400, {"error": str(e)})


class Bridge:
    """The HTTP server, in a thread; `url` is its origin."""

    def __init__(self, fed: Federation, host: str = "127.0.0.1", port: int = 0):
        handler = type("Handler", (_Handler,), {"fed": fed, "root": os.path.realpath(fed.bundle.folder),
                                                "pages": page_files(fed.bundle.name)})
        self.httpd = _Server((host, port), handler)
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.url = f"http://{shown}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="texelfit-bridge", daemon=True)

    def start(self) -> "Bridge":
        self.thread.start()
        return self

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
