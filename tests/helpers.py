"""Shared test helpers: build a bundle from a torch module, call it in the page, compare with PyTorch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

from texelfit.build import compile_onnx
from texelfit.codegen.kl_print import js
from texelfit.prep.load import export_simplified
from texelfit.prep.packing import ceil_div


def build_module(site, folder: str, module: torch.nn.Module, input_shape, *, max_batch=64, loss="cross_entropy",
                 name="model", trainable="*", input_dtype="float32", transform=None, onnx_file=False,
                 **options) -> str:
    """Export `module` the way `texelfit build` does and serve the bundle; returns the module URL.
    `options`: more of compile_onnx's (weights_file, input_normalize, ...). `transform(onnx_model)`: a rewrite of
    the export before the build (an ONNX form that torch does not export, of the same function). `onnx_file`: built
    as a user's ONNX file is (exported_as_a_file), not from the module."""
    onnx_model = exported_as_a_file(module, tuple(input_shape), input_dtype) if onnx_file else \
        export_simplified(module, tuple(input_shape), input_dtype=input_dtype)
    if transform is not None:
        onnx_model = transform(onnx_model)
    result = compile_onnx(onnx_model, name=name, input_shape=input_shape, max_batch=max_batch, loss=loss,
                          trainable=trainable, **options)
    url = site.add_files(folder, result.files)
    return f"{url}/{name}.js"


def _for_backend(options) -> dict:
    """The build options createModel's `options` need: WGSL for the webgpu backend (build --webgpu)."""
    return {"webgpu": True} if (options or {}).get("backend") == "webgpu" else {}


def _suffix(options) -> str:
    return "_webgpu" if _for_backend(options) else ""


def exported_as_a_file(module, input_shape, input_dtype="float32"):
    """What `texelfit build model.onnx --weights state.pt` builds from: torch.onnx.export at opset 17 as a user writes
    it (the batch dynamic), simplified with the state_dict, which names back the initializers the exporter renamed."""
    import io

    import onnx

    from texelfit.prep.simplify import simplify_onnx_file

    buf = io.BytesIO()
    example = torch.zeros((2,) + tuple(input_shape), dtype=getattr(torch, input_dtype))
    torch.onnx.export(module.eval(), (example,), buf, dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    return simplify_onnx_file(onnx.load_from_string(buf.getvalue()), module.state_dict())


TESTS = os.path.dirname(os.path.abspath(__file__))


def run_cli(*args, cwd=None, fresh=False):
    """The console script's entry point (texelfit.cli.main) with `args`, its exit status, stdout and stderr as a
    CompletedProcess: in this interpreter, its output captured (tests/ importable, for package.module:Attr sources
    such as models:mlp_45_31_7), which saves each call the seconds a fresh interpreter takes to import torch, ONNX and
    scikit-learn; or, `fresh`, in a new interpreter as a user runs it (what differs between processes: str hashes,
    the order of sets of str, are salted per process)."""
    args = [str(a) for a in args]
    if fresh:
        env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
        return subprocess.run([sys.executable, "-m", "texelfit.cli", *args], capture_output=True, text=True,
                              cwd=cwd, env=env, timeout=300)
    import contextlib
    import io

    from texelfit.cli import main
    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as e:  # (argparse's usage errors)
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess([sys.executable, "-m", "texelfit.cli", *args], code, out.getvalue(),
                                       err.getvalue())


def assert_close(what: str, got, ref, *, atol: float, rtol: float, norm: float | None = None):
    """|got - ref| <= atol + rtol * |ref| elementwise; the message lists the first mismatches.
    With `norm`, the check is on the whole tensor instead: ||got - ref|| <= atol + norm * ||ref|| (L2)."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    assert got.shape == ref.shape, f"{what}: {got.shape} values, expected {ref.shape}"
    if norm is not None:
        err, size = np.linalg.norm(got - ref), np.linalg.norm(ref)
        if os.environ.get("TEXELFIT_PRINT_ERRORS"):
            print(f"[parity] {what}: relative L2 error {err / max(size, 1e-30):.3g}")
        assert err <= atol + norm * size, f"{what}: ||got - ref|| = {err:.3g}, over {atol} + {norm} * ||ref|| ({size:.3g})"
        return
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


def predict_draws(web, url, batches, options=None) -> dict[str, int]:
    """The draws of one predict at each batch size, keyed by it."""
    return run_model(web, url, """
        const gl = WebGL2RenderingContext.prototype, draw = gl.drawArrays;
        let n = 0;
        gl.drawArrays = function (...a) { n++; return draw.apply(this, a); };
        const size = m.info.inputShape.reduce((a, b) => a * b, 1);
        const out = {};
        for (const b of args.batches) { n = 0; await m.predict(new Float32Array(b * size), b); out[b] = n; }
        gl.drawArrays = draw;
        return out;
    """, {"batches": batches}, options)


# ---- training trajectories ----------------------------------------------------------------------

ONE_STEP = dict(atol=1e-6, rtol=1e-5)
TRAJ_W = dict(atol=2e-5, rtol=2e-4)
TRAJ_LOSS = dict(atol=1e-5, rtol=1e-4)

OPTIMIZERS = {
    "sgd": {"type": "sgd", "lr": 0.1},
    "sgd_momentum_wd": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weightDecay": 1e-3},
    "sgd_nesterov": {"type": "sgd", "lr": 0.05, "momentum": 0.8, "nesterov": True, "weightDecay": 1e-2},
    "sgd_dampening": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.3},
    "adam": {"type": "adam", "lr": 1e-2, "weightDecay": 1e-2},
    "adam_betas": {"type": "adam", "lr": 3e-3, "betas": [0.8, 0.99], "eps": 1e-6},
    "adamw": {"type": "adamw", "lr": 1e-2, "weightDecay": 0.1},
}


def torch_optimizer(cfg, params):
    t = cfg["type"]
    if t == "sgd":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg.get("momentum", 0),
                               dampening=cfg.get("dampening", 0), nesterov=cfg.get("nesterov", False),
                               weight_decay=cfg.get("weightDecay", 0))
    kw = dict(lr=cfg["lr"], betas=tuple(cfg.get("betas", (0.9, 0.999))), eps=cfg.get("eps", 1e-8))
    if t == "adam":
        return torch.optim.Adam(params, weight_decay=cfg.get("weightDecay", 0), **kw)
    return torch.optim.AdamW(params, weight_decay=cfg.get("weightDecay", 1e-2), **kw)


def torch_fit(module, x, y, loss, cfg, batch_size, epochs, mu=0.0):
    """`mu`: FedProx's proximal term, mu / 2 * ||w - w_start||^2 over the parameters that train, in the loss
    that is minimised (the losses returned are the data loss alone, as fit reports)."""
    opt = torch_optimizer(cfg, module.parameters())
    start = [(p, p.detach().clone()) for p in module.parameters() if p.requires_grad]
    losses = []
    for _ in range(epochs):
        for s in range(0, len(x), batch_size):
            xb, yb = x[s:s + batch_size], y[s:s + batch_size]
            opt.zero_grad()
            out = module(xb)
            value = F.cross_entropy(out, yb) if loss == "cross_entropy" else F.mse_loss(out, yb)
            total = value + mu / 2 * sum(((p - p0) ** 2).sum() for p, p0 in start) if mu else value
            total.backward()
            opt.step()
            losses.append(value.item())
    return losses


FIT = """
    const x = args.ids ? Int32Array.from(args.x) : new Float32Array(args.x);
    const y = args.loss === 'cross_entropy' ? Int32Array.from(args.y) : new Float32Array(args.y);
    let calls = 0;
    const r = await m.fit(x, y, { batchSize: args.batchSize, epochs: args.epochs, shuffle: args.shuffle === true, seed: 5,
                                  loss: args.loss, optimizer: args.optimizer, onStep: () => { calls++; },
                                  proximal: args.mu ? { mu: args.mu } : undefined });
    return { loss: r.loss, weights: arr(await m.getWeights()), calls, info: m.info, folded: m.info.foldedTextures };
"""


def check_training(web, site, factory, shape, opt_name, loss, *, samples, batch_size, epochs, tol_w, tol_loss,
                   options=None, max_batch=64, seed=7, shuffle=False, ids=None, frozen=(), noise=None, mu=0.0,
                   onnx_file=False):
    """Train in the page and in PyTorch from the same weights on the same batches; compare the loss
    of every step and every weight at the end. Returns what the page returned. (With `shuffle` the
    page draws its own order and PyTorch's batches are unshuffled: only the same where each batch is
    the whole set.) With `ids` (an int V) x is int64 token ids in [0, V), passed as an Int32Array.
    `frozen`: fnmatch patterns of parameters that do not train (build --trainable the others;
    requires_grad False in PyTorch). `noise`: {parameter: slice of its flat values} whose gradient is exactly zero
    in exact arithmetic (an attention key's bias: the softmax cancels it), so that both sides train rounding
    noise there, which Adam scales up to steps of about lr: those values are checked to have moved by at most
    lr a step from where they started, on both sides, the others as every weight is. `mu`: fit's proximal term
    (fit options.proximal), in PyTorch's loss as FedProx defines it. `onnx_file`: build_module's."""
    import fnmatch

    torch.manual_seed(seed)
    module = factory()
    trainable = "*"
    if frozen:
        names = [n for n, _ in module.named_parameters()]
        held = {n for pat in frozen for n in fnmatch.filter(names, pat)}
        trainable = ",".join(n for n in names if n not in held)
        for n, p in module.named_parameters():
            p.requires_grad_(n not in held)
    url = build_module(site, f"train_{factory.__name__}_{max_batch}{_suffix(options)}", module, shape,
                       max_batch=max_batch, input_dtype="int64" if ids else "float32", trainable=trainable,
                       onnx_file=onnx_file, **_for_backend(options))
    x = torch.randint(0, ids, (samples,) + tuple(shape)) if ids else torch.randn((samples,) + tuple(shape))
    out_shape = tuple(module(x[:1]).shape[1:])
    if loss == "cross_entropy":
        y = torch.randint(0, out_shape[0], (samples,))
        y_js = y.tolist()
    else:
        y = torch.randn((samples,) + out_shape)
        y_js = y.reshape(-1).tolist()
    cfg = OPTIMIZERS[opt_name]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y_js, "loss": loss, "optimizer": cfg,
                                    "batchSize": batch_size, "epochs": epochs, "shuffle": shuffle, "ids": bool(ids),
                                    "mu": mu},
                    options)
    start = torch_state(module)
    ref_losses = torch_fit(module, x, y, loss, cfg, batch_size, epochs, mu)
    steps = epochs * -(-samples // batch_size)
    assert len(got["loss"]) == steps and got["calls"] == steps
    assert_close(f"{opt_name}/{loss} losses", got["loss"], ref_losses, **tol_loss)
    params = dict(module.named_parameters())  # buffers (a normalisation's mean, say) are constants of the bundle
    for name, ref in torch_state(module).items():
        if name not in params:
            continue
        w = np.asarray(got["weights"][name], dtype=np.float64).reshape(-1)
        if noise and name in noise:
            cut = noise[name]
            for side, v in (("page", w), ("torch", ref.reshape(-1))):
                moved = np.abs(v[cut] - start[name].reshape(-1)[cut]).max()
                assert moved <= steps * cfg["lr"] * 1.01 + 1e-6, f"{name}[{cut}] ({side}) moved {moved:.3g}"
            keep = np.ones(w.size, dtype=bool)
            keep[cut] = False
            w, ref = w[keep], ref.reshape(-1)[keep]
        assert_close(f"{opt_name}/{loss} {name} after {steps} steps", w, ref, **tol_w)
    return got



def perturbed(factory, scale: float):
    """`factory` with every parameter of what it makes moved off its init by scale * N(0, 1) (zero biases and unit
    scales would hide a value read from the wrong place); named after it, for the bundle's folder."""
    def make():
        m = factory()
        with torch.no_grad():
            for p in m.parameters():
                p.add_(scale * torch.randn_like(p))
        return m
    make.__name__ = f"{factory.__name__}_perturbed"
    return make


# ---- ops ----------------------------------------------------------------------------------------

FWD = dict(atol=2e-5, rtol=2e-4)
GRAD = dict(atol=2e-6, rtol=2e-4)


def check_op(web, site, case: str, factory, shape, loss: str, *, batch=5, seed=0,
             fwd=FWD, grad=GRAD, options=None, ids=None, max_batch=64, transform=None, onnx_file=False):
    """Forward output and the gradient of every weight against PyTorch autograd.

    Makes the module with `factory()` after seeding (the same weights whatever ran before),
    builds the bundle, runs `predict` and `gradients` in the page on random data, and compares
    tensor by tensor with |got - ref| <= atol + rtol * |ref|. The loss is taken on the raw output
    (class logits for cross_entropy, any shape for mse). With `ids` (an int V), x is int64 token ids
    in [0, V), passed to the page as an Int32Array. `transform`, `onnx_file`: build_module's."""
    torch.manual_seed(seed)
    module = factory().eval()
    g = torch.Generator().manual_seed(seed)  # the data, whatever the export draws from the global RNG
    x = torch.randint(0, ids, (batch,) + tuple(shape), generator=g) if ids else \
        torch.randn((batch,) + tuple(shape), generator=g)
    out_shape = module(x).shape[1:]
    if loss == "cross_entropy":
        y = torch.randint(0, out_shape[0], (batch,), generator=g)
        y_js = y.tolist()
    else:
        y = torch.randn((batch,) + tuple(out_shape), generator=g)
        y_js = y.reshape(-1).tolist()
    url = build_module(site, f"op_{case}{_suffix(options)}", module, shape, input_dtype="int64" if ids else "float32",
                       max_batch=max_batch, transform=transform, onnx_file=onnx_file, **_for_backend(options))
    got = run_model(web, url, """
        const x = args.ids ? Int32Array.from(args.x) : new Float32Array(args.x);
        const y = args.loss === 'cross_entropy' ? Int32Array.from(args.y) : new Float32Array(args.y);
        const out = Array.from(await m.predict(x, args.batch));
        const grads = arr(await m.gradients(x, y, { loss: args.loss }));
        return { out, grads };
    """, {"x": x.reshape(-1).tolist(), "y": y_js, "loss": loss, "batch": batch, "ids": bool(ids)}, options)

    module.zero_grad()
    out = module(x)
    ref_loss = F.cross_entropy(out, y) if loss == "cross_entropy" else F.mse_loss(out, y)
    ref_loss.backward()
    assert_close(f"{case} forward", got["out"], out.detach().numpy(), **fwd)
    named = dict(module.named_parameters())
    assert sorted(got["grads"]) == sorted(named), f"gradients are keyed by the state_dict names: {sorted(got['grads'])}"
    for name, p in named.items():
        assert_close(f"{case} d{loss}/d{name}", got["grads"][name], p.grad.numpy(), **grad)


def pause_data() -> dict:
    """40 samples of 45 features and 7 classes, for a page's script that starts with PAUSE_PRELUDE."""
    g = torch.Generator().manual_seed(5)
    return {"x": torch.randn(40 * 45, generator=g).tolist(), "y": torch.randint(0, 7, (40,), generator=g).tolist()}


# x and y of pause_data, sleep(ms), and opts(extra): a fit's options (batches of 4, 3 epochs, Adam), with extra's
PAUSE_PRELUDE = """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
        const opts = (extra) => ({ batchSize: 4, epochs: 3, shuffle: true, seed: 3,
                                   optimizer: { type: 'adam', lr: 0.01 }, ...extra });
"""

# A fit paused by its onStep at step 7 and resumed 100 ms later, in a page's script (x, y, opts(extra) the fit's
# options, sleep(ms)): states (before, paused, after), the steps seen when paused and 100 ms later, and the losses.
PAUSED_AT_STEP_7 = """
        const states = [m.state];
        let steps = 0;
        const p = m.fit(x, y, opts({ onStep: ({ step }) => { steps++; if (step === 7) m.pause(); } }));
        while (m.state !== 'paused') await sleep(5);
        states.push(m.state);
        const paused = steps;
        await sleep(100);
        const later = steps;
        m.resume();
        const loss = (await p).loss;
        states.push(m.state);
"""


def run_kl_js(k, inputs: dict[str, np.ndarray], width: int, rows: int, u: dict, block: int = 1,
              cols: int = 1) -> np.ndarray:
    """k printed as JavaScript and run over `rows` rows of `width` texels; a kernel computing `block` rows an
    invocation (output t: row block*ROW + t) over the ceil(rows / block) blocks, and `cols` texels of each (output
    t * cols + j: texel cols*COL + j; COL over width / cols), its outputs interleaved back."""
    fn = js(k, list(inputs), block * cols)
    tex = {n: {"width": a.shape[1], "data": [None if np.isnan(v) else float(v) for v in a.reshape(-1)]}
           for n, a in inputs.items()}
    blocks = ceil_div(rows, block)
    script = f"""
const fn = {fn};
const t = {json.dumps(tex)};
const ins = {json.dumps(list(inputs))}.map((n) => ({{ width: t[n].width,
                                           data: Float32Array.from(t[n].data.map((v) => v ?? NaN)) }}));
const outs = Array.from({{ length: {block * cols} }}, () => ({{ width: {width // cols},
                                                        data: new Float32Array({blocks * width // cols * 4}).fill(7) }}));
fn({json.dumps(k.symbols)}, ins, outs, {json.dumps(u)}, {blocks});
console.log(JSON.stringify(outs.map((o) => Array.from(o.data))));
"""
    got = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout
    assert width % cols == 0, (width, cols)
    parts = np.array(json.loads(got), dtype=np.float64).reshape(block, cols, blocks, width // cols, 4)
    out = parts.transpose(2, 0, 3, 1, 4).reshape(blocks * block, width, 4)
    assert (out[rows:] == 7).all(), "a block's rows past the batch's are not written (on WebGPU: past the buffer)"
    return out[:rows]
