"""The floor the GPU tests compare a purge against, shared by every file here.

A floor is this process's device memory (NVML's per-process figure) with
every cache emptied: torch's caching allocator and its cuBLAS workspaces,
CuPy's device and pinned pools and FFT plans, and whatever ``gc`` can free.
Measured with a cache still full (one an earlier test left, or one the
test's own warm-up made), the floor would include memory that a later
``%gpumem purge`` gives back as well, and the purge would end *below* it:
that is why ``assert_at_most_floor`` accepts any figure under the floor and
only bounds how far above it a purge may leave the process.

``empty_caches_after_each_test`` (autouse where a module imports it) empties
the same caches after every test, so no test leaves a cache for the next
one, whatever the order: the directory passes in one process as well as
file by file.

This is a plain module, not a ``conftest.py``: the tests import ``run`` with
``from conftest import run`` (tests/conftest.py), and pytest puts a second,
package-less ``conftest`` in ``sys.modules`` under the same name.

Nothing here imports torch or CuPy: only frameworks the process has already
imported are emptied, and CUDA is not initialised by this module.
"""
from __future__ import annotations

import gc
import sys
import time

import pytest

MiB = 1 << 20
SLACK = 2 * MiB


def _torch_empty() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    torch.cuda.synchronize()   # the current device; empty_cache waits for the others' events
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()           # every device's cuBLAS workspaces (held in torch's allocator)
    torch.cuda.empty_cache()   # every device's cached blocks


def _cupy_devices(cupy) -> list[int]:
    """CuPy's current device and every device where this process has a context."""
    from jupyter_gpumem.backends import nvml

    found = {int(cupy.cuda.runtime.getDevice())}
    if nvml.available():
        for ordinal, index in enumerate(nvml.visible_indices()):
            if (nvml.process_used(index) or 0) > 0:
                found.add(ordinal)
    return sorted(found)


def _cupy_empty() -> None:
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    try:
        devices = _cupy_devices(cupy)
    except Exception:  # noqa: BLE001 - CuPy without a usable GPU: nothing to empty
        return
    pool = cupy.get_default_memory_pool()
    for index in devices:
        with cupy.cuda.Device(index):
            cupy.cuda.Device(index).synchronize()
            pool.free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    config = sys.modules.get("cupy.fft.config")
    if config is not None:
        config.get_plan_cache().clear()


def empty_caches() -> None:
    """Free what ``gc`` can, then give every framework's cached device memory back."""
    gc.collect()
    _cupy_empty()
    _torch_empty()
    gc.collect()


def process_bytes(ordinal: int = 0) -> int:
    """This process's memory on visible device ``ordinal``, by NVML, after a sync."""
    from jupyter_gpumem.backends import nvml

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(ordinal)
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.cuda.Device(ordinal).synchronize()
        except Exception:  # noqa: BLE001 - CuPy without a usable GPU
            pass
    used = nvml.process_used(nvml.visible_indices()[ordinal])
    assert used is not None, "NVML must report this process on the GPU machine"
    return used


def floor(ordinal: int = 0) -> int:
    """The process's memory on ``ordinal`` with every cache emptied (see the module)."""
    empty_caches()
    time.sleep(0.2)   # let NVML's per-process figure settle after the frees
    return process_bytes(ordinal)


def assert_at_most_floor(after: int, floor_bytes: int, what: str = "", slack: int = SLACK) -> None:
    """``after`` (a purge's result) is at most ``slack`` above the floor; below is fine."""
    assert after - floor_bytes <= slack, (
        f"{what}: {after / MiB:.1f} MiB after, {(after - floor_bytes) / MiB:+.1f} MiB against "
        f"the floor of {floor_bytes / MiB:.1f} MiB (at most {slack / MiB:.0f} MiB above it)")


@pytest.fixture(autouse=True)
def empty_caches_after_each_test():
    """No test leaves a cache behind for the next one (import it into a module to use it)."""
    yield
    empty_caches()


# Python code for a kernel started by a test (test_comm_gpu): the same emptying there.
EMPTY_CACHES_IN_KERNEL = (
    "import sys as _sys\n"
    "_sys.path.insert(0, {here!r})\n"
    "import gpu_floor as _gpu_floor\n"
    "_gpu_floor.empty_caches()\n"
    "del _sys, _gpu_floor\n"
)


def empty_caches_code() -> str:
    """``EMPTY_CACHES_IN_KERNEL`` for this folder."""
    from pathlib import Path

    return EMPTY_CACHES_IN_KERNEL.format(here=str(Path(__file__).resolve().parent))
