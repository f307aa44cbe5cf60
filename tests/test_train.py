"""Training parity with PyTorch: one step of each optimizer, and whole trajectories.

Same initial weights, same batches in the same order (shuffle: false, the last batch
partial), same settings; compared tensor by tensor and loss by loss, driven from a list.

Tolerances (float32 on both sides, summation order differs; errors grow with steps):
  one step      weights atol 1e-6 + rtol 1e-5 * |ref|
  trajectory    weights atol 2e-5 + rtol 2e-4 * |ref|, losses atol 1e-5 + rtol 1e-4
"""
from __future__ import annotations

import pytest

import torch
import torch.nn.functional as F

from helpers import ONE_STEP, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, build_module, check_training, run_model, \
    torch_state
from models import mlp_45_31_7, mlp_45_31_100, mlp_48_31_7, sample_blocked_mlp

@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_one_step(web, site, opt_name):
    check_training(web, site, mlp_45_31_7, (45,), opt_name, "cross_entropy", samples=13, batch_size=13, epochs=1,
                   tol_w=ONE_STEP, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("opt_name", ["sgd", "sgd_momentum_wd", "sgd_nesterov", "adam", "adamw"])
def test_trajectory(web, site, opt_name, loss):
    # 50 samples in batches of 16: 16, 16, 16 and a partial 2, for 3 epochs = 12 steps
    check_training(web, site, mlp_45_31_7, (45,), opt_name, loss, samples=50, batch_size=16, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


def test_long_trajectory_reads_losses_across_the_ring(web, site):
    # 150 steps: more than two loss-ring readbacks (64 steps each) plus a partial one
    check_training(web, site, mlp_45_31_7, (45,), "adam", "cross_entropy", samples=50, batch_size=1, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


def test_softmax_statistics_pass_from_many_classes():
    """From layout.CE_STATS_MIN_C4 texels of classes a sample on, cross_entropy's schedule starts with
    cross_entropy_stats (the softmax's max and sum a sample, into ce_stats), and its gradient and value
    passes read them; below, there is no such pass nor texture (the bundle is as it was)."""
    import json
    import re

    from helpers import compile_onnx, export_simplified

    def loss_kernels(factory):
        js = compile_onnx(export_simplified(factory(), (45,)), name="m", input_shape=(45,), max_batch=16).files["m.js"]
        kernels = json.loads(re.search(r"^const KERNELS = (.*);$", js, re.M).group(1))
        textures = [t["name"] for t in json.loads(re.search(r"^const TEXTURES = (.*);$", js, re.M).group(1))]
        ce = json.loads(re.search(r"^const SCHEDULE = (.*);$", js, re.M).group(1))["loss"][0]["cross_entropy"]
        return [(kernels[p["kernel"]]["name"], [textures[i] for i in p["inputs"]], [textures[i] for i in p["outputs"]])
                for p in ce], textures

    few, few_textures = loss_kernels(mlp_45_31_7)
    assert [k for k, _, _ in few] == ["cross_entropy_grad", "cross_entropy_value"] and "ce_stats" not in few_textures
    many, _ = loss_kernels(mlp_45_31_100)
    assert [k for k, _, _ in many] == ["cross_entropy_stats", "cross_entropy_grad", "cross_entropy_value"]
    assert many[0][2] == ["ce_stats"] and all("ce_stats" in inputs for _, inputs, _ in many[1:])


@pytest.mark.parametrize("options", [None, {"backend": "cpu"}, {"precision": "rgba8"}], ids=["webgl2", "cpu", "rgba8"])
def test_trajectory_of_a_classifier_with_softmax_statistics(web, site, options):
    """100 classes (25 texels a sample): the loss gradient and value read the softmax's max and sum from
    the cross_entropy_stats pass. 40 samples in batches of 16 (the last one partial), Adam, 3 epochs."""
    check_training(web, site, mlp_45_31_100, (45,), "adam", "cross_entropy", samples=40, batch_size=16, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options=options)


@pytest.mark.parametrize("shuffle", [False, True])
def test_trajectory_with_an_input_packed_as_it_is(web, site, shuffle):
    """48 inputs fill their texels with no padding: a batch is uploaded by copying the samples
    (model.js: isPlainPacking), all at once when they are consecutive, one by one when shuffled.
    Shuffled, every batch is the whole set (its mean loss and gradient do not depend on the order)."""
    samples = 16 if shuffle else 50
    check_training(web, site, mlp_48_31_7, (48,), "adam", "cross_entropy", samples=samples, batch_size=16, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, shuffle=shuffle)


@pytest.mark.parametrize("opt_name", ["sgd", "sgd_momentum_wd", "adam"])
def test_trajectory_with_a_sample_blocked_layer(web, site, opt_name):
    # batches of 14 (a block of 8 samples and 6 more), the last of 5 (below 8: the one-sample twins);
    # 2 epochs = 8 steps, switching between the two kinds of passes and their optimizer passes
    check_training(web, site, sample_blocked_mlp, (45,), opt_name, "cross_entropy", samples=47, batch_size=14,
                   epochs=2, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("backend", ["webgl2", "cpu"])
@pytest.mark.parametrize("momenta,dampening", [([0.9, 0.0, 0.9], 0.0), ([0.0, 0.9], 0.3)],
                         ids=["off_and_on_again", "on_after_steps_without"])
def test_sgd_momentum_changed_between_fits_follows_torchs_buffer(web, site, backend, momenta, dampening):
    """Fits with one SGD optimizer whose momentum changes between them, as one torch.optim.SGD whose
    param group's momentum changes between loops. With momentum 0 torch neither uses nor updates the
    buffer: a later loop with momentum goes on from the earlier one's buffer (the runtime's
    momentum-free passes, sgd0, write the parameters alone, and the buffer must be found where the
    parameters' passes draw it: model.js #alignState), or, with none yet, starts it as the gradient,
    undampened, whatever the step count (model.js: buffered)."""
    torch.manual_seed(3)
    module = sample_blocked_mlp()
    url = build_module(site, "momentum_changed", module, (45,))
    x, y = torch.randn(30, 45), torch.randint(0, 7, (30,))
    got = run_model(web, url, """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const losses = [];
        for (const momentum of args.momenta) {
          const r = await m.fit(x, y, { batchSize: 10, epochs: 1, shuffle: false,
                                        optimizer: { type: 'sgd', lr: 0.05, momentum, dampening: args.dampening } });
          losses.push(...r.loss);
        }
        return { losses, weights: arr(await m.getWeights()) };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "momenta": momenta, "dampening": dampening},
                    {"backend": backend} if backend == "cpu" else None)
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9, dampening=dampening)
    losses = []
    for momentum in momenta:
        opt.param_groups[0]["momentum"] = momentum
        losses += torch_fit_epoch(module, opt, x, y, 10)
    assert_close("losses", got["losses"], losses, **TRAJ_LOSS)
    for name, ref in torch_state(module).items():
        assert_close(name, got["weights"][name], ref, **TRAJ_W)


def torch_fit_epoch(module, opt, x, y, batch_size) -> list[float]:
    losses = []
    for s in range(0, len(x), batch_size):
        opt.zero_grad()
        value = F.cross_entropy(module(x[s:s + batch_size]), y[s:s + batch_size])
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses


# ---- fit's proximal term (fit options.proximal: FedProx's mu / 2 * ||w - w_start||^2) ----------------------
# mu 0.5 moves the weights of these 12 steps by about 1e-2 against a plain fit: far beyond TRAJ_W.

@pytest.mark.parametrize("opt_name", ["sgd", "sgd_momentum_wd", "adam", "adamw"])
def test_proximal_trajectory(web, site, opt_name):
    check_training(web, site, mlp_45_31_7, (45,), opt_name, "cross_entropy", samples=50, batch_size=16, epochs=3,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, mu=0.5)


@pytest.mark.parametrize("options,frozen", [({"backend": "cpu"}, "0.*"), ({"precision": "rgba8", "maxTextureSize": 40}, "2.*")],
                         ids=["cpu", "rgba8-folded"])
def test_proximal_trajectory_of_a_subset(web, site, options, frozen):
    """Only what trains is pulled back (one layer is frozen), on the CPU backend and on rgba8 textures folded
    by a small texture limit (the first layer's weight, 48 x 31 bytes' texels, in rows of 40)."""
    got = check_training(web, site, mlp_45_31_7, (45,), "sgd_nesterov", "mse", samples=50, batch_size=16, epochs=3,
                         tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, mu=0.5, frozen=(frozen,), options=options, max_batch=16)
    if "precision" in options:
        assert got["info"]["precision"] == "rgba8" and got["folded"] > 0


def test_proximal_anchor_is_each_fits_start(web, site):
    """Two fits in a row, each anchored at the weights it started from (the second at the first's result), with the
    optimizer state carried over as usual; then a plain fit, which the anchors no longer touch."""
    torch.manual_seed(3)
    module = mlp_45_31_7()
    url = build_module(site, "train_proximal_twice", module, (45,))
    x, y = torch.randn(20, 45), torch.randint(0, 7, (20,))
    cfg = OPTIMIZERS["sgd_momentum_wd"]
    got = run_model(web, url, """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y), o = { batchSize: 10, shuffle: false };
        const a = await m.fit(x, y, { ...o, optimizer: args.cfg, proximal: { mu: 0.8 } });
        const b = await m.fit(x, y, { ...o, optimizer: args.cfg, proximal: { mu: 0.3 } });
        const c = await m.fit(x, y, { ...o, optimizer: args.cfg });
        return { loss: [...a.loss, ...b.loss, ...c.loss], weights: arr(await m.getWeights()) };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "cfg": cfg})
    opt = torch.optim.SGD(module.parameters(), lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weightDecay"])
    losses = []
    for mu in (0.8, 0.3, 0.0):
        start = [p.detach().clone() for p in module.parameters()]
        for s in (0, 10):
            opt.zero_grad()
            value = F.cross_entropy(module(x[s:s + 10]), y[s:s + 10])
            (value + mu / 2 * sum(((p - p0) ** 2).sum() for p, p0 in zip(module.parameters(), start))).backward()
            opt.step()
            losses.append(value.item())
    assert_close("losses", got["loss"], losses, **TRAJ_LOSS)
    for name, ref in torch_state(module).items():
        assert_close(name, got["weights"][name], ref.reshape(-1), **TRAJ_W)


def test_proximal_option_errors(web, site):
    url = build_module(site, "train_proximal_errors", mlp_45_31_7(), (45,))
    got = run_model(web, url, """
        const x = new Float32Array(45), y = Int32Array.from([1]), out = [];
        for (const proximal of [{ mu: -1 }, { mu: NaN }, { nu: 1 }, 0.5]) {
          try { await m.fit(x, y, { proximal }); out.push('fit'); } catch (e) { out.push(e.code + ': ' + e.message); }
        }
        return out;
    """)
    assert got == ["bad-option: texelfit: fit options.proximal.mu must be a finite number >= 0, got -1",
                   "bad-option: texelfit: fit options.proximal.mu must be a finite number >= 0, got NaN",
                   'bad-option: texelfit: fit options.proximal has no option "nu" (did you mean "mu"? the options are mu)',
                   "bad-option: texelfit: fit options.proximal must be an object, got 0.5"]
