"""What the GPU tests of a real Jupyter server read of real NVML (tests/gpu: the
orphans' and the terminal's): the kernels' cells that hold device memory, and NVML's
figures for the device the tests run on. pynvml is imported when a figure is read."""
from __future__ import annotations

import os
import time

import pytest

MiB, GiB = 1 << 20, 1 << 30
#: how far a figure read through the extension may stand from NVML's own
SLACK = 2 * MiB

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

#: the head of a kernel's cell that spawns processes running the :data:`WORKER` written to
#: ``{folder}`` (a format string: braces the cell needs are doubled)
SPAWN_HEAD = ('import sys, os, time\n'
              'sys.path.insert(0, {folder!r})\n'
              'import torch.multiprocessing as mp, gpumem_worker\n')


def gpu_server_mark():
    """For a test module of a real server on a GPU, at its top: skips the module where
    torch, jupyter_server, ipykernel or nvidia-ml-py is not installed; the mark that skips
    its tests where torch sees no CUDA device (the module's ``pytestmark``)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (wheels.sh)")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (wheels.sh)")
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    return pytest.mark.skipif(not torch.cuda.is_available(),
                              reason="no CUDA device (torch.cuda.is_available() is False)")


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


def two_kernels_holding(server):
    """Three kernels of ``server`` (a.ipynb, work/b.ipynb, c.ipynb), the first holding
    1 GiB of the GPU, the second 2 GiB: their ``(kernel id, client)`` and the two pids."""
    from jupyter_harness import run

    sessions = [server.session(name) for name in ("a.ipynb", "work/b.ipynb", "c.ipynb")]
    pids = [int(run(client, HOLD.format(n=n))) for (_, client), n in zip(sessions, (GiB, 2 * GiB))]
    return sessions, pids
