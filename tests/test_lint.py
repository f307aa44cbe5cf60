"""The runtime's plain-JavaScript modules (runtime_template/runtime/*.js) pass ESLint (eslint.config.js: the
recommended rules; a name is defined if some module of the bundle declares it, and unused only if no module reads
it), as files, before anything renders them."""
from __future__ import annotations

import glob
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _eslint(paths, config=None):
    cmd = [os.path.join(ROOT, "node_modules", ".bin", "eslint"), "--format", "json", *paths]
    if config:
        cmd[1:1] = ["--config", config]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return r.returncode, json.loads(r.stdout or "[]"), r.stderr


def test_runtime_modules_pass_eslint():
    files = sorted(glob.glob(os.path.join(ROOT, "runtime_template", "runtime", "*.js")))
    assert len(files) >= 8, files
    rc, results, err = _eslint(files)
    problems = [f"{os.path.relpath(r['filePath'], ROOT)}:{m['line']}: {m['message']} ({m.get('ruleId')})"
                for r in results for m in r["messages"]]
    assert rc == 0 and not problems, "\n".join(problems) or err
    assert sorted(r["filePath"] for r in results) == files


def test_eslint_finds_an_undefined_name_and_an_unused_function():
    """The configuration catches what it should: in a probe module, a name no module declares and a function no
    module calls; `describe`, which options.js declares, is defined."""
    probe = os.path.join(ROOT, "runtime_template", "runtime", "zz_lint_probe.js")
    try:
        with open(probe, "w", encoding="utf-8") as f:
            f.write("function neverCalled() {\n  return describe(notDeclaredAnywhere);\n}\n")
        rc, results, err = _eslint([probe])
    finally:
        os.remove(probe)
    found = sorted((m["ruleId"], m["line"]) for r in results for m in r["messages"])
    assert rc == 1 and found == [("no-undef", 2), ("no-unused-vars", 1)], (found, err)
