"""scripts/record_stream.py, run as the lead runs it on a GPU machine, here on the CPU.

It records what the sidebar receives over the product's comm while a few
cells train a small model; the browser test replays that file. Here it runs
in a child process (``--device cpu``) and the file is checked: the messages
the sidebar needs, in order, and the holders the cells leave behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "record_stream.py"


def test_record_stream_on_the_cpu(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "stream.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--pause", "0.2",
                          "--out", str(out)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith(f"wrote {out}: ")
    stream = json.loads(out.read_text())
    assert stream["schema"] == "jupyter_gpumem.stream/1"
    assert stream["device"] == "cpu" and stream["sidebar_device"] == "cpu"
    kinds = [m["data"]["type"] for m in stream["messages"]]
    assert kinds[0] == "hello"
    assert "error" not in kinds
    # one snapshot for the device selection, one after each cell, one for the refresh
    assert kinds.count("snapshot") >= len(stream["cells"]) + 2
    assert kinds.count("devices") >= 1
    times = [m["t"] for m in stream["messages"]]
    assert times == sorted(times)
    last = [m["data"] for m in stream["messages"] if m["data"]["type"] == "snapshot"][-1]
    assert last["reply_to"] == 2 and last["snapshot"]["schema"] == "jupyter_gpumem.snapshot/1"
    holders = {h["name"]: h for h in last["snapshot"]["holders"]}
    for name in ("model", "opt", "loss", "big", "small2", "alias"):
        assert name in holders, sorted(holders)
    assert "loss.item()" in holders["loss"]["hint"]
    out_holder = next(h for n, h in holders.items() if n.startswith("Out["))
    assert "`;`" in out_holder["hint"]
    # each cell's run, for the timeline's bands
    assert all(c["t"] <= c["t_end"] for c in stream["cells"])
