"""Shared test helpers: build a bundle from a torch module, call it in the page, compare with PyTorch."""
from __future__ import annotations

import os

import numpy as np
import torch

from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified


def build_module(site, folder: str, module: torch.nn.Module, input_shape, *, max_batch=64, loss="cross_entropy",
                 name="model") -> str:
    """Export `module` the way `texelfit build` does and serve the bundle; returns the module URL."""
    onnx_model = export_simplified(module, tuple(input_shape))
    result = compile_onnx(onnx_model, name=name, input_shape=input_shape, max_batch=max_batch, loss=loss)
    url = site.add_files(folder, result.files)
    return f"{url}/{name}.js"


def assert_close(what: str, got, ref, *, atol: float, rtol: float):
    """|got - ref| <= atol + rtol * |ref| elementwise; the message lists the first mismatches."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    assert got.shape == ref.shape, f"{what}: {got.shape} values, expected {ref.shape}"
    bound = atol + rtol * np.abs(ref)
    bad = np.flatnonzero(~(np.abs(got - ref) <= bound))
    if os.environ.get("TEXELFIT_PRINT_ERRORS"):  # for closing notes: the measured parity errors
        print(f"[parity] {what}: max abs {np.max(np.abs(got - ref)):.3g}, "
              f"max rel {np.max(np.abs(got - ref) / (np.abs(ref) + 1e-12)):.3g}")
    if bad.size:
        rows = "\n".join(f"  [{i}] got {got[i]:.8g} ref {ref[i]:.8g} diff {abs(got[i] - ref[i]):.3g} bound {bound[i]:.3g}"
                         for i in bad[:8])
        raise AssertionError(f"{what}: {bad.size} of {got.size} values off (atol={atol}, rtol={rtol}); "
                             f"max abs diff {np.max(np.abs(got - ref)):.3g}\n{rows}")


def torch_state(module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


# JavaScript run in the page: load the bundle, create a model, run the body, dispose.
_RUN = """
async ([url, options, args]) => {
  const mod = await import(url);
  const m = await mod.createModel(options);
  const arr = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Array.from(v)]));
  try {
    %s
  } finally {
    m.dispose();
  }
}
"""


def run_model(page, url, body: str, args=None, options=None):
    """Run `body` (JavaScript with m, mod, args and arr in scope; it may `return`) against a fresh model."""
    return page.evaluate(_RUN % body, [url, options or {}, args])
