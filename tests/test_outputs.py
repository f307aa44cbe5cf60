"""Models of several outputs (issue 32): predict returns an object keyed by output name, fit and gradients take y
keyed by it, a loss per output and lossWeights, and minimise the weighted sum of the outputs' losses
(runtime/outputs.js). Each against PyTorch: forward, every gradient, and SGD trajectories."""
from __future__ import annotations

import io

import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from texelfit.build import compile_onnx
from texelfit.prep.load import export_simplified
from texelfit.prep.torch_ir import IRModule

from helpers import FWD, GRAD, TRAJ_LOSS, TRAJ_W, assert_close, perturbed, run_model

FEAT, HID, CLASSES, BOX = 6, 8, 3, 4


class Detector(nn.Module):
    """A shared trunk, class logits and a box: {"logits", "box"}, as a user's detection head returns them."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(FEAT, HID)
        self.cls = nn.Linear(HID, CLASSES)
        self.box = nn.Linear(HID, BOX)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return {"logits": self.cls(h), "box": self.box(h)}


class FeaturesAndProbs(nn.Module):
    """A tuple: the trunk's features, which the head reads too (an output with a consumer), the head's softmax
    (its cross_entropy is that of the logits entering it, as NLLLoss of its log) and a tanh."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(FEAT, HID)
        self.head = nn.Linear(HID, CLASSES)
        self.aux = nn.Linear(FEAT, 2)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return h, torch.softmax(self.head(h), dim=1), torch.tanh(self.aux(x))


def build(site, folder, module, max_batch=4, **options):
    result = compile_onnx(export_simplified(module, (FEAT,)), name="model", input_shape=(FEAT,), max_batch=max_batch,
                          **options)
    return result, f"{site.add_files(folder, result.files)}/model.js"


def data(n, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, FEAT, generator=g), torch.randint(0, CLASSES, (n,), generator=g), torch.randn(n, BOX, generator=g)


PAGE = """
    const x = new Float32Array(args.x);
    const y = { logits: Int32Array.from(args.labels), box: new Float32Array(args.box) };
    const options = { loss: { logits: 'cross_entropy', box: 'mse' }, lossWeights: { box: 0.5 } };
    const out = await m.predict(x, args.n);
    const grads = arr(await m.gradients(x, y, options));
    const fit = await m.fit(x, y, { ...options, batchSize: 4, epochs: 2, shuffle: false, optimizer: args.optimizer });
    return { info: m.info.outputs, kinds: Object.keys(out), logits: Array.from(out.logits), box: Array.from(out.box),
             grads, loss: fit.loss, weights: arr(await m.getWeights()) };
"""
SGD = {"type": "sgd", "lr": 0.1, "momentum": 0.9}


def detector_loss(model, x, labels, box):
    out = model(x)
    return F.cross_entropy(out["logits"], labels) + 0.5 * F.mse_loss(out["box"], box)


@pytest.mark.parametrize("options", [{}, {"backend": "cpu"}], ids=["webgl2", "cpu"])
def test_two_outputs_predict_and_train_as_pytorch(web, site, options):
    torch.manual_seed(1)
    model = perturbed(Detector, 0.5)()
    result, url = build(site, "outputs_detector", model)
    assert result.graph.output_names == ("logits", "box")
    x, labels, box = data(10)
    got = run_model(web, url, PAGE, {"x": x.reshape(-1).tolist(), "labels": labels.tolist(), "box": box.reshape(-1).tolist(),
                                     "n": 10, "optimizer": SGD}, options)
    assert got["info"] == [{"name": "logits", "shape": [CLASSES], "loss": "cross_entropy"},
                           {"name": "box", "shape": [BOX], "loss": "cross_entropy"}]
    assert got["kinds"] == ["logits", "box"]
    with torch.no_grad():
        ref = model(x)
    assert_close("logits", got["logits"], ref["logits"].numpy(), **FWD)
    assert_close("box", got["box"], ref["box"].numpy(), **FWD)
    model.zero_grad()
    detector_loss(model, x, labels, box).backward()
    named = dict(model.named_parameters())
    assert sorted(got["grads"]) == sorted(named)
    for name, p in named.items():
        assert_close(f"d/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)
    opt = torch.optim.SGD(model.parameters(), lr=SGD["lr"], momentum=SGD["momentum"])
    losses = []
    for _ in range(2):
        for s in range(0, 10, 4):  # (10 samples: batches of 4, 4 and 2)
            opt.zero_grad()
            value = detector_loss(model, x[s:s + 4], labels[s:s + 4], box[s:s + 4])
            value.backward()
            opt.step()
            losses.append(value.item())
    assert_close("losses, the weighted sum", got["loss"], losses, **TRAJ_LOSS)
    for name, p in model.named_parameters():
        assert_close(f"{name} after 6 steps", got["weights"][name], p.detach().numpy(), **TRAJ_W)


def test_an_output_read_by_a_layer_a_softmax_and_one_no_weight_of_the_fit_reaches(web, site):
    """The features' gradient is the sum of their own loss's and the head's; the softmax output's cross_entropy is
    NLLLoss of its log; with --trainable leaving aux frozen, the tanh output's loss is counted but trains nothing."""
    torch.manual_seed(2)
    model = perturbed(FeaturesAndProbs, 0.5)()
    result, url = build(site, "outputs_features", model, max_batch=8, trainable="trunk.*,head.*")
    names = result.graph.output_names
    assert names == ("output0", "output1", "output2")
    x, labels, _ = data(5, seed=9)
    g = torch.Generator().manual_seed(3)
    feats, aux = torch.randn(5, HID, generator=g), torch.randn(5, 2, generator=g)
    got = run_model(web, url, """
        const x = new Float32Array(args.x);
        const y = { output0: new Float32Array(args.feats), output1: Int32Array.from(args.labels), output2: new Float32Array(args.aux) };
        const options = { loss: { output0: 'mse', output2: 'mse' }, lossWeights: { output0: 2, output2: 3 } };
        const out = await m.predict(x, 5);
        const grads = arr(await m.gradients(x, y, options));
        const fit = await m.fit(x, y, { ...options, batchSize: 5, epochs: 3, optimizer: { type: 'sgd', lr: 0.1 } });
        return { out: arr(out), grads, loss: fit.loss, weights: arr(await m.getWeights()), info: m.info.outputs };
    """, {"x": x.reshape(-1).tolist(), "labels": labels.tolist(), "feats": feats.reshape(-1).tolist(),
          "aux": aux.reshape(-1).tolist()})
    assert [o["loss"] for o in got["info"]] == ["cross_entropy"] * 3  # (--loss: each output is a vector)
    with torch.no_grad():
        ref = model(x)
    for name, r in zip(names, ref):
        assert_close(f"predict {name}", got["out"][name], r.numpy(), **FWD)

    def total(xb, lb, fb, ab):
        h, probs, t = model(xb)
        return 2 * F.mse_loss(h, fb) + F.nll_loss(torch.log(probs), lb) + 3 * F.mse_loss(t, ab)

    trains = {n: p for n, p in model.named_parameters() if not n.startswith("aux.")}
    for p in model.aux.parameters():
        p.requires_grad_(False)
    model.zero_grad()
    total(x, labels, feats, aux).backward()
    assert sorted(got["grads"]) == sorted(trains)
    for name, p in trains.items():
        assert_close(f"d/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)
    opt = torch.optim.SGD(trains.values(), lr=0.1)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        value = total(x, labels, feats, aux)
        value.backward()
        opt.step()
        losses.append(value.item())
    assert_close("losses", got["loss"], losses, **TRAJ_LOSS)
    for name, p in model.named_parameters():
        assert_close(f"{name} after 3 steps", got["weights"][name], p.detach().numpy(), **TRAJ_W)


def test_an_onnx_files_outputs_keep_its_names_and_rgba8_predicts_them(web, site):
    torch.manual_seed(4)
    model = perturbed(Detector, 0.5)().eval()

    class AsTuple(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            out = self.m(x)
            return out["logits"], out["box"]

    buf = io.BytesIO()
    torch.onnx.export(AsTuple(), (torch.zeros(2, FEAT),), buf, dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["scores", "boxes"], dynamic_axes={n: {0: "n"} for n in ("x", "scores", "boxes")})
    result = compile_onnx(onnx.load_from_string(buf.getvalue()), name="model", max_batch=4)
    assert result.graph.output_names == ("scores", "boxes")
    with torch.no_grad():  # the torch reading of the IR returns the outputs in order
        ir = IRModule(result.graph)(torch.ones(1, FEAT))
        assert [tuple(t.shape) for t in ir] == [(1, CLASSES), (1, BOX)]
    url = f"{site.add_files('outputs_onnx', result.files)}/model.js"
    x, _, _ = data(3)
    got = run_model(web, url, "return arr(await m.predict(new Float32Array(args.x), 3));",
                    {"x": x.reshape(-1).tolist()}, {"precision": "rgba8"})
    with torch.no_grad():
        ref = model(x)
    rgba8 = dict(atol=2e-3, rtol=2e-3)
    assert_close("scores (rgba8)", got["scores"], ref["logits"].numpy(), **rgba8)
    assert_close("boxes (rgba8)", got["boxes"], ref["box"].numpy(), **rgba8)


def test_bad_losses_and_targets_are_named(web, site):
    torch.manual_seed(1)
    _, url = build(site, "outputs_errors", Detector())
    errors = run_model(web, url, """
        const x = new Float32Array(2 * 6), labels = Int32Array.from([0, 1]), box = new Float32Array(8);
        const cases = {
          missing: [{ logits: labels }, {}],
          unknown: [{ logits: labels, box, extra: box }, {}],
          weightKey: [{ logits: labels, box }, { loss: { logits: 'cross_entropy', box: 'mse' }, lossWeights: { bbox: 1 } }],
          weight: [{ logits: labels, box }, { loss: { logits: 'cross_entropy', box: 'mse' }, lossWeights: { box: -1 } }],
          kind: [{ logits: labels, box }, { loss: { logits: 'hinge', box: 'mse' } }],
          labels: [{ logits: new Float32Array(2), box }, { loss: { box: 'mse' } }],
          array: [labels, {}],
          size: [{ logits: labels, box: new Float32Array(6) }, { loss: { box: 'mse' } }],
        };
        const out = {};
        for (const [k, [y, o]] of Object.entries(cases)) {
          try { await m.fit(x, y, { ...o, batchSize: 2 }); out[k] = 'resolved'; } catch (e) { out[k] = `${e.code}: ${e.message.replace('texelfit: ', '')}`; }
        }
        return out;
    """)
    assert errors["missing"].startswith('bad-targets: y has no output "box": the outputs are logits, box'), errors
    assert errors["unknown"].startswith('bad-targets: y has an unknown output "extra"'), errors
    assert errors["weightKey"].startswith('bad-option: lossWeights has an unknown output "bbox"'), errors
    assert errors["weight"].startswith("bad-option: lossWeights.box must be a finite number >= 0, got -1"), errors
    assert errors["kind"] == 'bad-option: the loss of output "logits" must be "cross_entropy" or "mse", got "hinge"', errors
    assert errors["labels"].startswith("bad-labels: y.logits must be an Int32Array of class indices"), errors
    assert errors["array"].startswith("bad-targets: y must be an object keyed by output name (logits, box)"), errors
    assert errors["size"].startswith("bad-targets: y.box has 6 values, expected 2 x 4 (batch x its shape [4])"), errors


def test_one_output_refuses_loss_weights(web, site):
    torch.manual_seed(1)
    result = compile_onnx(export_simplified(nn.Linear(FEAT, CLASSES), (FEAT,)), name="model", input_shape=(FEAT,),
                          max_batch=4)
    url = f"{site.add_files('outputs_one', result.files)}/model.js"
    got = run_model(web, url, """
        let error = null;
        try { await m.fit(new Float32Array(6), Int32Array.from([1]), { lossWeights: { output: 1 } }); } catch (e) { error = `${e.code}: ${e.message.replace('texelfit: ', '')}`; }
        const out = await m.predict(new Float32Array(6), 1);
        return { error, array: out instanceof Float32Array, outputs: m.info.outputs, module: mod.modelInfo.outputs };
    """)
    assert got["error"] == "bad-option: lossWeights weighs the losses of several outputs; this model has one"
    assert got["array"] and got["outputs"] == [{"name": "output", "shape": [CLASSES], "loss": "cross_entropy"}]
    assert got["module"] == [{"name": "output", "shape": [CLASSES]}]


def test_two_heads_on_a_frozen_trunk_train_on_its_cached_features(web, site):
    """--trainable the heads: fit computes the trunk once per sample (info.trunk) and both heads from it."""
    torch.manual_seed(3)
    model = perturbed(Detector, 0.5)()
    for p in model.trunk.parameters():
        p.requires_grad_(False)
    result, url = build(site, "outputs_trunk", model, trainable="cls.*,box.*")
    assert result.graph.trunk() is not None
    x, labels, box = data(8, seed=11)
    got = run_model(web, url, """
        const x = new Float32Array(args.x), y = { logits: Int32Array.from(args.labels), box: new Float32Array(args.box) };
        const fit = await m.fit(x, y, { loss: { box: 'mse' }, lossWeights: { logits: 0.25 }, batchSize: 4, epochs: 2,
                                        shuffle: false, optimizer: { type: 'adam', lr: 0.01 } });
        return { trunk: m.info.trunk, loss: fit.loss, weights: arr(await m.getWeights()) };
    """, {"x": x.reshape(-1).tolist(), "labels": labels.tolist(), "box": box.reshape(-1).tolist()})
    assert got["trunk"] is not None
    heads = [p for n, p in model.named_parameters() if not n.startswith("trunk.")]
    opt = torch.optim.Adam(heads, lr=0.01)
    losses = []
    for _ in range(2):
        for s in range(0, 8, 4):
            opt.zero_grad()
            out = model(x[s:s + 4])
            value = 0.25 * F.cross_entropy(out["logits"], labels[s:s + 4]) + F.mse_loss(out["box"], box[s:s + 4])
            value.backward()
            opt.step()
            losses.append(value.item())
    assert_close("losses", got["loss"], losses, **TRAJ_LOSS)
    for name, p in model.named_parameters():
        assert_close(f"{name} after 4 steps", got["weights"][name], p.detach().numpy(), **TRAJ_W)
