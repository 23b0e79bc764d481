"""``%gpumem trace on|off``: where each block of memory was allocated, by notebook cell.

While trace is on, allocations are recorded with their Python stacks through the
framework's own mechanism, and each frame is mapped to the notebook cell that ran
it, so a storage reads ``cell [12] line 3: out = model(x)``.

The framework's side comes from its backend (:class:`~jupyter_gpumem.backends.Backend`):
trace follows the first backend, in report order, whose ``trace_feed()`` gives a feed
(today PyTorch's: :mod:`jupyter_gpumem.backends.torch_trace`). This module speaks only
of feeds, recorders, cells, frames and sites:

* **a feed** (the device allocator's history): what :class:`Tracer` asks of it is
  ``state()`` (``absent``: the framework is not imported; ``unavailable``: no device;
  ``lazy``: not initialised yet; ``ready``), ``on_init(fn)`` (run ``fn`` inside the
  framework's lazy init, before its first allocation; returns how to take it back),
  ``enable(stacks=, context=, max_entries=, clear=)``, ``disable()``, ``snapshot()``
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
  ``live()`` (records with ``nbytes`` and the frames ``inner``, ``cin``, ``cout``),
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

The queries (:func:`site_of`, :func:`sites_of`, :func:`unattributed_sites`,
:func:`cell_lines`, :func:`save`) read one snapshot of the allocator, kept until its
counters move. No IPython import at module level: the shell is passed in.
"""
from __future__ import annotations

import linecache
import os
import pickle
import re
import sys
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from ..backends import REGISTRY, Backend
from ..backends.base import TraceCost as Cost
from .monitor import hook_cells, unhook_cells
from .scan_types import LIB_DIRS
from .render import fmt_bytes as _fmt_bytes
from ..units import complain

#: allocator events the framework keeps (a ring buffer); each costs host memory while kept
DEFAULT_MAX_ENTRIES = 100_000
STACKS = ("python", "all")
CONTEXTS = ("alloc", "all")
BEFORE_TEXT = "allocated before trace was on"
_INPUT_RE = re.compile(r"^<ipython-input-(\d+)-[0-9a-fA-F]+>$")
_IN_RE = re.compile(r"^In\s*\[(\d+)\]$")


# -- cells ---------------------------------------------------------------------------
def short_path(filename: str) -> str:
    """A library file relative to its site-packages (``torch/nn/modules/linear.py``)."""
    if not filename or filename.startswith("<"):
        return filename
    for root in LIB_DIRS:
        if filename.startswith(root):
            return filename[len(root):]
    return filename


class CellNames:
    """Which notebook cell a code file name is, through the shell's compiler."""

    def __init__(self, shell: Any = None) -> None:
        self.shell = shell
        self._fallback: dict[str, int | None] = {}

    def filename_map(self) -> dict:
        compiler = getattr(self.shell, "compile", None)
        fmap = getattr(compiler, "_filename_map", None)
        return fmap if isinstance(fmap, dict) else {}

    def number(self, filename: Any) -> int | None:
        """The execution count of the cell whose code file this is, else ``None``."""
        if type(filename) is not str:
            return None
        n = self.filename_map().get(filename)
        if type(n) is int:
            return n
        try:
            return self._fallback[filename]
        except KeyError:
            pass
        m = _INPUT_RE.match(filename) or _IN_RE.match(filename)
        out = int(m.group(1)) if m else None
        if len(self._fallback) > 100_000:
            self._fallback.clear()
        self._fallback[filename] = out
        return out

    @staticmethod
    def source(filename: str | None, line: int | None) -> str:
        if not filename or not line:
            return ""
        try:
            return linecache.getline(filename, int(line)).strip()
        except Exception:  # noqa: BLE001 - a source we cannot read is left out
            return ""


# -- what the queries return ---------------------------------------------------------------
@dataclass(frozen=True)
class Site:
    """Where a block of memory was allocated.

    ``cell``/``line``/``source``: the innermost frame that is in a notebook cell (for
    :func:`cell_lines`, the outermost), else the innermost frame (``cell`` None,
    ``line`` in ``filename``). ``inner``: the innermost frame when it is not that one
    (``torch/nn/modules/linear.py:125 in forward``). ``how``: ``"stack"`` (from the
    allocation's own frames), ``"nearest"`` (no Python frame: the cell line that
    allocated last before it), ``"cell"`` (no Python frame: the cell only, from the
    time), ``"before"`` (allocated before trace was on) or ``"unknown"``.
    """

    cell: int | None
    line: int | None
    source: str = ""
    filename: str | None = None
    function: str | None = None
    inner: str | None = None
    how: str = "stack"
    note: str | None = None

    @property
    def in_cell(self) -> bool:
        return self.cell is not None and self.line is not None

    @property
    def text(self) -> str:
        """``cell [12] line 3: out = model(x)`` (one line)."""
        if self.how == "before":
            return BEFORE_TEXT
        if self.how == "unknown":
            return self.note or "no allocation site recorded"
        if self.cell is not None and self.line is None:
            head = f"cell [{self.cell}]"
        elif self.cell is not None:
            head = f"cell [{self.cell}] line {self.line}"
        else:
            where = short_path(self.filename or "?")
            head = f"{where}:{self.line}" + (f" in {self.function}" if self.function else "")
        text = f"{head}: {self.source}" if self.source else head
        if self.how in ("nearest", "cell"):
            text += " (no Python frame: a C++ thread, e.g. autograd's backward)"
        return text

    def key(self) -> tuple:
        return (self.how, self.cell, self.line, self.filename if self.cell is None else None,
                self.function if self.cell is None else None)

    def to_json(self) -> dict:
        return {"cell": self.cell, "line": self.line, "source": self.source,
                "filename": self.filename, "function": self.function, "inner": self.inner,
                "how": self.how, "note": self.note, "text": self.text}

    def __str__(self) -> str:
        return self.text


BEFORE = Site(None, None, how="before",
              note="the block was allocated before trace was on, so it has no frames: "
                   "`c.GpuMemMagics.trace = True` records from the first cell")


@dataclass
class SiteGroup:
    """Blocks no name reaches that share an allocation site (or an internal's label)."""

    site: Site
    nbytes: int
    count: int
    device: str
    label: str | None = None     # an internal holder's label ("cuBLAS workspace")

    @property
    def text(self) -> str:
        blocks = f"{self.count} block{'s' if self.count != 1 else ''}"
        if not self.label:
            where = self.site.text
        elif self.site.how in ("unknown", "before"):
            where = f"{self.label} ({self.site.text})"
        else:
            where = f"{self.label}, first allocated at {self.site.text}"
        return f"{_fmt_bytes(self.nbytes)} in {blocks} · {where}"

    def to_json(self) -> dict:
        return {"site": self.site.to_json(), "bytes": self.nbytes, "count": self.count,
                "device": self.device, "label": self.label, "text": self.text}


class LineAlloc(NamedTuple):
    """A line of a cell and the bytes it allocated while the cell ran."""

    line: int | None
    source: str
    bytes: int


class CellLines(list):
    """The lines of one cell that allocated the most, largest first, as
    :class:`LineAlloc` ``(line, source, bytes)``; ``peak``: the line whose allocation
    reached the cell's peak and that peak above the cell's start (``None`` where the
    device keeps no history: the host); ``held``: line -> bytes still allocated at the
    end; ``peaks``: device -> its peak line."""

    def __init__(self, cell: int, items=(), *, peak: LineAlloc | None = None,
                 held: dict | None = None, peaks: dict | None = None,
                 note: str | None = None) -> None:
        super().__init__(items)
        self.cell = cell
        self.peak = peak
        self.held = dict(held or {})
        self.peaks = dict(peaks or {})
        self.note = note

    def text(self, top: int = 3) -> str:
        """One line for ``%%gpuwatch`` and the footer; '' when nothing was recorded."""
        parts = []
        if self:
            parts.append("allocated most: " + "; ".join(
                f"line {la.line} {_fmt_bytes(la.bytes)}"
                + (f", {_fmt_bytes(self.held[la.line])} kept" if self.held.get(la.line) else "")
                + (f" ({la.source})" if la.source else "")
                for la in self[:top]))
        if self.peak is not None:
            at = f"at line {self.peak.line}" if self.peak.line is not None else "outside its lines"
            parts.append(f"peak +{_fmt_bytes(self.peak.bytes)} {at}"
                         + (f" ({self.peak.source})" if self.peak.source else ""))
        return f"cell [{self.cell}] " + " · ".join(parts) if parts else ""

    def to_json(self) -> dict:
        return {"cell": self.cell, "lines": [la._asdict() for la in self],
                "peak": self.peak._asdict() if self.peak else None,
                "held": {str(k): v for k, v in self.held.items()},
                "peaks": {d: p._asdict() for d, p in self.peaks.items()}, "note": self.note}


# -- frames -> sites -------------------------------------------------------------------------
def _frame_tuple(f: Any) -> tuple | None:
    if isinstance(f, dict):
        return (f.get("filename"), f.get("line"), f.get("name"))
    if isinstance(f, tuple) and len(f) == 3:
        return f
    return None


def _is_python(f: Any) -> bool:
    fn = f.get("filename") if isinstance(f, dict) else f[0] if isinstance(f, tuple) else None
    return type(fn) is str and (fn.endswith(".py") or fn.startswith("<"))


def _frame_text(fr: tuple) -> str:
    return f"{short_path(fr[0] or '?')}:{fr[1]} in {fr[2]}"


class _Resolver:
    """Frames (innermost first) -> (innermost, innermost cell frame, outermost cell
    frame), with a cache by frame dict (torch shares one dict per distinct frame)."""

    def __init__(self, cells: CellNames) -> None:
        self.cells = cells
        self._memo: dict[int, tuple] = {}
        self._keep: list = []   # the frame dicts whose ids the memo uses

    def cell_of(self, f: Any) -> tuple | None:
        """``(cell, filename, line, name)`` when frame ``f`` is in a cell, else None."""
        key = id(f)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[0]
        fr = _frame_tuple(f)
        out = None
        if fr is not None:
            n = self.cells.number(fr[0])
            if n is not None:
                out = (n, fr[0], fr[1], fr[2])
        if isinstance(f, dict):
            self._memo[key] = (out,)
            self._keep.append(f)
        return out

    def pick(self, frames) -> tuple:
        """Python frames only: with ``stacks="all"`` torch adds C++ frames, and an
        allocation with C++ frames alone (autograd's thread) has no Python frame."""
        inner = cin = cout = None
        for f in frames or ():
            c = self.cell_of(f)
            if inner is None and (c is not None or _is_python(f)):
                inner = _frame_tuple(f)
            if c is not None:
                if cin is None:
                    cin = c
                cout = c
        return inner, cin, cout

    def site(self, frames, *, outer: bool = False) -> Site | None:
        inner, cin, cout = self.pick(frames)
        if inner is None:
            return None
        c = cout if outer else cin
        if c is not None:
            n, filename, line, name = c
            extra = None
            if inner[:2] != (filename, line):
                extra = _frame_text(inner)
            return Site(n, line, CellNames.source(filename, line), filename, name, extra)
        return Site(None, inner[1], CellNames.source(inner[0], inner[1]), inner[0], inner[2])


# -- a feed's snapshot, indexed ---------------------------------------------------------------
#: the events of a feed's history (``free_completed`` follows each ``free_requested``)
_ALLOC, _FREE = "alloc", "free_requested"


class _Block(NamedTuple):
    addr: int
    size: int
    frames: list
    state: str


class _DeviceIndex:
    """One device's part of a snapshot: active blocks by address, and its history."""

    def __init__(self, index: int, blocks: list[_Block], trace: list) -> None:
        self.index = index
        self.blocks = sorted(blocks)
        self.addrs = [b.addr for b in self.blocks]
        self.by_addr = {b.addr: b for b in self.blocks}
        self.trace = trace
        self.last_alloc: dict[int, int] = {}
        for i, e in enumerate(trace):
            if e.get("action") == _ALLOC:
                self.last_alloc[e.get("addr")] = i
        self._times: list | None = None
        self._nearest: dict[int, int | None] = {}

    def block_at(self, ptr: int) -> _Block | None:
        b = self.by_addr.get(ptr)
        if b is not None:
            return b
        i = bisect_right(self.addrs, ptr) - 1
        if i >= 0 and ptr < self.blocks[i].addr + self.blocks[i].size:
            return self.blocks[i]
        return None

    def nearest_cell_alloc(self, i: int, res: "_Resolver") -> int | None:
        """The last allocation before event ``i`` whose frames are in a cell (the
        answers are remembered along the way, so all the blocks together cost one pass)."""
        memo = self._nearest
        visited = []
        found = None
        j = i - 1
        while j >= 0:
            if j in memo:
                found = memo[j]
                break
            visited.append(j)
            e = self.trace[j]
            if e.get("action") == _ALLOC and e.get("frames") and res.pick(e["frames"])[2] is not None:
                found = j
                break
            j -= 1
        for v in visited:
            memo[v] = found
        return found

    def times(self) -> list:
        if self._times is None:
            self._times = [e.get("time_us") or 0 for e in self.trace]
        return self._times


class _SnapshotIndex:
    def __init__(self, data: dict) -> None:
        self.data = data
        by_dev: dict[int, list[_Block]] = {}
        for seg in data.get("segments") or ():
            dev = int(seg.get("device", 0))
            out = by_dev.setdefault(dev, [])
            addr = int(seg.get("address", 0))
            for b in seg.get("blocks") or ():
                size = int(b.get("size", 0))
                at = int(b.get("address", addr))
                if b.get("state") == "active_allocated":
                    out.append(_Block(at, size, b.get("frames") or [], "active_allocated"))
                addr = at + size
        traces = data.get("device_traces") or []
        self.devices: dict[int, _DeviceIndex] = {}
        for dev in set(by_dev) | set(range(len(traces))):
            trace = traces[dev] if dev < len(traces) else []
            if by_dev.get(dev) or trace:
                self.devices[dev] = _DeviceIndex(dev, by_dev.get(dev, []), trace)


# -- an import hook that waits for the framework----------------------------------------------------------
class _AfterImport:
    """A ``sys.meta_path`` finder that calls ``callback(module)`` once ``name`` has been
    imported (its module executed), then takes itself out. It finds nothing itself."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback
        self._busy = False

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PostExecLoader(spec.loader, self)
        return spec


class _PostExecLoader:
    def __init__(self, loader, hook: _AfterImport) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            # the module keeps its own loader, as if nothing had been in between
            try:
                module.__loader__ = self._loader
                module.__spec__.loader = self._loader
            except Exception:  # noqa: BLE001
                pass
        self._hook.remove()
        try:
            self._hook.callback(module)
        except Exception as exc:  # noqa: BLE001 - the user's import stands
            complain(f"trace could not start after `import {self._hook.name}`", exc)

    def __getattr__(self, name):
        return getattr(self._loader, name)


# -- the tracer ------------------------------------------------------------------------------------
def _ipython_offset() -> int:
    """How far ``shell.execution_count`` is past the running cell's number in
    ``pre_run_cell`` (IPython 9 counts the cell first); learnt again after each cell."""
    ipy = sys.modules.get("IPython")
    major = getattr(ipy, "version_info", (0,))[0] if ipy is not None else 0
    return 1 if major >= 9 else 0


def _run_code_of(shell: Any) -> Any:
    fn = getattr(type(shell), "run_code", None)
    return getattr(fn, "__code__", None)


class _NoFeed:
    """The feed where no backend gives one: no device history to record."""

    name = ""

    def state(self) -> str:
        return "unavailable"

    def key(self) -> None:
        return None

    def allocations(self) -> None:
        return None


def _trace_source() -> tuple[Backend | None, Any]:
    """The backend trace follows (the first, in report order, with a feed) and its feed."""
    for backend in REGISTRY.backends:
        feed = backend.trace_feed()
        if feed is not None:
            return backend, feed
    return None, None


class Tracer:
    """One per process (the framework's recording is process-wide). ``backend``: the
    framework it follows (see the module docstring); ``feed``: its device allocator's
    history (or a test's, given to :func:`start`); ``host``: its host recorder."""

    def __init__(self, shell: Any, device: str = "auto", *, stacks: str = "python",
                 context: str = "alloc", max_entries: int = DEFAULT_MAX_ENTRIES,
                 feed: Any = None, measure: bool = True,
                 cells: tuple[Callable, Callable] | None = None) -> None:
        if stacks not in STACKS:
            raise ValueError(f"stacks must be one of {', '.join(STACKS)} (got {stacks!r})")
        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {', '.join(CONTEXTS)} (got {context!r})")
        if int(max_entries) < 1:
            raise ValueError("max_entries must be at least 1")
        self.shell = shell
        #: how trace hears of cells: ``(hook, unhook)``, each ``f(shell, pre, post)``; the
        #: extension passes its session's, so the shell has one pair of hooks (see session.py)
        self._hooks = cells if cells is not None else (hook_cells, unhook_cells)
        self.device = device
        self.stacks, self.context, self.max_entries = stacks, context, int(max_entries)
        self.backend, own = _trace_source()
        self.feed = feed if feed is not None else own if own is not None else _NoFeed()
        self.module = self.backend.module if self.backend is not None else ""
        self.framework = self.backend.name if self.backend is not None else "its framework"
        self.cells = CellNames(shell)
        self.want_cuda = device in ("auto", "all") or device.startswith("cuda")
        self.want_host = device in ("cpu", "all")   # auto: decided once the framework is there
        self.auto = device == "auto"
        self.do_measure = measure
        self.cuda = "off"          # off | waiting-import | waiting-init | on | unavailable
        self.host: Any = None      # the backend's host recorder
        self.host_state = "off"    # off | waiting-import | waiting-thread | on
        self.cuda_cost: Cost | None = None
        self.host_cost: Cost | None = None
        self.started = time.time()
        self.allocs_at_start: int | None = None
        self.before: dict[int, set] = {}
        self.intervals: list[tuple[float, float, int]] = []   # (t0, t1, execution count)
        self._pending: list[tuple] = []    # cells running: (start, count then, guess)
        self._count_offset = _ipython_offset()
        self._cell_seconds = 0.0
        self._hook: _AfterImport | None = None
        self._cancel_init: Callable[[], None] | None = None
        self._index: tuple | None = None     # (key, _SnapshotIndex)
        self._carry: dict[tuple, Site] = {}  # (device, addr, size) -> site of a frameless block
        self._messages: list[str] = []
        self.active = False

    # -- on / off ------------------------------------------------------------------------
    def start(self) -> str:
        self.active = True
        self._register_events()
        there = self.feed.state() != "absent" or self._framework_there()
        if not there and self.module and (self.want_cuda or self.want_host):
            self._hook = _AfterImport(self.module, self._framework_imported)
            self._hook.install()
            if self.want_cuda:
                self.cuda = "waiting-import"
            if self.want_host or self.auto:
                self.host_state = "waiting-import"
        else:
            self._framework_imported(None)
        return self.status()

    def _framework_there(self) -> bool:
        return self.backend is not None and self.backend.is_active()

    def _framework_imported(self, _module) -> None:
        if not self.active:
            return
        state = self.feed.state()
        if self.want_cuda:
            if state == "ready":
                self._enable_cuda()
            elif state == "lazy":
                self.cuda = "waiting-init"
                self._cancel_init = self.feed.on_init(self._on_cuda_init)
            else:
                self.cuda = "unavailable"
        if self.auto:
            self.want_host = self.cuda == "unavailable" and self._framework_there()
        if self.want_host and self._framework_there():
            self._start_host()
        elif self.host_state == "waiting-import":
            self.host_state = "off"

    def _on_cuda_init(self) -> None:
        """Inside the framework's lazy CUDA init: start recording before the first
        allocation. Never raises (the framework would fail the user's first CUDA call)."""
        try:
            if self.active and self.cuda == "waiting-init":
                self._enable_cuda()
        except Exception as exc:  # noqa: BLE001
            self.cuda = "unavailable"
            self._messages.append(f"CUDA recording could not start: {type(exc).__name__}: {exc}")

    def _enable_cuda(self) -> None:
        feed = self.feed
        try:
            data = feed.snapshot()   # no history yet: cheap; what exists now has no frames
            self.before = {}
            for seg in data.get("segments") or ():
                dev = int(seg.get("device", 0))
                addr = int(seg.get("address", 0))
                for b in seg.get("blocks") or ():
                    size = int(b.get("size", 0))
                    at = int(b.get("address", addr))
                    if b.get("state") != "inactive":
                        self.before.setdefault(dev, set()).add((at, size))
                    addr = at + size
        except Exception:  # noqa: BLE001
            self.before = {}

        def enable(clear: bool = False) -> None:
            feed.enable(stacks=self.stacks, context=self.context, max_entries=self.max_entries,
                        clear=clear)

        if self.do_measure:
            try:
                self.cuda_cost = feed.measure(enable)
            except Exception as exc:  # noqa: BLE001
                self._messages.append(f"cost not measured: {type(exc).__name__}: {exc}")
                enable()
            enable(clear=True)   # the measurement's events go
        else:
            enable(clear=True)
        self.cuda = "on"
        self.allocs_at_start = feed.allocations()
        self._index = None

    def _start_host(self) -> None:
        if self.host is None:
            self.host = self.backend.host_recorder(self.cells, self.max_entries,
                                                   _run_code_of(self.shell))
            if self.host is None:
                self.host_state = "unavailable"
                return
        if self.do_measure and self.host_cost is None:
            try:
                self.host_cost = self.host.measure()
            except Exception as exc:  # noqa: BLE001
                self._messages.append(f"host cost not measured: {type(exc).__name__}: {exc}")
        if threading.get_ident() == self._shell_thread:
            self.host.push()
            self.host_state = "on"
        else:
            self.host_state = "waiting-thread"   # pushed by the next pre_run_cell

    def stop(self) -> str:
        was = self.active
        self.active = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._cancel_init is not None:
            try:
                self._cancel_init()
            except Exception:  # noqa: BLE001
                pass
            self._cancel_init = None
        if self.cuda == "on":
            try:
                self.feed.disable()
            except Exception as exc:  # noqa: BLE001
                self._messages.append(f"CUDA recording could not stop: {exc}")
        self.cuda = "off"
        if self.host is not None:
            try:
                self.host.pop()
            finally:
                self.host.clear()
            self.host = None
        self.host_state = "off"
        self._unregister_events()
        self._index = None
        self._carry.clear()
        return "trace is off" if was else "trace was off"

    # -- cells --------------------------------------------------------------------------
    def _register_events(self) -> None:
        self._shell_thread = threading.get_ident()
        self._hooks[0](self.shell, self._pre, self._post)

    def _unregister_events(self) -> None:
        self._hooks[1](self.shell, self._pre, self._post)

    def _pre(self, info=None) -> None:
        count = getattr(self.shell, "execution_count", None)
        guess = count - self._count_offset if type(count) is int and \
            getattr(info, "store_history", False) else count
        self._pending.append((time.time(), count, guess))
        if self.host is not None and self.host_state == "waiting-thread" \
                and threading.get_ident() == self._shell_thread:
            self.host.push()
            self.host_state = "on"

    def _post(self, result=None) -> None:
        if not self._pending:
            return
        t0, count, _ = self._pending.pop()
        t1 = time.time()
        n = getattr(result, "execution_count", None)
        if type(n) is int and type(count) is int and getattr(
                getattr(result, "info", None), "store_history", False):
            # IPython 9 counts the cell before pre_run_cell, older ones after it
            self._count_offset = count - n
        if type(n) is int and not self._pending:
            self.intervals.append((t0, t1, n))
            self._cell_seconds += t1 - t0
            if len(self.intervals) > 20_000:
                del self.intervals[:10_000]

    def cell_at(self, t: float) -> int | None:
        """The cell that was running at time ``t`` (seconds since the epoch)."""
        iv = self.intervals
        i = bisect_right(iv, (t, float("inf"), 0)) - 1
        if i >= 0 and iv[i][0] <= t <= iv[i][1]:
            return iv[i][2]
        if self._pending and t >= self._pending[0][0]:
            return self._pending[0][2]
        return None

    def interval(self, n: int) -> tuple[float, float] | None:
        for t0, t1, m in reversed(self.intervals):
            if m == n:
                return t0, t1
        return None

    # -- the CUDA snapshot ----------------------------------------------------------------
    def index(self) -> _SnapshotIndex | None:
        if self.cuda != "on":
            return None
        key = self.feed.key()
        if key is not None and self._index is not None and self._index[0] == key:
            return self._index[1]
        idx = _SnapshotIndex(self.feed.snapshot())
        after = self.feed.key()
        self._index = (after, idx) if after is not None and after == key else None
        self._carry_over(idx)
        return idx

    def segments(self) -> list | None:
        """The allocator's segments from the snapshot trace keeps (what
        ``torch.cuda.memory_snapshot()`` returns), so other readers need not ask torch
        for a second one while trace is on (torch's includes the whole history)."""
        idx = self.index()
        return None if idx is None else idx.data.get("segments")

    def _carry_over(self, idx: _SnapshotIndex) -> None:
        """Keep the sites of live blocks that have no frames of their own (found in the
        history) for when their events have left torch's ring buffer."""
        res = _Resolver(self.cells)
        keep: dict[tuple, Site] = {}
        for dev in idx.devices.values():
            for b in dev.blocks:
                if b.frames and res.pick(b.frames)[0] is not None:
                    continue      # its own Python frames tell
                k = (dev.index, b.addr, b.size)
                site = self._carry.get(k)
                if site is None:
                    i = dev.last_alloc.get(b.addr)
                    if i is not None:
                        site = self._from_history(dev, i, res)
                if site is not None and site.how != "unknown":
                    keep[k] = site
        self._carry = keep

    def _from_history(self, dev: _DeviceIndex, i: int, res: _Resolver) -> Site | None:
        e = dev.trace[i]
        site = res.site(e.get("frames"))
        if site is not None:
            return site
        # no Python frame: the cell line that allocated last before it, in the same cell
        t = e.get("time_us")
        cell = self.cell_at(t / 1e6) if t else None
        k = dev.nearest_cell_alloc(i, res)
        if k is not None:
            p = dev.trace[k]
            tk = p.get("time_us")
            if cell is None or not tk or self.cell_at(tk / 1e6) in (cell, None):
                n, filename, line, name = res.pick(p.get("frames"))[2]
                return Site(n, line, CellNames.source(filename, line), filename, name, None,
                            how="nearest",
                            note="allocated on a thread with no Python frame (a C++ thread such "
                                 "as autograd's backward, or a cuBLAS workspace of that thread); "
                                 "the line is the cell's last line that allocated before it")
        if cell is not None:
            return Site(cell, None, how="cell",
                        note="allocated on a thread with no Python frame while this cell ran")
        return None

    def _block_site(self, dev: _DeviceIndex, b: _Block, res: _Resolver) -> Site:
        if b.frames:
            site = res.site(b.frames)
            if site is not None:
                return site
        i = dev.last_alloc.get(b.addr)
        if i is not None:
            site = self._from_history(dev, i, res)
            if site is not None:
                return site
        site = self._carry.get((dev.index, b.addr, b.size))
        if site is not None:
            return site
        if (b.addr, b.size) in self.before.get(dev.index, ()):
            return BEFORE
        if len(dev.trace) < self.max_entries:
            # the history holds every event since trace was on, and not this block's
            return BEFORE
        return Site(None, None, how="unknown",
                    note=f"no frame: allocated on a thread with no Python frame before the oldest "
                         f"of the {self.max_entries:,} events kept (raise max_entries)")

    # -- queries --------------------------------------------------------------------------
    @staticmethod
    def _split(key: Any) -> tuple[str | None, int | None]:
        if isinstance(key, tuple) and len(key) == 2 and type(key[1]) is int:
            return str(key[0]), key[1]
        if type(key) is int:
            return None, key
        return None, None

    def _host_site(self, r: Any) -> Site | None:
        """The site of a host recorder's record (``None``: no record, or no frame)."""
        if r is None:
            return None
        frames = [fr for fr in (r.inner, r.cin, r.cout) if fr is not None]
        return _Resolver(self.cells).site(frames) if frames else None

    def site_of(self, key: Any, nbytes: int | None = None) -> Site | None:
        return self.sites_of([key]).get(key)

    def sites_of(self, keys: Iterable) -> dict:
        out: dict = {}
        idx = None
        res = _Resolver(self.cells)
        for key in keys:
            dev, ptr = self._split(key)
            if ptr is None:
                continue
            if dev in (None, "cpu") and self.host is not None:
                site = self._host_site(self.host.record(ptr))
                if site is not None:
                    out[key] = site
                    continue
            if dev == "cpu":
                continue
            if dev is not None and not dev.startswith("cuda"):
                continue
            if idx is None:
                idx = self.index()
                if idx is None:
                    continue
            ordinals = [int(dev[5:])] if dev and dev[5:].isdigit() else list(idx.devices)
            for o in ordinals:
                d = idx.devices.get(o)
                b = d.block_at(ptr) if d is not None else None
                if b is not None:
                    out[key] = self._block_site(d, b, res)
                    break
        return out

    def unattributed_sites(self, reached_ptrs: Iterable, device: str,
                           labels: Mapping[int, str] | None = None) -> list[SiteGroup]:
        reached = set()
        for k in reached_ptrs or ():
            if type(k) is int:
                reached.add(k)
            elif isinstance(k, tuple) and len(k) == 2 and k[0] == device and type(k[1]) is int:
                reached.add(k[1])
        ranges = sorted(reached)
        labels = dict(labels or {})

        def is_reached(addr: int, size: int) -> bool:
            if addr in reached:
                return True
            i = bisect_right(ranges, addr + size - 1) - 1
            return i >= 0 and ranges[i] >= addr

        groups: dict[tuple, SiteGroup] = {}

        def add(site: Site, size: int, label: str | None) -> None:
            k = (label, site.key())
            g = groups.get(k)
            if g is None:
                groups[k] = SiteGroup(site, size, 1, device, label)
            else:
                g.nbytes += size
                g.count += 1

        if device == "cpu":
            if self.host is not None:
                for ptr, r in self.host.live().items():
                    if ptr not in reached:
                        site = self._host_site(r) or Site(None, None, how="unknown")
                        add(site, r.nbytes, labels.get(ptr))
            return sorted(groups.values(), key=lambda g: (-g.nbytes, g.site.text))
        if not device.startswith("cuda:") or not device[5:].isdigit():
            return []
        idx = self.index()
        d = idx.devices.get(int(device[5:])) if idx is not None else None
        if d is None:
            return []
        res = _Resolver(self.cells)
        for b in d.blocks:
            if is_reached(b.addr, b.size):
                continue
            add(self._block_site(d, b, res), b.size, labels.get(b.addr))
        return sorted(groups.values(), key=lambda g: (-g.nbytes, g.site.text))

    def cell_lines(self, n: int, device: str | None = None, top: int | None = None) -> CellLines:
        totals: dict[tuple, int] = {}
        held: dict[tuple, int] = {}
        peaks: dict[str, LineAlloc] = {}
        note = None
        idx = self.index() if device in (None, "all") or str(device).startswith("cuda") else None
        if idx is not None:
            span = self.interval(n)
            if span is None and self._pending:
                span = (self._pending[0][0], time.time())
            res = _Resolver(self.cells)
            for o, d in idx.devices.items():
                if device and device.startswith("cuda:") and device != f"cuda:{o}":
                    continue
                peak = self._device_cell(d, n, span, res, totals, held)
                if peak is not None:
                    peaks[f"cuda:{o}"] = peak
        if self.host is not None and device in (None, "all", "cpu"):
            for k, v in self.host.by_cell.get(n, {}).items():
                totals[k] = totals.get(k, 0) + v
            if device == "cpu":
                note = "the host keeps no history of frees: no peak line"
        items = sorted((LineAlloc(line, CellNames.source(fn, line), b)
                        for (fn, line), b in totals.items() if b > 0),
                       key=lambda la: (-la.bytes, la.line or 0))
        if top is not None:
            items = items[:top]
        peak = max(peaks.values(), key=lambda p: p.bytes) if peaks else None
        return CellLines(n, items, peak=peak, held={line: b for (fn, line), b in held.items() if b > 0},
                         peaks=peaks, note=note)

    def _device_cell(self, d: _DeviceIndex, n: int, span, res: _Resolver,
                     totals: dict, held: dict) -> LineAlloc | None:
        trace = d.trace
        if not trace:
            return None
        if span is not None and trace[-1].get("time_us"):
            times = d.times()
            lo = bisect_right(times, span[0] * 1e6 - 1)
            hi = bisect_right(times, span[1] * 1e6 + 1)
        else:
            lo, hi = 0, len(trace)
        running = best = 0
        best_at = None
        last = None
        owner: dict[int, tuple] = {}
        in_cell = False
        for i in range(lo, hi):
            e = trace[i]
            a = e.get("action")
            if a == _ALLOC:
                inner, cin, cout = res.pick(e.get("frames"))
                at = None
                if inner is not None:
                    if cout is not None and cout[0] == n:
                        at = last = (cout[1], cout[2])
                elif last is not None or span is not None:
                    at = last     # no Python frame: the line that allocated last before
                if at is None and span is None:
                    continue      # no time window: only this cell's own events count
                size = int(e.get("size") or 0)
                in_cell = True
                running += size
                if at is not None:
                    totals[(at[0], at[1])] = totals.get((at[0], at[1]), 0) + size
                    held[(at[0], at[1])] = held.get((at[0], at[1]), 0) + size
                    owner[e.get("addr")] = (at, size)
                if running > best:
                    best, best_at = running, at or (None, None)
            elif a == _FREE and in_cell:
                size = int(e.get("size") or 0)
                running -= size
                o = owner.pop(e.get("addr"), None)
                if o is not None:
                    k = (o[0][0], o[0][1])
                    held[k] = held.get(k, 0) - o[1]
        if best_at is None:
            return None
        return LineAlloc(best_at[1], CellNames.source(best_at[0], best_at[1]), best)

    # -- the visualizer's file ------------------------------------------------------------
    def save(self, path: str, device: str | None = None) -> str:
        if device in (None, "all") or str(device).startswith("cuda"):
            if self.cuda == "on":
                data = self.feed.snapshot()
                renamed = rename_cells(data, self.cells)
                _dump(path, data)
                return (f"saved the CUDA allocator's snapshot to {path} ({renamed} cell frame(s) "
                        f"named In[N]; open it at https://pytorch.org/memory_viz)")
            if device not in (None, "all"):
                raise RuntimeError(f"nothing recorded on {device}: trace is {self._cuda_words()}")
        if self.host is not None:
            data = self.host_snapshot()
            _dump(path, data)
            n = len(data["segments"])
            return (f"saved {n} host storage(s) with their sites to {path}, in the format of "
                    f"torch.cuda.memory._snapshot() (device 0 stands for the host)")
        raise RuntimeError("nothing recorded: turn trace on first (`%gpumem trace on`)")

    def host_snapshot(self) -> dict:
        """The host's records shaped like ``torch.cuda.memory._snapshot()``: one segment
        per live storage (its frames named ``In[N]``), the events as device 0's trace."""
        host = self.host
        if host is None:
            return {"segments": [], "device_traces": [[]]}
        host.sweep()

        def frames(rec_frames) -> list:
            out, seen = [], set()
            for fr in rec_frames or ():
                if fr is None or fr in seen:
                    continue
                seen.add(fr)
                out.append({"filename": fr[0], "line": fr[1], "name": fr[2]})
            return out

        segments = []
        for ptr, r in sorted(host.live().items()):
            fr = frames((r.inner, r.cin, r.cout))
            kind = "large" if r.nbytes > (1 << 20) else "small"
            segments.append({
                "device": 0, "address": ptr, "total_size": r.nbytes, "allocated_size": r.nbytes,
                "active_size": r.nbytes, "requested_size": r.nbytes, "stream": 0,
                "segment_type": kind, "segment_pool_id": (0, 0), "is_expandable": False,
                "frames": fr,
                "blocks": [{"address": ptr, "size": r.nbytes, "requested_size": r.nbytes,
                            "state": "active_allocated", "frames": fr}]})
        trace = []
        for action, ptr, nbytes, t, fr in host.events:
            entries = [action] if action == _ALLOC else [_FREE, "free_completed"]
            for act in entries:
                trace.append({"action": act, "addr": ptr, "size": nbytes, "stream": 0,
                              "time_us": int(t * 1e6), "frames": frames(fr) if fr else []})
        data = {"segments": segments, "device_traces": [trace],
                "allocator_settings": {}}
        rename_cells(data, self.cells)
        return data

    # -- words --------------------------------------------------------------------------
    def _cuda_words(self) -> str:
        return {"off": "off", "waiting-import": f"waiting for `import {self.module}`",
                "waiting-init": f"waiting for {self.framework} to initialise CUDA",
                "on": "recording", "unavailable": "not available (no CUDA device)"}[self.cuda]

    def since_text(self) -> str | None:
        """The measured cost per allocation times the allocations since trace was on,
        against the time cells ran meanwhile."""
        if self.cuda != "on" or self.cuda_cost is None or self.allocs_at_start is None:
            return None
        now = self.feed.allocations()
        if now is None:
            return None
        count = max(now - self.allocs_at_start, 0)
        spent = count * self.cuda_cost.extra
        cells = self._cell_seconds
        share = f", {spent / cells:.1%} of the {cells:.1f} s cells ran" if cells > 0 else ""
        return f"{count:,} CUDA allocations since on, about {spent:.2f} s of recording{share}"

    def status(self) -> str:
        """One line: what is recorded, and its measured cost."""
        if not self.active:
            return "trace is off"
        parts = []
        if self.auto and self.cuda == "waiting-import":
            parts.append(f"waiting for `import {self.module}` (then CUDA's allocator where "
                         f"{self.framework} sees a GPU, else the host)")
            if self.do_measure:
                parts.append("its cost is measured when recording starts (`%gpumem trace`)")
        elif self.want_cuda:
            what = self._cuda_words()
            if self.cuda == "on":
                what = f"recording ({self.stacks} stacks, {self.max_entries:,} events kept)"
            parts.append(f"CUDA {what}")
            if self.cuda_cost is not None:
                parts.append("cost " + self.cuda_cost.text)
            elif self.cuda in ("waiting-import", "waiting-init") and self.do_measure:
                parts.append("its cost is measured when recording starts (`%gpumem trace`)")
        if (self.host_state != "off" or self.want_host) and not (
                self.auto and self.cuda == "waiting-import"):
            words = {"on": f"recording {self.framework} calls' results", "waiting-import":
                     f"waiting for `import {self.module}`", "waiting-thread":
                     "starts with the next cell", "off": "off", "unavailable":
                     f"not available ({self.framework} has no host recorder)"
                     }.get(self.host_state, self.host_state)
            parts.append(f"host {words}")
            if self.host_cost is not None:
                parts.append("cost " + self.host_cost.text)
        since = self.since_text()
        if since:
            parts.append(since)
        parts += self._messages[-2:]
        return "trace is on: " + " · ".join(parts)


def rename_cells(data: dict, cells: CellNames) -> int:
    """Name the frames of notebook cells ``In[N]`` in a ``_snapshot()`` dict, in place
    (torch shares frame dicts between blocks and events: each is renamed once)."""
    done: set[int] = set()
    count = 0

    def fix(frames) -> None:
        nonlocal count
        for f in frames or ():
            if not isinstance(f, dict) or id(f) in done:
                continue
            done.add(id(f))
            n = cells.number(f.get("filename"))
            if n is not None and not _IN_RE.match(str(f.get("filename"))):
                f["filename"] = f"In[{n}]"
                count += 1

    for seg in data.get("segments") or ():
        fix(seg.get("frames"))
        for b in seg.get("blocks") or ():
            fix(b.get("frames"))
    for trace in data.get("device_traces") or ():
        for e in trace:
            fix(e.get("frames"))
    return count


def _dump(path: str, data: dict) -> None:
    path = os.path.expanduser(str(path))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(data, f)
    os.replace(tmp, path)


# -- the module's API ------------------------------------------------------------------------------
_TRACER: Tracer | None = None
_LOCK = threading.Lock()


def start(shell: Any, device: str = "auto", *, stacks: str = "python", context: str = "alloc",
          max_entries: int = DEFAULT_MAX_ENTRIES, feed: Any = None, measure: bool = True,
          cells: tuple[Callable, Callable] | None = None) -> str:
    """Turn trace on for ``shell`` (see the module docstring); returns one status line
    with the measured cost. ``device``: ``auto`` (CUDA where the framework sees a GPU, else
    the host), ``all`` (both), ``cpu`` (the host) or ``cuda``/``cuda:N`` (the framework
    records every GPU; queries read the one asked). ``feed``: the allocator to ask instead
    of the backend's own (tests). ``cells``: ``(hook, unhook)`` for the cell events,
    IPython's own by default (the extension gives its session's)."""
    global _TRACER
    with _LOCK:
        if _TRACER is not None:
            _TRACER.stop()
            _TRACER = None
        tracer = Tracer(shell, device, stacks=stacks, context=context, max_entries=max_entries,
                        feed=feed, measure=measure, cells=cells)
        _TRACER = tracer
    try:
        return tracer.start()
    except Exception:
        stop()
        raise


def stop() -> str:
    """Turn trace off: the framework's recording stops (its history goes), the host
    recorder leaves the stack, the hooks go."""
    global _TRACER
    with _LOCK:
        tracer, _TRACER = _TRACER, None
    return tracer.stop() if tracer is not None else "trace was off"


def is_on() -> bool:
    return _TRACER is not None and _TRACER.active


def tracer() -> Tracer | None:
    """The running :class:`Tracer`, if any."""
    return _TRACER


def status() -> str:
    return _TRACER.status() if _TRACER is not None else "trace is off"


def site_of(storage_key_or_ptr: Any, nbytes: int | None = None) -> Site | None:
    """The allocation site of a storage: ``(device, pointer)`` as the scan keys it
    (``("cuda:0", 0x7f…)``, ``("cpu", …)``) or a bare pointer. ``None`` when trace is
    off or the storage is not known to it."""
    return _TRACER.site_of(storage_key_or_ptr, nbytes) if is_on() else None


def sites_of(keys: Iterable) -> dict:
    """:func:`site_of` for many storages at once, from one snapshot: key -> Site."""
    return _TRACER.sites_of(keys) if is_on() else {}


def unattributed_sites(reached_ptrs: Iterable, device: str,
                       labels: Mapping[int, str] | None = None) -> list[SiteGroup]:
    """The blocks on ``device`` that no name reaches (``reached_ptrs``: the storages'
    pointers on that device, or their ``(device, pointer)`` keys), grouped by
    allocation site, largest first. ``labels``: block address -> an internal holder's
    label (cuBLAS workspaces, ...) to group those under."""
    return _TRACER.unattributed_sites(reached_ptrs, device, labels) if is_on() else []


def cell_lines(execution_count: int, device: str | None = None, top: int | None = None) -> CellLines:
    """The lines of cell ``execution_count`` that allocated the most (largest first) and
    the line at the cell's peak (``.peak``)."""
    if not is_on():
        return CellLines(execution_count, note="trace is off")
    return _TRACER.cell_lines(execution_count, device, top)


def segments() -> list | None:
    """The allocator's segments from trace's own snapshot (``None`` when not recording
    CUDA): what ``torch.cuda.memory_snapshot()`` would return, without a second one."""
    return _TRACER.segments() if is_on() else None


def save(path: str, device: str | None = None) -> str:
    """Write a snapshot PyTorch's memory visualizer opens (a pickle of
    ``torch.cuda.memory._snapshot()``, the cells' frames named ``In[N]``); returns one line."""
    if not is_on():
        raise RuntimeError("trace is off: `%gpumem trace on` first")
    return _TRACER.save(path, device)





