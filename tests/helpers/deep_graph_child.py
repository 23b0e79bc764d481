"""Run in a child process by tests/hostile/test_deep_graph.py (a crash must not end the
test run): scans of deep autograd graphs, then the purge and ``del`` that once
killed the process. Prints ``ok <json>`` at the end.

    python tests/helpers/deep_graph_child.py million|growing
"""
from __future__ import annotations

import json
import sys
import time

import torch
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.backends import active_backends


def main(case: str) -> None:
    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext jupyter_gpumem", store_history=False)
    ns = ip.user_ns
    x = torch.ones(64, requires_grad=True)
    out: dict = {}
    if case == "million":
        y = x
        for _ in range(1_000_000):
            y = y * 1.0001
        ns["y"] = y
        del y
        start = time.perf_counter()
        snap = ip.run_line_magic("gpumem", "--device cpu -o")
        out["scan_s"] = time.perf_counter() - start
        out["messages"] = snap.messages
        out["y_bytes"] = snap.holder("y").total
        ip.run_line_magic("gpumem", "purge y --device cpu")
        out["purged"] = "y" not in ns
    else:   # a graph that grows between scans, as a loss summed over steps without .item()
        ns["total"] = x * 1.0
        for _ in range(12):
            ip.run_cell("for _ in range(5000): total = total * 1.0001", store_history=True)
            ip.run_line_magic("gpumem", "--device cpu")
        ns.pop("total")   # del total: the chain of 60,000 nodes is freed here
    out["marks_alive"] = active_backends()[0].ledger.alive
    print("ok " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
