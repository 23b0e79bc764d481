"""What the GPU tests of a real Jupyter server read of real NVML (tests/gpu: the
orphans' and the terminal's): the kernels' cells that hold device memory, and NVML's
figures for the device the tests run on. pynvml is imported when a figure is read."""
from __future__ import annotations

import os
import time

#: a module a kernel writes to its folder: ``hold`` allocates on the GPU in a process of
#: its own session (out of the kernel's process group) and says so in the file ``ready``
WORKER = '''
import os, sys, time
def hold(nbytes, ready):
    os.setsid()                  # out of the kernel's process group
    import torch
    x = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    open(ready, "w").write(str(os.getpid()))
    time.sleep(600)
'''

#: a kernel's cell: hold ``n`` bytes on the GPU, print the kernel's pid
HOLD = ("import os, torch\n"
        "x = torch.ones({n}, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
        "print(os.getpid())")


def nvml_index() -> int:
    """NVML's index of the first device CUDA_VISIBLE_DEVICES shows (0 where unset)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def nvml_figures() -> tuple[int, dict[int, int]]:
    """Device 0's used bytes and NVML's bytes per pid (compute list), read here."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index())
    used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    procs = {p.pid: int(p.usedGpuMemory or 0)
             for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    return used, procs


def wait_listed(pids, present=True, timeout=30.0):
    """Wait until NVML lists (or, ``present=False``, no longer lists) each of ``pids``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        _, procs = nvml_figures()
        if all((p in procs) == present for p in pids):
            return
        time.sleep(0.2)
    raise AssertionError(f"NVML still {'lacks' if present else 'lists'} some of {pids}")
