"""``%%gpuwatch``, ``%gpumem watch|history|plot`` and ``jupyter_gpumem.watch()``.

What a cell (or a block of a script) did to memory, per device: wall time, the change
in allocated and reserved bytes, the exact peak (:mod:`.peaks`), the sampled process
peak (:mod:`.sampling`) and the names it created, grew, shrank or deleted
(:mod:`.holders`); on an error, out-of-memory included, the report still comes and
names the biggest holders with their purge command. Its face: :class:`Watch`,
:func:`watch`, :func:`purge_names`, and, from :mod:`.state`, :func:`history_for` and
:func:`series_for`. The pieces: docs/ARCHITECTURE.md#a-watch-and-its-record; the JSON
of one record: docs/PROTOCOL.md#watchresult-schema-jupyter_gpumemwatch1.
"""
from __future__ import annotations

import time
from typing import Any

from ..core import devices as _devices
from ..core import sampler as _sampler
from ..core import scan as _scan
from ..core.rescue.oom import is_oom
from ..core.scan.hidden import traceback_root
from ..core.scan import Root
from ..settings import check_device, check_time_limit
from ..units import complain
from . import sampling as _sampling
from .frames import caller_frame, cell_label, running_shell, show
from .holders import HolderTracker, RootInfo
from .peaks import LEDGER, PeakScope, counter_for
from .result import DeviceWatch, HolderChange, HolderEntry, WatchResult, allocator_measure
from .sampling import Sampling, ordered
from .state import WatchState, history_for, series_for, state_for

__all__ = ["Watch", "watch", "purge_names", "history_for", "series_for"]

EXACT_BUDGET = 0.01     # share of a cell's wall time a full holder scan may take
_HOLDERS_SHOWN = 12


def _marks(usages: dict[str, _devices.DeviceUsage]) -> dict[str, int]:
    out = {}
    for dev, du in usages.items():
        value = du.used_process if dev == "cpu" else du.allocated
        if value is not None:
            out[dev] = value
    return out


# -- the watch itself ------------------------------------------------------------------------
def _is_oom(exc: BaseException) -> bool:
    """Python's MemoryError, an "out of memory" message, or a framework's own error: the
    one rule, :func:`jupyter_gpumem.core.rescue.oom.is_oom`."""
    return is_oom(exc)


def _error_info(exc: BaseException) -> dict:
    try:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    except Exception:  # noqa: BLE001
        message = ""
    if len(message) > 300:
        message = message[:297] + "..."
    return {"type": type(exc).__name__, "message": message, "oom": _is_oom(exc)}


class Watch:
    """Watch a block of code: ``with Watch(...) as w: ...`` then ``w.result``.

    Use :func:`watch` to make one; ``%%gpuwatch`` and the ``watch on``
    footer are thin wrappers over it.
    """

    def __init__(self, *, shell: Any = None, namespace: dict | None = None, device: str = "auto",
                 interval: float = 0.05, label: str | None = None, report: bool = True,
                 time_limit: float = 3.0, exact_budget: float = EXACT_BUDGET,
                 source: str = "watch()", state: WatchState | None = None, record: bool = True,
                 frame: Any = None) -> None:
        self.shell = shell
        self.namespace = namespace
        self.device = _devices.parse_device(device)
        self.interval = _sampler.check_interval(interval, "interval")
        self.label = label
        self.report = report
        self.time_limit = time_limit
        self.exact_budget = exact_budget
        self.source = source
        self.record = record
        self.result: WatchResult | None = None
        self._frame = frame
        if state is None:
            # a shell's: its session's; outside a session the watch keeps its own
            state = state_for(shell) if shell is not None else WatchState(
                namespace=namespace if namespace is not None else {})
        self._state = state
        self._started = False
        self._extra_roots: list[Root] = []
        #: ``(device ids selected, readings, the timeline's point of them, the peak
        #: counters' readings)`` at :meth:`stop` (None before): what a next watch's
        #: :meth:`start` may take as its own (``armed``)
        self.end: tuple | None = None

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> "Watch":
        try:
            self.start()
        except Exception as failure:  # noqa: BLE001 - the block runs unwatched instead
            self.abandon()
            complain("watch could not start; the block runs unwatched", failure)
        return self

    def __exit__(self, etype, exc, tb) -> bool:
        try:
            self.stop(error=exc)
            if self.report and self.result is not None:
                show(self.result)
        except Exception as failure:  # noqa: BLE001 - never raise into the user's code
            complain("watch failed", failure)
        return False

    # -- namespace -------------------------------------------------------------------------
    def _ns(self) -> dict | None:
        if self.shell is not None:
            return None
        if self._frame is not None:
            return self._frame.f_locals
        return self.namespace if self.namespace is not None else self._state.namespace

    def _roots(self, error: BaseException | None = None) -> list[Root]:
        roots = _scan.collect_roots(self._ns(), self.shell)
        extra = list(self._extra_roots)
        if error is not None:
            if self.shell is not None:
                roots = [r for r in roots if r.kind != "traceback"]
                extra.append(traceback_root((error,)))
            else:
                extra.append(Root("raised exception", (error,), hidden=True, kind="exception"))
        taken = {r.name for r in extra}
        return [r for r in roots if r.name not in taken] + extra

    def _update(self, usages, error: BaseException | None = None, **kwargs):
        state = self._state
        roots = self._roots(error)
        upd = state.tracker.update(roots, shell=self.shell, namespace=self._ns(),
                                   marks=_marks(usages), time_limit=self.time_limit,
                                   extra_stop=lambda: state.internal_ids() | {id(self)},
                                   **kwargs)
        # a watch of a function's locals, or one that ended in an error (its frames are
        # dropped after), leaves nothing a next watch may start from as it is
        state.fresh = self._frame is None and error is None
        return upd

    # -- start / stop ---------------------------------------------------------------------
    def start(self, armed: tuple | None = None) -> "Watch":
        """Measure from now on. ``armed``: the previous watch's :attr:`end` (device ids,
        readings, their timeline point, the peak counters' readings) where that end is
        recent enough to stand for this start (the ``watch on`` footer, cells run back to
        back): the readings and the tracker's holders are taken as they are, unread and
        unchecked, and the peak counters whose peak was their current value then start
        from it."""
        t = time.perf_counter()
        self._ids0 = _devices.selected_ids(self.device)
        state = self._state
        self._messages = []
        point = readings = None
        if armed is not None and armed[0] == self._ids0 and state.tracker.seeded \
                and state.fresh:
            usages, point, readings = armed[1:]
        else:
            # what changed since the last watch (between cells: a widget's callback, say)
            # is the tracker's before this code runs, not this code's doing
            usages = _sampling.read_devices(ordered(self._ids0 + ["cpu"]))
            if self._update(usages).partial:
                self._messages.append("holders: partial scan before the code ran")
        self._tracked0 = dict(self._state.tracker.totals)
        self._roots0 = dict(self._state.tracker.roots)   # RootInfos are replaced, never changed
        self._version0 = self._state.tracker.version
        self._usages0 = usages
        self._scope: PeakScope = LEDGER.open(self._ids0, readings)
        try:
            self._sampling = Sampling(self._ids0, self._state.series, self.interval)
            self._state.hub.add(self._sampling, usages, point)
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
                self._state.hub.remove(sampling)
        finally:
            if scope is not None:
                LEDGER.close(scope)

    def scan_holders(self, force_full: bool = False) -> None:
        """Bring the holders' tracker up to date now, outside any watched code (the footer
        scans every holder once as it starts, so that its first cell need not)."""
        ids = _devices.selected_ids(self.device)
        self._update(_sampling.read_devices(ordered(ids + ["cpu"])), force_full=force_full)

    def add_root(self, root: Root) -> None:
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
        now_ids = _devices.selected_ids(self.device)
        ids = ordered(self._ids0 + now_ids)
        usages = _sampling.read_devices(ordered(ids + ["cpu"]))
        point = self._state.hub.remove(self._sampling, usages)
        LEDGER.close(self._scope, ids)
        self.end = (now_ids, usages, point, self._scope.end)
        upd = self._update(usages, error=error, force_full=error is not None,
                           full_budget=self.exact_budget * wall)
        self._frame = None
        self._extra_roots = []
        tracker = self._state.tracker
        # no root replaced since the start (most cells): nothing to diff
        changes = (self._changes(tracker.diff(self._roots0), ids)
                   if tracker.version != self._version0 else [])
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
        result.holders_total = len(infos)
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
            key = next((k for k in scope.start if k[1] == dev), ("", dev))
            counter = counter_for(key)
            born_inside = key in scope.start and not scope.start[key]
            d.allocated_before = 0 if born_inside else getattr(u0, "allocated", None)
            d.allocated_after = getattr(u1, "allocated", None)
            d.reserved_before = 0 if born_inside else getattr(u0, "reserved", None)
            d.reserved_after = getattr(u1, "reserved", None)
            d.allocated_measure = allocator_measure(u1 or u0)
            if counter is not None and counter.allocated_field:
                d.peak_allocated = scope.peak(key, counter.allocated_field)
            if counter is not None and counter.reserved_field:
                d.peak_reserved = scope.peak(key, counter.reserved_field)
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
    device = check_device(device)          # as the magics check --device
    time_limit = check_time_limit(time_limit)
    frame = None
    if shell is None and namespace is None:
        caller = caller_frame()
        ip = running_shell()
        if ip is not None and caller is not None and caller.f_globals is ip.user_ns:
            shell = ip
        elif caller is not None:
            if caller.f_locals is caller.f_globals:
                namespace = caller.f_globals
            else:
                frame = caller
    return Watch(shell=shell, namespace=namespace, device=device, interval=interval,
                 label=label or ("block" if shell is None else f"block in {cell_label(shell)}"),
                 report=report, time_limit=time_limit, frame=frame,
                 record=shell is None)   # a shell's history is per cell, not per block
