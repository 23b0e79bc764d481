"""Device and per-process memory readings through NVML (nvidia-ml-py).

NVML is initialised lazily on first use and shut down at exit. Where it is
missing (no driver, no GPU, no package) every reading is ``None`` and
:func:`status` says why, once; nothing raises.
"""
from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass

_lock = threading.Lock()
_state: dict = {"init": None, "error": None}


@dataclass
class NvmlDevice:
    """One physical GPU as NVML sees it."""

    index: int
    uuid: str
    name: str
    total: int
    used: int
    free: int


def _pynvml():
    import pynvml  # nvidia-ml-py

    return pynvml


def _ensure() -> bool:
    with _lock:
        if _state["init"] is not None:
            return _state["init"]
        try:
            nv = _pynvml()
            nv.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
            _state["init"] = False
            _state["error"] = f"NVML unavailable ({type(exc).__name__}: {exc})".strip()
            return False
        _state["init"] = True
        atexit.register(_shutdown)
        return True


def _shutdown() -> None:
    with _lock:
        if _state["init"]:
            try:
                _pynvml().nvmlShutdown()
            except Exception:
                pass
        _state["init"] = None


def available() -> bool:
    """True when NVML answers."""
    return _ensure()


def status() -> str | None:
    """Why NVML is not available, or ``None`` when it is."""
    _ensure()
    return _state["error"]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_count() -> int:
    if not _ensure():
        return 0
    try:
        return _pynvml().nvmlDeviceGetCount()
    except Exception:
        return 0


def read_device(index: int) -> NvmlDevice | None:
    """Memory of physical device ``index`` (NVML order), or ``None``."""
    if not _ensure():
        return None
    nv = _pynvml()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        return NvmlDevice(index, _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h)),
                          int(mem.total), int(mem.used), int(mem.free))
    except Exception:
        return None


def process_used(index: int, pid: int | None = None) -> int | None:
    """Bytes that process ``pid`` (default: this one) uses on device ``index``."""
    if not _ensure():
        return None
    nv = _pynvml()
    pid = os.getpid() if pid is None else pid
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
        try:
            procs += list(nv.nvmlDeviceGetGraphicsRunningProcesses(h))
        except Exception:
            pass
    except Exception:
        return None
    total = 0
    for p in procs:
        if p.pid == pid and p.usedGpuMemory is not None:
            total += int(p.usedGpuMemory)
    return total


def visible_indices(env: str | None = None) -> list[int]:
    """NVML indices of the devices CUDA numbers 0, 1, ... in this process.

    Follows ``CUDA_VISIBLE_DEVICES``: integers, full ``GPU-...`` UUIDs and
    UUID prefixes; parsing stops at the first entry that matches nothing, as
    CUDA does.
    """
    count = device_count()
    if env is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    uuids = {}
    out: list[int] = []
    for raw in env.split(","):
        item = raw.strip()
        if not item:
            break
        if item.lstrip("-").isdigit():
            idx = int(item)
            if idx < 0 or idx >= count:
                break
            out.append(idx)
            continue
        if not uuids:
            for i in range(count):
                d = read_device(i)
                if d is not None:
                    uuids[i] = d.uuid
        want = item if item.startswith(("GPU-", "MIG-")) else "GPU-" + item
        matches = [i for i, u in uuids.items() if u.startswith(want)]
        if len(matches) != 1:
            break
        out.append(matches[0])
    return out


def index_for_uuid(uuid: str) -> int | None:
    """NVML index of the device with this UUID (``GPU-`` prefix optional)."""
    want = uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
    for i in range(device_count()):
        d = read_device(i)
        if d is not None and d.uuid == want:
            return i
    return None
