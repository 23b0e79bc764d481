"""Per-device figures: NVML totals, this process, framework allocators.

Cheap enough to call every 50 ms from a thread: it reads counters only (after
the first read, two NVML calls per GPU: see nvml.py),
never the user's namespace, never imports a framework and never creates a
CUDA context (frameworks are asked only once they have initialised one).
"""
from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field

from ..backends import nvml
from ..backends import AcceleratorInfo, FrameworkUsage, active_backends
from ..units import JsonFields
from .scan import native

_DEVICE_RE = re.compile(r"(auto|all|cpu|cuda|gpu|(cuda|mps):([0-9]{1,9})|mps)", re.ASCII)
DEVICE_CHOICES = "auto, all, cpu, cuda or cuda:N"


#: selection text -> the selection it names (the footer parses its selection a few times
#: a cell); only valid ones, and only so many
_PARSED: dict[str, str] = {}


def parse_device(text: str) -> str:
    """Validate a device selection (``auto``, ``all``, ``cpu``, ``cuda``, ``cuda:N``).

    Only ASCII is read: case and the spaces around are let go (``" CPU"`` is ``cpu``),
    ``cuda:01`` is ``cuda:1``; anything else (``cuda:１``, a fullwidth digit) is refused."""
    if type(text) is str:
        known = _PARSED.get(text)
        if known is not None:
            return known
    value = str(text).strip(" \t\r\n")
    m = _DEVICE_RE.fullmatch(value.lower()) if value.isascii() else None
    if m is None:
        raise ValueError(f"unknown device {text!r}: use {DEVICE_CHOICES}")
    value = m.group(1)
    if value == "gpu":
        value = "cuda"
    elif m.group(2):
        value = f"{m.group(2)}:{int(m.group(3))}"
    if type(text) is str and len(_PARSED) < 64:
        _PARSED[text] = value
    return value


def memory_on(ids) -> str:
    """``host memory`` / ``memory on cuda:0, cuda:1`` / ``memory``: the devices' memory in
    the words of every "holds no ..." message."""
    ids = sorted(ids)
    return "host memory" if ids == ["cpu"] else f"memory on {', '.join(ids)}" if ids \
        else "memory"


def holds_nothing(name: str, ids) -> str:
    """The one phrase for "this name holds no memory on these devices" (report, purge,
    panel): ``'x' holds no host memory`` / ``'x' holds no memory on cuda:0``."""
    return f"{name!r} holds no {memory_on(ids)}"


#: the one phrase for "this process sees no accelerator" (the sidebar looks for its start)
NO_ACCELERATOR = "no accelerator: showing host tensors (device cpu)"


@dataclass
class DeviceUsage(JsonFields, AcceleratorInfo):
    """One device's memory, reconciled across NVML and the frameworks (bytes): the device
    (its id, kind, name, uuid and total, as an :class:`AcceleratorInfo`; the host's for
    ``cpu``) and what is in use. Its JSON: the ``DeviceUsage`` object of docs/PROTOCOL.md."""

    JSON_AFTER = {"nvml_index": "name", "other_processes": "used_process",
                  "allocated": "frameworks", "reserved": "allocated",
                  "non_framework": "reserved", "fragmentation": "non_framework"}

    nvml_index: int | None = None
    used_all: int | None = None
    used_process: int | None = None
    free: int | None = None
    frameworks: list[FrameworkUsage] = field(default_factory=list)
    attributed: int | None = None   # bytes a scan reached here; None: no scan yet
    notes: list[str] = field(default_factory=list)
    time: float = field(default_factory=time.time)

    def _sum(self, attr: str) -> int | None:
        values = [getattr(f, attr) for f in self.frameworks if getattr(f, attr) is not None]
        return sum(values) if values else None

    @property
    def allocated(self) -> int | None:
        """Bytes the frameworks' allocators hand out to tensors."""
        return self._sum("allocated")

    @property
    def reserved(self) -> int | None:
        """Bytes the frameworks hold from the device (allocated + cached)."""
        reserved = self._sum("reserved")
        allocated = self.allocated
        if reserved is None or (allocated is not None and reserved < allocated):
            return allocated
        return reserved

    @property
    def other_processes(self) -> int | None:
        if self.used_all is None or self.used_process is None or self.kind == "cpu":
            return None
        return max(self.used_all - self.used_process, 0)

    @property
    def non_framework(self) -> int | None:
        """CUDA context, cuBLAS/cuDNN workspaces, NCCL, other libraries."""
        if self.used_process is None or self.kind == "cpu":
            return None
        return max(self.used_process - (self.reserved or 0), 0)

    @property
    def fragmentation(self) -> dict | None:
        free_in = self._sum("free_in_reserved")
        if free_in is None:
            return None
        largest = self._sum("largest_free_block")
        return {"free_in_reserved": free_in, "largest_free_block": largest}


def accelerators() -> list[AcceleratorInfo]:
    """Every accelerator of this process: initialised by a framework or seen by NVML."""
    found: dict[str, AcceleratorInfo] = {}
    for backend in active_backends():
        try:
            for acc in backend.accelerators():
                found.setdefault(acc.id, acc)
        except Exception:
            continue
    for i, _ in enumerate(nvml.visible_indices()):
        found.setdefault(f"cuda:{i}", AcceleratorInfo(f"cuda:{i}", "cuda"))
    return sorted(found.values(), key=_order)


def _order(acc: AcceleratorInfo):
    kind, _, index = acc.id.partition(":")
    return (kind, int(index) if index.isdigit() else 0)


def selected_ids(device: str, accs: list[AcceleratorInfo] | None = None) -> list[str]:
    """Device ids a selection's text covers (``auto``: accelerators, else ``cpu``); where
    a :class:`DeviceSelection` is at hand, its ``ids`` are these."""
    return list(select(device, present=False, accs=accs, host_lists=False).ids)


def check_present(device: str, accs: list[AcceleratorInfo] | None = None) -> str:
    """``device`` (parsed) if this process has it; a ValueError in one line if a named
    accelerator (``cuda:3``, or ``cuda`` on a machine without one) is not here."""
    return select(device, accs=accs, host_lists=False).device


@dataclass(frozen=True)
class DeviceSelection:
    """Which devices count, made once where the user's text enters (:func:`select`): the
    text as given, the selection it names (``auto``, ``all``, ``cpu``, ``cuda``, ``mps``,
    ``cuda:N``), the device ids it covers and the accelerators seen when it was made.
    The layers below take only this (a ``str`` there is a TypeError): none parses again."""

    text: str
    device: str
    ids: tuple[str, ...]
    accelerators: tuple[AcceleratorInfo, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return self.device

    @staticmethod
    def of(selection: "DeviceSelection") -> "DeviceSelection":
        """``selection`` itself; anything else (a ``str``) is a TypeError: text is parsed
        at the edge (:func:`select`), never below it."""
        if type(selection) is not DeviceSelection:
            raise TypeError(f"a DeviceSelection is needed here, not {type(selection).__name__}"
                            " (make one with jupyter_gpumem.core.devices.select)")
        return selection


def select(text: str, *, present: bool = True, accs: list[AcceleratorInfo] | None = None,
           host_lists: bool = True) -> DeviceSelection:
    """The one parse of a device selection: ``text`` validated (:func:`parse_device`), the
    accelerators listed once (``accs``, where the caller listed them already) and the ids
    it covers. With ``present``, a named accelerator this process does not have
    (``cuda:3``, or ``cuda`` on a machine without one) is a ValueError in one line (a
    cluster's workers have devices of their own: ``present=False``). ``host_lists``
    false: a ``cpu`` selection lists no accelerator (a reading of the host alone, as the
    footer's after every cell, needs none; a snapshot says whether there is one)."""
    if type(text) is DeviceSelection:
        text = text.text
    device = parse_device(text)
    if device == "cpu" and not host_lists:
        accs = ()
    return _selection(text, device, present, accs)


def _selection(text: str, device: str, present: bool, accs) -> DeviceSelection:
    """:func:`select` of ``text`` once parsed (``device``)."""
    found = tuple(accelerators() if accs is None else accs)
    ids = _ids(device, found)
    if present and device not in ("auto", "all", "cpu") and not (
            ids and (device in ("cuda", "mps") or device in {a.id for a in found})):
        seen = ", ".join(a.id for a in found)
        raise ValueError(f"no device {device} here: this process sees "
                         + (seen if seen else "no accelerator (--device cpu tracks host tensors)"))
    return DeviceSelection(text if type(text) is str else str(text), device, ids, found)


def _ids(device: str, accs) -> tuple[str, ...]:
    """Device ids a parsed selection covers among ``accs``."""
    if device == "cpu":
        return ("cpu",)      # no accelerator needs listing
    ids = tuple(a.id for a in accs)
    if device == "auto":
        return ids or ("cpu",)
    if device == "all":
        return ids + ("cpu",)
    if device in ("cuda", "mps"):
        return tuple(i for i in ids if i.startswith(device + ":"))
    return (device,)


def _nvml_index(acc: AcceleratorInfo) -> tuple[int | None, bool]:
    """NVML index of an accelerator, and whether it was found by UUID (exact)."""
    if not acc.id.startswith("cuda:") or not nvml.available():
        return None, False
    if acc.uuid:
        idx = nvml.index_for_uuid(acc.uuid)
        if idx is not None:
            return idx, True
    visible = nvml.visible_indices()
    ordinal = int(acc.id.split(":")[1])
    return (visible[ordinal] if ordinal < len(visible) else None), False


def _pread_py(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes of ``fd`` from its start (the C core's ``pread_held``
    without the C core: the same bytes, the interpreter lock let go meanwhile)."""
    return os.pread(fd, size, 0)


# the C core (built with the package where a compiler was found): see _reach.c
_pread = native.function("pread_held") or (_pread_py if hasattr(os, "pread") else None)
_write = native.function("write_held") or os.write

_PROC_FDS: dict[tuple[int, str, int], int] = {}   # (pid, path, flags) -> an open descriptor


def _proc_fd(path: str, flags: int = os.O_RDONLY) -> tuple[tuple, int]:
    key = (os.getpid(), path, flags)
    fd = _PROC_FDS.get(key)
    if fd is None:
        fd = _PROC_FDS[key] = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    return key, fd


def _forget(key: tuple, fd: int) -> None:
    if _PROC_FDS.get(key) == fd:
        del _PROC_FDS[key]
        os.close(fd)


def read_proc(path: str, size: int = 16384) -> bytes:
    """A /proc file's text now. Opening a /proc file costs far more than reading it
    (tens of µs on a busy machine, several times per cell), so each is opened once
    per process and read again from its start; a forked child opens its own
    (``/proc/self`` names the process that opened it). With the C core the read
    keeps the interpreter lock (see ``_reach.c``: in a kernel, each time the main
    thread lets go of it the I/O thread may keep it for a message's sending)."""
    if _pread is None:
        with open(path, "rb") as f:
            return f.read(size)
    key, fd = _proc_fd(path)
    try:
        return _pread(fd, size)
    except OSError:
        _forget(key, fd)
        raise


def write_proc(path: str, data: bytes) -> None:
    """Write to a /proc file (``/proc/self/clear_refs``), its descriptor kept open."""
    key, fd = _proc_fd(path, os.O_WRONLY)
    try:
        _write(fd, data)
    except OSError:
        _forget(key, fd)
        raise


def process_memory() -> tuple[int | None, int | None]:
    """This process's resident set and its peak (``VmRSS``, ``VmHWM``) in bytes, from
    ``/proc/self/status``: the one reader of both for the device lines and the peaks."""
    try:
        status = read_proc("/proc/self/status")
        return _kib(status, b"VmRSS:"), _kib(status, b"VmHWM:")
    except (OSError, ValueError, IndexError):
        return None, None


def _kib(text: bytes, label: bytes) -> int | None:
    """The bytes of a ``Label:   1234 kB`` line of a /proc file; None without that line."""
    at = text.find(label)
    if at < 0:
        return None
    return int(text[at + len(label):text.index(b"\n", at)].split()[0]) * 1024


#: the host's available memory is the whole machine's (other processes' doing too): a
#: reading this recent stands (the kernel computes all of /proc/meminfo to give it,
#: about 40 µs, and a cell's footer asks four times); this process's figure is read anew
AVAILABLE_TTL = 0.05
_AVAILABLE: list = [float("-inf"), None]


def process_rss() -> int | None:
    """This process's resident set in bytes, from ``/proc/self/statm`` (the kernel
    writes that file in a fraction of what ``status`` takes; the same counter as
    ``VmRSS``): the device line's figure, read after every cell."""
    try:
        return int(read_proc("/proc/self/statm", 128).split()[1]) * _machine_pages()[0]
    except (OSError, ValueError, IndexError):
        return process_memory()[0]


@functools.cache
def _machine_pages() -> tuple[int, int]:
    """(page size, physical pages): the machine's, read once."""
    return os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES")


def _host_memory() -> tuple[int | None, int | None, int | None]:
    """(total, available, this process's resident set) of host RAM."""
    total = avail = None
    try:
        size, pages = _machine_pages()
        total = size * pages
    except (ValueError, OSError, AttributeError):
        pass
    try:
        now = time.monotonic()
        if now - _AVAILABLE[0] > AVAILABLE_TTL:
            available = _kib(read_proc("/proc/meminfo"), b"MemAvailable:")
            if available is None:
                raise ValueError("no MemAvailable in /proc/meminfo")
            _AVAILABLE[:] = [now, available]
        avail = _AVAILABLE[1]
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    return total, avail, process_rss()


def _cpu_usage() -> DeviceUsage:
    total, avail, rss = _host_memory()
    used = total - avail if total is not None and avail is not None else None
    return DeviceUsage("cpu", "cpu", "host memory", total=total, used_all=used,
                       used_process=rss, free=avail)


def read_devices(selection: DeviceSelection, *, detail: bool = False) -> list[DeviceUsage]:
    """Figures for every device the selection covers.

    ``detail`` adds what costs more or touches the frameworks' arrays (largest
    free block, JAX's live host arrays): the main thread only; sampling threads
    call it without.

    One NVML reading: each device's memory info and process list are asked once,
    however many parts (the device lines, the backends) want them.
    """
    selection = DeviceSelection.of(selection)
    if selection.device == "cpu":
        return _read_devices(selection, detail)     # no NVML to ask (the footer's, every cell)
    with nvml.reading():
        return _read_devices(selection, detail)


def read_devices_now(text: str = "auto", *, detail: bool = False) -> list[DeviceUsage]:
    """:func:`read_devices` of a selection's text, selected anew (the accelerators listed
    now): for the samplers and views that keep a selection's text and read it again and
    again, while frameworks may open devices between readings."""
    device = parse_device(text)
    if device == "cpu":      # no accelerator to list, no NVML to ask (the footer's, every cell)
        return read_devices(_selection(text, device, False, ()), detail=detail)
    with nvml.reading():     # the listing's questions to NVML and the reading's: one batch
        return read_devices(_selection(text, device, False, None), detail=detail)


def _read_devices(selection: DeviceSelection, detail: bool) -> list[DeviceUsage]:
    by_id = {a.id: a for a in selection.accelerators}
    ids = list(selection.ids)
    backends = active_backends()
    usages: dict[str, list[FrameworkUsage]] = {i: [] for i in ids}
    for backend in backends:
        try:
            for dev, usage in backend.usage(ids, detail=detail).items():
                usages.setdefault(dev, []).append(usage)
        except Exception:
            continue
    out = []
    for dev in ids:
        if dev == "cpu":
            du = _cpu_usage()
        else:
            acc = by_id.get(dev) or AcceleratorInfo(dev, dev.split(":")[0])
            du = _accelerator_usage(acc)
        du.frameworks = usages.get(dev, [])
        out.append(du)
    return out


def _accelerator_usage(acc: AcceleratorInfo) -> DeviceUsage:
    du = DeviceUsage(acc.id, acc.kind, acc.name, uuid=acc.uuid, total=acc.total)
    idx, exact = _nvml_index(acc)
    if idx is not None and not exact:
        why = nvml.order_note()
        if why:
            du.notes.append(why)
    if idx is None:
        why = nvml.status() if acc.id.startswith("cuda:") else None
        if why:
            du.notes.append(why)
        return du
    reading = nvml.read_device(idx)
    du.nvml_index = idx
    if reading is not None:
        du.name = du.name or reading.name
        du.uuid = reading.uuid
        du.total, du.used_all, du.free = reading.total, reading.used, reading.free
    du.used_process = nvml.process_used(idx)
    return du
