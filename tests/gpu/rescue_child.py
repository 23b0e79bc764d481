"""A child process for test_rescue_gpu.py: an IPython shell with the extension on
``cuda:0`` runs one scenario and prints what the user would read.

    python rescue_child.py oom        (a memory cap from set_per_process_memory_fraction)
    python rescue_child.py fragment   (a variable-length workload that fragments the cache)
    python rescue_child.py reruns     (a leaking cell run three times, a clean one ten)

The fragmentation run is made twice by the test: with the default allocator, and with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment (a new process: the
setting is read when CUDA is first used)."""
from __future__ import annotations

import sys

import torch
from IPython.core.interactiveshell import InteractiveShell

MiB, GiB = 1 << 20, 1 << 30


def cap(nbytes: int) -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(nbytes / total, 0)


def main(mode: str) -> None:
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext jupyter_gpumem\n%config GpuMemMagics.default_device = 'cuda:0'")
    sh.run_cell("import torch\nkeep = torch.ones(64 << 20, device='cuda')   # the user's own")
    if mode == "reruns":
        leak = "if 'acc' not in globals():\n    acc = []\nacc.append(torch.ones(64 << 20, device='cuda'))"
        clean = "x = torch.ones(64 << 20, device='cuda')"
        for i in range(3):
            sh.run_cell(leak, store_history=True)
        for i in range(10):
            sh.run_cell(clean, store_history=True)
        return
    if mode == "oom":
        cap(4 * GiB)
        sh.run_cell("torch.ones(1536 << 20, dtype=torch.uint8, device='cuda')", store_history=True)
        cell = ("def step():\n    t = torch.ones(1536 << 20, dtype=torch.uint8, device='cuda')\n"
                "    big = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')\n"
                "    return t.numel() + big.numel()\ndone = step()\nprint('RERUN-DONE', done)")
    else:
        cap(6 * GiB)
        # a cache of variable-length results beside big temporaries, in the same segments
        cell = ("kept = []\nfor i in range(4):\n    seg = torch.empty(1200 << 20, dtype=torch.uint8, device='cuda')\n"
                "    del seg\n    holes = []\n    for j in range(2):\n"
                "        holes.append(torch.empty((560 - 40 * j) << 20, dtype=torch.uint8, device='cuda'))\n"
                "        kept.append(torch.empty((20 + 10 * j) << 20, dtype=torch.uint8, device='cuda'))\n"
                "    del holes\n"
                "big = torch.empty(1536 << 20, dtype=torch.uint8, device='cuda')\nprint('RERUN-DONE', big.numel())")
    result = sh.run_cell(cell, store_history=True)
    print("CELL-FAILED" if result.error_in_exec is not None else "CELL-PASSED", flush=True)
    if mode == "oom" and result.error_in_exec is not None:
        del result
        sh.run_cell("%gpumem rescue", store_history=True)
        sh.run_cell("print('KEEP-INTACT', keep.numel() == (64 << 20))")


if __name__ == "__main__":
    main(sys.argv[1])
