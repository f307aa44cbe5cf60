"""The conv family's generic kernels (codegen/ops/conv_kl.py), which the CPU backend and WGSL run beside the
hand-written WebGL2 routines (Kernel.routine):

  * each printed as JavaScript and run in node against PyTorch on odd shapes: groups, strides, dilations,
    asymmetric padding, a batch short of the texture (rows past it hold NaN: never read), padding lanes;
  * a model's passes run on WebGL2 (the routines: sample-blocked from blocking.BLOCK_MIN_BATCH on, column-blocked,
    4x4 channel blocks, depthwise) and on the CPU backend (the generic kernels, dealt out by cpuBlocked and
    cpuColumns) with the same weights and batch: the outputs and every gradient against each other and PyTorch.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from codegen.kl_print import glsl
from codegen.ops import conv_vec
from codegen.ops.conv_kl import forward_kl, grad_input_kl, grad_weight_kl, interleave_cols_kl
from helpers import FWD, GRAD, assert_close, build_module, run_kl_js, run_model
from models import ColumnChain, TransposedConvs
from texelfit.codegen.webgl2.blocking import BLOCK_MIN_BATCH, COLUMN_BLOCK, COLUMN_HALVES
from texelfit.prep.packing import ceil_div

BATCH, MAX_BATCH = 5, 8  # (the textures hold 8 samples: the kernels read the first u_batch)


def _act_tex(a: np.ndarray, samples: int = MAX_BATCH) -> np.ndarray:
    """(N, C, H, W) -> the texture [samples*H, W*C4, 4], rows n*H + h, texel w*C4 + c/4; rows past N NaN."""
    n, c, h, w = a.shape
    c4 = ceil_div(c, 4)
    t = np.full((samples, h, w, c4 * 4), np.nan)
    t[:n] = 0.0
    t[:n, :, :, :c] = a.transpose(0, 2, 3, 1)
    return t.reshape(samples * h, w * c4, 4).astype(np.float32)


def _from_tex(t: np.ndarray, n: int, c: int, h: int, w: int) -> np.ndarray:
    c4 = ceil_div(c, 4)
    a = t.reshape(n, h, w, c4 * 4)
    assert not a[..., c:].any(), "padding lanes are zero"
    return a[..., :c].transpose(0, 3, 1, 2)


def _weight_tex(wt: np.ndarray) -> np.ndarray:
    """W[oc, icg, kh, kw] -> [kh*icg rows, kw*oc4 texels]: texel (kh*icg + j, kw*oc4 + oc/4), lane oc % 4."""
    oc, icg, kh, kw = wt.shape
    oc4 = ceil_div(oc, 4)
    t = np.zeros((kh, icg, kw, oc4 * 4))
    t[..., :oc] = wt.transpose(2, 1, 3, 0)
    return t.reshape(kh * icg, kw * oc4, 4).astype(np.float32)


def _samples_last(x: np.ndarray, nb4: int) -> np.ndarray:
    """X (N, C, H, W) with the samples as channels: texel (c*H + h, w*nb4 + n/4), lane n % 4, zero past N."""
    n, c, h, w = x.shape
    t = np.zeros((c, h, w, nb4 * 4))
    t[..., :n] = x.transpose(1, 2, 3, 0)
    return t.reshape(c * h, w * nb4, 4).astype(np.float32)


def _bias_tex(b: np.ndarray) -> np.ndarray:
    t = np.zeros(ceil_div(len(b), 4) * 4)
    t[:len(b)] = b
    return t.reshape(1, -1, 4).astype(np.float32)


# ic, oc, groups, kernel, stride, pads (t, l, b, r), dilation, ih, iw
SHAPES = {
    "plain_3x3": (3, 5, 1, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 6, 7),
    "grouped_strided_dilated_asymmetric": (6, 10, 2, (3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 7, 9),
    "depthwise_padded": (5, 5, 5, (3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 5, 8),
    "depthwise_multiplier_1x1": (3, 9, 3, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 5, 5),
    "wide_channels_kernel_2x3": (9, 7, 1, (2, 3), (1, 2), (0, 1, 1, 0), (2, 1), 6, 7),
    "channels_of_whole_texels_strided": (8, 12, 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 7, 6),
    # (WebGPU's forward and input gradient 2 texels an invocation, 2 blocks of them a position: 16 output channels,
    # 13 input ones, a lane short)
    "two_blocks_of_texels_a_position": (13, 16, 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 5, 6),
}


def _case(name: str, rng):
    ic, oc, g, (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw), ih, iw = SHAPES[name]
    x = torch.tensor(rng.standard_normal((BATCH, ic, ih, iw)), dtype=torch.float64, requires_grad=True)
    w = torch.tensor(rng.standard_normal((oc, ic // g, kh, kw)), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(rng.standard_normal(oc), dtype=torch.float64)
    y = F.conv2d(F.pad(x, (pl, pr, pt, pb)), w, b, (sh, sw), 0, (dh, dw), g)
    oh, ow = y.shape[2:]
    c = dict(ic=ic, ih=ih, iw=iw, oc=oc, oh=oh, ow=ow, ic4=ceil_div(ic, 4), oc4=ceil_div(oc, 4), kh=kh, kw=kw,
             sh=sh, sw=sw, pt=pt, pl=pl, dh=dh, dw=dw, icg=ic // g, ocg=oc // g, has_bias=True,
             nb4=ceil_div(MAX_BATCH, 4), groups=g, depthwise=g == ic == oc)
    return c, x, w, b, y


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_conv_forward_printed_as_javascript(name):
    rng = np.random.default_rng(len(name))
    c, x, w, b, y = _case(name, rng)
    ins = {"X": _act_tex(x.detach().numpy()), "W": _weight_tex(w.detach().numpy()), "B": _bias_tex(b.numpy())}
    got = run_kl_js(forward_kl(c, "tanh", {}), ins, c["ow"] * c["oc4"], BATCH * c["oh"], {})
    np.testing.assert_allclose(_from_tex(got, BATCH, c["oc"], c["oh"], c["ow"]), torch.tanh(y).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    glsl(forward_kl(c, "tanh", {}))  # (it prints)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_conv_grad_input_and_weight_printed_as_javascript(name):
    rng = np.random.default_rng(len(name) + 1)
    c, x, w, b, y = _case(name, rng)
    dz = torch.tensor(rng.standard_normal(y.shape), dtype=torch.float64)
    dx, dw = torch.autograd.grad(y, (x, w), dz)
    got = run_kl_js(grad_input_kl(c), {"DZ": _act_tex(dz.numpy()), "W": _weight_tex(w.detach().numpy())},
               c["iw"] * c["ic4"], BATCH * c["ih"], {})
    np.testing.assert_allclose(_from_tex(got, BATCH, c["ic"], c["ih"], c["iw"]), dx.numpy(), rtol=1e-5, atol=1e-5)
    scale = 4.0  # the loss gradient comes scaled (u_loss_scale)
    ins = {"DZ": _act_tex(dz.numpy() * scale), "XT": _samples_last(x.detach().numpy(), c["nb4"])}
    rows = c["kh"] * c["icg"]
    got = run_kl_js(grad_weight_kl(c), ins, c["kw"] * c["oc4"], rows + 3, {"u_batch": BATCH, "u_loss_scale": scale})
    assert not got[rows:].any(), "rows past the weight's (a blocked part's padding) are zero"
    want = _weight_tex(dw.numpy())
    np.testing.assert_allclose(got[:rows], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["grouped_strided_dilated_asymmetric", "depthwise_padded", "plain_3x3"])
def test_conv_transpose_forward_printed_as_javascript(name):
    """A conv_transpose is the input gradient of the conv C with its weight (ops/conv_transpose.py), plus its bias and
    activation: grad_input_kl with `bias`, against torch's conv_transpose2d (C's pads, output_padding absorbed)."""
    rng = np.random.default_rng(len(name) + 2)
    c, x, w, b, y = _case(name, rng)
    z = torch.tensor(rng.standard_normal(y.shape), dtype=torch.float64)  # the transposed conv's input: C's output
    bt = torch.tensor(rng.standard_normal(c["ic"]), dtype=torch.float64)
    want = torch.tanh(torch.autograd.grad(y, x, z)[0] + bt[None, :, None, None])
    ins = {"DZ": _act_tex(z.numpy()), "W": _weight_tex(w.detach().numpy()), "B": _bias_tex(bt.numpy())}
    got = run_kl_js(grad_input_kl(c, True, "tanh", {}), ins, c["iw"] * c["ic4"], BATCH * c["ih"], {})
    np.testing.assert_allclose(_from_tex(got, BATCH, c["ic"], c["ih"], c["iw"]), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [1, conv_vec.ROWS])
@pytest.mark.parametrize("name", [n for n in sorted(SHAPES) if conv_vec.applies(_case(n, np.random.default_rng())[0])])
def test_vectorised_kernels_compute_what_the_generic_ones_do(name, block):
    """WebGPU's vectorised conv kernels (ops/conv_vec.py: groups 1 and depthwise; whole texels of input channels and
    a rest, 4 samples a fetch of XT and a rest), forward and grad_input one row or `block` rows an invocation
    (the last block past the batch's rows: not written) and grad_weight whole or split into partial sums over the
    output's rows (split_sum_kl adds them), printed as JavaScript, against the generic
    kernels on the same inputs and against PyTorch; a batch short of the texture (rows past it NaN)."""
    rng = np.random.default_rng(len(name) + 3)
    c, x, w, b, y = _case(name, rng)
    # (block 1: the weight gradient one row an invocation, whole; else as WebGPU runs it, the test's small weights
    # split, and 4 channels an invocation where they fill texels)
    split, chans = (conv_vec.split_of(c), conv_vec.chans_of(c)) if block > 1 else (1, 1)
    assert block == 1 or split > 1
    dz = torch.tensor(rng.standard_normal(y.shape), dtype=torch.float64)
    dx, dw = torch.autograd.grad(y, (x, w), dz)
    xs, ws = _act_tex(x.detach().numpy()), _weight_tex(w.detach().numpy())
    scale, rows = 4.0, c["kh"] * c["icg"]
    u = {"u_batch": BATCH, "u_loss_scale": scale}
    # (block > 1: as WebGPU runs them, several output texels an invocation where a conv of groups 1 has them)
    fcols, icols = (conv_vec.wgsl_cols(c, "oc4"), conv_vec.wgsl_cols(c, "ic4")) if block > 1 else (1, 1)
    runs = [({"X": xs, "W": ws, "B": _bias_tex(b.numpy())}, c["ow"] * c["oc4"], BATCH * c["oh"],
             conv_vec.forward_vec_kl(c, "tanh", {}, block, fcols), forward_kl(c, "tanh", {}), block, fcols),
            ({"DZ": _act_tex(dz.numpy()), "W": ws}, c["iw"] * c["ic4"], BATCH * c["ih"],
             conv_vec.grad_input_vec_kl(c, block, icols), grad_input_kl(c), block, icols),
            ({"DZ": _act_tex(dz.numpy() * scale), "XT": _samples_last(x.detach().numpy(), c["nb4"])},
             c["kw"] * c["oc4"], rows + 4, conv_vec.grad_weight_vec_kl(c, split, chans), grad_weight_kl(c), chans)]
    got = [(run_kl_js(vec, ins, width, n, u, blocks, cols), run_kl_js(generic, ins, width, n, u))
           for ins, width, n, vec, generic, blocks, cols in runs[:2]]
    ins, width, n, vec, generic, _ = runs[2]
    if split == 1:
        got.append((run_kl_js(vec, ins, width, n, u, chans), run_kl_js(generic, ins, width, n, u)))
    else:  # (row p*rows + r holds part p of row r's sum; split_sum_kl adds them, zero past the weight's rows)
        parts = run_kl_js(vec, ins, width, split * rows, u, chans)
        summed = run_kl_js(conv_vec.split_sum_kl(split, rows), {"P": parts.astype(np.float32)}, width, n, {})
        np.testing.assert_allclose(summed[:rows], parts.reshape(split, rows, width, 4).sum(0), rtol=1e-6, atol=1e-6)
        got.append((summed, run_kl_js(generic, ins, width, n, u)))
        # (and unsplit, `chans` rows an invocation: a weight of many texels)
        got.append((run_kl_js(conv_vec.grad_weight_vec_kl(c, 1, chans), ins, width, n, u, chans), got[-1][1]))
    for vec, generic in got:
        np.testing.assert_allclose(vec, generic, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_from_tex(got[0][0], BATCH, c["oc"], c["oh"], c["ow"]), torch.tanh(y).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_from_tex(got[1][0], BATCH, c["ic"], c["ih"], c["iw"]), dx.numpy(), rtol=1e-5,
                               atol=1e-5)
    assert not got[2][0][rows:].any(), "rows past the weight's are zero"
    np.testing.assert_allclose(got[2][0][:rows], _weight_tex(dw.numpy()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c4,ow", [(9, 23), (5, 4), (1, 7)])
def test_interleave_cols_printed_as_javascript(c4, ow):
    """Y's texel k of position p from part block*g + p % block, texel column (k - g*c4h) * qb + p / block."""
    b, nh = COLUMN_BLOCK, COLUMN_HALVES
    qb, c4h, rows = ceil_div(ow, b), ceil_div(c4, nh), 3
    rng = np.random.default_rng(c4)
    y = rng.standard_normal((rows, ow * c4, 4)).astype(np.float32)
    parts = [np.full((rows, c4h * qb, 4), np.nan, np.float32) for _ in range(b * nh)]
    for p in range(ow):
        for k in range(c4):
            g = k // c4h
            parts[b * g + p % b][:, (k - g * c4h) * qb + p // b] = y[:, p * c4 + k]
    got = run_kl_js(interleave_cols_kl(b, nh), {f"T{t}": parts[t] for t in range(b * nh)}, ow * c4, rows,
               {"u_c4": c4, "u_qb": qb})
    np.testing.assert_array_equal(got, y)


# ---- the routines (WebGL2) against the generic kernels (the CPU backend) on the same inputs ------------------------

class MixedConvs(nn.Module):
    """groups 1 convs past blocking.SAMPLE_BLOCK_MIN_MACS (their forward, grad_input and weight gradient sample-blocked
    from BLOCK_MIN_BATCH samples on), a grouped one strided, dilated and asymmetrically padded (a ZeroPad2d taken into
    its pads), a depthwise one, a 2x3 kernel with an uneven stride; fused activations."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.grouped = nn.Conv2d(16, 8, 3, stride=2, dilation=2, groups=2)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.wide = nn.Conv2d(8, 12, (2, 3), stride=(1, 2), padding=(1, 0))

    def forward(self, x):
        y = torch.relu(self.stem(x))
        y = torch.tanh(self.grouped(F.pad(y, (1, 0, 2, 1))))
        return self.wide(torch.sigmoid(self.dw(y)))


def _column_blocked():
    from models import CNN_CASES

    return CNN_CASES["conv_column_blocked"][0]()


# name -> (factory, per-sample shape, loss, batch, trainable)
ROUTINE_CASES = {
    "mixed_sample_blocked": (MixedConvs, (3, 13, 11), "mse", BLOCK_MIN_BATCH + 2, "*"),
    "mixed_one_sample": (MixedConvs, (3, 13, 11), "mse", 3, "*"),
    "column_blocked": (_column_blocked, (3, 19, 19), "mse", BLOCK_MIN_BATCH + 1, "*"),
    "column_parts_read": (ColumnChain, (3, 23, 23), "cross_entropy", 3, "fc.*"),
    "conv_transpose": (TransposedConvs, (3, 5, 4), "cross_entropy", BLOCK_MIN_BATCH, "*"),
}

BOTH = """
    const x = new Float32Array(args.x);
    const y = args.loss === 'cross_entropy' ? Int32Array.from(args.y) : new Float32Array(args.y);
    const out = Array.from(await m.predict(x, args.batch));
    const grads = arr(await m.gradients(x, y, { loss: args.loss }));
    const fit = await m.fit(x, y, { batchSize: args.batch, epochs: 2, shuffle: false, loss: args.loss,
                                    optimizer: { type: 'sgd', lr: 0.05, momentum: 0.9 } });
    return { out, grads, loss: fit.loss, weights: arr(await m.getWeights()), backend: m.info.backend };
"""


@pytest.mark.parametrize("case", sorted(ROUTINE_CASES))
def test_routines_and_generic_kernels_agree(web, site, case):
    """One bundle, fresh PyTorch init, one batch: predict, gradients and 2 SGD steps (momentum: the optimizer passes
    include the weight gradient, the routine's template on WebGL2 and the generic kernel's function on the CPU) on
    WebGL2 and on the CPU; each against the other and against PyTorch."""
    factory, shape, loss, batch, trainable = ROUTINE_CASES[case]
    torch.manual_seed(17)
    module = factory().eval()
    x = torch.randn((batch,) + shape)
    url = build_module(site, f"kl_conv_{case}", module, shape, max_batch=16, trainable=trainable)
    out = module(x)
    y = torch.randint(0, out.shape[1], (batch,)) if loss == "cross_entropy" else torch.randn(out.shape)
    args = {"x": x.reshape(-1).tolist(), "y": y.reshape(-1).tolist(), "loss": loss, "batch": batch}
    gl = run_model(web, url, BOTH, args)
    cpu = run_model(web, url, BOTH, args, {"backend": "cpu"})
    assert gl["backend"] == "webgl2" and cpu["backend"] == "cpu", (gl["backend"], cpu["backend"])
    bundle = web.evaluate("async (u) => (await fetch(u)).text()", url)
    routines = {"mixed_sample_blocked": "conv_forward 3x13x11->16x13x11 k3x3 s1x1 g1 relu blocked",
                "column_blocked": "conv_forward 3x19x19->32x19x19 k3x3 s1x1 g1 clip columns",
                "column_parts_read": "columns, read as columns"}
    if case in routines:  # (what WebGL2 ran: the routine; the CPU has no twin of it, only the generic kernels)
        assert routines[case] in bundle, case
    assert "const CPU_KERNELS" not in bundle and "function convForward" not in bundle  # (every CPU kernel printed)

    ref_loss = F.cross_entropy(out, y) if loss == "cross_entropy" else F.mse_loss(out, y)
    named = {n: p for n, p in module.named_parameters() if trainable == "*" or n.startswith("fc.")}
    for n, p in module.named_parameters():
        p.requires_grad_(n in named)
    ref_grads = dict(zip(named, torch.autograd.grad(ref_loss, list(named.values()))))
    assert sorted(gl["grads"]) == sorted(cpu["grads"]) == sorted(named)
    assert_close(f"{case} forward: cpu vs webgl2", cpu["out"], gl["out"], **FWD)
    for got in (gl, cpu):
        assert_close(f"{case} forward ({got['backend']})", got["out"], out.detach().numpy(), **FWD)
        for name, g in ref_grads.items():
            assert_close(f"{case} d/d{name} ({got['backend']})", got["grads"][name], g.numpy(), **GRAD)
    for name in named:
        assert_close(f"{case} d/d{name}: cpu vs webgl2", cpu["grads"][name], gl["grads"][name], **GRAD)

    from helpers import TRAJ_LOSS, TRAJ_W, torch_fit  # 2 steps of the same batch, as the page took them
    losses = torch_fit(module, torch.cat([x, x]), torch.cat([y, y]), loss,
                       {"type": "sgd", "lr": 0.05, "momentum": 0.9}, batch, 1)
    state = dict(module.named_parameters())
    for got in (gl, cpu):
        assert_close(f"{case} fit losses ({got['backend']})", got["loss"], losses, **TRAJ_LOSS)
        for name in named:
            assert_close(f"{case} {name} after 2 steps ({got['backend']})", got["weights"][name],
                         state[name].detach().numpy(), **TRAJ_W)
    for name in named:
        assert_close(f"{case} {name} after 2 steps: cpu vs webgl2", cpu["weights"][name], gl["weights"][name], **TRAJ_W)
