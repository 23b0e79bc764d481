"""SPEC's table on a real GPU: blame, purge, and back to the floor (2 MiB above at most).

For every case: measure the process's floor (CUDA context and loaded kernels,
with every cache emptied: gpu_floor.py), leak about 1 GiB the way the case does, run
``%gpumem`` and purge exactly the holders it blamed (user names by name, hidden
holders with a bare ``%gpumem purge``), then read NVML's per-process figure
and torch's counters again. An unrelated tensor must survive untouched.

Run on a GPU machine: ``python -m pytest -q -s tests/gpu/test_table_gpu.py``.
"""
from __future__ import annotations

import pytest

from gpu_setup import GIB_FLOATS, MIB, cuda_torch

torch = cuda_torch()

from conftest import run  # noqa: E402

from gpu_floor import (  # noqa: E402,F401
    assert_at_most_floor, empty_caches_after_each_test, floor, process_bytes)


CASES = {
    "plain variable": f"t = torch.ones({GIB_FLOATS}, device='cuda')",
    "displayed value (Out, _)": f"torch.ones({GIB_FLOATS}, device='cuda')",
    "frame in the last traceback": (
        f"def f():\n    t = torch.ones({GIB_FLOATS}, device='cuda')\n    1/0\nf()"),
    "exception kept in a variable": (
        f"def f():\n    t = torch.ones({GIB_FLOATS}, device='cuda')\n    1/0\n"
        "try:\n    f()\nexcept ZeroDivisionError as e:\n    err = e"),
    "autograd graph of a scalar loss": (
        "model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.ReLU(),"
        " torch.nn.Linear(8192, 1)).cuda()\n"
        "x = torch.randn(8192, 4096, device='cuda')\nloss = model(x).square().mean()\ndel model, x"),
    "optimizer state after del model": (
        "model = torch.nn.Linear(8192, 8192).cuda()\nopt = torch.optim.Adam(model.parameters())\n"
        "model(torch.randn(64, 8192, device='cuda')).sum().backward()\nopt.step()\ndel model"),
    "closure": (f"def make():\n    t = torch.ones({GIB_FLOATS}, device='cuda')\n    return lambda: t\nfn = make()"),
    "lru_cache": (f"import functools\n@functools.lru_cache\ndef g(n):\n    return torch.ones(n, device='cuda')\n"
                  f"g({GIB_FLOATS});"),
    "suspended generator": (f"def gen():\n    t = torch.ones({GIB_FLOATS}, device='cuda')\n    yield 1\n"
                            "it = gen()\nnext(it);"),
    "class attribute": f"class C:\n    cache = torch.ones({GIB_FLOATS}, device='cuda')",
    "16-element view of 1 GiB": f"base = torch.ones({GIB_FLOATS}, device='cuda')\nv = base[:16]\ndel base",
    "module object in sys.modules": (
        f"import sys, types\nmymod = types.ModuleType('mymod')\nmymod.t = torch.ones({GIB_FLOATS}, device='cuda')\n"
        "sys.modules['mymod'] = mymod"),
}


def _floor(ip) -> tuple[int, int]:
    """The floor (process bytes, torch's allocated bytes) with no hidden holder and
    every cache emptied."""
    ip.run_line_magic("gpumem", "purge")     # hidden holders (and caches)
    return floor(), torch.cuda.memory_allocated(0)


RESULTS: list[tuple] = []


@pytest.fixture
def gpu_ip(ip):
    run(ip, "import torch\nkeep = torch.full((1024,), 7.0, device='cuda')\n"
            "torch.ones(64, 64, device='cuda') @ torch.ones(64, 64, device='cuda');")
    yield ip


def _leak_and_purge(ip, case):
    """Run the case, purge what %gpumem blames; return (blamed, process bytes while leaked)."""
    ip.run_cell(CASES[case], store_history=True)
    leaked = process_bytes()
    snap = ip.run_line_magic("gpumem", "--device cuda:0 -o")
    blamed = [h for h in snap.holders if h.total >= 256 * MIB]
    assert blamed, f"nothing blamed for {case}: {snap!r}"
    names = [h.purge for h in blamed if not h.hidden]
    if names:
        ip.run_line_magic("gpumem", "purge " + " ".join(names) + " --device cuda:0")
    if any(h.hidden for h in blamed):
        ip.run_line_magic("gpumem", "purge --device cuda:0")
    return blamed, leaked


@pytest.mark.parametrize("case", list(CASES))
def test_case_back_to_floor(gpu_ip, case):
    ip = gpu_ip
    # a first run loads the case's kernels (CUDA loads module code lazily, and that code
    # stays with the context): the floor is measured after it, as GPU.md asks
    _leak_and_purge(ip, case)
    base, floor_alloc = _floor(ip)
    blamed, leaked = _leak_and_purge(ip, case)
    after = process_bytes()
    after_alloc = torch.cuda.memory_allocated(0)
    RESULTS.append((case, [h.label for h in blamed], base, leaked, after, floor_alloc, after_alloc))
    print(f"\n{case}: blamed {[h.label for h in blamed]}; floor {base / MIB:.1f} MiB, leaked "
          f"{(leaked - base) / MIB:.1f} MiB, after purge {(after - base) / MIB:+.1f} MiB "
          f"(allocated {floor_alloc} -> {after_alloc} bytes)")
    assert leaked - base >= 256 * MIB
    assert_at_most_floor(after, base, case)
    assert after_alloc <= floor_alloc
    assert float(ip.user_ns["keep"][0]) == 7.0 and ip.user_ns["keep"].is_cuda
