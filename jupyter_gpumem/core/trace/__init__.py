"""``%gpumem trace on|off``: where each block of memory was allocated, by notebook cell.

At cell depth each block is mapped to the cell during which it was allocated; at line
depth (``--lines``) to the cell's line that allocated it. The framework's side is a
feed (and, on the host, a recorder) given by its backend's ``trace_feed()`` /
``host_recorder()``; this package speaks only of feeds, recorders, cells, frames and
sites: :mod:`.sites`, :mod:`.index`, :mod:`.hook`, :mod:`.tracer`, :mod:`.queries`,
:mod:`.save`. No framework is imported and no CUDA context is made here; no IPython
import at module level. The story (the feed's contract, frames to cells, allocations
with no frame): docs/ARCHITECTURE.md#the-allocation-trace.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Mapping

from ...backends.base import TraceCost as Cost
from ..cells import CellNames, CellSpan, CellSpans, short_path
from .save import SUFFIXES, check_path, rename_cells
from .sites import BEFORE, BEFORE_TEXT, BETWEEN_TEXT, CellLines, LineAlloc, Site, SiteGroup
from .tracer import CONTEXTS, DEFAULT_MAX_ENTRIES, DEPTHS, STACKS, Tracer

__all__ = ["BEFORE", "BEFORE_TEXT", "BETWEEN_TEXT", "CONTEXTS", "DEFAULT_MAX_ENTRIES", "DEPTHS",
           "STACKS", "SUFFIXES", "CellLines", "CellNames", "CellSpan", "CellSpans", "Cost",
           "LineAlloc", "Site", "SiteGroup", "Tracer", "cell_lines", "check_path", "is_on",
           "rename_cells", "save", "segments", "short_path", "site_of", "sites_of", "start",
           "status", "stop", "tracer", "unattributed_sites"]

#: per process: the one recording (the framework's allocator history is process-wide,
#: so one tracer records at a time, whichever shell started it); the session of the
#: shell that started it owns it (``Session.tracer``) and stops it when it closes
_RECORDING: Tracer | None = None
_LOCK = threading.Lock()


def start(shell: Any, device: str = "auto", *, depth: str = "cell", stacks: str = "python",
          context: str = "alloc", max_entries: int = DEFAULT_MAX_ENTRIES, feed: Any = None,
          measure: bool = True, cells: tuple[Callable, Callable] | None = None,
          spans: CellSpans | None = None) -> str:
    """Turn trace on for ``shell`` (see the module docstring); returns one status line
    with the measured cost. ``device``: ``auto`` (CUDA where the framework sees a GPU, else
    the host), ``all`` (both), ``cpu`` (the host) or ``cuda``/``cuda:N`` (the framework
    records every GPU; queries read the one asked). ``feed``: the allocator to ask instead
    of the backend's own (tests). ``depth``: ``cell`` or ``lines`` (see the module
    docstring). ``cells``: ``(hook, unhook)`` for the cell events, IPython's own by
    default; ``spans``: the record of cell spans to read (the extension gives its
    session's; without one the tracer keeps its own). Returns one status line with the
    measured cost; :func:`tracer` gives the :class:`Tracer` (the shell's session owns it)."""
    global _RECORDING
    with _LOCK:
        if _RECORDING is not None:
            _RECORDING.stop()
            _RECORDING = None
        tracer = Tracer(shell, device, depth=depth, stacks=stacks, context=context,
                        max_entries=max_entries, feed=feed, measure=measure, cells=cells,
                        spans=spans)
        _RECORDING = tracer
    try:
        return tracer.start()
    except Exception:
        stop()
        raise


def stop() -> str:
    """Turn trace off: the framework's recording stops (its history goes), the host
    recorder leaves the stack, the hooks go."""
    global _RECORDING
    with _LOCK:
        tracer, _RECORDING = _RECORDING, None
    return tracer.stop() if tracer is not None else "trace was off"


def is_on() -> bool:
    return _RECORDING is not None and _RECORDING.active


def tracer() -> Tracer | None:
    """The running :class:`Tracer`, if any."""
    return _RECORDING


def status() -> str:
    return _RECORDING.status() if _RECORDING is not None else "trace is off"


def site_of(storage_key_or_ptr: Any, nbytes: int | None = None) -> Site | None:
    """The allocation site of a storage: ``(device, pointer)`` as the scan keys it
    (``("cuda:0", 0x7f…)``, ``("cpu", …)``) or a bare pointer. ``None`` when trace is
    off or the storage is not known to it."""
    return _RECORDING.site_of(storage_key_or_ptr, nbytes) if is_on() else None


def sites_of(keys: Iterable) -> dict:
    """:func:`site_of` for many storages at once, from one snapshot: key -> Site."""
    return _RECORDING.sites_of(keys) if is_on() else {}


def unattributed_sites(reached: Iterable | Mapping, device: str,
                       internals: Mapping[int, str] | None = None) -> list[SiteGroup]:
    """The blocks on ``device`` that no name reaches, grouped by allocation site, largest
    first. ``reached``: the storages names reach (their pointers on that device or
    their ``(device, pointer)`` keys; a mapping to their sizes adds a last group, the
    allocator's rounding past them in their blocks). ``internals``: block address ->
    label of the blocks shown as framework internals (cuBLAS workspaces, a graph's
    pool): left out, so that the groups add up to what the report calls unattributed."""
    return _RECORDING.unattributed_sites(reached, device, internals) if is_on() else []


def cell_lines(execution_count: int, device: str | None = None, top: int | None = None) -> CellLines:
    """The lines of cell ``execution_count`` that allocated the most (largest first) and
    the line at the cell's peak (``.peak``)."""
    if not is_on():
        return CellLines(execution_count, note="trace is off")
    return _RECORDING.cell_lines(execution_count, device, top)


def segments() -> list | None:
    """The allocator's segments from trace's own snapshot (``None`` when not recording
    CUDA): what ``torch.cuda.memory_snapshot()`` would return, without a second one."""
    return _RECORDING.segments() if is_on() else None


def save(path: str, device: str | None = None) -> str:
    """Write a snapshot PyTorch's memory visualizer opens (a pickle of
    ``torch.cuda.memory._snapshot()``, the cells' frames named ``In[N]``); returns one line."""
    if not is_on():
        raise RuntimeError("trace is off: `%gpumem trace on` first")
    return _RECORDING.save(path, device)
