"""Browser test plumbing: Debian's Chromium through pytest-playwright, pages served from 127.0.0.1.

A console error (or an uncaught page error) in any page fails the test.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import socketserver
import threading

import pytest

CHROMIUM = os.environ.get("TEXELFIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

INDEX = b"""<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>texelfit tests</title></head>
<body><canvas id="c" width="1" height="1"></canvas></body></html>
"""


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if not os.path.exists(CHROMIUM):
        pytest.exit(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)", returncode=3)
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "headless": True, "args": CHROMIUM_ARGS}


class _Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, headers_for=None, **kwargs):
        self.headers_for = headers_for or {}
        super().__init__(*args, **kwargs)

    def log_message(self, *args):  # keep test output quiet
        pass

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        for prefix, headers in self.headers_for.items():  # e.g. a Content-Security-Policy for a folder
            if self.path.startswith(prefix):
                for k, v in headers.items():
                    self.send_header(k, v)
        super().end_headers()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Site:
    """A folder served on loopback; bundles are built into sub-folders of it."""

    def __init__(self, root):
        self.root = str(root)
        with open(os.path.join(self.root, "index.html"), "wb") as f:
            f.write(INDEX)
        self.headers_for: dict[str, dict[str, str]] = {}  # URL path prefix -> extra response headers
        handler = functools.partial(_Handler, directory=self.root, headers_for=self.headers_for)
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def add_files(self, folder: str, files: dict[str, str]) -> str:
        d = self.path(folder)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for name, data in files.items():  # text, or bytes (NAME.weights.bin)
            if isinstance(data, bytes):
                with open(os.path.join(d, name), "wb") as f:
                    f.write(data)
                continue
            with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                f.write(data)
        return f"{self.url}/{folder}"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    s = Site(tmp_path_factory.mktemp("site"))
    yield s
    s.close()


# Clears what a page of the test site keeps across navigations (a test's checkpoints: IndexedDB, localStorage).
CLEAR_STORAGE = """async () => {
  for (const d of await indexedDB.databases()) {
    await new Promise((resolve) => { const r = indexedDB.deleteDatabase(d.name); r.onsuccess = r.onerror = r.onblocked = resolve; });
  }
  localStorage.clear();
}"""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call" and outcome.get_result().failed:
        item.page_failed = True  # (web: the next test gets a fresh page)


class _Pages:
    """A page reused by a module's `web` tests, each on a freshly loaded index.html with the site's storage
    cleared: a new browser context a test cost 0.3 to 0.5 s more here, some 1000 times a run. A test that leaves
    more behind than a navigation clears (an init script, a CDP session) or that needs a context of its own
    (@pytest.mark.fresh_page: before and after it), a test that failed and a page that is gone, are replaced by a
    new context's."""

    def __init__(self, browser):
        self.browser, self.page = browser, None

    def get(self):
        if self.page is None or self.page.is_closed():
            self.page = self.browser.new_context().new_page()
        return self.page

    def drop(self):
        if self.page is not None:
            self.page.context.close()
            self.page = None


@pytest.fixture(scope="module")
def _pages(browser):
    pages = _Pages(browser)
    yield pages
    pages.drop()


def _blank_page(pages: _Pages, site, request, check=None):
    """The body of `web` and `webgpu_web`: `pages`' page on a freshly loaded index.html, its storage cleared, `check`
    run on it; console errors fail the test."""
    fresh = request.node.get_closest_marker("fresh_page") is not None
    if fresh:
        pages.drop()
    page = pages.get()
    page.goto(f"{site.url}/index.html")
    page.evaluate(CLEAR_STORAGE)
    if check:
        check(page)
    errors: list[str] = []

    def on_console(msg):
        if msg.type == "error":
            errors.append(f"console.{msg.type}: {msg.text}")

    def on_error(exc):
        errors.append(f"pageerror: {exc}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    yield page
    if not page.is_closed():
        page.remove_listener("console", on_console)
        page.remove_listener("pageerror", on_error)
    if fresh or getattr(request.node, "page_failed", False):
        pages.drop()
    assert not errors, "errors in the page:\n" + "\n".join(errors)


@pytest.fixture
def web(_pages, site, request):
    """A blank page on the test site (a module's tests share one, reloaded: _Pages); console errors fail the test."""
    yield from _blank_page(_pages, site, request)


@pytest.fixture(scope="session")
def webgpu_browser(browser_type):
    """A Chromium with WebGPU (--enable-unsafe-webgpu: SwiftShader's adapter here), for the WebGPU backend's tests."""
    b = browser_type.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS + ["--enable-unsafe-webgpu"])
    yield b
    b.close()


@pytest.fixture(scope="module")
def _webgpu_pages(webgpu_browser):
    pages = _Pages(webgpu_browser)
    yield pages
    pages.drop()


def _has_webgpu(page):
    assert page.evaluate("async () => !!(navigator.gpu && await navigator.gpu.requestAdapter())"), \
        "no WebGPU adapter: Chromium must give SwiftShader's with --enable-unsafe-webgpu"


@pytest.fixture
def webgpu_web(_webgpu_pages, site, request):
    """A blank page of the WebGPU browser (shared as `web`'s); console errors fail the test, and so does a missing
    adapter (not a skip)."""
    yield from _blank_page(_webgpu_pages, site, request, _has_webgpu)
