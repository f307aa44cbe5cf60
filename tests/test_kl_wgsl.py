"""The kernel language's WGSL printer (codegen/kl_wgsl.py), run as WebGPU compute shaders in Chromium (SwiftShader's
WebGPU adapter, --enable-unsafe-webgpu): every kernel written in the language that real models schedule (pools,
reductions, softmax, resample, gather, the bias gradients, ..., forward and backward, with their shape constants
and constant arrays) computes on random textures what the same
kernel printed as the CPU backend's JavaScript computes, run by node. The JavaScript is the CPU backend's, which
the op tests check against PyTorch; so the WGSL is checked against PyTorch through it.
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import CHROMIUM, CHROMIUM_ARGS
from texelfit.codegen.kl_print import js
from texelfit.codegen.kl_wgsl import dispatch, struct_fields, wgsl
from texelfit.codegen.schedule import build_schedule
from texelfit.prep.fold import fold_batchnorm
from texelfit.prep.fuse import fuse_activations
from texelfit.prep.graph import to_ir
from texelfit.codegen.webgl2.layout import plan_layout
from texelfit.prep.load import export_simplified

BATCH = 3
# the per-step uniforms a kernel may read (codegen/kernels.py: UNIFORM_TYPES): a loss scale other than 1, a
# training step's dropout (its masks drawn, from a seed with all 31 bits in use), a loss value's texel of the ring,
# an output's loss weight other than 1
UNIFORMS = {"u_batch": BATCH, "u_loss_scale": 4.0, "u_loss_weight": 0.5, "u_dropout": 1.0, "u_dropseed": 0x6A09E667,
            "u_ring": 5}


class Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.mp = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.ap = nn.AvgPool2d(2, padding=1, count_include_pad=False)
        self.conv2 = nn.Conv2d(6, 5, 1)
        self.head = nn.Linear(5, 9)

    def forward(self, x):
        y = self.conv2(self.ap(self.mp(self.conv(x))))
        return torch.log_softmax(self.head(y.mean((2, 3))), 1)


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(7, 6), nn.Linear(6, 5)

    def forward(self, x):  # (T, F) tokens
        y = torch.softmax(self.a(x), -1)
        return self.b(y).amax(1) + y.sum(1).mean(1, keepdim=True)


class Merges(nn.Module):
    """A concat on the channels, a flatten, a dropout: the layout ops."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 5, 3, padding=1), nn.Conv2d(3, 2, 1)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(7 * 6 * 5, 6)

    def forward(self, x):
        y = torch.relu(torch.cat([self.a(x), self.b(x)], 1))
        return self.head(self.drop(torch.flatten(y, 1)))


class Embedded(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(11, 6, padding_idx=2), nn.Linear(6, 3)

    def forward(self, ids):  # (T,) ids: a texel of 4 and 2 more (the gradient's last ids)
        return self.head(self.emb(ids)).mean(1)


class Resampled(nn.Module):
    """Upsampling, reflect padding, a transpose and a slice: resample and gather kernels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.head = nn.Linear(5 * 9 * 9, 4)

    def forward(self, x):  # (3, 5, 4)
        y = torch.nn.functional.pad(self.up(self.conv(x)), (1, 0, 0, 1), mode="reflect")  # (5, 11, 9)
        y = y.transpose(2, 3)[:, :, :, 1:10]  # (5, 9, 9)
        return self.head(torch.tanh(y).flatten(1))


class Tokened(nn.Module):
    """A class token (a parameter's part of a gather, and its gradient summed over the batch) and constant rows
    joined to the tokens."""

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 7))
        self.a = nn.Linear(7, 6)
        self.register_buffer("pad", torch.linspace(-1, 1, 14).reshape(1, 2, 7))

    def forward(self, x):  # (5, 7) tokens
        n = x.shape[0]
        y = torch.cat([self.cls.expand(n, -1, -1), x, self.pad.expand(n, -1, -1)], 1)  # (8, 7)
        return self.a(y).mean(1)


class Normed(nn.Module):
    """A layernorm and an attention's products of activations (Q K^T, A V): the token kernels."""

    def __init__(self):
        super().__init__()
        self.pre, self.ln = nn.Linear(6, 6), nn.LayerNorm(6)
        self.q, self.k = nn.Linear(6, 5), nn.Linear(6, 5)

    def forward(self, x):  # (T, F) tokens
        y = self.ln(self.pre(x))
        a = torch.softmax(self.q(y) @ self.k(y).transpose(1, 2), -1)
        return (a @ y).mean(2)


class Classes(nn.Module):
    """A classifier of 41 classes: cross_entropy's softmax statistics pass (layout.ce_stats), read by its gradient
    and its value."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(5, 41)

    def forward(self, x):
        return self.head(x)


class Elementwise(nn.Module):
    """Elementwise ops (prep/elementwise.py): a fused ReLU's gradient pass (activation_grad), a PReLU (its slope a
    parameter per channel), GELU (erf) and tanh on their own, a parameter per channel, a constant broadcast over the
    channels and columns, an odd power, and an activation broadcast over another's channels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.act = nn.PReLU(6)
        self.conv2 = nn.Conv2d(6, 6, 1)
        self.scale = nn.Parameter(torch.randn(6, 1, 1))
        self.register_buffer("shift", torch.randn(1, 5, 1))
        self.gate = nn.Conv2d(6, 1, 1)
        self.head = nn.Linear(6, 4)

    def forward(self, x):  # (3, 5, 4)
        y = torch.relu(self.conv(x))
        z = torch.tanh(F.gelu(self.act(self.conv2(y)))) * self.scale + self.shift
        z = torch.pow(z, 3) - torch.sigmoid(z) * self.gate(y)
        return self.head(z.mean((2, 3)))


class Dense(nn.Module):
    """Dense layers at a max batch of 16 (MAX_BATCH): the first and the last split-K, the first two sample-blocked
    (their generic kernels beside the WebGL2 routines: codegen/ops/dense.py), the first's tanh gradient fused into
    the second's grad_input."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(300, 64), nn.Linear(64, 256), nn.Linear(256, 7)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.tanh(self.a(x)))))


class Convs(nn.Module):
    """The conv family's generic kernels (ops/conv_kl.py): a grouped conv strided, dilated and padded unevenly, a
    3x3 one of 8 channels, a transposed one with a fused activation. (Short sums: the float32 WGSL against float64 JavaScript.)"""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.wide = nn.Conv2d(8, 8, 3, padding=1)  # (its vectorised kernels' tap loop printed as a loop in WGSL)
        self.grouped = nn.Conv2d(8, 6, 3, stride=2, dilation=2, padding=(2, 1), groups=2)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.up = nn.ConvTranspose2d(6, 5, 3, stride=2, padding=1, output_padding=1)
        self.head = nn.Linear(5, 4)

    def forward(self, x):  # (3, 7, 6)
        y = self.dw(torch.tanh(self.grouped(torch.relu(self.wide(torch.relu(self.stem(x)))))))
        return self.head(torch.relu(self.up(y)).mean((2, 3)))


MODELS = {"pools": (Pools, (3, 11, 9), "float32"), "tokens": (Tokens, (5, 7), "float32"),
          "merges": (Merges, (3, 5, 6), "float32"), "embedded": (Embedded, (6,), "int64"),
          "resampled": (Resampled, (3, 5, 4), "float32"), "tokened": (Tokened, (5, 7), "float32"),
          "normed": (Normed, (7, 6), "float32"), "classes": (Classes, (5,), "float32"),
          "elementwise": (Elementwise, (3, 5, 4), "float32"), "dense": (Dense, (300,), "float32"),
          "convs": (Convs, (3, 7, 6), "float32")}
MAX_BATCH = {"dense": 16}  # (the textures' samples where not BATCH: a sample-blocked layer's from blocking.BLOCK_MIN_BATCH on)
# the random textures' scale where not 2: the WGSL sums in float32, the JavaScript in float64, and a dense layer's
# 300 products of values of that scale would sum to ~70, whose float32 rounding (~1e-5) is past the tolerance where
# the sum nearly cancels; at 1/4, ~1, and its rounding ~1e-7 (merges: a dense layer of 210 inputs; convs: a 3x3
# conv of 8 channels, 72 products a sum)
SCALE = {"dense": 0.25, "merges": 0.25, "convs": 0.25}


def kl_passes(name):
    """The passes of every distinct kernel written in the kernel language that the model's forward, backward and
    losses schedule, with the layout plan."""
    factory, shape, dtype = MODELS[name]
    torch.manual_seed(0)
    graph = fuse_activations(fold_batchnorm(to_ir(export_simplified(factory(), shape, input_dtype=dtype), shape, dtype)))
    plan = plan_layout(graph, MAX_BATCH.get(name, BATCH))
    s = build_schedule(graph, plan)
    seen, out = set(), []
    for p in s.forward + s.backward + [p for kinds in s.loss for passes in kinds.values() for p in passes]:
        # (a WebGL2 routine's column-blocked draw, into or from the parts col0..7: its generic kernel is the plain
        # forward's, printed reading X whole; a sample-blocked one's runs, writing the tensor whole, below)
        laid_out = p.kernel.routine and p.wide is not None
        if p.kernel.kl is not None and p.kernel.name not in seen and not laid_out:
            seen.add(p.kernel.name)
            out.append((p, plan))
    return out


@pytest.fixture(scope="module")
def gpu_page(browser_type, site):
    b = browser_type.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS + ["--enable-unsafe-webgpu"])
    page = b.new_page()
    page.goto(f"{site.url}/index.html")
    assert page.evaluate("async () => !!(navigator.gpu && await navigator.gpu.requestAdapter())"), "no WebGPU adapter"
    yield page
    b.close()


RUN = """async ({ code, inputs, outputs, rows, width, fields, grid }) => {
  const adapter = await navigator.gpu.requestAdapter();
  // (the adapter's own limit of storage buffers: interleave reads 8 parts and writes 1, past WebGPU's default of 8;
  // only the CPU and this check run it: a blocked layout is WebGL2's routines')
  const device = await adapter.requestDevice({ requiredLimits: {
    maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage } });
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ code });
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((m) => m.type === 'error');
  if (errors.length) return { error: errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join('\\n') };
  const pipeline = device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: 'main' } });
  const buffer = (bytes, usage) => device.createBuffer({ size: Math.max(16, bytes), usage });
  const entries = [];
  for (const data of inputs) {
    const b = buffer(data.length * 4, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST);
    device.queue.writeBuffer(b, 0, Float32Array.from(data));
    entries.push(b);
  }
  const outs = [], reads = [], bytes = rows * width * 16;
  for (let i = 0; i < outputs; i++) {
    outs.push(buffer(bytes, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC));
    reads.push(buffer(bytes, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST));
  }
  const d = new ArrayBuffer(Math.ceil(fields.length / 4) * 16), ints = new Int32Array(d), floats = new Float32Array(d);
  fields.forEach(([type, v], i) => { if (type === 'i32') ints[i] = v; else floats[i] = v; });
  const u = buffer(d.byteLength, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
  device.queue.writeBuffer(u, 0, d);
  const group = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0),
    entries: [...entries, ...outs, u].map((b, binding) => ({ binding, resource: { buffer: b } })) });
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(0, group);
  pass.dispatchWorkgroups(grid[0], grid[1]);
  pass.end();
  outs.forEach((b, i) => enc.copyBufferToBuffer(b, 0, reads[i], 0, bytes));
  device.queue.submit([enc.finish()]);
  const result = [];
  for (const r of reads) {
    await r.mapAsync(GPUMapMode.READ);
    result.push(Array.from(new Float32Array(r.getMappedRange().slice(0, bytes))));
    r.unmap();
  }
  const e = await device.popErrorScope();
  device.destroy();
  return e ? { error: e.message } : { result };
}"""


def _run_js(fn: str, consts: dict, inputs: list[np.ndarray], widths: list[int], outputs: int, rows: int,
            width: int, values: dict | None = None) -> list[np.ndarray]:
    script = f"""
const fn = {fn};
const src = {json.dumps([a.reshape(-1).tolist() for a in inputs])};
const ins = src.map((d, i) => ({{ width: {json.dumps(widths)}[i], data: Float32Array.from(d) }}));
const outs = Array.from({{ length: {outputs} }}, () => ({{ width: {width}, data: new Float32Array({rows * width * 4}) }}));
fn({json.dumps(consts)}, ins, outs, {json.dumps({**UNIFORMS, **(values or {})})}, {rows});
console.log(JSON.stringify(outs.map((o) => Array.from(o.data))));
"""
    # (the script on stdin: a large model's textures pass the limit of one command-line argument)
    got = subprocess.run(["node"], input=script, capture_output=True, text=True, check=True).stdout
    return [np.array(o, dtype=np.float64) for o in json.loads(got)]


# what each model schedules among the kernels written in the kernel language (a family migrated to it joins here)
EXPECTED = {"pools": {"avgpool_forward", "avgpool_grad", "global_avgpool_forward", "global_avgpool_grad",
                      "cross_entropy_grad", "cross_entropy_value", "log_softmax_forward", "maxpool_forward", "maxpool_grad", "conv_grad_bias", "dense_grad_bias",
                      "samples_last", "conv_forward", "conv_grad_input", "conv_grad_weight"},
            "tokens": {"matmul_forward", "matmul_grad_a", "matmul_grad_weight", "reduce_forward", "reduce_grad",
                       "softmax_forward", "softmax_grad", "grad_sum", "mse_grad", "mse_value"},
            "merges": {"concat_forward", "concat_grad", "flatten_forward", "flatten_grad", "conv_grad_bias",
                       "dense_grad_bias", "dropout"},
            "embedded": {"embedding_forward", "embedding_grad_weight", "matmul_forward", "matmul_grad_weight",
                         "reduce_forward", "reduce_grad"},
            "resampled": {"resample", "gather", "gather_grad", "conv_grad_bias", "dense_grad_bias"},
            "tokened": {"gather", "gather_grad"},
            "normed": {"layernorm_forward", "layernorm_grad_input", "layernorm_grad_weight", "matmul_forward",
                       "matmul_grad_a", "matmul_grad_b", "matmul_grad_weight", "rows_sum"},
            "classes": {"cross_entropy_stats", "cross_entropy_grad", "cross_entropy_value"},
            "elementwise": {"elementwise_forward", "elementwise_grad", "activation_grad"},
            "dense": {"dense_forward", "dense_reduce", "dense_grad_input", "dense_grad_weight", "dense_grad_bias",
                      "interleave", "samples_last"},
            "convs": {"conv_forward", "conv_grad_input", "conv_grad_weight", "conv_transpose", "conv_grad_bias",
                      "samples_last"}}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_wgsl_computes_what_the_cpu_kernels_compute(gpu_page, model):
    passes = kl_passes(model)
    kinds = {p.kernel.name.split(" ")[0] for p, _ in passes}
    assert kinds >= EXPECTED[model], f"{model} schedules {sorted(kinds)}"
    rng = np.random.default_rng(1)
    for p, plan in passes:
        k, names = p.kernel, p.kernel.inputs
        specs = [plan.textures[t] for t in p.inputs]
        # a WebGL2 routine's generic kernel (Kernel.routine) writes its own outputs: a blocked one's, the whole tensor
        # the routine's parts (blk0..7:T) hold, which the CPU deals out (runtime/cpu.js: cpuBlocked)
        outputs = len(k.kl.written) if k.routine else k.outputs
        out = plan.textures[p.outputs[0].split(":", 1)[1] if p.outputs[0].startswith("blk") else p.outputs[0]]
        rows, width = out.height, out.width
        data = [(rng.standard_normal((s.height, s.width, 4)) * SCALE.get(model, 2)).astype(np.float32) for s in specs]
        for i, t in enumerate(p.inputs):  # a loss's labels: class ids; its softmax statistics: a sum above 0
            if t == "labels":
                data[i][:, :, 0] = rng.integers(0, k.kl.symbols["classes"], data[i].shape[:2])
            if t == "ce_stats":
                data[i][:, :, 1] = np.abs(data[i][:, :, 1]) + 0.5
        values = {"rows": rows, "width": width, **{f"w_{n}": s.width for n, s in zip(names, specs)},
                  **UNIFORMS, **p.values}
        ref = _run_js(js(k.kl, list(names), outputs), k.kl.symbols, data, [s.width for s in specs], outputs,
                      rows, width, p.values)
        # the generic kernel, and the kernel WebGPU runs in its place (Kernel.wgsl_kl: a conv's vectorised one, ops/
        # conv_vec.py, several rows an invocation written in place, the dispatch over the blocks of rows)
        for kdef, scatter, cols in [(k.kl, 0, 1)] + ([(k.wgsl_kl, k.scatter, k.cols)] if k.wgsl_kl is not None else []):
            fields = struct_fields(kdef, list(names))
            code = wgsl(kdef, list(names), outputs, scatter, cols)
            parts = k.split[0] if k.split and kdef is k.wgsl_kl else 1  # (its output: `parts` blocks of the rows)
            drawn = -(-rows * parts // (scatter or 1))
            got = gpu_page.evaluate(RUN, {"code": code, "inputs": [d.reshape(-1).tolist() for d in data],
                                          "outputs": outputs, "rows": rows * parts, "width": width,
                                          "fields": [[t, dict(values, rows=drawn)[n]] for n, t in fields],
                                          "grid": list(dispatch(drawn, width // cols))})
            assert "error" not in got, f"{k.name}: {got.get('error')}\n{code}"
            if parts > 1:  # (partial sums, row p*rows + r part p of row r's: their sum)
                got["result"] = [np.asarray(g).reshape(parts, rows, -1).sum(0).reshape(-1) for g in got["result"]]
            # (a vectorised kernel of batch rows computes the batch's, u_batch samples: the generic one, every row)
            n = BATCH * (out.sample_rows or 1) if kdef is k.wgsl_kl and p.rows == "batch" else rows
            for i, (g, r) in enumerate(zip(got["result"], ref)):
                np.testing.assert_allclose(np.asarray(g).reshape(rows, -1)[:n], r.reshape(rows, -1)[:n], rtol=2e-5,
                                           atol=2e-6, err_msg=f"{k.name} out{i}")
    print(model, sorted(kinds))


def test_wgsl_unrolls_lane_loops_and_keeps_long_bodies_rolled():
    """kl_wgsl.UNROLL_BUDGET: a short loop whose variable indexes a lane is unrolled however long its body; a 3x3
    conv's taps around its 4 channel texels and 8 rows an invocation stay a loop (unrolled, SwiftShader ran them
    2-3x slower), its innermost loop of 4 unrolled; a conv of 1 input channel, whose whole body is short,
    unrolled."""
    from texelfit.codegen.ops import conv_kl, conv_vec

    def consts(ic, oc):
        return dict(ih=13, iw=13, ic=ic, ic4=-(-ic // 4), oc=oc, oc4=-(-oc // 4), oh=11, ow=11, kh=3, kw=3, sh=1,
                    sw=1, pt=0, pl=0, dh=1, dw=1, groups=1, depthwise=False, has_bias=False, icg=ic, ocg=oc)
    wide = wgsl(conv_vec.forward_vec_kl(consts(16, 16), block=8), ["X", "W"], 1, scatter=8)
    assert "for (var v_a: i32" in wide and "const v_k4: i32 = 3;" in wide
    assert "for (" not in wgsl(conv_vec.forward_vec_kl(consts(1, 8), block=8), ["X", "W"], 1, scatter=8)
    generic = wgsl(conv_kl.forward_kl(consts(16, 16)), ["X", "W"], 1)  # (its loop over a texel's 4 lanes)
    assert "const v_j: i32 = 3;" in generic and "for (var v_j" not in generic


def test_dispatch_covers_large_outputs():
    """More texels than 65,535 workgroups of 64 hold in one row of the grid: the grid goes over y too."""
    for rows, width in [(1, 1), (3, 100), (70_000, 64), (4096, 4096)]:
        x, y = dispatch(rows, width)
        assert x <= 65535 and y <= 65535 and x * y * 64 >= rows * width > x * (y - 1) * 64


@pytest.mark.parametrize("k,p", [(16, 40), (24, 36), (32, 64), (8, 6)])
def test_row_blocked_matmul_wgsl_of_several_texels(gpu_page, k, p):
    """A row-blocked token matmul as WebGPU runs it (ops/matmul.py: _rows_twins): 8 rows and 1, 2 or 4 output texels
    an invocation (kl_wgsl.wgsl's scatter and cols; every count dividing the output's width, and wgsl_cols' choice
    among them), its forward, input gradient and weight gradient, against the one-row kernels printed as the CPU's
    JavaScript and against numpy: 3 samples of 16 tokens, a weight [k, p] with a bias (widths of 10, 9, 16 and 2
    texels; inputs of 4, 6, 8, 2)."""
    from texelfit.codegen.ops.matmul import (_forward_kl, _forward_rows_kl, _grad_a_kl, _grad_a_rows_kl,
                                             _grad_weight_kl, _grad_weight_rows_kl, wgsl_cols)

    rng = np.random.default_rng(k * p)
    tokens, p4, k4 = 16, -(-p // 4), -(-k // 4)
    rows = BATCH * tokens
    c = dict(groups=1, m=tokens, k=k, k4=k4, p=p, p4=p4, rows_a=tokens, rows_b=0, weight=True, has_bias=True)

    def packed(a):  # (R, F) -> R rows of ceil(F / 4) texels, the padding lanes 0
        out = np.zeros((a.shape[0], -(-a.shape[1] // 4) * 4), np.float32)
        out[:, :a.shape[1]] = a
        return out.reshape(a.shape[0], -1, 4)

    a, w, bias, dy = (rng.standard_normal(s).astype(np.float32) for s in ((rows, k), (k, p), (1, p), (rows, p)))
    cases = [("forward", _forward_kl, _forward_rows_kl, {"A": a, "B": w, "BIAS": bias}, rows, a @ w + bias),
             ("grad_a", _grad_a_kl, _grad_a_rows_kl, {"DY": dy, "B": w}, rows, dy @ w.T)]
    if k % 8 == 0:
        cases.append(("grad_weight", _grad_weight_kl, _grad_weight_rows_kl, {"A": a, "DY": dy}, k,
                      a.T @ dy / UNIFORMS["u_loss_scale"]))
    for what, one, blocked, ins, out_rows, want in cases:
        names, data = list(ins), [packed(x) for x in ins.values()]
        width = data[-1].shape[1] if what != "grad_a" else k4
        ref = _run_js(js(one(c), names, 1), one(c).symbols, data, [d.shape[1] for d in data], 1, out_rows, width)[0]
        np.testing.assert_allclose(ref.reshape(out_rows, -1)[:, :want.shape[1]], want, rtol=1e-4, atol=1e-4)
        counts = [n for n in (1, 2, 4) if width % n == 0]
        assert wgsl_cols(width) == counts[-1]
        for cols in counts:
            kdef = blocked(c, 8, cols)
            values = {"rows": out_rows // 8, "width": width, **{f"w_{n}": d.shape[1] for n, d in zip(names, data)},
                      **UNIFORMS}
            code = wgsl(kdef, names, 1, scatter=8, cols=cols)
            got = gpu_page.evaluate(RUN, {"code": code, "inputs": [d.reshape(-1).tolist() for d in data],
                                          "outputs": 1, "rows": out_rows, "width": width,
                                          "fields": [[t, values[n]] for n, t in struct_fields(kdef, names)],
                                          "grid": list(dispatch(out_rows // 8, width // cols))})
            assert "error" not in got, f"{what} {cols}: {got.get('error')}\n{code}"
            np.testing.assert_allclose(np.asarray(got["result"][0]), ref, rtol=2e-5, atol=2e-5,
                                       err_msg=f"{what}, {cols} texels an invocation")


def test_interleave_cols_wgsl(gpu_page):
    """interleave_cols (ops/conv_kl.py), which only a column-blocked conv past blocking.COLUMN_BLOCK_MIN_MACS schedules
    (sums too long for the models above): 9 channel texels a position (halves of 5, the last one short), 23 positions
    (a partial last block of 4), from 8 parts, as the JavaScript and numpy place them."""
    from texelfit.codegen.ops.conv_kl import interleave_cols_kl
    from texelfit.codegen.webgl2.blocking import COLUMN_BLOCK, COLUMN_HALVES

    b, nh, c4, ow, rows = COLUMN_BLOCK, COLUMN_HALVES, 9, 23, 3
    qb, c4h = -(-ow // b), -(-c4 // nh)
    k, names = interleave_cols_kl(b, nh), [f"T{t}" for t in range(b * nh)]
    rng = np.random.default_rng(4)
    y = rng.standard_normal((rows, ow * c4, 4)).astype(np.float32)
    parts = [np.zeros((rows, c4h * qb, 4), np.float32) for _ in names]
    for p in range(ow):
        for j in range(c4):
            g = j // c4h
            parts[b * g + p % b][:, (j - g * c4h) * qb + p // b] = y[:, p * c4 + j]
    width, uniforms = ow * c4, dict(UNIFORMS, u_c4=c4, u_qb=qb)
    values = {"rows": rows, "width": width, **{f"w_{n}": c4h * qb for n in names}, **uniforms}
    got = gpu_page.evaluate(RUN, {"code": wgsl(k, names, 1), "inputs": [d.reshape(-1).tolist() for d in parts],
                                  "outputs": 1, "rows": rows, "width": width,
                                  "fields": [[t, values[n]] for n, t in struct_fields(k, names)],
                                  "grid": list(dispatch(rows, width))})
    assert "error" not in got, got.get("error")
    ref = _run_js(js(k, names, 1), k.symbols, parts, [c4h * qb] * len(names), 1, rows, width, uniforms)
    np.testing.assert_array_equal(ref[0], y.reshape(-1))
    np.testing.assert_array_equal(np.asarray(got["result"][0]), y.reshape(-1))


# the optimizers (ops/optim.py): their update as WGSL, the gradient an input G (kl.py: gradient) as on the CPU, the
# proximal variant computed always (u_mu and P0 bound as the CPU binds them), against the printed JavaScript
_OPT_UNIFORMS = {"u_lr": 0.05, "u_wd": 0.01, "u_mu": 0.7, "u_momentum": 0.9, "u_dampening": 0.3, "u_nesterov": 1.0,
                 "u_first": 0.0, "u_decoupled": 0.0, "u_beta1": 0.9, "u_beta2": 0.99, "u_eps": 1e-6,
                 "u_step_size": 0.05 / (1 - 0.9 ** 3), "u_bc2_sqrt": (1 - 0.99 ** 3) ** 0.5}


@pytest.mark.parametrize("opt", ["sgd0", "sgd", "sgd_first", "adam", "adamw"])
def test_wgsl_optimizers_compute_what_the_cpu_updates_compute(gpu_page, opt):
    from test_kl import _run_update

    from texelfit.codegen.ops.optim import adam_kl, sgd_kl

    k = adam_kl() if opt.startswith("adam") else sgd_kl(opt == "sgd0")
    names = ["G", "P0", "P", "M", "V"][: 3 + len(k.written) - 1]
    u = _OPT_UNIFORMS | {"u_decoupled": float(opt == "adamw"), "u_first": float(opt == "sgd_first")}
    rows, width = 3, 70  # (more texels than a workgroup)
    rng = np.random.default_rng(5)
    data = [rng.standard_normal((rows, width, 4)).astype(np.float32) for _ in names]
    data[-1] = np.abs(data[-1]) if opt.startswith("adam") else data[-1]  # Adam's V: a sum of squares
    fields = struct_fields(k, names)
    values = {"rows": rows, "width": width, **{f"w_{n}": width for n in names}, **u}
    code = wgsl(k, names, len(k.written))
    got = gpu_page.evaluate(RUN, {"code": code, "inputs": [d.reshape(-1).tolist() for d in data],
                                  "outputs": len(k.written), "rows": rows, "width": width,
                                  "fields": [[t, values[n]] for n, t in fields], "grid": list(dispatch(rows, width))})
    assert "error" not in got, f"{opt}: {got.get('error')}\n{code}"
    ref = _run_update(k, dict(zip(names, data)), len(k.written), u)
    for i, (g, r) in enumerate(zip(got["result"], ref)):
        np.testing.assert_allclose(np.asarray(g), r.reshape(-1), rtol=2e-5, atol=2e-6, err_msg=f"{opt} out{i}")
