"""`texelfit train`, the report of `texelfit build` with --prune/--quantize/--finetune-epochs/--eval-data,
and `texelfit prune-sweep`, run as a user runs them (a fresh interpreter per command)."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

from helpers import run_cli
from texelfit.build import compile_source
from texelfit.examples import DEFAULT_SOURCE, digits_cnn, digits_split
from texelfit.train import train_default

PRUNE_Q = ["--prune", "0.5", "--quantize", "int8"]
texelfit = run_cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`texelfit train` with its defaults; returns (checkpoint path, stdout)."""
    d = tmp_path_factory.mktemp("train")
    r = texelfit("train", "--out", str(d / "cnn.pt"), cwd=str(d))
    assert r.returncode == 0, r.stderr
    return d / "cnn.pt", r


def test_train_reaches_the_accuracy_it_prints_and_saves_a_state_dict(trained):
    path, r = trained
    acc = float(re.search(r"validation accuracy ([\d.]+)%", r.stdout).group(1)) / 100
    assert acc >= 0.95, r.stdout
    assert "epoch 20/20" in r.stderr and "[####" in r.stderr, "no progress bar on stderr"
    module = digits_cnn()
    module.load_state_dict(torch.load(path, weights_only=True))
    (_, _), (xv, yv) = digits_split()
    with torch.no_grad():
        own = (module(torch.from_numpy(xv)).argmax(1).numpy() == yv).mean()
    assert abs(own - acc) < 1e-4, (own, acc)


def test_training_is_seeded():
    a, acc_a = train_default(epochs=1, progress=False)
    b, acc_b = train_default(epochs=1, progress=False)
    assert acc_a == acc_b
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def build(tmp_path, out, ckpt, *args):
    r = texelfit("build", DEFAULT_SOURCE, "--weights", str(ckpt), "--out", str(tmp_path / out), *args)
    assert r.returncode == 0, r.stderr
    return r, json.loads((tmp_path / out / "report.json").read_text())


def test_digits_prune_and_int8_with_and_without_finetuning(trained, tmp_path):
    ckpt, _ = trained
    r0, full = build(tmp_path, "full", ckpt)
    r1, plain = build(tmp_path, "p", ckpt, *PRUNE_Q)
    r2, tuned = build(tmp_path, "t", ckpt, *PRUNE_Q, "--finetune-epochs", "5")
    a0, a1, a2 = full["accuracy"], plain["accuracy"], tuned["accuracy"]
    print(f"\n[digits] trained {a0['before']:.4f}; --prune 0.5 --quantize int8: pruned {a1['after_prune']:.4f}, "
          f"shipped {a1['after_quantize']:.4f}; with 5 fine-tuning epochs: {a2['after_finetune']:.4f}, "
          f"shipped {a2['after_quantize']:.4f}; weights {full['quantize']['blob_bytes']} -> "
          f"{plain['quantize']['blob_bytes']} bytes, bundle {full['files']['digits_cnn.js']} -> "
          f"{plain['files']['digits_cnn.js']} bytes")
    assert a0["data"] == "digits validation split (360 samples)" and a0["metric"] == "accuracy"
    assert a0["before"] >= 0.95 and a0["after_quantize"] == a0["before"]  # --quantize none ships float32 exactly
    assert a1["before"] == a2["before"] == a0["before"]
    assert 0.85 <= a1["after_prune"] < a0["before"] and abs(a1["after_quantize"] - a1["after_prune"]) <= 0.02
    assert a2["after_finetune"] >= 0.97 and a2["after_quantize"] >= 0.97 and a2["after_quantize"] > a1["after_quantize"]
    # the table: every layer's channels, and totals that add up
    assert "16 -> 8" in r1.stdout and "32 -> 16" in r1.stdout and "512 -> 256" in r1.stdout
    assert re.search(r": before [\d.]+%, pruned [\d.]+%, shipped [\d.]+%$", r1.stdout, re.M), r1.stdout
    assert re.search(r"accuracy on digits validation split \(360 samples\): before [\d.]+%, pruned [\d.]+%, "
                     r"fine-tuned [\d.]+%, shipped [\d.]+%", r2.stdout), r2.stdout
    for rep in (full, plain, tuned):
        t = rep["table"]
        assert t["totals"]["parameters"] == rep["parameters"] == sum(row["parameters"] for row in t["rows"])
        assert t["totals"]["texture_bytes"] == rep["texture_bytes"]
        assert t["totals"]["shipped_bytes"] == rep["quantize"]["blob_bytes"]
    rows = {row["layer"]: row for row in plain["table"]["rows"]}
    conv2 = next(v for k, v in rows.items() if k.startswith("/conv2/Conv"))
    assert (conv2["channels_before"], conv2["channels_after"], conv2["parameters"]) == (32, 16, 16 * 8 * 9 + 16)
    assert conv2["flops"] == 2 * 16 * 8 * 8 * 8 * 9 + 2 * 16 * 8 * 8  # multiply-adds, bias, relu
    assert conv2["shipped_bytes"] == 16 + 4 * 16 + 16 * 8 * 9 + 16 + 4 * 16  # entries, scales, int8, float32 bias
    assert plain["quantize"]["blob_bytes"] < 0.1 * full["quantize"]["blob_bytes"]


@pytest.mark.parametrize("value", ["1", "1.0", "-0.1", "abc", "nan", "2"])
def test_bad_prune_values_are_one_clear_line(tmp_path, value):
    r = texelfit("build", DEFAULT_SOURCE, "--prune", value, "--out", str(tmp_path / "o"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert lines[0].startswith("texelfit: error: argument --prune: --prune must be"), lines[0]
    assert not os.path.exists(tmp_path / "o")


def test_prune_sweep_writes_a_plot_and_its_numbers(trained, tmp_path):
    ckpt, _ = trained
    out = tmp_path / "sweep" / "s.png"
    r = texelfit("prune-sweep", "--weights", str(ckpt), "--ratios", "0,0.5,0.75", "--quantize", "int8",
                 "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert f"wrote the plot to {out}" in r.stdout
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    points = json.loads(out.with_suffix(".json").read_text())["points"]
    assert [p["ratio"] for p in points] == [0, 0.5, 0.75]
    assert points[0]["value"] >= 0.95 and points[2]["value"] < points[0]["value"]
    sizes = [p["bundle_bytes"] for p in points]
    assert sizes[0] > sizes[1] > sizes[2] and points[0]["weights_bytes"] > 3 * points[1]["weights_bytes"]


def test_prune_sweep_without_evaluation_data_says_so(tmp_path):
    r = texelfit("prune-sweep", "models:mlp_45_31_7", "--input-shape", "45", "--out", str(tmp_path / "s.png"))
    assert r.returncode != 0 and "prune-sweep needs evaluation data: give --eval-data" in r.stderr, r.stderr


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(path, x=rng.standard_normal((40, 45)).astype(np.float32), y=rng.integers(0, 7, 40))
    return path


def test_eval_and_finetune_data_files(tmp_path, npz):
    from models import mlp_45_31_7

    torch.manual_seed(3)
    torch.save(mlp_45_31_7().state_dict(), tmp_path / "w.pt")
    r = texelfit("build", "models:mlp_45_31_7", "--weights", str(tmp_path / "w.pt"), "--input-shape", "45",
                 "--out", str(tmp_path / "o"), "--prune", "0.5", "--finetune-epochs", "3", "--finetune-data", str(npz),
                 "--eval-data", str(npz), "--quantize", "fp16")
    assert r.returncode == 0, r.stderr
    acc = json.loads((tmp_path / "o" / "report.json").read_text())["accuracy"]
    assert acc["data"] == "data.npz (40 samples)"
    assert {"before", "after_prune", "after_finetune", "after_quantize"} <= set(acc)
    torch.manual_seed(3)
    m = mlp_45_31_7()
    m.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    with np.load(npz) as f:
        ref = float((m(torch.from_numpy(f["x"])).argmax(1).numpy() == f["y"]).mean())
    assert acc["before"] == ref
    assert acc["after_finetune"] > acc["after_prune"]  # 3 epochs on the evaluation data itself


@pytest.mark.parametrize("case", ["no_data", "missing_y", "wrong_shape", "label_range", "not_npz"])
def test_data_errors_are_one_clear_line(tmp_path, npz, case):
    np.savez(tmp_path / "x_only.npz", x=np.zeros((4, 45), np.float32))
    np.savez(tmp_path / "shape.npz", x=np.zeros((4, 44), np.float32), y=np.zeros(4, np.int64))
    np.savez(tmp_path / "labels.npz", x=np.zeros((4, 45), np.float32), y=np.array([0, 1, 7, 2]))
    (tmp_path / "text.npz").write_text("hello")
    args, words = {
        "no_data": (["--finetune-epochs", "2"], "--finetune-epochs needs data: give --finetune-data"),
        "missing_y": (["--eval-data", str(tmp_path / "x_only.npz")], "must hold arrays named x and y (it has x)"),
        "wrong_shape": (["--eval-data", str(tmp_path / "shape.npz")],
                        "x has shape (4, 44), which does not hold samples of the model's input shape (45,)"),
        "label_range": (["--eval-data", str(tmp_path / "labels.npz")], "labels must be class indices in [0, 7)"),
        "not_npz": (["--finetune-data", str(tmp_path / "text.npz"), "--finetune-epochs", "1"], "as an .npz file"),
    }[case]
    r = texelfit("build", "models:mlp_45_31_7", "--input-shape", "45", "--out", str(tmp_path / "o"), *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("texelfit: error:"), r.stderr
    assert words in lines[0], lines[0]


def test_finetuned_build_is_deterministic(trained):
    ckpt, _ = trained
    a, b = (compile_source(DEFAULT_SOURCE, weights=str(ckpt), prune=0.5, quantize="int8", finetune_epochs=1).files
            for _ in range(2))
    assert a == b
