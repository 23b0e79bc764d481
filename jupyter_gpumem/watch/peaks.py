"""Exact peaks for nested watch scopes, read from counters that keep one high-water mark.

The :class:`PeakLedger` folds each counter's peak into every open scope before any reset
(a scope's or the user's, through wrappers), and lifts what the user's own reading
functions return to what they would have shown had no scope reset the counter: no
reading anyone makes is lowered by a scope. Counters: each framework's (a backend's
``peak_counters`` and ``peak_patches``), ``rss`` and ``tracemalloc``. How resets are
folded, detected and patched: docs/ARCHITECTURE.md#exact-peaks.
"""
from __future__ import annotations

import os
import sys
import threading
import tracemalloc
from typing import Any, Callable

from ..backends import REGISTRY, active_backends
from ..backends.base import PeakCounter as Counter
from ..backends.base import PeakLedgerView, Reading
from ..core.devices import process_memory, write_proc

try:
    import resource   # POSIX only; the rss counter and its patch need it
except ImportError:  # pragma: no cover - Windows
    resource = None

Peaks = dict  # field -> peak bytes

_TRACEMALLOC_ORIG = {"get_traced_memory": tracemalloc.get_traced_memory,
                     "reset_peak": getattr(tracemalloc, "reset_peak", None)}


class RssCounter(Counter):
    """This process's peak resident set (``VmHWM``); Linux only."""

    family = "rss"
    key = ("rss", "cpu")
    device = "cpu"
    exact_label = "process peak RSS (VmHWM), exact"
    _works: bool | None = None

    @classmethod
    def available(cls) -> bool:
        if cls._works is None:
            cls._works = False
            if sys.platform.startswith("linux"):
                cls._works = read_rss() is not None and os.access("/proc/self/clear_refs", os.W_OK)
        return cls._works

    def read(self) -> Reading | None:
        return read_rss()

    def reset(self) -> None:
        write_proc("/proc/self/clear_refs", b"5")


class TracemallocCounter(Counter):
    """The Python heap as tracemalloc counts it; only while tracing is on."""

    family = "tracemalloc"
    key = ("tracemalloc", "cpu")
    device = "cpu"
    exact_label = "Python heap (tracemalloc), exact"

    def read(self) -> Reading | None:
        if not tracemalloc.is_tracing():
            return None
        current, peak = _TRACEMALLOC_ORIG["get_traced_memory"]()
        return {"traced": (current, peak)}

    def reset(self) -> None:
        if _TRACEMALLOC_ORIG["reset_peak"] is not None:
            _TRACEMALLOC_ORIG["reset_peak"]()


def read_rss() -> Reading | None:
    """``{"rss": (VmRSS, VmHWM)}`` in bytes (:func:`~..core.devices.process_memory`)."""
    rss, hwm = process_memory()
    if rss is None or hwm is None:
        return None
    return {"rss": (rss, hwm)}


def counters_for(device_ids) -> list[Counter]:
    """The counters available now for these device ids: the host's, and each active
    framework's (which never creates a device context to get one)."""
    ids = list(device_ids)
    out: list[Counter] = []
    accelerators = [d for d in ids if d != "cpu"]
    for backend in active_backends() if accelerators else ():
        try:
            out += backend.peak_counters(accelerators)
        except Exception:  # noqa: BLE001 - no exact peak from that framework then
            pass
    if "cpu" in ids:
        if RssCounter.available():
            out.append(RssCounter())
        if tracemalloc.is_tracing():
            out.append(TracemallocCounter())
    return out


class PeakScope:
    """The peaks one scope saw: ``peaks[counter key][field]``, exact once closed."""

    def __init__(self) -> None:
        self.peaks: dict[tuple, Peaks] = {}
        self.start: dict[tuple, dict[str, int]] = {}
        self.labels: dict[tuple, str] = {}
        self.notes: list[str] = []
        self.closed = False
        #: each counter's reading at the close (what a scope right after may start from)
        self.end: dict[tuple, Reading] = {}

    def fold(self, key: tuple, peaks: Peaks) -> None:
        mine = self.peaks.setdefault(key, {})
        for field, value in peaks.items():
            if value > mine.get(field, -1):
                mine[field] = value

    def peak(self, key: tuple, field: str) -> int | None:
        return self.peaks.get(key, {}).get(field)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _peaks(reading: Reading) -> Peaks:
    return {f: p for f, (_, p) in reading.items()}


class PeakLedger(PeakLedgerView):
    """Open scopes, the user view and the last peaks seen, per counter."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._open: list[PeakScope] = []
        self._base: dict[tuple, Peaks] = {}
        self._last: dict[tuple, Peaks | None] = {}
        self._holds = 0

    # -- scopes ------------------------------------------------------------------------
    def open(self, device_ids, readings: dict | None = None) -> PeakScope:
        """Start a scope on every counter available for ``device_ids``. ``readings``: the
        counters as the last scope's close read them (:attr:`PeakScope.end`), where this
        scope starts from that close (cells run back to back): a counter whose peak was
        its current value then starts from it unread (nothing to reset); the others are
        read now."""
        scope = PeakScope()
        with self._lock:
            for counter in counters_for(device_ids):
                given = readings.get(counter.key) if readings else None
                if given is not None and all(p <= c for c, p in given.values()):
                    current = {f: c for f, (c, _) in given.items()}
                    scope.start[counter.key] = current
                    scope.labels[counter.key] = counter.exact_label
                    scope.fold(counter.key, current)
                    continue
                reading = counter.read()
                if reading is None:
                    continue
                peaks = self._observe(counter.key, reading)
                for s in self._open:
                    s.fold(counter.key, peaks)
                current = {f: c for f, (c, _) in reading.items()}
                if any(p > current[f] for f, p in peaks.items()):
                    self._fold_base(counter.key, peaks)
                    _PATCHES.install(counter.family)
                    try:
                        counter.reset()
                    except Exception:  # noqa: BLE001 - no exact peak from this counter then
                        continue
                    after = counter.read()   # the mark as the reset left it
                    self._last[counter.key] = _peaks(after) if after is not None else None
                scope.start[counter.key] = current
                scope.labels[counter.key] = counter.exact_label
                scope.fold(counter.key, current)
            self._open.append(scope)
            for family in {k[0] for k in scope.start}:
                _PATCHES.install(family)
        return scope

    def close(self, scope: PeakScope, device_ids=()) -> PeakScope:
        """End ``scope``: its peaks are final. Counters born inside it count too."""
        with self._lock:
            if scope.closed:
                return scope
            # only a framework's allocator begins lazily: the host's counters are not asked
            for counter in counters_for([d for d in device_ids if d != "cpu"]):
                if counter.key in scope.start:
                    continue
                if not counter.born_lazily:
                    continue
                # the allocator began inside the scope, so inside every open scope
                for s in self._open + [scope]:
                    s.start.setdefault(counter.key, {})
                    s.labels.setdefault(counter.key, counter.exact_label)
                _PATCHES.install(counter.family)
            for key in list(scope.start):
                reading = self._fold_now(key, also=scope)
                if reading is not None:
                    scope.end[key] = reading
            scope.closed = True
            if scope in self._open:
                self._open.remove(scope)
            if not self._open:
                self._drop_redundant_base()
                if not self._holds:
                    _PATCHES.uninstall_unneeded(self._needed_families())
        return scope

    def hold(self) -> None:
        """Keep the patches between scopes (the ``watch on`` footer opens one a cell:
        putting them in and taking them out each time costs the cell)."""
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        with self._lock:
            self._holds = max(self._holds - 1, 0)
            if not self._holds and not self._open:
                _PATCHES.uninstall_unneeded(self._needed_families())

    def tick(self) -> None:
        """Fold every open counter's peak into the open scopes (the sampler calls this).

        So a reset that bypasses the wrappers loses at most what came since the
        last tick, and is noticed when the peak drops below what a tick saw.
        """
        with self._lock:
            for key in {k for s in self._open for k in s.start}:
                self._fold_now(key)

    # -- the user's own resets and reads -------------------------------------------------
    def before_user_reset(self, key: tuple) -> None:
        """Fold the peak the user is about to reset into every open scope."""
        with self._lock:
            self._fold_now(key)
            self._base.pop(key, None)
            self._last[key] = None  # the reset lowers the peak: that is not a foreign reset

    def user_peaks(self, key: tuple, reading: Reading) -> Peaks:
        """Peaks a user reading should show: the real ones, lifted by what scopes reset."""
        with self._lock:
            peaks = self._observe(key, reading)
            base = self._base.get(key)
            if not base:
                return peaks
            return {f: max(p, base.get(f, 0)) for f, p in peaks.items()}

    def has_base(self, key: tuple) -> bool:
        with self._lock:
            return bool(self._base.get(key))

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    # -- internals ---------------------------------------------------------------------
    def _fold_now(self, key: tuple, also: PeakScope | None = None) -> Reading | None:
        """Read the counter of ``key`` and fold its peaks into every open scope that
        watches it (and into ``also``); the reading."""
        counter = counter_for(key)
        reading = counter.read() if counter is not None else None
        if reading is None:
            return None
        peaks = self._observe(key, reading)
        for s in self._open:
            if key in s.start or s is also:
                s.fold(key, peaks)
        return reading

    def _observe(self, key: tuple, reading: Reading) -> Peaks:
        """Peaks of ``reading``; notice a reset done behind the ledger's back."""
        peaks = _peaks(reading)
        last = self._last.get(key)
        slack = _DROP_SLACK.get(key[0], 0)
        if last is not None and any(peaks.get(f, 0) < v - slack for f, v in last.items()):
            self._base.pop(key, None)
            for s in self._open:
                if key in s.start:
                    s.note("the peak counter was reset by code that bypassed jupyter_gpumem: "
                           "the peak covers only the time since that reset")
        self._last[key] = peaks
        return peaks

    def _fold_base(self, key: tuple, peaks: Peaks) -> None:
        base = self._base.setdefault(key, {})
        for f, v in peaks.items():
            if v > base.get(f, -1):
                base[f] = v

    def _drop_redundant_base(self) -> None:
        for key in list(self._base):
            last = self._last.get(key) or {}
            if all(last.get(f, -1) >= v for f, v in self._base[key].items()):
                del self._base[key]

    def _needed_families(self) -> set[str]:
        return {k[0] for k, v in self._base.items() if v}


# VmHWM shows max(mark, current RSS) and the kernel updates the mark lazily, so it can
# dip a little below a value read earlier without anyone resetting it.
_DROP_SLACK = {"rss": 16 << 20}


def counter_for(key: tuple) -> Counter | None:
    family = key[0]
    if family == "rss":
        return RssCounter()
    if family == "tracemalloc":
        return TracemallocCounter()
    for backend in REGISTRY.backends:
        if backend.name == family:
            return backend.peak_counter(key)
    return None


#: per process: the counters it keeps right (an allocator's peak per device, the
#: process's peak resident set, tracemalloc's peak) are the process's, whichever shell
#: or script opens the scopes
LEDGER = PeakLedger()


# -- patches: the user's reset and read functions ------------------------------------------
class _Patches:
    """Module attributes replaced while needed, restored only if still ours."""

    def __init__(self) -> None:
        self._installed: dict[str, list[tuple[Any, str, Any, Any]]] = {}
        self._originals: dict[tuple[str, str], Any] = {}
        self._lock = threading.RLock()

    def install(self, family: str) -> None:
        if family in self._installed:
            return      # every scope asks: most find them in place (read without the lock)
        with self._lock:
            if family in self._installed:
                return
            done: list[tuple[Any, str, Any, Any]] = []
            for module_name, attr, make in _wrappers(family):
                module = sys.modules.get(module_name)
                if module is None or not hasattr(module, attr):
                    continue
                original = self._originals.setdefault((module_name, attr), getattr(module, attr))
                wrapper = make(original)
                wrapper.__wrapped__ = original
                wrapper.__jupyter_gpumem__ = True
                setattr(module, attr, wrapper)
                done.append((module, attr, original, wrapper))
            self._installed[family] = done

    def uninstall_unneeded(self, needed: set[str]) -> None:
        with self._lock:
            for family in [f for f in self._installed if f not in needed]:
                for module, attr, original, wrapper in self._installed.pop(family):
                    if getattr(module, attr, None) is wrapper:
                        setattr(module, attr, original)

    def installed(self) -> set[str]:
        with self._lock:
            return set(self._installed)


#: per process: the functions it wraps are the frameworks' module-level ones
_PATCHES = _Patches()


def uninstall_all() -> None:
    """Remove every patch (extension unload); the user view is then the real counters."""
    with LEDGER._lock:
        if LEDGER.open_count() == 0:
            LEDGER._base.clear()
            _PATCHES.uninstall_unneeded(set())


def _wrap_traced(original: Callable) -> Callable:
    def get_traced_memory():
        current, peak = original()
        try:
            peak = LEDGER.user_peaks(TracemallocCounter.key, {"traced": (current, peak)})["traced"]
        except Exception:  # noqa: BLE001
            pass
        return current, peak
    get_traced_memory.__doc__ = original.__doc__
    return get_traced_memory


def _wrap_tracemalloc_reset(original: Callable) -> Callable:
    def reset_peak():
        try:
            LEDGER.before_user_reset(TracemallocCounter.key)
        except Exception:  # noqa: BLE001
            pass
        return original()
    reset_peak.__doc__ = original.__doc__
    return reset_peak


def _wrap_getrusage(original: Callable) -> Callable:
    def getrusage(who):
        usage = original(who)
        try:
            if who == resource.RUSAGE_SELF and LEDGER.has_base(RssCounter.key):
                reading = read_rss()
                if reading is not None:
                    hwm_kib = LEDGER.user_peaks(RssCounter.key, reading)["rss"] // 1024
                    if hwm_kib > usage.ru_maxrss:
                        values = list(usage)
                        values[2] = hwm_kib
                        usage = resource.struct_rusage(values)
        except Exception:  # noqa: BLE001
            pass
        return usage
    getrusage.__doc__ = original.__doc__
    return getrusage


_HOST_WRAPPERS: dict[str, list[tuple[str, str, Callable[[Callable], Callable]]]] = {
    "tracemalloc": [
        ("tracemalloc", "get_traced_memory", _wrap_traced),
        ("tracemalloc", "reset_peak", _wrap_tracemalloc_reset),
    ],
    "rss": [("resource", "getrusage", _wrap_getrusage)],
}


def _wrappers(family: str) -> list[tuple[str, str, Callable[[Callable], Callable]]]:
    """The functions to patch for a family of counters: the host's, or a backend's."""
    if family in _HOST_WRAPPERS:
        return _HOST_WRAPPERS[family]
    for backend in REGISTRY.backends:
        if backend.name == family:
            return backend.peak_patches(LEDGER)
    return []
