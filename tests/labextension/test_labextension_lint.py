"""The sidebar's frontend passes its lint: prettier's formatting and eslint
(the flat config of the JupyterLab extension template, labextension/eslint.config.mjs).

``jlpm lint:check`` in labextension/ takes well under a minute. Skipped only
when Node.js is absent.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LABEXT = Path(__file__).resolve().parents[2] / "labextension"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_frontend_lint_check():
    jlpm = shutil.which("jlpm") or shutil.which("jlpm", path=str(Path(sys.executable).parent))
    assert jlpm, "jlpm not found (it comes with the jupyter-builder or jupyterlab package)"
    if not (LABEXT / "node_modules").is_dir():
        subprocess.run([jlpm, "install"], cwd=LABEXT, check=True, timeout=600)
    run = subprocess.run([jlpm, "lint:check"], cwd=LABEXT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
