"""The generated NAME.d.ts types the whole API: a TypeScript usage example compiles against it
with `tsc --strict` (npm run typecheck), and a wrong call does not."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from models import mlp_45_31_7
from texelfit.build import compile_onnx, write_files
from texelfit.prep.load import export_simplified

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TSC = os.path.join(ROOT, "node_modules", ".bin", "tsc")


@pytest.fixture(scope="module")
def bundle():
    if not os.path.exists(TSC):
        pytest.fail("node_modules/.bin/tsc is missing: run `npm install` (scripts/setup.sh does)")
    torch.manual_seed(0)
    out = os.path.join(ROOT, "dist", "typecheck")
    shutil.rmtree(out, ignore_errors=True)
    write_files(out, compile_onnx(export_simplified(mlp_45_31_7(), (45,)), name="model", input_shape=(45,)).files)
    return out


def typecheck():
    return subprocess.run(["npm", "run", "--silent", "typecheck"], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_usage_example_typechecks(bundle):
    r = typecheck()
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_wrong_call_fails_to_typecheck(bundle, tmp_path):
    usage = os.path.join(ROOT, "tests", "typecheck", "usage.ts")
    original = open(usage).read()
    try:
        with open(usage, "w") as f:  # an optimizer the API does not have, and a weight name the model lacks
            f.write(original.replace('type: "adamw"', 'type: "rmsprop"').replace('"0.bias": w["0.bias"]', '"fc.bias": w["0.bias"]'))
        r = typecheck()
    finally:
        with open(usage, "w") as f:
            f.write(original)
    assert r.returncode != 0
    assert '"rmsprop"' in r.stdout and '"fc.bias"' in r.stdout, r.stdout


def test_worker_project_typechecks(bundle):
    """Issue 18, item 13: a module worker's project (lib WebWorker: no HTMLCanvasElement, no DOM)
    type-checks the .d.ts without skipLibCheck."""
    config = os.path.join(ROOT, "tests", "typecheck", "tsconfig.worker.json")
    options = json.load(open(config))["compilerOptions"]
    assert options["lib"] == ["ES2022", "WebWorker"] and options["skipLibCheck"] is False
    r = subprocess.run([TSC, "-p", config], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def check_keyed_types(folder: str, onnx_model, shapes, project: str, cut: str, missing: str):
    """The bundle built into dist/FOLDER type-checks tests/typecheck/PROJECT.ts (its tsconfig.PROJECT.json), and the
    same usage with `cut` taken out of it does not: tsc says `missing` is missing."""
    out = os.path.join(ROOT, "dist", folder)
    shutil.rmtree(out, ignore_errors=True)
    write_files(out, compile_onnx(onnx_model, name="model", input_shape=shapes).files)
    config = os.path.join(ROOT, "tests", "typecheck", f"tsconfig.{project}.json")
    r = subprocess.run([TSC, "-p", config], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    usage = os.path.join(ROOT, "tests", "typecheck", f"{project}.ts")
    original = open(usage).read()
    try:
        with open(usage, "w") as f:
            f.write(original.replace(cut, " }"))
        r = subprocess.run([TSC, "-p", config], cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        with open(usage, "w") as f:
            f.write(original)
    assert r.returncode != 0 and f"{missing} is missing" in r.stdout, r.stdout


def test_a_multi_input_bundle_types_its_inputs_by_name():
    """build --inputs: predict, fit and gradients take `Inputs`, an object with one array per input name;
    an object missing an input does not type-check."""
    from test_masks import NAMES, SHAPES, masked_pool

    torch.manual_seed(0)
    check_keyed_types("typecheck_inputs", export_simplified(masked_pool(), SHAPES, NAMES), SHAPES, "inputs",
                      ", mask: new Float32Array(2 * 7) }", "'mask'")


def test_a_bundle_of_several_outputs_types_them_by_name():
    """predict returns `Outputs` and fit and gradients take `Targets`, one array per output name, with a loss and a
    weight per output; y missing an output does not type-check."""
    from test_outputs import FEAT, Detector

    torch.manual_seed(0)
    check_keyed_types("typecheck_outputs", export_simplified(Detector(), (FEAT,)), (FEAT,), "outputs",
                      ", box: new Float32Array(2 * 4) }", "'\"box\"'")
