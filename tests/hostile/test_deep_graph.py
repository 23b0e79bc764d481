"""Deep autograd graphs: after a scan, freeing the graph must not crash the process.

Reading ``grad_fn.next_functions`` gives each node a Python wrapper that torch
keeps for the node's life, and freeing a chain of wrapped nodes recurses once per
node: about 40,000 of them overflowed the stack (``del y`` killed the kernel).
The scan now wraps a bounded number of nodes per scan and keeps the nodes it
has wrapped that still live under a process-wide bound (see
``jupyter_gpumem.backends.torch_graph.GraphLedger``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.backends.torch_graph import GraphLedger  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run_child(case: str) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "deep_graph_child.py"), case],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ok ")]
    assert proc.returncode == 0 and lines, (
        f"the process died (rc {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][3:])


def test_a_million_op_chain_survives_scan_purge_and_del():
    out = run_child("million")
    assert out["purged"]
    assert out["y_bytes"] > 0
    assert any(f"autograd graph walked to its first {GraphLedger.per_scan:,} nodes" in m
               for m in out["messages"]), out["messages"]
    assert out["scan_s"] < 3.0 * 1.2
    assert out["marks_alive"] == 0


def test_a_graph_that_grows_between_scans_survives_its_del():
    out = run_child("growing")
    assert out["marks_alive"] == 0


def test_the_ledger_counts_the_nodes_it_marked_until_they_die(ip):
    from conftest import run
    from jupyter_gpumem.backends import active_backends

    ledger = next(b for b in active_backends() if b.name == "torch").ledger
    before = ledger.alive
    run(ip, "import torch\nx = torch.ones(4, requires_grad=True)\nloss = x\n"
            "for _ in range(300): loss = loss * 2")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert "keeps its autograd graph" in snap.holder("loss").hint
    assert ledger.alive - before >= 300   # 300 MulBackward nodes and the leaf's AccumulateGrad
    run(ip, "del loss")
    assert ledger.alive == before
