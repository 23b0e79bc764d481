"""Out-of-memory errors: the one rule that says an exception is one, and what it asked for.

:func:`is_oom` is the rule (Python's ``MemoryError``, an "out of memory" message, or
what a backend says is its framework's own: ``Backend.is_oom``); :func:`read_oom` parses
the failed request from the message (each framework words it its own way) and reads the
device it failed on: what is free, and where the allocator reports it the largest free
block, so fragmentation (enough free in total, no block large enough) is told apart
from plain lack of memory. Nothing here imports a framework or keeps the exception.
"""
from __future__ import annotations

import os
import re
try:
    import resource     # POSIX only
except ImportError:  # pragma: no cover - Windows
    resource = None
from dataclasses import dataclass, field
from typing import Any

from ...backends import REGISTRY
from .. import devices as _devices
from ...units import fmt_bytes
from ...backends.base import is_a

#: the allocator setting that lets PyTorch's CUDA caching allocator grow segments in place
#: instead of cutting blocks (read when the process first uses CUDA)
EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
_ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = r"([0-9][0-9,]*(?:\.[0-9]+)?)\s*(bytes|byte|[KMGT]i?B|B)\b"
#: how each framework words the request: torch (CUDA, host), JAX/XLA, CuPy, NumPy
_REQUEST = [re.compile(p, re.IGNORECASE) for p in (
    r"tried to allocate\s+" + _SIZE,
    r"trying to allocate\s+" + _SIZE,
    r"out of memory allocating\s+" + _SIZE,
    r"unable to allocate\s+" + _SIZE,
    r"failed to allocate\s+(?:request for\s+)?" + _SIZE,
    r"allocat\w*\s+" + _SIZE,
)]
#: TensorFlow says a shape and a dtype: ``OOM when allocating tensor with shape[a,b] and type float``
_TF_SHAPE = re.compile(r"tensor with shape\s*\[([0-9, ]*)\]\s*and type\s+(\w+)", re.IGNORECASE)
_TF_DTYPES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
              "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
              "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1,
              "float8_e5m2": 1}
_TORCH_FREE = re.compile(r"of which\s+" + _SIZE + r"\s+is free", re.IGNORECASE)
#: under a memory cap (``set_per_process_memory_fraction``) the CUDA caching allocator's
#: message says the cap, what it handed out and what it keeps cached
_ALLOWED = re.compile(_SIZE + r"\s+allowed;", re.IGNORECASE)
_ALLOCATED = re.compile(r"Of the allocated memory\s+" + _SIZE + r"\s+is allocated", re.IGNORECASE)
_CACHED = re.compile(r"and\s+" + _SIZE + r"\s+is reserved by \w+ but unallocated", re.IGNORECASE)
_GPU = re.compile(r"\b(?:GPU|device:GPU:|cuda:)\s*([0-9]+)", re.IGNORECASE)


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a __str__ of the user's that raises
        return ""


def first_line(exc: BaseException) -> str:
    """The first line of the error's message (300 characters at most)."""
    text = _text(exc).strip()
    return (text.splitlines()[0] if text else "")[:300]


def framework_of(exc: BaseException, text: str | None = None) -> str | None:
    """The framework whose out-of-memory error ``exc`` is (its backend's name), ``host``
    for Python's ``MemoryError``, ``unknown`` for a bare "out of memory" message, or
    None: not an out-of-memory error. Each backend knows its own, whether or not its
    framework is imported yet."""
    text = _text(exc) if text is None else text
    said = []
    for backend in REGISTRY.backends:
        try:
            if backend.is_oom(exc, text):
                said.append(backend)
        except Exception:  # noqa: BLE001 - one backend must not hide the others
            continue
    if said:    # XLA's status is JAX's and TensorFlow's: the class's own package decides
        home = (getattr(type(exc), "__module__", None) or "").split(".")[0]
        return next((b.name for b in said if getattr(b, "module", None) == home), said[0].name)
    if is_a(exc, MemoryError):
        return "host"
    return "unknown" if "out of memory" in text.lower() else None


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (the one rule: :func:`framework_of`)."""
    return framework_of(exc) is not None


def parse_size(number: str, unit: str) -> int:
    return int(float(number.replace(",", "")) * _UNITS[unit.lower()])


def requested_bytes(text: str) -> int | None:
    """What the failed allocation asked for, from the error's message; None where it
    does not say."""
    for pattern in _REQUEST:
        m = pattern.search(text)
        if m:
            return parse_size(m.group(1), m.group(2))
    m = _TF_SHAPE.search(text)
    if m and m.group(2).lower() in _TF_DTYPES:
        n = _TF_DTYPES[m.group(2).lower()]
        for dim in m.group(1).replace(" ", "").split(","):
            if dim:
                n *= int(dim)
        return n
    return None


def device_of(text: str, framework: str | None) -> str:
    """The device the request failed on: ``cuda:N`` where the message names a GPU, else
    the host for torch's host allocator and Python's MemoryError, else ``auto``."""
    if "DefaultCPUAllocator" in text or framework == "host" or "device:CPU" in text:
        return "cpu"
    m = _GPU.search(text)
    if m:
        return f"cuda:{int(m.group(1))}"
    return "auto"


def expandable_segments_on(environ: Any = None) -> bool:
    """Whether this process's PyTorch allocator setting has ``expandable_segments:True``."""
    environ = os.environ if environ is None else environ
    return any(re.search(r"expandable_segments\s*:\s*true", environ.get(v, ""), re.IGNORECASE)
               for v in _ALLOC_CONF_VARS)


def host_free() -> tuple[int | None, str]:
    """What the host can still give this process: the machine's available memory, or
    less where an address-space limit (``ulimit -v``, ``RLIMIT_AS``) is nearer."""
    usage = _devices.read_devices_now("cpu")[0]
    free, why = usage.free, "available on the host"
    try:
        soft = resource.getrlimit(resource.RLIMIT_AS)[0] if resource is not None else -1
        if soft >= 0 and soft != resource.RLIM_INFINITY:
            m = re.search(rb"VmSize:\s*([0-9]+)\s*kB", _devices.read_proc("/proc/self/status"))
            if m:
                room = max(soft - int(m.group(1)) * 1024, 0)
                if free is None or room < free:
                    free, why = room, "left under this process's address-space limit"
    except (OSError, ValueError):
        pass
    return free, why


@dataclass
class OomInfo:
    """What one out-of-memory error says and what the device had at that moment (bytes)."""

    framework: str
    device: str
    message: str
    requested: int | None = None
    free: int | None = None
    free_what: str = "free"
    free_in_reserved: int | None = None     # cached by the allocator, not in use
    largest_free_block: int | None = None
    expandable_on: bool = False
    #: the failure is the CUDA caching allocator's (its message says so), where the
    #: expandable-segments setting helps
    expandable_applies: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def total_free(self) -> int | None:
        if self.free is None and self.free_in_reserved is None:
            return None
        return (self.free or 0) + (self.free_in_reserved or 0)

    @property
    def fragmented(self) -> bool:
        """Enough free in total, but no free block large enough for the request. Where the
        largest free block is unknown, an allocator that failed while it kept enough cached
        had no cached block large enough: that is fragmentation too."""
        if self.requested is None or self.total_free is None or self.free_in_reserved is None:
            return False
        if self.total_free < self.requested or (self.free or 0) >= self.requested:
            return False
        return self.largest_free_block is None or self.largest_free_block < self.requested

    def lines(self) -> list[str]:
        """The plain lines that say what was asked against what was free."""
        asked = fmt_bytes(self.requested) if self.requested is not None else "an unknown amount"
        where = "the host" if self.device == "cpu" else self.device
        line = f"out of memory on {where} ({self.framework}): asked for {asked}"
        if self.free is not None:
            line += f", {fmt_bytes(self.free)} {self.free_what}"
        if self.free_in_reserved:
            line += f", {fmt_bytes(self.free_in_reserved)} cached by the allocator"
        if self.largest_free_block is not None:
            line += f", largest free block {fmt_bytes(self.largest_free_block)}"
        out = [line]
        if self.fragmented:
            out.append(f"fragmentation: {fmt_bytes(self.total_free)} is free in total, but no "
                       f"block of {asked}")
            if self.expandable_applies and not self.expandable_on:
                out.append(f"  the allocator can grow blocks in place: set {EXPANDABLE} before "
                           "the process first uses CUDA (it takes effect in a new process: "
                           "restart the kernel with it in its environment)")
        return out + self.notes


def read_oom(exc: BaseException) -> OomInfo | None:
    """The :class:`OomInfo` of ``exc``, or None when it is no out-of-memory error. Reads
    the device it failed on (the main thread: the largest free block needs the
    allocator's snapshot); a failed reading leaves its fields None."""
    text = _text(exc)
    framework = framework_of(exc, text)
    if framework is None:
        return None
    info = OomInfo(framework, device_of(text, framework), first_line(exc) or type(exc).__name__,
                   requested=requested_bytes(text), expandable_on=expandable_segments_on(),
                   expandable_applies="CUDA out of memory" in text)
    try:
        if info.device == "cpu":
            info.free, info.free_what = host_free()
        else:
            usages = _devices.read_devices_now(info.device, detail=True)
            usage = next((u for u in usages if u.id != "cpu"), usages[0] if usages else None)
            if usage is not None:
                if info.device == "auto":
                    info.device = usage.id
                info.free = usage.free
                frag = usage.fragmentation or {}
                info.free_in_reserved = frag.get("free_in_reserved")
                info.largest_free_block = frag.get("largest_free_block")
    except Exception as exc2:  # noqa: BLE001 - the parsed request still stands
        info.notes.append(f"(the device could not be read: {type(exc2).__name__})")
    _from_message(info, text)
    return info


def _from_message(info: OomInfo, text: str) -> None:
    """What the message says where the device reading could not (no NVML), and the room
    under a memory cap, which no device reading shows."""
    sizes = {name: parse_size(m.group(1), m.group(2)) for name, m in (
        ("free", _TORCH_FREE.search(text)), ("allowed", _ALLOWED.search(text)),
        ("allocated", _ALLOCATED.search(text)), ("cached", _CACHED.search(text))) if m}
    if info.free_in_reserved is None and "cached" in sizes:
        info.free_in_reserved = sizes["cached"]
    if "allowed" in sizes and "allocated" in sizes:
        room = max(sizes["allowed"] - sizes["allocated"] - (info.free_in_reserved or 0), 0)
        if info.free is None or room < info.free:
            info.free, info.free_what = room, "left under this process's memory cap"
    elif info.free is None and "free" in sizes:
        info.free = sizes["free"]
