"""Runs the sidebar's frontend unit tests (vitest, in labextension/).

Before that, the real kernel side (jupyter_gpumem/comm.py on a real shell
with a real torch tensor) produces one message of each type; the frontend
tests check that every one passes the sidebar's protocol checks and renders.
Skipped only when Node.js is absent.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LABEXT = ROOT / "labextension"


def _jlpm() -> list[str] | None:
    found = shutil.which("jlpm") or shutil.which("jlpm", path=str(Path(sys.executable).parent))
    return [found] if found else None


def _kernel_messages(path: Path) -> None:
    torch = pytest.importorskip("torch")
    from IPython.core.interactiveshell import InteractiveShell

    from recording_comm import open_sidebar, send  # the recording comm (tests/helpers)

    from jupyter_gpumem.views import comm as gpucomm

    ip = InteractiveShell.instance()
    if "jupyter_gpumem" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "jupyter_gpumem")
    gpucomm.register_comm(ip)
    try:
        gpucomm.hub_of(ip).interval = 0.05
        ip.run_cell("import torch; big = torch.ones(1024, 1024)")
        c = open_sidebar()
        send(c, {"type": "set_device", "id": 1, "device": "cpu"})
        ip.run_cell("import time; time.sleep(0.3)")
        send(c, {"type": "purge", "id": 2, "names": ["no_such_name"]})
        send(c, {"type": "purge", "id": 3, "names": ["big"]})
        messages = [d for kind, d, _ in c.sent if kind == "comm_msg"]
    finally:
        gpucomm.unregister_comm(ip)
        ip.user_ns.pop("big", None)
    assert not torch.is_tensor(ip.user_ns.get("big"))
    path.write_text(json.dumps(messages))


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_frontend_unit_tests(tmp_path):
    jlpm = _jlpm()
    assert jlpm, "jlpm not found (it comes with the jupyter-builder or jupyterlab package)"
    if not (LABEXT / "node_modules").is_dir():
        subprocess.run(jlpm + ["install"], cwd=LABEXT, check=True, timeout=600)
    messages = tmp_path / "kernel_messages.json"
    _kernel_messages(messages)
    env = dict(os.environ, GPUMEM_KERNEL_MESSAGES=str(messages), CI="true", NO_COLOR="1")
    env.pop("FORCE_COLOR", None)
    # the cluster's contract runs on its own kernel messages in tests/cluster/test_cluster_magics.py
    run = subprocess.run(jlpm + ["test", "--exclude", "test/cluster_contract.test.ts"],
                         cwd=LABEXT, env=env, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert re.search(r"Tests\s+\d+ passed \(\d+\)", output), output[-3000:]
    assert "contract.test.ts" in output and "skipped" not in output, output[-3000:]
