"""``%gpumem trace on|off``: where each block of memory was allocated, by notebook cell.

Two depths. At **cell** depth (``%gpumem trace on``) the framework's allocation history
is recorded without stacks, and each block is mapped to the cell during which it was
allocated, from the history's own timestamps and the record of cell spans (the
session's ``cells``): a storage reads ``cell [12]``; a block allocated while no cell
ran (a thread, a callback) says so. At **line** depth (``%gpumem trace on --lines``)
allocations are recorded with their Python stacks too, and each frame is mapped to the
notebook cell that ran it: ``cell [12] line 3: out = model(x)``.

The framework's side comes from its backend (:class:`~jupyter_gpumem.backends.Backend`):
trace follows the first backend, in report order, whose ``trace_feed()`` gives a feed
(today PyTorch's: :mod:`jupyter_gpumem.backends.torch_trace`). This module speaks only
of feeds, recorders, cells, frames and sites:

* **a feed** (the device allocator's history): what :class:`Tracer` asks of it is
  ``state()`` (``absent``: the framework is not imported; ``unavailable``: no device;
  ``lazy``: not initialised yet; ``ready``), ``on_init(fn)`` (run ``fn`` inside the
  framework's lazy init, before its first allocation; returns how to take it back),
  ``enable(stacks=, context=, max_entries=, clear=)`` (``context=None`` at cell depth:
  the history with its times, no stack), ``disable()``, ``snapshot()``
  (segments and blocks with the frames of their allocation, and the history of
  allocator events per device, in the format of ``torch.cuda.memory._snapshot()``),
  ``devices()``, ``key()`` (what changes whenever any device's blocks do),
  ``allocations()`` (a running count) and ``measure(enable)`` (a :class:`Cost`).
  Recording starts only where the framework is imported and its device initialised:
  with it not imported yet, an import hook waits for it; with the device not
  initialised yet, ``on_init`` starts the recording before the first allocation. No
  framework is imported and no CUDA context is created here.
* **a host recorder** (``Backend.host_recorder``, for frameworks with no allocator
  history on the CPU): ``push()``/``pop()`` on the shell's thread, ``record(ptr)`` and
  ``live()`` (records with ``nbytes``, ``time`` and the frames ``inner``, ``cin``, ``cout``;
  ``frames = False`` at cell depth: the time alone),
  ``by_cell`` (cell -> (filename, line) -> bytes), ``events``, ``sweep()``, ``clear()``,
  ``measure()``. Storages it does not see (torch's autograd gradients) have no site.

Frames are mapped to cells through IPython's compiler: ``shell.compile._filename_map``
(``<ipython-input-8-…>`` in IPython, ``/tmp/ipykernel_*/….py`` in ipykernel) and
``linecache`` for the source lines (IPython puts each cell's source there).

Allocations that no Python frame asks for (autograd's backward runs on a C++
thread per device; cuBLAS's workspace of that thread) carry no frame: they are given
the cell line that allocated last before them in the same cell (for a backward, the
``loss.backward()`` line, whose ``ones_like`` starts it), and say so. Blocks allocated
before trace was on say "allocated before trace was on".

The package: :mod:`.cells` (cell names, the record of cell spans), :mod:`.sites` (what
the queries return, frames -> sites), :mod:`.index` (a snapshot, indexed), :mod:`.hook`
(the import hook), :mod:`.tracer` (on/off, cells, status), :mod:`.queries` (the sites of
blocks), :mod:`.save` (the visualizer's file).

The queries (:func:`site_of`, :func:`sites_of`, :func:`unattributed_sites`,
:func:`cell_lines`, :func:`save`) read one snapshot of the allocator, kept until its
counters move. No IPython import at module level: the shell is passed in.
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
