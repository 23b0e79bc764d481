"""Memory the walk used to miss, on a real GPU: a wrapper tensor subclass's inner
tensor and what a custom autograd Function keeps on its ctx. Each is blamed on its
name with its path, and purging the name takes the process back to its floor.

Run on a GPU machine: ``python -m pytest -q -s tests/gpu/test_walk_gpu.py``.
"""
from __future__ import annotations

import pytest

from gpu_setup import GIB_FLOATS, MIB, cuda_torch

torch = cuda_torch()

from conftest import run  # noqa: E402

from gpu_floor import (  # noqa: E402,F401
    assert_at_most_floor, empty_caches_after_each_test, floor, process_bytes)


DEFINE = """
import torch
from wrapper_tensor import wrapper_class

Wrapper = wrapper_class()

class KeepsExtra(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.extra = torch.ones(%d, device=x.device)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2
""" % GIB_FLOATS

CASES = {
    "wrapper subclass": (f"w = Wrapper(torch.ones({GIB_FLOATS}, device='cuda'))", "w", "w.elem"),
    "custom Function ctx": (
        "x = torch.ones(16, device='cuda', requires_grad=True)\nout = KeepsExtra.apply(x)\ndel x",
        "out", "out.grad_fn.extra"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_blamed_with_its_path_and_purged_to_the_floor(ip, case):
    code, name, path = CASES[case]
    run(ip, DEFINE)
    run(ip, code)   # a first run loads the kernels, which stay with the context
    ip.run_line_magic("gpumem", f"purge {name} --device cuda:0")
    base = floor()
    run(ip, code)
    leaked = process_bytes()
    snap = ip.run_line_magic("gpumem", "--device cuda:0 -o")
    h = snap.holder(name)
    rows = {r.path: r.nbytes for r in
            ip.run_line_magic("gpumem", f"{name} --device cuda:0 -o").holder(name).rows}
    ip.run_line_magic("gpumem", f"purge {name} --device cuda:0")
    after = process_bytes()
    print(f"\n{case}: {name} holds {h.unique / MIB:.1f} MiB, rows {rows}; floor "
          f"{base / MIB:.1f} MiB, leaked {(leaked - base) / MIB:.1f} MiB, after purge "
          f"{(after - base) / MIB:+.1f} MiB")
    assert h.unique >= 4 * GIB_FLOATS and rows.get(path) == 4 * GIB_FLOATS, rows
    assert leaked - base >= 1000 * MIB
    assert_at_most_floor(after, base, case)
