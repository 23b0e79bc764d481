"""A child process for test_rescue_gpu.py: an IPython shell with the extension on
``cuda:0`` runs one scenario and prints what the user would read.

    python rescue_child.py oom        (a memory cap from set_per_process_memory_fraction)
    python rescue_child.py fragment   (a nearly full device, a workload that fragments the cache)
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


_FILLED = []


def fill_device(leave: int) -> None:
    """Take all of the device's free memory but ``leave`` bytes outside torch's allocator
    (CuPy's runtime call, no pool), as another program on the card would."""
    import cupy  # noqa: PLC0415 - this scenario only
    torch.cuda.synchronize()
    free, _total = torch.cuda.mem_get_info(0)
    _FILLED.append(cupy.cuda.runtime.malloc(free - leave))
    print(f"device filled: {(free - leave) / GiB:.1f} GiB taken, "
          f"{torch.cuda.mem_get_info(0)[0] / MiB:.0f} MiB free", flush=True)


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
        # the device itself nearly full (another program's memory, as beside a second job),
        # not a cap: 2 GiB left. One 1800 MiB block is cut into 200 MiB pieces with a 20
        # MiB result kept after each; the pieces freed leave 1.6 GiB cached in holes of
        # 200 MiB, and a 400 MiB request fits no hole (largest free block 200 MiB) and no
        # new segment (about 250 MiB left on the device). Expandable segments give the
        # holes' pages back and map the request at the segment's end.
        fill_device(leave=2 * GiB)
        cell = ("block = torch.empty(1800 << 20, dtype=torch.uint8, device='cuda')\ndel block\n"
                "holes, kept = [], []\nfor i in range(8):\n"
                "    holes.append(torch.empty(200 << 20, dtype=torch.uint8, device='cuda'))\n"
                "    kept.append(torch.empty(20 << 20, dtype=torch.uint8, device='cuda'))\n"
                "del holes\n"
                "big = torch.empty(400 << 20, dtype=torch.uint8, device='cuda')\n"
                "print('RERUN-DONE', big.numel())")
    result = sh.run_cell(cell, store_history=True)
    print("CELL-FAILED" if result.error_in_exec is not None else "CELL-PASSED", flush=True)
    if mode == "oom" and result.error_in_exec is not None:
        del result
        sh.run_cell("%gpumem rescue", store_history=True)
        sh.run_cell("print('KEEP-INTACT', keep.numel() == (64 << 20))")


if __name__ == "__main__":
    main(sys.argv[1])
