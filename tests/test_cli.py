"""The CLI contract: sources, refusal of pickles, clear errors, deterministic builds."""
from __future__ import annotations

import filecmp
import json
import os

import pytest
import torch

from helpers import assert_close, run_cli, run_model
from models import mlp_45_31_7

texelfit = run_cli


class _ProdNet(torch.nn.Module):
    """A Linear into a product over its features (ONNX ReduceProd): an op texelfit does not support."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(45, 7)

    def forward(self, x):
        return self.lin(x).prod(1, keepdim=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("sources")
    torch.manual_seed(3)
    m = mlp_45_31_7().eval()
    torch.save(m.state_dict(), d / "state.pt")
    torch.save(m, d / "pickled.pt")
    torch.jit.save(torch.jit.trace(m, torch.randn(2, 45)), d / "scripted.pt")
    torch.onnx.export(m, (torch.randn(2, 45),), str(d / "mlp.onnx"), dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    torch.onnx.export(_ProdNet(), (torch.randn(2, 45),), str(d / "prod.onnx"), dynamo=False,
                      dynamic_axes={"input": {0: "n"}}, input_names=["input"])
    return d, m


def test_build_is_deterministic(sources, tmp_path):
    d, _ = sources
    for out in ("a", "b"):
        # (each in a fresh interpreter: str hashes, and the order of sets of str, differ between processes)
        r = texelfit("build", "models:mlp_45_31_7", "--weights", str(d / "state.pt"), "--input-shape", "45",
                     "--out", str(tmp_path / out), "--name", "mlp", fresh=True)
        assert r.returncode == 0, r.stderr
    files = sorted(os.listdir(tmp_path / "a"))
    assert files == ["mlp.d.ts", "mlp.js", "report.json"]
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)
    assert match == files, (mismatch, errors)


def test_pickled_model_is_refused_unless_trusted(sources, tmp_path):
    d, _ = sources
    r = texelfit("build", str(d / "pickled.pt"), "--input-shape", "45", "--out", str(tmp_path / "p"))
    assert r.returncode != 0
    assert "fully pickled" in r.stderr and "arbitrary code" in r.stderr and "--trust-pickle" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "p")
    r = texelfit("build", str(d / "pickled.pt"), "--input-shape", "45", "--out", str(tmp_path / "p"), "--trust-pickle")
    assert r.returncode == 0, r.stderr


def test_state_dict_alone_is_explained(sources, tmp_path):
    d, _ = sources
    r = texelfit("build", str(d / "state.pt"), "--input-shape", "45", "--out", str(tmp_path / "s"))
    assert r.returncode != 0 and "state_dict without its architecture" in r.stderr


@pytest.mark.parametrize("error_case", ["unsupported_op", "missing_shape", "bad_weights", "bad_prune", "no_module",
                                        "quantize_unknown"])
def test_errors_are_one_clear_line(sources, tmp_path, error_case):
    d, _ = sources
    torch.save({"0.weight": torch.zeros(3, 3)}, tmp_path / "wrong.pt")
    args, words = {
        "unsupported_op": ([str(d / "prod.onnx")], ["unsupported ONNX op ReduceProd (from Tensor.prod)", "/ReduceProd",
                                                   "supported ops: Gemm"]),
        "missing_shape": (["models:mlp_45_31_7"], ["--input-shape is needed"]),
        "bad_weights": (["models:mlp_45_31_7", "--weights", str(tmp_path / "wrong.pt"), "--input-shape", "45"],
                        ["does not fit the model"]),
        "bad_prune": ([str(d / "mlp.onnx"), "--prune", "1.5"], ["--prune must be in [0, 1)"]),
        "no_module": (["no_such_module_xyz:Net", "--input-shape", "4"], ["cannot import module 'no_such_module_xyz'"]),
        "quantize_unknown": ([str(d / "mlp.onnx"), "--quantize", "int4"], ["--quantize", "invalid choice: 'int4'"]),
    }[error_case]
    r = texelfit("build", *args, "--out", str(tmp_path / "o"))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("texelfit: error:"), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("kind", ["onnx", "torchscript", "factory"])
def test_every_source_kind_predicts_like_pytorch(sources, site, web, kind):
    d, m = sources
    src = {"onnx": [str(d / "mlp.onnx")], "torchscript": [str(d / "scripted.pt"), "--input-shape", "45"],
           "factory": ["models:mlp_45_31_7", "--weights", str(d / "state.pt"), "--input-shape", "45"]}[kind]
    out = site.path(f"cli_{kind}")
    r = texelfit("build", *src, "--out", out, "--name", "net", "--max-batch", "5")
    assert r.returncode == 0, r.stderr
    assert "texelfit: built" in r.stdout
    rep = json.loads(open(os.path.join(out, "report.json")).read())
    assert rep["parameters"] == sum(p.numel() for p in m.parameters())
    assert all({"shape", "texture", "pad_lanes", "bytes", "tiles"} <= set(t) for t in rep["textures"])
    x = torch.randn(5, 45)
    got = run_model(web, f"{site.url}/cli_{kind}/net.js", """
        const y = await m.predict(new Float32Array(args), 5);
        return { y: Array.from(y), names: Object.keys(await m.getWeights()).sort(), max: m.info.maxBatch };
    """, x.reshape(-1).tolist())
    assert_close(f"{kind} forward", got["y"], m(x).detach().numpy(), atol=2e-5, rtol=2e-4)
    assert got["max"] == 5
    if kind != "onnx":  # ONNX files keep whatever initializer names they have
        assert got["names"] == sorted(m.state_dict())


def test_a_build_over_1_gb_warns_and_the_default_batch_is_reduced_to_fit(tmp_path):
    """A 224x224 conv at --max-batch 64 plans more than 1 GB (textures, readbacks, snapshots, uploads): given
    explicitly, the build keeps it and says so, with what to do, and prints the bytes per role; its batch-norm
    is folded, said once. Not given, the default 64 is lowered to the largest batch that fits the 1 GB budget,
    and the build says so: no warning. At --max-batch 4 no warning either."""
    r = texelfit("build", "models:conv_224_bn", "--input-shape", "3,224,224", "--max-batch", "64",
                 "--out", str(tmp_path / "big"))
    assert r.returncode == 0, r.stderr
    assert "texelfit: warning: a fit needs" in r.stdout and "lower --max-batch" in r.stdout, r.stdout
    assert r.stdout.count("BatchNormalization layer(s) folded") == 1, r.stdout
    assert "texture bytes by role" in r.stdout and "activation" in r.stdout, r.stdout
    assert "texelfit: memory: a fit needs 1.37 GB at its peak" in r.stdout, r.stdout
    assert 'texelfit: memory: the largest texture is "act:/2/Relu_output_0" (308.3 MB)' in r.stdout, r.stdout
    big = json.loads((tmp_path / "big" / "report.json").read_text())["memory"]
    assert big["max_batch"] == 64 and big["reduced_from"] is None and big["fit_bytes"] > 10 ** 9 and not big["fits"]
    r = texelfit("build", "models:conv_224_bn", "--input-shape", "3,224,224", "--out", str(tmp_path / "default"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "default" / "report.json").read_text())
    chosen = rep["max_batch"]
    assert 1 <= chosen < 64 and rep["memory"]["reduced_from"] == 64, rep["memory"]
    assert f"texelfit: --max-batch {chosen}, not the default 64" in r.stdout, r.stdout
    assert "warning" not in r.stdout, r.stdout
    assert rep["memory"]["fit_bytes"] <= 10 ** 9 < big["fit_bytes"]
    r = texelfit("build", "models:conv_224_bn", "--input-shape", "3,224,224", "--max-batch", "4",
                 "--out", str(tmp_path / "small"))
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stdout, r.stdout


def test_memory_budget_takes_bytes_or_units(tmp_path):
    """--memory-budget 150KB: the MLP plans about 198 KB at the default batch 64, so the build lowers it (and
    says so); a budget that is not a number of bytes is one line, exit 2."""
    r = texelfit("build", "models:mlp_45_31_7", "--input-shape", "45", "--memory-budget", "150KB",
                 "--out", str(tmp_path / "m"))
    assert r.returncode == 0, r.stderr
    mem = json.loads((tmp_path / "m" / "report.json").read_text())["memory"]
    assert mem["budget"] == 150_000 and mem["reduced_from"] == 64 and mem["fits"] and mem["fit_bytes"] <= 150_000
    assert f"texelfit: --max-batch {mem['max_batch']}, not the default 64" in r.stdout, r.stdout
    r = texelfit("build", "models:mlp_45_31_7", "--input-shape", "45", "--memory-budget", "lots",
                 "--out", str(tmp_path / "n"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--memory-budget" in r.stderr, r.stderr


def test_build_input_normalize_and_weights_file(sources, tmp_path):
    """Issue 17: --input-normalize is recorded; --weights-file writes NAME.weights.bin (deterministic), and
    --embed-weights conflicts with it; a mode that does not fit the input is one clear line."""
    for out in ("a", "b"):
        r = texelfit("build", "texelfit.examples:digits_cnn", "--input-normalize", "0.5:0.25", "--weights-file",
                     "--out", str(tmp_path / out), "--name", "cnn")
        assert r.returncode == 0, r.stderr
        assert "texelfit: weights in" in r.stdout and "cnn.weights.bin" in r.stdout
    files = sorted(os.listdir(tmp_path / "a"))
    assert files == ["cnn.d.ts", "cnn.js", "cnn.weights.bin", "report.json"]
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)
    assert match == files, (mismatch, errors)
    rep = json.load(open(tmp_path / "a" / "report.json"))
    assert rep["input_normalize"] == {"mode": "custom", "mean": [0.5], "std": [0.25], "channels": 1, "height": 8, "width": 8}
    assert rep["weights_file"]["bytes"] == os.path.getsize(tmp_path / "a" / "cnn.weights.bin")
    r = texelfit("build", "texelfit.examples:digits_cnn", "--weights-file", "--embed-weights", "--out", str(tmp_path / "c"))
    assert r.returncode != 0 and "not allowed with argument" in r.stderr
    r = texelfit("build", "texelfit.examples:digits_cnn", "--input-normalize", "imagenet", "--out", str(tmp_path / "c"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and lines[-1] == ("texelfit: error: --input-normalize imagenet is for a 3-channel (RGB) input; "
                                              "this input has 1 channel(s): give MEAN:STD for it"), r.stderr
