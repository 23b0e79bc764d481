"""The warm scan on a real GPU: after each change a training notebook makes between two
``%gpumem`` (a step, new gradients, a name replaced, ``param.data =``, a new state entry),
the warm report is the full scan's, byte for byte; what the warm scan keeps pins no
device memory (a purge after warm scans takes the process back to its floor); and the
warm call is faster than the full one (the times are printed for RESULTS.md).

Run on a GPU machine: ``python -m pytest -q -s tests/gpu/test_warm_gpu.py``.
"""
from __future__ import annotations

import statistics
import time

from gpu_setup import cuda_torch

torch = cuda_torch()

from conftest import run  # noqa: E402
from gpu_floor import (  # noqa: E402,F401
    assert_at_most_floor, empty_caches_after_each_test, floor, process_bytes)
from conftest import same_report  # noqa: E402
from jupyter_gpumem.core.scan import warm as scan_warm  # noqa: E402
from jupyter_gpumem.session import session_of  # noqa: E402

SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(256, 4, 1024)
                              for _ in range(24)]).cuda()
opt = torch.optim.Adam(model.parameters())
model(torch.randn(16, 4, 256, device='cuda')).sum().backward()
opt.step()
batches = [torch.randn(64, 256, device='cuda') for _ in range(200)]
table = {i: (i, str(i), [i]) for i in range(20_000)}
"""

STEPS = [
    ("nothing", "pass"),
    ("an optimizer step", "opt.step()"),
    ("a training step", "opt.zero_grad()\nmodel(torch.randn(16, 4, 256, device='cuda')).sum()"
                        ".backward()\nopt.step()"),
    ("a name replaced", "batches = [torch.randn(64, 256, device='cuda') for _ in range(300)]"),
    ("param.data = new", "model[0].linear1.bias.data = torch.zeros(1024, device='cuda')"),
    ("a new state entry", "opt.state[model[0].linear1.bias]['extra'] = "
                          "torch.ones(1 << 20, device='cuda')"),
    ("a tensor into plain data", "table[3][2].append(torch.ones(1 << 18, device='cuda'))"),
]


def _timed(ip, line: str) -> tuple[object, float]:
    t = time.perf_counter()
    snap = ip.run_line_magic("gpumem", line)
    return snap, (time.perf_counter() - t) * 1000


def test_warm_reports_are_the_full_ones_and_pin_nothing(ip):
    run(ip, SETUP)   # a first run loads the kernels, which stay with the context
    ip.run_line_magic("gpumem", "purge model opt batches --device cuda:0")
    base = floor()
    run(ip, SETUP)
    state = session_of(ip).warm
    _timed(ip, "--device cuda:0 -o")
    for what, cell in STEPS:
        run(ip, cell)
        warm, warm_ms = _timed(ip, "--device cuda:0 -o")
        reused = state.reused
        full, full_ms = _timed(ip, "--device cuda:0 --full -o")
        same_report(warm, full)
        print(f"{what}: warm {warm_ms:.1f} ms (names reused {reused}), full {full_ms:.1f} ms")
    if scan_warm.WarmScan.available():
        times = [_timed(ip, "--device cuda:0 -o")[1] for _ in range(9)]
        fulls = [_timed(ip, "--device cuda:0 --full -o")[1] for _ in range(5)]
        print(f"unchanged: warm median {statistics.median(times):.1f} ms, "
              f"full median {statistics.median(fulls):.1f} ms")
        assert statistics.median(times) < statistics.median(fulls)
    used = process_bytes()
    ip.run_line_magic("gpumem", "purge model opt batches table --device cuda:0")
    after = process_bytes()
    print(f"device used by the process: {used / 2**20:.1f} MiB before the purge, "
          f"{after / 2**20:.1f} MiB after, floor {base / 2**20:.1f} MiB")
    assert_at_most_floor(after, base)
