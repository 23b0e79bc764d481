"""``%%gpuwatch``, ``%gpumem watch|history|plot`` and ``jupyter_gpumem.watch()``.

What a cell (or a block of a script) did to memory, per device: wall time,
change in allocated and reserved bytes, the exact peak inside it from the
framework allocator's counters, the process's peak from a sampling thread
(NVML on accelerators, the resident set on the host; labelled as sampled),
and the names it created, grew, shrank or deleted. When the code raises,
out-of-memory included, the report still comes and names the biggest
holders with the ``%gpumem purge ...`` command that frees them.

Pieces (each a module of its own):

- :mod:`.watch_peaks`: exact peaks that stay right when scopes nest and
  when user code resets the counters; nobody's reading is lowered.
- :mod:`.watch_holders`: per-root storages kept up to date cheaply, so the
  per-cell footer does not rescan the whole namespace.
- :mod:`.watch_result`: :class:`WatchResult` with text, HTML and JSON.
- :mod:`.watch_plot`, :mod:`.watch_export`: the timeline figure, CSV/JSON
  and TensorBoard export.

For other parts of the product (the live panel, the sidebar):

- :func:`history_for(shell) <history_for>`: the list of per-cell records
  (:class:`WatchResult`, oldest first, at most ``MAX_HISTORY``) kept while
  ``%gpumem watch on`` is on, plus ``%%gpuwatch`` cells run while it is off.
  Read it on the main thread; records are never changed once appended.
- :func:`series_for(shell) <series_for>`: the :class:`~.monitor.Series` the
  sampling thread fills while watched code runs: points
  ``(unix time, {device: {"allocated", "reserved", "used_process", "total"}})``
  as :func:`~.monitor.device_point` makes them, about every
  ``sample_interval`` seconds; none between cells.

JSON of one record (``WatchResult.to_json()``, ``"schema":
"jupyter_gpumem.watch/1"``): ``label``, ``source`` (``"%%gpuwatch"``,
``"watch on"``, ``"watch()"``), ``execution_count``, ``start``/``end`` (unix
s), ``wall`` (s), ``interval`` (s), ``devices`` (per device: ``id``, ``kind``,
``total``, ``allocated_before/after/delta`` and ``allocated_measure``,
``reserved_before/after/delta``, ``peak_allocated``, ``peak_reserved`` and
``peak_measure`` (exact, null where no allocator counter), ``peak_rss``
(cpu: the process's exact peak resident set), ``peak_traced`` (cpu, with
tracemalloc on), ``process_before/after``, ``process_peak_sampled``,
``process_measure`` (``"NVML"`` or ``"RSS"``), ``samples``,
``used_all_after``, ``share_after``, ``notes``), ``changes`` (``name``,
``change`` created|grew|shrank|deleted, ``before``, ``after``, ``delta``,
``devices``, ``hidden``, ``shared``, ``type``, ``purge``), ``holders_mode``
(none|incremental|full), ``partial``, ``error`` (``type``, ``message``,
``oom``) or null, ``holders`` (biggest, on error or warning), ``purge_command``,
``warning``, ``auto_purge``, ``messages``, ``overhead`` (s).
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import sys
import threading
import time
from collections import OrderedDict, deque
from typing import Any

from IPython.core.error import UsageError

from . import devices as _devices
from . import monitor as _monitor
from . import scan as _scan
from . import trace as _trace
from .render import fmt_bytes
from .watch_holders import HolderTracker, RootInfo
from .watch_peaks import LEDGER, PeakScope, uninstall_all
from .watch_result import DeviceWatch, HolderChange, HolderEntry, WatchResult, fmt_seconds

MAX_HISTORY = 10000
SERIES_POINTS = 20000
EXACT_BUDGET = 0.01     # share of a cell's wall time a full holder scan may take
_HOLDERS_SHOWN = 12


# -- state per shell or namespace ---------------------------------------------------------------
class _State:
    """History, timeline and holder tracker of one shell (or script namespace)."""

    def __init__(self, shell: Any = None, namespace: dict | None = None) -> None:
        self.shell = shell
        self.namespace = namespace
        self.tracker = HolderTracker()
        self.history: list[WatchResult] = []
        self.series = _monitor.Series(maxlen=SERIES_POINTS)
        self.magics: Any = None
        self.footer: _Footer | None = None
        self.footer_device: str | None = None
        self.costs: deque = deque(maxlen=2000)   # seconds each footer cost (pre + post)
        self.ns_mark: tuple | None = None
        self._observer = None

    def record(self, result: WatchResult) -> None:
        self.history.append(result)
        if len(self.history) > MAX_HISTORY:
            del self.history[: len(self.history) - MAX_HISTORY]

    def internal_ids(self) -> set[int]:
        """Objects of this extension a scan must not walk into (frames of ours hold them)."""
        objs = [self, self.tracker, self.history, self.series, self.costs, HUB, LEDGER,
                self.footer, self.magics]
        return {id(o) for o in objs if o is not None}


_shell_states: dict[int, _State] = {}
_ns_states: OrderedDict = OrderedDict()
_MAX_NS_STATES = 32


def _state_for_shell(shell: Any) -> _State:
    state = _shell_states.get(id(shell))
    if state is None or state.shell is not shell:
        state = _shell_states[id(shell)] = _State(shell=shell)
    return state


def _state_for_namespace(namespace: dict) -> _State:
    state = _ns_states.get(id(namespace))
    if state is None or state.namespace is not namespace:
        state = _State(namespace=namespace)
        _ns_states[id(namespace)] = state
        while len(_ns_states) > _MAX_NS_STATES:
            _ns_states.popitem(last=False)
    _ns_states.move_to_end(id(namespace))
    return state


def _state_of(target: Any) -> _State:
    if isinstance(target, dict):
        return _state_for_namespace(target)
    return _state_for_shell(target)


def history_for(shell_or_namespace: Any) -> list[WatchResult]:
    """The per-cell records of a shell (or a script's namespace), oldest first."""
    return _state_of(shell_or_namespace).history


def series_for(shell_or_namespace: Any) -> _monitor.Series:
    """The sampled timeline of a shell (or namespace); see the module docstring."""
    return _state_of(shell_or_namespace).series


def footer_costs(shell: Any) -> list[float]:
    """Seconds each ``watch on`` footer cost (before and after the cell together)."""
    return list(_state_for_shell(shell).costs)


# -- the shared sampling thread -------------------------------------------------------------------
class _Sampling:
    """What one open watch gathers from the sampler: max process usage per device."""

    def __init__(self, device_ids: list[str], series: _monitor.Series, interval: float) -> None:
        self.devices = set(device_ids)
        self.series = series
        self.interval = interval
        self.max_process: dict[str, int] = {}
        self.samples: dict[str, int] = {}
        self.failure: str | None = None     # why the sampling thread stopped while this was open

    def observe(self, point: dict) -> None:
        for dev in self.devices:
            value = (point.get(dev) or {}).get("used_process")
            if value is None:
                continue
            self.samples[dev] = self.samples.get(dev, 0) + 1
            if value > self.max_process.get(dev, -1):
                self.max_process[dev] = value


class _SamplerHub:
    """One sampling thread for every open watch; it reads counters only.

    It runs while a watch is open; ``hold()`` (the ``watch on`` footer) keeps
    it alive but paused between cells; without holders it stops. Should the
    thread end on its own, the open watches say so in their reports
    (``failure``) and the next watch starts a new thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[_Sampling] = []
        self._holds = 0
        self._sampler: _monitor.Sampler | None = None
        #: why the last sampling thread ended on its own; None once a new one runs
        self.failure: str | None = None

    def add(self, sampling: _Sampling) -> None:
        with self._lock:
            self._open.append(sampling)
            interval = min(s.interval for s in self._open)
            if self._sampler is None or self._sampler.stopped:
                self._sampler = _monitor.Sampler(self._tick, interval, name="jupyter_gpumem-watch",
                                                 on_failure=self._failed)
                self.failure = None
                self._sampler.start()
            self._sampler.interval = interval
            self._sampler.resume()
        self.sample([sampling])

    def remove(self, sampling: _Sampling) -> None:
        try:
            self.sample([sampling])
        finally:
            self._drop(sampling)

    def _drop(self, sampling: _Sampling) -> None:
        stop = None
        with self._lock:
            if sampling in self._open:
                self._open.remove(sampling)
            if not self._open and self._sampler is not None:
                if self._holds:
                    self._sampler.pause()
                else:
                    stop, self._sampler = self._sampler, None
        if stop is not None:
            stop.stop()

    def hold(self) -> None:
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        stop = None
        with self._lock:
            self._holds = max(self._holds - 1, 0)
            if not self._holds and not self._open:
                stop, self._sampler = self._sampler, None
        if stop is not None:
            stop.stop()

    def running(self) -> bool:
        """True while the thread exists (sampling or paused)."""
        with self._lock:
            return self._sampler is not None

    def _failed(self, failure: str) -> None:
        """In the sampling thread as it ends: tell the open watches (never print)."""
        with self._lock:
            self.failure = failure
            for s in self._open:
                s.failure = failure

    def _tick(self) -> None:
        with self._lock:
            opens = list(self._open)
        if opens:
            self.sample(opens)
            LEDGER.tick()

    @staticmethod
    def sample(opens: list[_Sampling]) -> None:
        ids = sorted(set().union(*(s.devices for s in opens)))
        usages = _read_devices(ids)
        t = time.time()
        point = _monitor.device_point(usages.values())
        seen: set[int] = set()
        for s in opens:
            s.observe(point)
            if id(s.series) not in seen:
                seen.add(id(s.series))
                s.series.append(t, {d: v for d, v in point.items()})


HUB = _SamplerHub()


def _read_devices(ids: list[str]) -> dict[str, _devices.DeviceUsage]:
    """Device figures for these ids (counters only; never creates a CUDA context)."""
    selection = "cpu" if list(ids) == ["cpu"] else "all"
    wanted = set(ids)
    return {d.id: d for d in _devices.read_devices(selection, detail=False) if d.id in wanted}


def _marks(usages: dict[str, _devices.DeviceUsage]) -> dict[str, int]:
    out = {}
    for dev, du in usages.items():
        value = du.used_process if dev == "cpu" else du.allocated
        if value is not None:
            out[dev] = value
    return out


# -- the watch itself ------------------------------------------------------------------------
def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        return False
    return "out of memory" in text.lower() or "RESOURCE_EXHAUSTED" in text


def _error_info(exc: BaseException) -> dict:
    try:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    except Exception:  # noqa: BLE001
        message = ""
    if len(message) > 300:
        message = message[:297] + "..."
    return {"type": type(exc).__name__, "message": message, "oom": _is_oom(exc)}


def _ordered(ids) -> list[str]:
    return sorted(set(ids), key=lambda d: (d == "cpu", d))


class Watch:
    """Watch a block of code: ``with Watch(...) as w: ...`` then ``w.result``.

    Use :func:`watch` to make one; ``%%gpuwatch`` and the ``watch on``
    footer are thin wrappers over it.
    """

    def __init__(self, *, shell: Any = None, namespace: dict | None = None, device: str = "auto",
                 interval: float = 0.05, label: str | None = None, report: bool = True,
                 time_limit: float = 3.0, exact_budget: float = EXACT_BUDGET,
                 source: str = "watch()", state: _State | None = None, record: bool = True,
                 frame: Any = None) -> None:
        self.shell = shell
        self.namespace = namespace
        self.device = _devices.parse_device(device)
        self.interval = _monitor.check_interval(interval, "interval")
        self.label = label
        self.report = report
        self.time_limit = time_limit
        self.exact_budget = exact_budget
        self.source = source
        self.record = record
        self.result: WatchResult | None = None
        self._frame = frame
        if state is None:
            if shell is not None:
                state = _state_for_shell(shell)
            elif frame is not None and namespace is None:
                state = _State(namespace={})      # a function's locals: a private state
            else:
                state = _state_for_namespace(namespace if namespace is not None else {})
        self._state = state
        self._started = False
        self._extra_roots: list[_scan.Root] = []

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> "Watch":
        try:
            self.start()
        except Exception as failure:  # noqa: BLE001 - the block runs unwatched instead
            self.abandon()
            _complain("watch could not start; the block runs unwatched", failure)
        return self

    def __exit__(self, etype, exc, tb) -> bool:
        try:
            self.stop(error=exc)
            if self.report and self.result is not None:
                _show(self.result)
        except Exception as failure:  # noqa: BLE001 - never raise into the user's code
            _complain("watch failed", failure)
        return False

    # -- namespace -------------------------------------------------------------------------
    def _ns(self) -> dict | None:
        if self.shell is not None:
            return None
        if self._frame is not None:
            return self._frame.f_locals
        return self.namespace if self.namespace is not None else self._state.namespace

    def _roots(self, error: BaseException | None = None) -> list[_scan.Root]:
        roots = _scan.collect_roots(self._ns(), self.shell)
        extra = list(self._extra_roots)
        if error is not None:
            if self.shell is not None:
                roots = [r for r in roots if r.kind != "traceback"]
                extra.append(_scan.Root("last traceback", (error,), hidden=True, kind="traceback"))
            else:
                extra.append(_scan.Root("raised exception", (error,), hidden=True, kind="exception"))
        taken = {r.name for r in extra}
        return [r for r in roots if r.name not in taken] + extra

    def _update(self, usages, error: BaseException | None = None, **kwargs):
        state = self._state
        upd = state.tracker.update(self._roots(error), shell=self.shell, namespace=self._ns(),
                                   marks=_marks(usages), time_limit=self.time_limit,
                                   extra_stop=state.internal_ids() | {id(self)}, **kwargs)
        state.ns_mark = None if self._frame is not None or error is not None else self._ns_mark()
        return upd

    def _ns_mark(self) -> tuple | None:
        """Names, hidden holders and their identities, cheaply: unchanged means nothing
        ran since the tracker's last update (a cell's start right after the last cell's end)."""
        shell = self.shell
        ns = shell.user_ns if shell is not None else self._ns()
        try:
            parts: list = [tuple(ns), tuple(map(id, ns.values()))]
            if shell is not None:
                out = shell.history_manager.output_hist
                hook = shell.displayhook
                parts += [tuple(out), tuple(map(id, out.values())),
                          tuple(id(getattr(hook, n, None)) for n in ("_", "__", "___")),
                          tuple(map(id, _scan.traceback_objects(shell)))]
            return tuple(parts)
        except Exception:  # noqa: BLE001
            return None

    # -- start / stop ---------------------------------------------------------------------
    def start(self) -> "Watch":
        """Measure from now on."""
        t = time.perf_counter()
        self._ids0 = _devices.selected_ids(self.device)
        usages = _read_devices(_ordered(self._ids0 + ["cpu"]))
        state = self._state
        self._messages = []
        if not (state.tracker.seeded and state.ns_mark is not None
                and state.ns_mark == self._ns_mark()):
            if self._update(usages).partial:
                self._messages.append("holders: partial scan before the code ran")
        self._tracked0 = dict(self._state.tracker.totals)
        self._roots0 = dict(self._state.tracker.roots)   # RootInfos are replaced, never changed
        self._usages0 = usages
        self._scope: PeakScope = LEDGER.open(self._ids0)
        try:
            self._sampling = _Sampling(self._ids0, self._state.series, self.interval)
            HUB.add(self._sampling)
        except BaseException:
            self.abandon()   # leave no open scope or sampling entry behind
            raise
        self._start_unix = time.time()
        self._overhead = time.perf_counter() - t
        self._started = True
        self._t0 = time.perf_counter()
        return self

    def abandon(self) -> None:
        """Stop measuring without a report (the extension unloads mid-cell)."""
        sampling, scope = getattr(self, "_sampling", None), getattr(self, "_scope", None)
        self._sampling = self._scope = None
        self._started = False
        self._frame = None
        try:
            if sampling is not None:
                HUB.remove(sampling)
        finally:
            if scope is not None:
                LEDGER.close(scope)

    def add_root(self, root: _scan.Root) -> None:
        """A holder the report should count that no namespace shows yet (the cell's value)."""
        self._extra_roots.append(root)

    def stop(self, error: BaseException | None = None,
             execution_count: int | None = None) -> WatchResult | None:
        """Stop measuring; build, record and return the :class:`WatchResult`."""
        t1 = time.perf_counter()
        if not self._started:
            return None
        self._started = False
        wall = t1 - self._t0
        HUB.remove(self._sampling)
        ids = _ordered(self._ids0 + _devices.selected_ids(self.device))
        LEDGER.close(self._scope, ids)
        usages = _read_devices(_ordered(ids + ["cpu"]))
        upd = self._update(usages, error=error, force_full=error is not None,
                           full_budget=self.exact_budget * wall)
        self._frame = None
        self._extra_roots = []
        changes = self._changes(self._state.tracker.diff(self._roots0), ids)
        self._roots0 = {}
        result = WatchResult(
            label=self.label or self.source, source=self.source, execution_count=execution_count,
            start=self._start_unix, wall=wall, interval=self.interval,
            devices=[self._device_watch(dev, usages) for dev in ids],
            changes=changes, holders_mode=upd.mode,
            partial=upd.partial, context="ipython" if self.shell is not None else "script",
            messages=self._messages + list(self._scope.notes),
        )
        if upd.partial:
            result.messages.append("holders: partial scan (raise GpuMemMagics.scan_time_limit)")
        if self._sampling.failure:
            result.messages.append(f"sampling stopped: {self._sampling.failure}; the sampled "
                                   "peak covers only the time before")
        if error is not None:
            result.error = _error_info(error)
            self.name_holders(result, ids)
        result.overhead = self._overhead + (time.perf_counter() - t1)
        self.result = result
        if self.record:
            self._state.record(result)
        return result

    def name_holders(self, result: WatchResult, ids) -> None:
        """Fill ``result.holders`` and the purge command from the tracker (biggest first)."""
        tracker = self._state.tracker
        accel = [d for d in ids if d != "cpu"] or list(ids)
        infos = tracker.top(accel)
        result.holders = [_entry(i, accel, tracker) for i in infos[:_HOLDERS_SHOWN]]
        result.purge_names = purge_names(infos, accel, script=self.shell is None)

    # -- building the result -------------------------------------------------------------
    def _device_watch(self, dev: str, usages) -> DeviceWatch:
        u0, u1 = self._usages0.get(dev), usages.get(dev)
        kind = (u1 or u0).kind if (u1 or u0) is not None else dev.split(":")[0]
        d = DeviceWatch(dev, kind, total=getattr(u1, "total", None))
        scope = self._scope
        if dev == "cpu":
            tracker = self._state.tracker
            d.allocated_before = self._tracked0.get("cpu", 0)
            d.allocated_after = tracker.totals.get("cpu", 0)
            d.allocated_measure = "tracked tensors: the scan's count"
            d.peak_rss = scope.peak(("rss", "cpu"), "rss")
            d.peak_traced = scope.peak(("tracemalloc", "cpu"), "traced")
            if d.peak_traced is not None:
                d.traced_before = scope.start.get(("tracemalloc", "cpu"), {}).get("traced")
            d.process_measure = "RSS"
        else:
            key = ("torch", dev)
            born_inside = key in scope.start and not scope.start[key]
            d.allocated_before = 0 if born_inside else getattr(u0, "allocated", None)
            d.allocated_after = getattr(u1, "allocated", None)
            d.reserved_before = 0 if born_inside else getattr(u0, "reserved", None)
            d.reserved_after = getattr(u1, "reserved", None)
            d.peak_allocated = scope.peak(key, "allocated_bytes.all")
            d.peak_reserved = scope.peak(key, "reserved_bytes.all")
            d.peak_measure = scope.labels.get(key) if d.peak_allocated is not None else None
            if born_inside:
                d.notes.append("the framework started using this device inside the watched code")
        d.process_before = getattr(u0, "used_process", None)
        d.process_after = getattr(u1, "used_process", None)
        d.process_peak_sampled = self._sampling.max_process.get(dev)
        d.samples = self._sampling.samples.get(dev, 0)
        d.used_all_after = getattr(u1, "used_all", None)
        return d

    def _changes(self, root_changes, ids) -> list[HolderChange]:
        tracker = self._state.tracker
        wanted = set(ids)
        out = []
        for rc in root_changes:
            old, new = rc.before, rc.after
            b0 = old.by_device(wanted) if old else {}
            b1 = new.by_device(wanted) if new else {}
            before, after = sum(b0.values()), sum(b1.values())
            if before == after and b0 == b1:
                continue
            if old is None or (before == 0 and new is not None):
                change = "created"
            elif new is None:
                change = "deleted"
            else:
                change = "grew" if after > before else "shrank"
            info = new or old
            out.append(HolderChange(
                name=rc.name, change=change, before=before, after=after,
                devices={d: b1.get(d, 0) - b0.get(d, 0) for d in set(b0) | set(b1)},
                hidden=info.hidden, shared=tracker.shared_bytes(info, wanted), type=info.type,
                purge=info.purge_arg))
        out.sort(key=lambda c: (-abs(c.delta), c.name))
        return out


PURGE_FLOOR = 1 << 20   # holders smaller than this, all together, are left out of the command


def purge_names(infos: list[RootInfo], devices, script: bool = False) -> list[str]:
    """What to purge to free ``infos`` (largest first), leaving out a tail under 1 MiB."""
    sizes = [i.nbytes(devices) for i in infos]
    out = []
    for k, info in enumerate(infos):
        if sum(sizes[k:]) < PURGE_FLOOR:
            break
        if info.purge_arg and not (script and info.hidden):
            out.append(info.purge_arg)
    return out


def _entry(info: RootInfo, devices, tracker: HolderTracker) -> HolderEntry:
    return HolderEntry(info.name, info.nbytes(devices), info.by_device(devices), info.hidden,
                       tracker.shared_bytes(info, devices), info.type, info.purge_arg)


def _caller_frame():
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("jupyter_gpumem"):
        frame = frame.f_back
    return frame


def _running_shell():
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:  # noqa: BLE001
        return None


def watch(shell: Any = None, namespace: dict | None = None, *, device: str = "auto",
          interval: float = 0.05, label: str | None = None, report: bool = True,
          time_limit: float = 3.0) -> Watch:
    """Report what a block of code did to memory: ``with jupyter_gpumem.watch() as w:``.

    Without ``shell`` or ``namespace`` it watches the caller's names: the
    IPython shell when called from a notebook cell, the module's globals at
    the top of a script, or the calling function's locals. ``report``
    prints (or, in IPython, displays) the report at the end; ``w.result`` is
    the :class:`WatchResult` either way. ``interval`` is the sampling period
    of the process's memory (seconds).
    """
    frame = None
    if shell is None and namespace is None:
        caller = _caller_frame()
        ip = _running_shell()
        if ip is not None and caller is not None and caller.f_globals is ip.user_ns:
            shell = ip
        elif caller is not None:
            if caller.f_locals is caller.f_globals:
                namespace = caller.f_globals
            else:
                frame = caller
    return Watch(shell=shell, namespace=namespace, device=device, interval=interval,
                 label=label or ("block" if shell is None else f"block in {_cell_label(shell)}"),
                 report=report, time_limit=time_limit, frame=frame,
                 record=shell is None)   # a shell's history is per cell, not per block


def _cell_label(shell: Any) -> str:
    n = _current_count(shell)
    return f"In [{n}]" if n is not None else "cell"


def _current_count(shell: Any) -> int | None:
    """The number of the cell running now: what IPython's display hook files ``Out[N]`` under."""
    try:
        return int(shell.displayhook.prompt_count)
    except Exception:  # noqa: BLE001
        return getattr(shell, "execution_count", None)


def _show(result: Any) -> None:
    if _running_shell() is not None:
        from IPython.display import display

        display(result)
    else:
        print(repr(result))


def _complain(what: str, exc: BaseException) -> None:
    print(f"jupyter_gpumem: {what}: {type(exc).__name__}: {exc}", file=sys.stderr)


# -- the watch on footer --------------------------------------------------------------------------
def _parse_share(value: Any) -> float | None:
    """``"80%"``, ``0.8`` or ``80`` -> 0.8; ``None``/``"off"`` -> None; ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "off", "none", "no"):
            return None
        percent = text.endswith("%")
        number = float(text.rstrip("%").strip())
        share = number / 100 if percent or number > 1 else number
    else:
        number = float(value)
        share = number / 100 if number > 1 else number
    if not 0 < share <= 1:
        raise ValueError(f"a share between 0% and 100% is needed, not {value!r}")
    return share


_UNSET = object()


def _patch(obj: Any, name: str, make) -> tuple | None:
    """Set ``obj.name = make(current)`` on the instance; (obj, name, previous, patched) or None
    where the instance takes no attribute (a C-level stream such as a terminal's stdout)."""
    try:
        previous = vars(obj).get(name, _UNSET)
        current = getattr(obj, name)
        patched = make(current)
        setattr(obj, name, patched)
    except Exception:  # noqa: BLE001
        return None
    return obj, name, previous, patched


def _unpatch(patch: tuple | None) -> None:
    """Undo :func:`_patch` unless someone patched over it since (then ours stays, inert)."""
    if patch is None:
        return
    obj, name, previous, patched = patch
    try:
        if vars(obj).get(name, _UNSET) is not patched:
            return
        if previous is _UNSET:
            delattr(obj, name)
        else:
            setattr(obj, name, previous)
    except Exception:  # noqa: BLE001
        pass


class _OpenLine:
    """Whether a cell's output left the cursor in the middle of a line (``print('x', end='')``).

    For the cell's duration it wraps ``write`` of ``sys.stdout`` on the
    instance, as IPython's own ``run_cell`` does to keep a cell's output, and
    notes whether the last text ended with a newline; a display (its own
    output area in a notebook, its own lines in a terminal) ends the line too.
    Where the stream takes no attribute it knows nothing and says no.
    """

    def __init__(self, shell: Any) -> None:
        self.open = False
        self.active = True
        self.stream = sys.stdout
        self._patches = [_patch(self.stream, "write", self._write)]
        for owner, name in ((getattr(shell, "display_pub", None), "publish"),
                            (getattr(shell, "displayhook", None), "finish_displayhook")):
            if owner is not None:
                self._patches.append(_patch(owner, name, self._ends_line))

    def _write(self, original):
        def write(data, *args, **kwargs):
            result = original(data, *args, **kwargs)
            if self.active and isinstance(data, str) and data:
                self.open = not data.endswith("\n")
            return result
        return write

    def _ends_line(self, original):
        def call(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                if self.active:
                    self.open = False
        return call

    def needs_newline(self) -> bool:
        return self.open and self._patches[0] is not None and sys.stdout is self.stream

    def remove(self) -> None:
        self.active = False
        patches, self._patches = self._patches, [None]
        for patch in reversed(patches):
            _unpatch(patch)


class _FooterCell:
    """What the footer keeps for one outermost cell: its watch and its output's last line."""

    def __init__(self, watch: Watch | None, line: _OpenLine | None) -> None:
        self.watch = watch
        self.line = line

    def abandon(self) -> None:
        line, self.line = self.line, None
        if line is not None:
            line.remove()
        w, self.watch = self.watch, None
        if w is not None:
            w.abandon()


class _Footer:
    """The ``pre_run_cell`` / ``post_run_cell`` pair of ``%gpumem watch on``.

    The events are paired by :class:`~.monitor.CellEvents` (IPython does not
    pair them): a cell run from inside a cell counts in its outer cell, and a
    "pre" or "post" without its partner never turns the footer off.
    """

    def __init__(self, state: _State) -> None:
        self.state = state
        self.cells = _monitor.CellEvents(state.shell)
        self._pre_cost = 0.0

    @property
    def magics(self):
        return self.state.magics

    @property
    def watch(self) -> Watch | None:
        """The watch of the outermost cell running now, if any."""
        payload = self.cells.outer_payload()
        return payload.watch if payload is not None else None

    def pre(self, info=None) -> None:
        t = time.perf_counter()
        try:
            cell, ended = self.cells.pre(info)
        except Exception as exc:  # noqa: BLE001 - never in the user's way
            _complain("watch footer failed", exc)
            return
        for payload in ended:       # cells whose "post" never came: no footer to print now
            payload.abandon()
        if not cell.outer:
            return      # a cell run from inside a cell (%%capture, run_cell): the outer one counts
        shell = self.state.shell
        w = line = None
        try:
            count = _current_count(shell)
            magics = self.magics
            device = self.state.footer_device or getattr(magics, "default_device", "auto")
            w = Watch(shell=shell, device=device,
                      interval=getattr(magics, "sample_interval", 0.05),
                      label=f"In [{count}]", report=False,
                      time_limit=getattr(magics, "scan_time_limit", 3.0),
                      source="watch on", state=self.state, record=True).start()
            line = _OpenLine(shell)
        except Exception as exc:  # noqa: BLE001 - never in the user's way
            _complain("watch footer failed", exc)
        cell.payload = _FooterCell(w, line)
        self._pre_cost = time.perf_counter() - t

    def post(self, result=None) -> None:
        try:
            payload, ended = self.cells.post(result)
        except Exception as exc:  # noqa: BLE001
            _complain("watch footer failed", exc)
            return
        for other in ended:
            other.abandon()
        if payload is None:
            return      # an inner cell, or the cell that turned watching on
        line, payload.line = payload.line, None
        w, payload.watch = payload.watch, None
        newline = False
        if line is not None:
            newline = line.needs_newline()
            line.remove()
        if w is None:
            return
        t = time.perf_counter()
        try:
            error = getattr(result, "error_in_exec", None)
            count = getattr(result, "execution_count", None)
            r = w.stop(error=error, execution_count=count)
            # the exception keeps the failed cell's frames alive: drop it before an
            # automatic purge, which must find that memory unreferenced
            error = result = None
            if r is not None:
                if count is not None:
                    r.label = f"In [{count}]"
                self._thresholds(w, r)
                print(("\n" if newline else "") + r.footer())
                lines = _traced_lines(count)
                if lines:
                    print(lines)
        except Exception as exc:  # noqa: BLE001
            _complain("watch footer failed", exc)
        self.state.costs.append(self._pre_cost + time.perf_counter() - t)

    def abandon(self) -> None:
        for payload in self.cells.clear():
            payload.abandon()

    def _thresholds(self, w: Watch, r: WatchResult) -> None:
        magics = self.magics
        try:
            share = _parse_share(getattr(magics, "warn_at", None))
        except ValueError as exc:
            r.messages.append(f"warn_at ignored: {exc}")
            return
        if share is None:
            return
        full = [d for d in r.devices if d.share_after is not None and d.share_after >= share]
        if not full:
            return
        ids = [d.id for d in full]
        if not r.holders:
            w.name_holders(r, ids)
        worst = max(full, key=lambda d: d.share_after)
        used = worst.used_all_after if worst.used_all_after is not None else worst.reserved_after
        names = ", ".join(f"{h.name} {fmt_bytes(h.nbytes)}" + (" (hidden)" if h.hidden else "")
                          for h in r.holders[:5]) or "no name holds memory there"
        r.warning = (f"warning: {worst.id} is {worst.share_after:.0%} full ({fmt_bytes(used)} of "
                     f"{fmt_bytes(worst.total)}) after this cell, above {share:.0%}; "
                     f"purge candidates: {names}"
                     + (f" → {r.purge_command}" if r.purge_command else ""))
        if getattr(magics, "auto_purge_hidden", False):
            from .purge import purge

            removed: list[str] = []
            freed: dict[str, int | None] = {}
            for dev in ids:
                res = purge(shell=self.state.shell, device=dev,
                            time_limit=getattr(magics, "scan_time_limit", 3.0))
                removed += [n for n in res.removed if n not in removed]
                freed.update({k: v for k, v in res.freed.items() if k == dev})
            r.auto_purge = {"removed": removed, "freed": freed}


def _start_footer(state: _State) -> None:
    if state.footer is not None:
        return
    footer = _Footer(state)
    _monitor.hook_cells(state.shell, footer.pre, footer.post)
    state.footer = footer
    HUB.hold()
    if state.magics is not None:
        _seed(state, state.magics)


def _stop_footer(state: _State) -> None:
    footer, state.footer = state.footer, None
    if footer is None:
        return
    _monitor.unhook_cells(state.shell, footer.pre, footer.post)
    footer.abandon()
    HUB.release()


# -- magics ----------------------------------------------------------------------------------
def _watch_parser():
    from IPython.core.magic_arguments import MagicArgumentParser

    p = MagicArgumentParser(prog="%gpumem watch", add_help=False,
                            description="a one-line memory footer after every cell")
    p.add_argument("state", nargs="?", choices=["on", "off", "status"], default="status")
    p.add_argument("--warn-at", default=None, metavar="SHARE",
                   help="warn when a cell leaves a device above this share (80%% or 0.8; off)")
    p.add_argument("--auto-purge-hidden", dest="auto_purge", action="store_const", const=True,
                   default=None, help="past --warn-at, clear hidden holders and caches")
    p.add_argument("--no-auto-purge-hidden", dest="auto_purge", action="store_const", const=False)
    p.add_argument("--interval", type=float, default=None, metavar="S",
                   help="seconds between samples of the process's memory")
    p.add_argument("--device", default=None)
    return p


def magic_watch(magics, argv: list[str]) -> None:
    """``%gpumem watch on|off [--warn-at 80%] [--auto-purge-hidden] [--interval S] [--device D]``."""
    args = _watch_parser().parse_args(argv)
    interval = magics.interval(args.interval) if args.interval is not None else None
    state = _state_for_shell(magics.shell)
    state.magics = magics
    if args.warn_at is not None:
        try:
            share = _parse_share(args.warn_at)
        except ValueError as exc:
            raise UsageError(f"--warn-at: {exc}") from None
        magics.warn_at = None if share is None else f"{share:.0%}" if (share * 100).is_integer() \
            else share
    if args.auto_purge is not None:
        magics.auto_purge_hidden = args.auto_purge
    if interval is not None:
        magics.sample_interval = interval
    if args.device is not None:
        state.footer_device = magics.device(args.device)
    if args.state == "on":
        magics.watch = True
        _start_footer(state)
    elif args.state == "off":
        magics.watch = False
        _stop_footer(state)
    print(_status(magics, state))


def _seed(state: _State, magics) -> None:
    """Scan every holder once now, so the first watched cell's footer need not."""
    try:
        device = state.footer_device or magics.default_device
        ids = _devices.selected_ids(device)
        w = Watch(shell=state.shell, device=device, report=False, state=state, record=False,
                  time_limit=magics.scan_time_limit)
        w._update(_read_devices(_ordered(ids + ["cpu"])), force_full=not state.tracker.seeded)
    except Exception as exc:  # noqa: BLE001
        _complain("could not scan the holders", exc)


def _status(magics, state: _State) -> str:
    on = state.footer is not None
    try:
        share = _parse_share(magics.warn_at)
    except ValueError:
        share = None
    parts = [f"watch is {'on' if on else 'off'}"]
    if on:
        parts.append(f"device {state.footer_device or magics.default_device}")
        parts.append(f"warn at {share:.0%}" if share is not None else "no warning threshold")
        if share is not None:
            parts.append(f"auto-purge-hidden {'on' if magics.auto_purge_hidden else 'off'}")
        parts.append(f"sampling every {fmt_seconds(magics.sample_interval)}" if not HUB.failure
                     else f"sampling stopped ({HUB.failure}); it starts again with the next cell")
    parts.append(f"{len(state.history)} cell(s) in history")
    return " · ".join(parts)


def _gpuwatch_parser():
    from IPython.core.magic_arguments import MagicArgumentParser

    p = MagicArgumentParser(prog="%%gpuwatch", add_help=False,
                            description="run the cell and report what it did to memory")
    p.add_argument("-o", dest="output", default=None, metavar="NAME",
                   help="also store the result object in NAME")
    p.add_argument("--interval", type=float, default=None, metavar="S")
    p.add_argument("--plot", action="store_true", help="show the cell's memory over time")
    p.add_argument("--device", default=None)
    return p


_TOP_LEVEL_AWAIT = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)


def _is_coroutine(code) -> bool:
    return code is not None and bool(code.co_flags & inspect.CO_COROUTINE)


def _compile_cell(shell, cell: str, number: int):
    """The cell as IPython would run it: (statements, last expression or None).

    With IPython's autoawait on, top-level ``await`` compiles as IPython
    compiles it; such code objects are coroutine code (see :func:`_is_coroutine`).
    """
    __tracebackhide__ = True  # noqa: F841 - a SyntaxError shows the cell, not this frame
    transformed = shell.transform_cell(cell)
    tree = shell.compile.ast_parse(transformed)
    tree = shell.transform_ast(tree)
    name = shell.compile.cache(transformed, number, raw_code=cell)
    body, last = list(tree.body), None
    if body and isinstance(body[-1], ast.Expr):
        last = body.pop()
    flags = _TOP_LEVEL_AWAIT if getattr(shell, "autoawait", False) else 0
    extra = getattr(shell.compile, "extra_flags", None)
    with (extra(flags) if flags and extra is not None else contextlib.nullcontext()):
        statements = shell.compile(ast.Module(body, []), name, "exec")
        expression = shell.compile(ast.Expression(last.value), name, "eval") if last else None
    return statements, expression


def _run_compiled(shell, statements, expression):
    __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of tracebacks
    exec(statements, shell.user_global_ns, shell.user_ns)
    if expression is not None:
        return eval(expression, shell.user_global_ns, shell.user_ns)
    return None


async def _run_compiled_async(shell, statements, expression):
    """As IPython's ``run_code`` runs a cell with top-level ``await``."""
    __tracebackhide__ = True  # noqa: F841
    if _is_coroutine(statements):
        await eval(statements, shell.user_global_ns, shell.user_ns)
    else:
        exec(statements, shell.user_global_ns, shell.user_ns)
    if expression is None:
        return None
    value = eval(expression, shell.user_global_ns, shell.user_ns)
    if _is_coroutine(expression):
        value = await value
    return value


class _GpuwatchCell:
    """One ``%%gpuwatch`` cell: parsed, compiled and watched; it runs in between."""

    def __init__(self, magics, line: str, cell: str) -> None:
        __tracebackhide__ = True  # noqa: F841
        from .magics import split_line

        args = _gpuwatch_parser().parse_args(split_line(line))
        if args.output is not None and not args.output.isidentifier():
            raise UsageError(f"-o needs a variable name, not {args.output!r}")
        interval = magics.interval(args.interval) if args.interval is not None \
            else magics.sample_interval
        device = magics.device(args.device)
        shell = self.shell = magics.shell
        self.magics, self.args = magics, args
        self.number = _current_count(shell) or 0
        self.statements, self.expression = _compile_cell(shell, cell, self.number)
        self.awaits = _is_coroutine(self.statements) or _is_coroutine(self.expression)
        state = _state_for_shell(shell)
        state.magics = magics
        footer_open = state.footer is not None and state.footer.watch is not None
        self._state = state
        self._record = not footer_open
        self._device, self._interval = device, interval
        self.watch: Watch | None = None

    def start(self) -> None:
        try:
            self.watch = Watch(shell=self.shell, device=self._device, interval=self._interval,
                               label=f"In [{self.number}]", report=False,
                               time_limit=self.magics.scan_time_limit, source="%%gpuwatch",
                               state=self._state, record=self._record).start()
        except Exception as exc:  # noqa: BLE001 - run the cell unwatched rather than not at all
            _complain("%%gpuwatch could not start; the cell runs unwatched", exc)
            self.watch = None

    def failed(self, error: BaseException) -> None:
        _finish(self.magics, self.watch, self.args, self.number, error=error)

    def done(self, value: Any) -> Any:
        w, number = self.watch, self.number
        if w is not None and value is not None and not _quiet(self.shell):
            w.add_root(_scan.Root(f"Out[{number}]", value, hidden=True, kind="output",
                                  purge=f"Out[{number}]"))
        _finish(self.magics, w, self.args, number)
        return value

    def run(self) -> Any:
        __tracebackhide__ = True  # noqa: F841
        self.start()
        try:
            value = _run_compiled(self.shell, self.statements, self.expression)
        except BaseException as exc:
            self.failed(exc)
            raise
        return self.done(value)

    async def run_async(self) -> Any:
        __tracebackhide__ = True  # noqa: F841
        self.start()
        try:
            value = await _run_compiled_async(self.shell, self.statements, self.expression)
        except BaseException as exc:
            self.failed(exc)
            raise
        return self.done(value)


def cell_magic_gpuwatch(magics, line: str, cell: str) -> Any:
    """``%%gpuwatch [-o NAME] [--interval S] [--plot] [--device D]``: run the cell, report.

    Like ``%time``: the cell runs in the user's namespace, its last
    expression is the magic's value (shown as ``Out``), and an exception it
    raises propagates after the report. A cell with top-level ``await`` is
    turned by :func:`async_cells_transform` into an awaited call of
    :func:`cell_magic_gpuwatch_async`, so IPython runs it as any async cell;
    called some other way (``run_cell_magic``), this runs it with IPython's
    loop runner where no event loop is running already.
    """
    __tracebackhide__ = True  # noqa: F841
    run = _GpuwatchCell(magics, line, cell)
    if not run.awaits:
        return run.run()
    if _loop_running():
        raise UsageError("%%gpuwatch: this cell awaits, and an event loop already runs here; "
                         "run it as a cell of its own (IPython's autoawait runs it then)")
    return magics.shell.loop_runner(run.run_async())


async def cell_magic_gpuwatch_async(magics, line: str, cell: str) -> Any:
    """``%%gpuwatch`` over a cell with top-level ``await``; IPython awaits it."""
    __tracebackhide__ = True  # noqa: F841
    run = _GpuwatchCell(magics, line, cell)
    if run.awaits:
        return await run.run_async()
    return run.run()


def _loop_running() -> bool:
    try:
        import asyncio

        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _needs_await(shell, cell: str) -> bool:
    """Whether IPython would run ``cell`` as a coroutine (top-level ``await``)."""
    if not getattr(shell, "autoawait", False) or not _TOP_LEVEL_AWAIT:
        return False
    try:
        code = compile(shell.transform_cell(cell), "<gpuwatch>", "exec", flags=_TOP_LEVEL_AWAIT,
                       dont_inherit=True)
    except Exception:  # noqa: BLE001 - not valid code: the magic reports it as IPython would
        return False
    return _is_coroutine(code)


def async_cells_transform(shell):
    """An input transformer (``input_transformers_cleanup``) for ``%%gpuwatch`` cells that
    await: the cell becomes one awaited call, so IPython (and ipykernel, inside its own
    event loop) sees a cell with top-level ``await`` and runs it as it runs any such cell.
    Other cells pass unchanged; this never raises."""
    def gpuwatch_async_cells(lines: list[str]) -> list[str]:
        try:
            if not lines or not lines[0].startswith("%%gpuwatch"):
                return lines
            name, _, line = lines[0][2:].rstrip().partition(" ")
            body = "".join(lines[1:])
            if name != "gpuwatch" or not _needs_await(shell, body):
                return lines
            return ["await get_ipython().magics_manager.registry['GpuMemMagics']"
                    f".gpuwatch_async({line!r}, {body!r})\n"]
        except Exception:  # noqa: BLE001 - IPython's own path then reports what is wrong
            return lines

    gpuwatch_async_cells.__jupyter_gpumem__ = True
    # check_complete (the terminal's "is the cell finished?") leaves it out: a cell magic
    # there ends with a blank line, which this one-line rewrite would hide
    gpuwatch_async_cells.has_side_effects = True
    return gpuwatch_async_cells


def _quiet(shell) -> bool:
    try:
        return bool(shell.displayhook.quiet())
    except Exception:  # noqa: BLE001
        return False


def _finish(magics, w: Watch | None, args, number: int, error: BaseException | None = None) -> None:
    if w is None:
        return
    try:
        result = w.stop(error=error, execution_count=number)
        if result is None:
            return
        lines = _traced_lines(number)
        if lines:
            result.messages.append(lines)
        magics.show(result, False)
        if args.output:
            magics.shell.user_ns[args.output] = result
        if args.plot:
            from .watch_plot import show_figure

            show_figure([result], _state_for_shell(magics.shell).series.points(result.start - 0.5),
                        rich=_shows_images(magics.shell))
    except Exception as exc:  # noqa: BLE001
        _complain("%%gpuwatch report failed", exc)


def _traced_lines(count: int | None) -> str | None:
    """While ``%gpumem trace`` is on: the lines of cell ``count`` that allocated the most,
    and the line at its peak, in one line."""
    if count is None or not _trace.is_on():
        return None
    try:
        return _trace.cell_lines(count).text() or None
    except Exception as exc:  # noqa: BLE001 - the footer stands without it
        return f"allocation sites unknown: {type(exc).__name__}: {exc}"


def _history_parser():
    from IPython.core.magic_arguments import MagicArgumentParser

    p = MagicArgumentParser(prog="%gpumem history", add_help=False,
                            description="the per-cell records kept while watching")
    p.add_argument("--save", default=None, metavar="FILE", help="write CSV or JSON (by extension)")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="write per-cell scalars")
    p.add_argument("--last", type=int, default=None, metavar="N")
    p.add_argument("--clear", action="store_true", help="forget the records")
    p.add_argument("-o", dest="output", action="store_true", help="return the records")
    return p


def _last_records(state: "_State", last: int | None) -> list:
    """The per-cell records kept, or the last ``last`` of them (``--last N``)."""
    records = list(state.history)
    if last is None:
        return records
    if last < 1:
        raise UsageError("--last needs a positive number")
    return records[-last:]


def magic_history(magics, argv: list[str]) -> Any:
    """``%gpumem history [--save FILE] [--tensorboard DIR] [--last N] [--clear] [-o]``."""
    from . import watch_export

    args = _history_parser().parse_args(argv)
    state = _state_for_shell(magics.shell)
    records = _last_records(state, args.last)
    done = False
    if args.save:
        try:
            n = watch_export.save(records, args.save)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--save: {exc}") from None
        print(f"wrote {n} record(s) to {args.save}")
        done = True
    if args.tensorboard:
        try:
            n = watch_export.tensorboard(records, args.tensorboard)
        except (ImportError, OSError) as exc:
            raise UsageError(f"--tensorboard: {exc}") from None
        print(f"wrote {n} scalar(s) for {len(records)} cell(s) to {args.tensorboard}")
        done = True
    if args.clear:
        state.history.clear()
        print("history cleared")
        done = True
    table = watch_export.HistoryTable(records)
    if args.output:
        return magics.show(table, True) if not done else table
    if not done:
        magics.show(table, False)
    return None


def _plot_parser():
    from IPython.core.magic_arguments import MagicArgumentParser

    p = MagicArgumentParser(prog="%gpumem plot", add_help=False,
                            description="memory over time, cell boundaries marked")
    p.add_argument("--last", type=int, default=None, metavar="N")
    p.add_argument("--device", default=None)
    p.add_argument("--save", default=None, metavar="FILE")
    p.add_argument("-o", dest="output", action="store_true", help="return the Figure")
    return p


def magic_plot(magics, argv: list[str]) -> Any:
    """``%gpumem plot [--last N] [--device D] [--save FILE] [-o]``."""
    from .watch_plot import show_figure

    args = _plot_parser().parse_args(argv)
    state = _state_for_shell(magics.shell)
    records = _last_records(state, args.last)
    if not records:
        raise UsageError("nothing to plot yet: run `%gpumem watch on` or a `%%gpuwatch` cell first")
    devices = None
    if args.device is not None:
        devices = _devices.selected_ids(magics.device(args.device))
    points = state.series.points(records[0].start - 0.5)
    try:
        fig = show_figure(records, points, devices=devices, save=args.save,
                          rich=_shows_images(magics.shell))
    except ImportError as exc:
        raise UsageError(f"plotting needs matplotlib: {exc}") from None
    return fig if args.output else None


def _shows_images(shell: Any) -> bool:
    """Whether the frontend displays images: a kernel's does, a terminal's does not."""
    return getattr(shell, "kernel", None) is not None or type(shell).__name__ != "TerminalInteractiveShell"


# -- loading -----------------------------------------------------------------------------
def on_load(ip, magics) -> None:
    """Called by ``%load_ext``: start the footer if configured; register the cleanup."""
    state = _state_for_shell(ip)
    state.magics = magics

    def on_watch_trait(change) -> None:
        if change["new"]:
            _start_footer(state)
        else:
            _stop_footer(state)

    magics.observe(on_watch_trait, names="watch")
    state._observer = on_watch_trait
    if magics.watch:
        _start_footer(state)
    transforms = getattr(ip, "input_transformers_cleanup", None)
    transform = async_cells_transform(ip)
    if transforms is not None:
        transforms.append(transform)

    def cleanup() -> None:
        if transforms is not None and transform in transforms:
            transforms.remove(transform)
        _stop_footer(state)
        try:
            magics.unobserve(on_watch_trait, names="watch")
        except ValueError:
            pass
        _shell_states.pop(id(ip), None)
        uninstall_all()

    magics.add_cleanup(cleanup)


from ._callable import make_module_callable  # noqa: E402

make_module_callable(__name__, watch)   # `jupyter_gpumem.watch(...)` once this module shadows it
