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
    """Bytes that process ``pid`` (default: this one) uses on device ``index``.

    A process with both a compute and a graphics context is listed twice by
    NVML with the same figure: it is counted once. ``None`` where NVML lists
    the process but cannot tell its memory (some drivers, MIG, WSL).
    """
    if not _ensure():
        return None
    nv = _pynvml()
    pid = os.getpid() if pid is None else pid
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        lists = [list(nv.nvmlDeviceGetComputeRunningProcesses(h))]
        try:
            lists.append(list(nv.nvmlDeviceGetGraphicsRunningProcesses(h)))
        except Exception:
            pass
    except Exception:
        return None
    figure, unknown = 0, False
    for procs in lists:
        values = [p.usedGpuMemory for p in procs if p.pid == pid]
        if any(v is None for v in values):
            unknown = True
        else:
            figure = max(figure, sum(int(v) for v in values))
    return None if unknown and not figure else figure


def visible_indices(env: str | None = None) -> list[int]:
    """NVML indices of the devices CUDA numbers 0, 1, ... in this process.

    Follows ``CUDA_VISIBLE_DEVICES`` as CUDA does: integers, full ``GPU-...``
    UUIDs and unambiguous UUID prefixes; parsing stops at the first entry
    that matches nothing, matches more than one device, or repeats one.
    Integers count in NVML's (PCI bus) order, which is CUDA's only when
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or the GPUs are all alike: see
    :func:`order_note`.
    """
    count = device_count()
    if env is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    uuids: dict[int, str] = {}
    out: list[int] = []
    for raw in env.split(","):
        item = raw.strip()
        if not item:
            break
        if item.lstrip("-").isdigit():
            idx = int(item)
            if idx < 0 or idx >= count or idx in out:
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
        if len(matches) != 1 or matches[0] in out:
            break
        out.append(matches[0])
    return out


def order_note() -> str | None:
    """Why numbering CUDA devices by position may not match NVML, or ``None``.

    CUDA numbers devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``;
    NVML numbers them by PCI bus. Alike GPUs tie, and ties go by PCI bus, so
    the orders differ only when the GPUs differ.
    """
    if os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper() == "PCI_BUS_ID":
        return None
    names = set()
    for i in range(device_count()):
        d = read_device(i)
        if d is not None:
            names.add(d.name)
    if len(names) <= 1:
        return None
    return ("the GPUs differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID, so CUDA's device "
            "numbers may not follow NVML's: set CUDA_DEVICE_ORDER=PCI_BUS_ID before any "
            "framework starts for exact per-device figures")


def index_for_uuid(uuid: str) -> int | None:
    """NVML index of the device with this UUID (``GPU-`` prefix optional)."""
    want = uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
    for i in range(device_count()):
        d = read_device(i)
        if d is not None and d.uuid == want:
            return i
    return None
