"""Device and per-process memory readings through NVML (nvidia-ml-py).

Initialised lazily, shut down at exit; where NVML is missing every reading is ``None``
and :func:`status` says why, once; nothing raises. What cannot change is read once
(count, handles, UUIDs); a reading asks only what changes, once per device inside one
:func:`reading`. A lost driver is tried again at most every :data:`RETRY_EVERY` seconds.
What is read when: docs/ARCHITECTURE.md#nvml-readings.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from .base import is_a

RETRY_EVERY = 1.0       # seconds between tries to get NVML (or one device) back
GRAPHICS_EVERY = 1.0    # seconds a device's list of graphics processes is kept

# nvml.h error codes that mean the driver, the library or the device went away
# (a handle read before is then worthless): start NVML again later.
_GONE = frozenset({
    1,    # UNINITIALIZED
    2,    # INVALID_ARGUMENT (a handle of a device that no longer exists)
    9,    # DRIVER_NOT_LOADED
    12,   # LIBRARY_NOT_FOUND
    15,   # GPU_IS_LOST
    16,   # RESET_REQUIRED
    18,   # LIB_RM_VERSION_MISMATCH (a driver reloaded under the process)
    28,   # GPU_NOT_FOUND
    999,  # UNKNOWN
})
_NOT_SUPPORTED = 3

_lock = threading.RLock()
_local = threading.local()
_clock = time.monotonic
_exit_hook = {"registered": False}


def _fresh_state() -> dict:
    """What NVML told this process; ``init``: ``None`` not started, ``True``, ``False`` never."""
    return {
        "init": None,
        "error": None,
        "lost": False,          # it worked once, then went away: try again
        "retry_at": 0.0,        # when to try again (NVML, or the devices in ``missing``)
        "gen": 0,               # bumped at each start: a reading of an older one is dropped
        "nv": None,
        "count": 0,
        "devices": [],          # per index: _Static, or None where it could not be read
        "missing": set(),
        "by_uuid": {},
        "graphics": {},         # index -> (time, processes)
        "no_graphics": set(),   # devices that do not support the graphics list
    }


_state: dict = _fresh_state()


@dataclass
class NvmlDevice:
    """One physical GPU as NVML sees it."""

    index: int
    uuid: str
    name: str
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class _Static:
    """What does not change while the process lives."""

    handle: object
    uuid: str
    name: str


def _pynvml():
    import pynvml  # nvidia-ml-py

    return pynvml


def _text(value) -> str:
    return value.decode() if is_a(value, bytes) else str(value)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _gone(exc: BaseException) -> bool:
    return getattr(exc, "value", None) in _GONE


# -- starting, losing and restarting NVML --------------------------------------------------

def _ensure() -> bool:
    st = _state
    if st["init"] is True:
        if st["missing"] and _clock() >= st["retry_at"]:
            with _lock:
                if st is _state and st["init"] is True:
                    _read_missing(st)
        return True
    if st["init"] is False:
        return False
    with _lock:
        return _start(_state)


def _start(st: dict) -> bool:
    """Start NVML and read what does not change (under ``_lock``)."""
    if st["init"] is not None:
        return bool(st["init"])
    if st["lost"] and _clock() < st["retry_at"]:
        return False
    try:
        nv = _pynvml()
        nv.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
        if st["lost"]:
            st["retry_at"] = _clock() + RETRY_EVERY
            st["error"] = f"NVML went away ({_why(exc)}); trying again"
        else:
            st["init"] = False
            st["error"] = f"NVML unavailable ({_why(exc)})".strip()
        return False
    if not _exit_hook["registered"]:
        _exit_hook["registered"] = True
        atexit.register(_shutdown)
    try:
        count = int(nv.nvmlDeviceGetCount())
    except Exception as exc:
        _stop(nv)
        st.update(lost=True, retry_at=_clock() + RETRY_EVERY,
                  error=f"NVML went away ({_why(exc)}); trying again")
        return False
    st.update(init=True, error=None, lost=False, nv=nv, count=count, gen=st["gen"] + 1,
              devices=[None] * count, missing=set(range(count)), by_uuid={},
              graphics={}, no_graphics=set())
    _read_missing(st)
    return st["init"] is True


def _read_missing(st: dict) -> None:
    """Handle, UUID and name of each device not read yet (under ``_lock``)."""
    nv, gen = st["nv"], st["gen"]
    for i in sorted(st["missing"]):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            dev = _Static(h, _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h)))
        except Exception as exc:
            if _gone(exc):
                _went_away(exc, gen)
                return
            continue
        st["devices"][i] = dev
        st["missing"].discard(i)
        st["by_uuid"][dev.uuid] = i
    if st["missing"]:
        st["retry_at"] = _clock() + RETRY_EVERY


def _went_away(exc: BaseException, gen: int) -> None:
    """The driver or a device went away: forget the handles, try again later."""
    with _lock:
        st = _state
        if st["gen"] != gen or st["init"] is not True:
            return
        _stop(st["nv"])
        st.update(init=None, lost=True, retry_at=_clock() + RETRY_EVERY,
                  error=f"NVML went away ({_why(exc)}); trying again", nv=None, count=0,
                  devices=[], missing=set(), by_uuid={}, graphics={}, no_graphics=set())


def _failed(exc: BaseException, gen: int) -> None:
    if _gone(exc):
        _went_away(exc, gen)


def _stop(nv) -> None:
    try:
        nv.nvmlShutdown()
    except Exception:
        pass


def _shutdown() -> None:
    with _lock:
        st = _state
        if st["init"] and st["nv"] is not None:
            _stop(st["nv"])
        st.update(init=None, nv=None, count=0, devices=[], missing=set(), by_uuid={},
                  graphics={}, no_graphics=set())


def _static(index: int) -> tuple[_Static | None, int, object]:
    """This device's handle, UUID and name (or ``None``), the NVML start they belong to
    and its module."""
    st = _state
    devs = st["devices"]
    if st["init"] is not True or not 0 <= index < len(devs):
        return None, st["gen"], None
    return devs[index], st["gen"], st["nv"]


# -- one reading -----------------------------------------------------------------------------

@contextlib.contextmanager
def reading():
    """Within this block each device's memory info and compute processes are asked once.

    ``read_devices`` opens one per read; nested blocks share the outer one. Each thread
    has its own, so a sampling thread never sees the main thread's figures. Outside any
    block every call asks NVML afresh.
    """
    if getattr(_local, "batch", None) is not None:
        yield
        return
    _local.batch = {"gen": None, "mem": {}, "procs": {}}
    try:
        yield
    finally:
        _local.batch = None


def _batch(gen: int) -> dict | None:
    batch = getattr(_local, "batch", None)
    if batch is not None and batch["gen"] != gen:
        batch.update(gen=gen, mem={}, procs={})
    return batch


def _ask(kind: str, index: int, function: str):
    """NVML's ``function(handle)`` for this device, once per reading; ``None`` where it fails."""
    dev, gen, nv = _static(index)
    if dev is None:
        return None
    batch = _batch(gen)
    if batch is not None and index in batch[kind]:
        return batch[kind][index]
    try:
        value = getattr(nv, function)(dev.handle)
        if kind == "procs":
            value = list(value)
    except Exception as exc:
        _failed(exc, gen)
        value = None
    if batch is not None and _state["gen"] == gen:
        batch[kind][index] = value
    return value


def _graphics(index: int) -> list:
    """Device ``index``'s graphics processes, kept for ``GRAPHICS_EVERY`` seconds."""
    st = _state
    dev, gen, nv = _static(index)
    if dev is None or index in st["no_graphics"]:
        return []
    now = _clock()
    kept = st["graphics"].get(index)
    if kept is not None and now - kept[0] < GRAPHICS_EVERY:
        return kept[1]
    try:
        procs = list(nv.nvmlDeviceGetGraphicsRunningProcesses(dev.handle))
    except Exception as exc:
        if is_a(exc, AttributeError) or getattr(exc, "value", None) == _NOT_SUPPORTED:
            st["no_graphics"].add(index)
        else:
            _failed(exc, gen)
        procs = []
    if _state["gen"] == gen:
        st["graphics"][index] = (now, procs)
    return procs


# -- the public readings ---------------------------------------------------------------------

def available() -> bool:
    """True when NVML answers."""
    return _ensure()


def status() -> str | None:
    """Why NVML is not available, or ``None`` when it is."""
    _ensure()
    return _state["error"]


def device_count() -> int:
    if not _ensure():
        return 0
    return _state["count"]


def read_device(index: int) -> NvmlDevice | None:
    """Memory of physical device ``index`` (NVML order), or ``None``."""
    if not _ensure():
        return None
    dev, _, _ = _static(index)
    if dev is None:
        return None
    mem = _ask("mem", index, "nvmlDeviceGetMemoryInfo")
    if mem is None:
        return None
    try:
        return NvmlDevice(index, dev.uuid, dev.name, int(mem.total), int(mem.used), int(mem.free))
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
    pid = os.getpid() if pid is None else pid
    compute = _ask("procs", index, "nvmlDeviceGetComputeRunningProcesses")
    if compute is None:
        return None
    lists = [compute]
    mine = [p.usedGpuMemory for p in compute if p.pid == pid]
    if not mine or any(v is None for v in mine):
        # no compute context here (or no figure for it): a graphics context may have one
        lists.append(_graphics(index))
    figure, unknown = 0, False
    for procs in lists:
        values = [p.usedGpuMemory for p in procs if p.pid == pid]
        if any(v is None for v in values):
            unknown = True
        else:
            figure = max(figure, sum(int(v) for v in values))
    return None if unknown and not figure else figure


def _uuids() -> dict[int, str]:
    """NVML index -> UUID of every device that could be read (no NVML call)."""
    return {i: d.uuid for i, d in enumerate(_state["devices"]) if d is not None}


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
    uuids: dict[int, str] | None = None
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
        if uuids is None:
            uuids = _uuids()
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
    if not _ensure():
        return None
    names = {d.name for d in _state["devices"] if d is not None}
    if len(names) <= 1:
        return None
    return ("the GPUs differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID, so CUDA's device "
            "numbers may not follow NVML's: set CUDA_DEVICE_ORDER=PCI_BUS_ID before any "
            "framework starts for exact per-device figures")


def index_for_uuid(uuid: str) -> int | None:
    """NVML index of the device with this UUID (``GPU-`` prefix optional)."""
    if not _ensure():
        return None
    want = uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
    return _state["by_uuid"].get(want)


@dataclass(frozen=True)
class NvmlProcess:
    """One process in a device's NVML lists: ``pid`` 0 where NVML gives none (a PID
    namespace hides it), ``used`` ``None`` where NVML cannot tell its memory, ``lists``
    the lists it is in (``"compute"``, ``"graphics"``)."""

    pid: int
    used: int | None
    lists: tuple[str, ...]


def processes(index: int) -> list[NvmlProcess] | None:
    """Every process in device ``index``'s compute and graphics lists, once each.

    A process in both lists is one entry (the larger figure: NVML gives the same one
    twice); several entries of one pid in one list (MIG instances) add up. Entries
    without a pid stay one each. ``None`` where NVML cannot answer.
    """
    if not _ensure():
        return None
    compute = _ask("procs", index, "nvmlDeviceGetComputeRunningProcesses")
    if compute is None:
        return None
    by_pid: dict[int, list] = {}     # pid -> [used or None, lists]
    nameless: list[NvmlProcess] = []
    for kind, procs in (("compute", compute), ("graphics", _graphics(index))):
        seen: dict[int, int | None] = {}
        for p in procs:
            pid = int(getattr(p, "pid", 0) or 0)
            value = getattr(p, "usedGpuMemory", None)
            value = None if value is None else int(value)
            if pid <= 0:
                nameless.append(NvmlProcess(0, value, (kind,)))
            elif pid in seen:
                old = seen[pid]
                seen[pid] = None if old is None or value is None else old + value
            else:
                seen[pid] = value
        for pid, value in seen.items():
            entry = by_pid.setdefault(pid, [None, ()])
            if value is not None:
                entry[0] = value if entry[0] is None else max(entry[0], value)
            entry[1] += (kind,)
    out = [NvmlProcess(pid, used, lists) for pid, (used, lists) in by_pid.items()]
    return out + nameless
