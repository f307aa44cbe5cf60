"""The notebook API (issue 32): texelfit.export of an nn.Module itself, and texelfit.load_weights of what the page
trained back into it, batch-norms the bundle folded unfolded (texelfit/notebook.py)."""
from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import texelfit
from texelfit.build import compile_onnx
from texelfit.prep.errors import BuildError
from texelfit.prep.load import export_simplified

from helpers import assert_close, run_model, torch_state


class BnNet(nn.Module):
    """Batch-norms of every kind the build meets: after a conv without a bias (folds; the conv gains one), after a
    conv with one (folds), after a pool (free: trains under its own names), after a Linear (folds into it)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.bn3 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 5)
        self.bn4 = nn.BatchNorm1d(5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.bn3(self.pool(torch.relu(self.bn2(self.conv2(x)))))
        return self.bn4(self.fc(x.flatten(1)))


def bn_net(perturbed: bool) -> BnNet:
    torch.manual_seed(3)
    m = BnNet()
    if perturbed:  # (fresh batch-norms scale by ~1 and shift by 0: an unfold along the wrong axis would hide)
        with torch.no_grad():
            for bn in (m.bn1, m.bn2, m.bn3, m.bn4):
                bn.weight.uniform_(0.5, 2.0)
                bn.bias.normal_(0, 0.5)
                bn.running_mean.normal_(0, 0.5)
                bn.running_var.uniform_(0.3, 3.0)
    return m.eval()


X = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
Y = torch.tensor([0, 1, 2, 3, 4, 0])


def test_export_is_the_build_of_the_module_and_leaves_it_as_it_was(tmp_path):
    m = bn_net(True)
    m.train()
    m.bn3.eval()
    before = torch_state(m)
    report = texelfit.export(m, X[:1], str(tmp_path), max_batch=8)
    assert report["name"] == "BnNet" and report["max_batch"] == 8
    assert sorted(os.listdir(tmp_path)) == ["BnNet.d.ts", "BnNet.js", "report.json"]
    with open(tmp_path / "report.json", encoding="utf-8") as f:
        assert json.load(f)["trainable"] == report["trainable"]
    # what texelfit build makes of the same module (prep/load.py's export, then compile_onnx)
    ref = compile_onnx(export_simplified(bn_net(True), (3, 8, 8)), name="BnNet", input_shape=(3, 8, 8), max_batch=8)
    assert (tmp_path / "BnNet.js").read_text(encoding="utf-8") == ref.files["BnNet.js"]
    # the export runs the module in eval mode and with marked parameters: both are put back
    assert m.training and m.conv1.training and not m.bn3.training
    after = torch_state(m)
    assert all(np.array_equal(before[k], after[k]) for k in before)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, ids, scale, unused=None):
        return self.fc(self.emb(ids).mean(1) * scale)


def test_export_names_several_inputs_from_the_forward_and_reads_their_dtypes(tmp_path):
    m = TwoInputs()
    ids, scale = torch.zeros(2, 5, dtype=torch.int64), torch.ones(2, 1)
    report = texelfit.export(m, {"scale": scale, "ids": ids}, str(tmp_path / "a"), name="two")
    ref = compile_onnx(export_simplified(m, [(5,), (1,)], ["ids", "scale"], ["int64", "float32"]), name="two",
                       input_shape=[(5,), (1,)], input_dtype=["int64", "float32"])
    assert (tmp_path / "a" / "two.js").read_text(encoding="utf-8") == ref.files["two.js"]
    texelfit.export(m, (ids, scale), str(tmp_path / "b"), name="two")  # a tuple: the forward's order
    assert (tmp_path / "b" / "two.js").read_bytes() == (tmp_path / "a" / "two.js").read_bytes()
    assert report["trainable"] == ["emb.weight", "fc.weight", "fc.bias"]
    with pytest.raises(BuildError, match=r"skips ids"):
        texelfit.export(m, {"scale": scale, "unused": scale}, str(tmp_path / "c"))
    with pytest.raises(BuildError, match=r"'bogus' is not a parameter of TwoInputs.forward \(ids, scale, unused\)"):
        texelfit.export(m, {"bogus": scale}, str(tmp_path / "c"))
    with pytest.raises(BuildError, match=r"example input 'scale' is float64: inputs are float32, int64, int32"):
        texelfit.export(m, (ids, scale.double()), str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


def _train_in_page(web, site, m, folder):
    """Export `m` into the test site, fine-tune it in the page (SGD, 2 epochs of 2 batches), and return what a
    user saves (getWeights as lists) and the page's predictions after."""
    texelfit.export(m, X[:1], site.path(folder), max_batch=8)
    return run_model(web, f"{site.url}/{folder}/BnNet.js", """
        const x = Float32Array.from(args.x), y = Int32Array.from(args.y);
        await m.fit(x, y, { batchSize: 3, epochs: 2, shuffle: false, optimizer: { type: 'sgd', lr: 0.2, momentum: 0.5 } });
        return { weights: arr(await m.getWeights()), out: Array.from(await m.predict(x, 6)) };
    """, {"x": X.reshape(-1).tolist(), "y": Y.tolist()})


@pytest.mark.parametrize("perturbed", [True, False], ids=["perturbed", "fresh"])
def test_load_weights_gives_the_module_what_the_page_trained(web, site, tmp_path, perturbed):
    m = bn_net(perturbed)
    got = _train_in_page(web, site, m, f"nb_{perturbed}")
    # the folded layers come under the conv's and Linear's names (conv1 gains a bias); the free bn3 under its own
    assert sorted(got["weights"]) == ["bn3.bias", "bn3.weight", "conv1.bias", "conv1.weight", "conv2.bias",
                                      "conv2.weight", "fc.bias", "fc.weight"]
    path = tmp_path / "weights.json"
    path.write_text(json.dumps(got["weights"]), encoding="utf-8")

    with pytest.raises(BuildError, match=r"lacks the tensors of batch-norm bn1, bn2, bn4: .* needs example_inputs"):
        texelfit.load_weights(m, str(path))
    done = texelfit.load_weights(m, str(path), X[:1])
    assert done["unfolded"] == {"conv1.weight": "bn1", "conv2.weight": "bn2", "fc.weight": "bn4"}
    assert done["loaded"] == ["bn1.bias", "bn2.bias", "bn3.bias", "bn3.weight", "bn4.bias", "conv1.weight",
                              "conv2.weight", "fc.weight"]
    with torch.no_grad():
        out = m.eval()(X).numpy()
    assert_close("the module after load_weights vs the page", out, got["out"], atol=1e-4, rtol=1e-4)
    # the page did train (its predictions moved), and the folded tensors copied as they are would be wrong
    with torch.no_grad():
        fresh = bn_net(perturbed)
        assert np.abs(fresh(X).numpy() - out).max() > 1e-2
        naive = bn_net(perturbed)
        naive.conv1.weight.copy_(torch.tensor(got["weights"]["conv1.weight"]).reshape(8, 3, 3, 3))
        assert np.abs(naive(X).numpy() - out).max() > 1e-2


def test_load_weights_changes_nothing_when_the_file_does_not_fit(tmp_path):
    m = bn_net(True)
    before = torch_state(m)
    w = {k: v.reshape(-1).tolist() for k, v in before.items() if "running" not in k and "num_batches" not in k}
    cases = {
        "unknown": ({**w, "fc2.weight": [1.0]}, r"'fc2.weight' is no tensor of BnNet"),
        "size": ({**w, "fc.bias": [1.0, 2.0]}, r"'fc.bias' has 2 values \(expected 5"),
        "missing": ({k: v for k, v in w.items() if k != "fc.bias"}, r"lacks fc.bias .*partial=True"),
    }
    for case, (weights, message) in cases.items():
        path = tmp_path / f"{case}.json"
        path.write_text(json.dumps(weights), encoding="utf-8")
        with pytest.raises(BuildError, match=message):
            texelfit.load_weights(m, str(path), X[:1])
        after = torch_state(m)
        assert all(np.array_equal(before[k], after[k]) for k in before), case
    # every batch-norm in the file (a state_dict's tensors): nothing to unfold, no examples needed
    w["fc.bias"] = [0.5] * 5
    path = tmp_path / "all.json"
    path.write_text(json.dumps(w), encoding="utf-8")
    assert texelfit.load_weights(m, str(path))["unfolded"] == {}
    assert np.array_equal(m.fc.bias.detach().numpy(), np.full(5, 0.5, np.float32))
    # partial files (some tensors: a trained head), as state_dict files: a folded layer's tensors unfold together
    torch.save({"bn3.weight": torch.full((8,), 2.0), "bn3.bias": torch.full((8,), 3.0)}, tmp_path / "head.pt")
    kept = copy.deepcopy(torch_state(m))
    with pytest.raises(BuildError, match=r"lacks the tensors of batch-norm bn1, bn2, bn4"):
        texelfit.load_weights(m, str(tmp_path / "head.pt"), partial=True)
    assert texelfit.load_weights(m, str(tmp_path / "head.pt"), X[:1], partial=True)["loaded"] == ["bn3.bias", "bn3.weight"]
    assert np.array_equal(m.bn3.bias.detach().numpy(), np.full(8, 3.0, np.float32))
    assert np.array_equal(m.fc.weight.detach().numpy(), kept["fc.weight"])
    torch.save({"fc.bias": torch.full((5,), 2.0)}, tmp_path / "bias.pt")
    with pytest.raises(BuildError, match=r"has 'fc.bias' but not 'fc.weight': batch-norm bn4 was folded into both"):
        texelfit.load_weights(m, str(tmp_path / "bias.pt"), X[:1], partial=True)
