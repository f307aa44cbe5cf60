"""Transfer learning: a bundle built with --trainable trains some parameters and keeps the others
frozen, bit for bit; fit({ trainable }) freezes more for one fit; a frozen trunk's output is
computed once per sample of a fit (the cached trunk) with the same results as without.

PyTorch is the oracle: the same module with requires_grad_(False) on what is frozen, trained on the
same batches (shuffle off, the last batch partial) by the same optimizer. Tolerances as in
test_train.py (helpers.TRAJ_W, TRAJ_LOSS); frozen weights, and cached against uncached fits, are
compared for equality.
"""
from __future__ import annotations

import fnmatch
import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import FWD, GRAD, OPTIMIZERS, TRAJ_LOSS, TRAJ_W, assert_close, build_module, run_cli, run_model, \
    torch_fit, torch_state
from models import BLOCK_CASES, ResidualCNN, SmallCNN, trunk_two_layer_head

from texelfit.build import compile_onnx
from texelfit.prep.load import BuildError, export_simplified

SHAPE = (1, 12, 12)


def small_cnn():
    return SmallCNN(1, 10)


def _url(site, module, trainable, shape=SHAPE, max_batch=64):
    folder = "tl_" + re.sub(r"\W", "_", f"{type(module).__name__}_{trainable}_{max_batch}")
    return build_module(site, folder, module, shape, trainable=trainable, max_batch=max_batch)


FIT = """
    const x = new Float32Array(args.x);
    const y = Int32Array.from(args.y);
    const extra = {};
    if (args.trainable) extra.trainable = args.trainable;
    if (args.cacheTrunk !== null) extra.cacheTrunk = args.cacheTrunk;
    const r = await m.fit(x, y, { batchSize: args.batchSize, epochs: args.epochs, shuffle: args.shuffle, seed: 5,
                                  optimizer: args.optimizer, ...extra });
    return { loss: r.loss, weights: arr(await m.getWeights()), info: m.info };
"""


def data(samples, shape=SHAPE, classes=10, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((samples,) + tuple(shape), generator=g), torch.randint(0, classes, (samples,), generator=g)


def check_frozen_training(web, site, factory, built, opt_name, *, fit_trainable=None, samples=21, batch_size=8,
                          epochs=3, options=None, cache=None, seed=7, max_batch=64, shape=SHAPE, classes=10):
    """Build `factory()` with --trainable `built`, fit it in the page (with fit({ trainable: fit_trainable })
    when given) and in PyTorch with requires_grad_(False) on every other parameter; compare every loss and
    trainable weight within the trajectory tolerances, and the frozen weights for equality with the shipped
    ones. Returns what the page returned."""
    torch.manual_seed(seed)
    module = factory()
    url = _url(site, module, built, shape=shape, max_batch=max_batch)
    shipped = torch_state(module)
    patterns = fit_trainable or built.split(",")
    trains = {n for n, _ in module.named_parameters() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    assert trains and trains != set(shipped), "the test must freeze something and train something"
    for n, p in module.named_parameters():
        p.requires_grad_(n in trains)
    x, y = data(samples, shape, classes)
    cfg = OPTIMIZERS[opt_name]
    got = run_model(web, url, FIT, {"x": x.reshape(-1).tolist(), "y": y.tolist(), "optimizer": cfg,
                                    "batchSize": batch_size, "epochs": epochs, "shuffle": False,
                                    "trainable": fit_trainable, "cacheTrunk": cache}, options)
    ref = torch_fit(module, x, y, "cross_entropy", cfg, batch_size, epochs)
    assert len(got["loss"]) == epochs * -(-samples // batch_size)
    assert_close(f"{opt_name} losses", got["loss"], ref, **TRAJ_LOSS)
    for name, value in torch_state(module).items():
        if name in trains:
            assert_close(f"{opt_name} {name}", got["weights"][name], value, **TRAJ_W)
            assert not np.array_equal(np.float32(got["weights"][name]), shipped[name].reshape(-1)), f"{name} did not train"
        else:
            np.testing.assert_array_equal(np.float32(got["weights"][name]), shipped[name].reshape(-1),
                                          err_msg=f"frozen {name}")
    return got


# ---- trajectories against PyTorch ---------------------------------------------------------------

@pytest.mark.parametrize("backend", ["webgl2", "cpu"])
@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum_wd"])
def test_head_only(web, site, opt_name, backend):
    got = check_frozen_training(web, site, small_cnn, "fc.*", opt_name, options={"backend": backend})
    assert got["info"]["trainable"] == ["fc.weight", "fc.bias"]
    assert got["info"]["trunk"] == "/Flatten_output_0"


@pytest.mark.parametrize("built", ["fc.*", "block.project.*,block.se.*,fc.*"], ids=["head", "se_project_head"])
def test_mobile_block_frozen_under_a_head(web, site, built):
    """A MobileNetV3 block (HardSwish, SE with a HardSigmoid gate) frozen under the head, or its SE and
    projection training too: the backward runs through the SE's product and broadcast and stops there."""
    factory, shape = BLOCK_CASES["mobilenet_v3_block"]
    check_frozen_training(web, site, factory, built, "adam", shape=shape, classes=5, samples=13, batch_size=5,
                          epochs=2)


@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum_wd"])
def test_last_block_and_head(web, site, opt_name):
    # the trunk's output (relu of the stem) has two consumers: the block's conv and the residual add
    got = check_frozen_training(web, site, ResidualCNN, "block.*,head.*", opt_name)
    assert got["info"]["trunk"] is not None


@pytest.mark.parametrize("backend", ["webgl2", "cpu"])
@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum_wd"])
def test_frozen_trunk_under_a_two_layer_head(web, site, opt_name, backend):
    check_frozen_training(web, site, trunk_two_layer_head, "6.*,8.*", opt_name, options={"backend": backend})


def test_head_only_rgba8(web, site):
    got = check_frozen_training(web, site, trunk_two_layer_head, "6.*,8.*", "adam", options={"precision": "rgba8"})
    assert got["info"]["precision"] == "rgba8"


@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum_wd"])
def test_fit_trains_a_subset(web, site, opt_name):
    # built all-trainable; one fit trains the last layer and the first head layer's weight (not its bias)
    check_frozen_training(web, site, trunk_two_layer_head, "*", opt_name, fit_trainable=["8.*", "6.weight"])


def test_fit_subset_of_a_head_only_bundle_on_cpu(web, site):
    check_frozen_training(web, site, trunk_two_layer_head, "6.*,8.*", "adam", fit_trainable=["8.*"],
                          options={"backend": "cpu"})


def test_trunk_across_a_folded_texture_and_sample_blocks(web, site):
    # maxBatch 16 and a forced texture limit: the trunk's textures fold; batches of 10 and 1
    got = check_frozen_training(web, site, trunk_two_layer_head, "6.*,8.*", "adam", samples=21, batch_size=10,
                                max_batch=16, options={"maxTextureSize": 64})
    assert got["info"]["foldedTextures"] > 0


# ---- the cached trunk ---------------------------------------------------------------------------

CACHED_VS_NOT = """
    const x = new Float32Array(args.x);
    const y = Int32Array.from(args.y);
    const start = await m.getWeights();
    const out = {};
    for (const cacheTrunk of [true, false]) {
      await m.setWeights(start);
      await m.resetOptimizer();
      const r = await m.fit(x, y, { batchSize: 8, epochs: 3, shuffle: true, seed: 9, cacheTrunk,
                                    optimizer: { type: 'sgd', lr: 0.05, momentum: 0.9 } });
      out[cacheTrunk] = { loss: r.loss, weights: arr(await m.getWeights()) };
    }
    return out;
"""


@pytest.mark.parametrize("backend", ["webgl2", "cpu"])
@pytest.mark.parametrize("factory,built", [(trunk_two_layer_head, "6.*,8.*"), (ResidualCNN, "block.*,head.*")],
                         ids=["two_layer_head", "last_block"])
def test_cached_and_uncached_fits_are_identical(web, site, factory, built, backend):
    torch.manual_seed(1)
    x, y = data(21)
    got = run_model(web, _url(site, factory(), built), CACHED_VS_NOT, {"x": x.reshape(-1).tolist(), "y": y.tolist()},
                    {"backend": backend})
    cached, plain = got["true"], got["false"]
    assert cached["loss"] == plain["loss"]
    for name in plain["weights"]:
        np.testing.assert_array_equal(np.float32(cached["weights"][name]), np.float32(plain["weights"][name]),
                                      err_msg=name)


@pytest.mark.parametrize("backend", ["webgl2", "cpu"])
def test_features_are_the_trunk_output(web, site, backend):
    torch.manual_seed(2)
    module = trunk_two_layer_head().eval()
    x, _ = data(5)
    got = run_model(web, _url(site, module, "6.*,8.*"), """
        return { f: Array.from(await m.features(new Float32Array(args), 5)), trunk: m.info.trunk };
    """, x.reshape(-1).tolist(), {"backend": backend})
    ref = module[:6](x).detach().numpy()
    assert got["trunk"] == "/5/Flatten_output_0"
    assert_close("features", got["f"], ref, **FWD)


def test_gradients_are_those_of_the_trainable_parameters(web, site):
    torch.manual_seed(4)
    module = trunk_two_layer_head()
    x, y = data(6)
    got = run_model(web, _url(site, module, "6.*,8.*"), """
        return arr(await m.gradients(new Float32Array(args.x), Int32Array.from(args.y)));
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()})
    F.cross_entropy(module(x), y).backward()
    assert sorted(got) == ["6.bias", "6.weight", "8.bias", "8.weight"]
    named = dict(module.named_parameters())
    for name in got:
        assert_close(f"d/d{name}", got[name], named[name].grad.numpy(), **GRAD)


# ---- lifecycle with frozen parameters -----------------------------------------------------------

def test_head_only_checkpoint_restores_exactly(web, site):
    torch.manual_seed(5)
    x, y = data(21)
    got = run_model(web, _url(site, trunk_two_layer_head(), "6.*,8.*"), """
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const opts = { batchSize: 8, epochs: 2, shuffle: false, optimizer: { type: 'adam', lr: 0.01 } };
        await m.fit(x, y, opts);
        await m.save('head-only');
        await m.fit(x, y, opts);
        const straight = arr(await m.getWeights());
        await m.fit(x, y, opts);  // moves on, then back to the checkpoint and the same fit again
        await m.restore('head-only');
        await m.fit(x, y, opts);
        return { straight, restored: arr(await m.getWeights()) };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()})
    for name in got["straight"]:
        np.testing.assert_array_equal(np.float32(got["restored"][name]), np.float32(got["straight"][name]),
                                      err_msg=name)


def test_lost_context_during_a_cached_fit_loses_nothing(web, site):
    torch.manual_seed(6)
    x, y = data(40)
    url = _url(site, trunk_two_layer_head(), "6.*,8.*")
    got = web.evaluate("""async (args) => {
        const mod = await import(args.url);
        const canvas = document.createElement('canvas');
        document.body.appendChild(canvas);
        const lose = canvas.getContext('webgl2').getExtension('WEBGL_lose_context');
        const m = await mod.createModel({ canvas });
        const arr = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, Array.from(v)]));
        const x = new Float32Array(args.x), y = Int32Array.from(args.y);
        const start = await m.getWeights();
        const opts = (extra) => ({ batchSize: 4, epochs: 3, shuffle: true, seed: 3, optimizer: { type: 'adam', lr: 0.01 },
                                   ...extra });
        const straight = await m.fit(x, y, opts({}));
        const ref = arr(await m.getWeights());
        await m.setWeights(start);
        await m.resetOptimizer();
        let lost = false;
        const r = await m.fit(x, y, opts({ onStep: ({ step }) => {
          if (step === 13 && !lost) {
            lost = true;
            lose.loseContext();
            setTimeout(() => lose.restoreContext(), 30);
          }
        } }));
        const out = { ref, refLoss: straight.loss, loss: r.loss, weights: arr(await m.getWeights()), lost };
        m.dispose();
        return out;
    }""", {"url": url, "x": x.reshape(-1).tolist(), "y": y.tolist()})
    assert got["lost"] and got["loss"] == got["refLoss"]
    for name in got["ref"]:
        np.testing.assert_array_equal(np.float32(got["weights"][name]), np.float32(got["ref"][name]), err_msg=name)


def test_import_weights_of_a_head_only_fit(web, site, tmp_path):
    from texelfit.importer import import_weights

    torch.manual_seed(10)
    module = trunk_two_layer_head()
    shipped = tmp_path / "shipped.pt"
    torch.save(module.state_dict(), shipped)
    x, y = data(16)
    got = run_model(web, _url(site, module, "6.*,8.*"), """
        await m.fit(new Float32Array(args.x), Int32Array.from(args.y), { batchSize: 8, epochs: 2 });
        return arr(await m.getWeights());
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()})
    (tmp_path / "w.json").write_text(json.dumps(got))
    import_weights(str(tmp_path / "w.json"), "models:trunk_two_layer_head", str(tmp_path / "out.pt"),
                   input_shape=SHAPE, weights=str(shipped))
    back = torch.load(tmp_path / "out.pt", weights_only=True)
    for name, value in module.state_dict().items():
        np.testing.assert_array_equal(back[name].numpy().reshape(-1), np.float32(got[name]), err_msg=name)
        trained = not np.array_equal(back[name].numpy(), value.numpy())
        assert trained == name.startswith(("6.", "8.")), name


# ---- errors: each names the problem and changes nothing -----------------------------------------

def test_a_pattern_matching_nothing_fails_the_build_listing_the_names():
    onnx_model = export_simplified(small_cnn(), SHAPE)
    with pytest.raises(BuildError, match=r"'classifier\.\*' matches no parameter.*conv1\.weight.*fc\.bias"):
        compile_onnx(onnx_model, name="m", input_shape=SHAPE, trainable="fc.*,classifier.*")
    for bad in ("", " ", "fc.*,"):
        with pytest.raises(BuildError, match="--trainable"):
            compile_onnx(onnx_model, name="m", input_shape=SHAPE, trainable=bad)


def test_cli_trainable_pattern_matching_nothing_exits_with_the_names(tmp_path):
    r = run_cli("build", "models:mlp_45_31_7", "--input-shape", "45", "--out", str(tmp_path / "b"),
                "--trainable", "head.*")
    assert r.returncode == 1
    assert "'head.*' matches no parameter" in r.stderr and "0.weight" in r.stderr
    assert not (tmp_path / "b").exists()


def test_frozen_parameters_have_no_gradient_state_or_passes():
    onnx_model = export_simplified(trunk_two_layer_head(), SHAPE)
    full = compile_onnx(onnx_model, name="m", input_shape=SHAPE, max_batch=8)
    head = compile_onnx(onnx_model, name="m", input_shape=SHAPE, max_batch=8, trainable="6.*,8.*")
    none = compile_onnx(onnx_model, name="m", input_shape=SHAPE, max_batch=8, trainable="none")
    frozen = ("0.weight", "0.bias", "3.weight", "3.bias")
    for n in frozen:
        assert not head.plan.textures["param:" + n].double
        for pre in ("pgrad:", "m:", "v:"):
            assert pre + n not in head.plan.textures and pre + n in full.plan.textures
    # the backward stops above the trunk: gradients of the head's tensors only, no samples-last input, and
    # passes of the head's layers only (dz of 8's input is written by its grad_input: act_grad_fused)
    assert sorted(t for t in head.plan.textures if t.startswith(("grad:", "dz:", "xt:", "dzt:"))) == \
        ["dz:/7/Relu_output_0", "grad:output"]
    assert {p["label"] for p in _schedule(head)["backward"]} == {"/6/Gemm+/7/Relu", "/8/Gemm"}
    assert any(t.startswith("xt:") for t in full.plan.textures)
    assert head.plan.total_bytes() < full.plan.total_bytes()
    assert none.plan.total_bytes() < head.plan.total_bytes()
    s = _schedule(none)
    assert s["backward"] == [] and s["loss"] == [{}] and all(v == [] for v in s["optimizer"].values())
    assert not any(t.role in ("gradient", "param_grad", "state") for t in none.plan.textures.values())


def _schedule(result):
    import json

    text = result.files["m.js"]
    return json.loads(text.split("const SCHEDULE = ", 1)[1].split(";\n", 1)[0])


ERRORS = """
    const x = new Float32Array(args.x), y = Int32Array.from(args.y);
    const before = arr(await m.getWeights());
    const codes = {};
    for (const [what, opts] of Object.entries(args.cases)) {
      try {
        await m.fit(x, y, { batchSize: 4, epochs: 1, ...opts });
        codes[what] = 'resolved';
      } catch (e) {
        codes[what] = e.code;
      }
    }
    let features;
    try { await m.features(x.subarray(0, args.size), 1); features = 'resolved'; } catch (e) { features = e.code; }
    return { codes, features, before, after: arr(await m.getWeights()), info: m.info };
"""


def test_a_fit_subset_outside_the_built_set_is_refused(web, site):
    torch.manual_seed(8)
    x, y = data(8)
    cases = {"frozen": {"trainable": ["conv1.*"]}, "unknown": {"trainable": ["nothing.*"]},
             "mixed": {"trainable": ["fc.weight", "conv2.bias"]}, "not_a_list": {"trainable": "fc.*"},
             "empty": {"trainable": []}, "cache_not_boolean": {"cacheTrunk": "yes"}}
    got = run_model(web, _url(site, small_cnn(), "fc.*"), ERRORS,
                    {"x": x.reshape(-1).tolist(), "y": y.tolist(), "cases": cases, "size": 144})
    assert got["codes"] == {k: "bad-option" for k in cases}
    assert got["features"] == "resolved"
    for name in got["before"]:
        np.testing.assert_array_equal(got["after"][name], got["before"][name], err_msg=name)


def test_an_inference_only_bundle_refuses_to_train(web, site):
    torch.manual_seed(9)
    module = small_cnn()
    x, y = data(8)
    url = _url(site, module, "none")
    got = run_model(web, url, ERRORS + "", {"x": x.reshape(-1).tolist(), "y": y.tolist(), "size": 144,
                                            "cases": {"plain": {}, "subset": {"trainable": ["fc.*"]}}})
    assert got["codes"] == {"plain": "not-trainable", "subset": "not-trainable"}
    assert got["features"] == "no-trunk"
    assert got["info"]["trainable"] == [] and got["info"]["trunk"] is None
    for name, value in torch_state(module).items():
        np.testing.assert_array_equal(np.float32(got["after"][name]), value.reshape(-1), err_msg=name)
    more = run_model(web, url, """
        let code;
        try { await m.gradients(new Float32Array(args.x), Int32Array.from(args.y)); } catch (e) { code = e.code; }
        return { code, out: Array.from(await m.predict(new Float32Array(args.x), 8)) };
    """, {"x": x.reshape(-1).tolist(), "y": y.tolist()})
    assert more["code"] == "not-trainable"
    assert_close("predict", more["out"], module(x).detach().numpy(), **FWD)


# ---- memory: textures with disjoint lifetimes share storage -------------------------------------

def test_textures_with_disjoint_lifetimes_share_storage_and_the_report_gives_bytes_per_role():
    from texelfit.codegen.memory import GROUPS, sequence
    from texelfit.codegen.schedule import build_schedule

    onnx_model = export_simplified(ResidualCNN(), SHAPE)
    for trainable in ("*", "head.*", "none"):
        r = compile_onnx(onnx_model, name="m", input_shape=SHAPE, max_batch=16, trainable=trainable)
        textures = json.loads(r.files["m.js"].split("const TEXTURES = ", 1)[1].split(";\n", 1)[0])
        storage = {t["name"]: t["storage"] for t in textures if t["storage"] >= 0}
        assert storage, f"{trainable}: nothing shares"
        # an independent check of the lifetimes: no pass touches two textures of one storage, and between
        # a texture's first and last use no other of its storage is used
        seq = sequence(build_schedule(r.graph, r.plan))
        uses = {}
        for i, p in enumerate(seq):
            touched = [n for n in list(p.inputs) + list(p.outputs) if n in storage]
            assert len({storage[n] for n in touched}) == len(set(touched)), (trainable, p.label, touched)
            for n in touched:
                uses.setdefault(n, []).append(i)
        for a in storage:
            for b in storage:
                if a < b and storage[a] == storage[b]:
                    assert max(uses[a]) < min(uses[b]) or max(uses[b]) < min(uses[a]), (trainable, a, b)
        roles = r.report["texture_bytes_by_role"]
        assert set(roles["before"]) == set(roles["after"]) == set(GROUPS)
        assert roles["total_before"] == r.plan.total_bytes() == sum(roles["before"].values())
        assert roles["total_after"] < roles["total_before"]
        if trainable == "none":
            assert roles["before"]["gradients"] == roles["before"]["optimizer_state"] == 0
        if trainable == "head.*":
            assert r.report["trunk"] and roles["trunk_cache_bytes_per_sample"] > 0
