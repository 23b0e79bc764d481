"""Background sampling of device counters (tqdm's monitor thread is the model).

A :class:`Sampler` is a daemon thread that calls a function every
``interval`` seconds until stopped; it stops at once (it waits on an
Event) and is joined on :meth:`Sampler.stop`. Sampling threads read device
counters only: they never touch the user's namespace, print or display, and
they never end with a traceback: a failure is kept in :attr:`Sampler.failure`
and handed to ``on_failure``.

:func:`check_interval` is the one check of a sampling interval that every
option and setting taking one goes through.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable

MIN_INTERVAL = 0.001   # seconds; below this a sampler only burns a core
MAX_INTERVAL = 3600.0  # seconds; above this a timeline has nothing to show


def check_interval(value: object, what: str = "the interval", minimum: float = MIN_INTERVAL,
                   maximum: float = MAX_INTERVAL) -> float:
    """``value`` as seconds, finite and within ``[minimum, maximum]``; ValueError otherwise."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or not minimum <= seconds <= maximum:
        raise ValueError(f"{what} needs a number of seconds from {minimum:g} to {maximum:g}, "
                         f"not {value!r}")
    return seconds


def _bounded(seconds: object) -> float:
    """What a sampler waits: any value is brought into the range (Event.wait(inf) raises)."""
    try:
        value = float(seconds)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return MAX_INTERVAL
    if math.isnan(value):
        return MAX_INTERVAL
    return min(max(value, MIN_INTERVAL), MAX_INTERVAL)


class Sampler(threading.Thread):
    """Call ``fn()`` every ``interval`` seconds in a daemon thread.

    :meth:`pause` lets the thread wait, idle, until :meth:`resume` (starting a
    thread costs milliseconds on a busy machine, so a watch keeps one paused
    between cells instead of starting a new one each time).
    """

    def __init__(self, fn: Callable[[], object], interval: float,
                 name: str = "jupyter_gpumem-sampler",
                 on_failure: Callable[[str], object] | None = None):
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.interval = interval
        self.on_failure = on_failure
        self._stop_event = threading.Event()
        self._active = threading.Event()
        self._active.set()
        self.errors = 0
        self.last_error: str | None = None
        #: why the thread ended on its own (``"Type: message"``), None while it runs or after stop()
        self.failure: str | None = None

    @property
    def interval(self) -> float:
        """Seconds between two calls; whatever is set is brought into [1 ms, 1 h]."""
        return self._interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        self._interval = _bounded(seconds)

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - a thread's traceback lands in a cell
            self.failure = f"{type(exc).__name__}: {exc}"
            self._stop_event.set()
            handler = self.on_failure
            if handler is not None:
                try:
                    handler(self.failure)
                except BaseException:  # noqa: BLE001
                    pass

    def _loop(self) -> None:
        while not self._stop_event.is_set():
            if not self._active.is_set():
                self._active.wait()
                continue
            try:
                self.fn()
            except Exception as exc:  # noqa: BLE001 - a sampler must never die noisily
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._stop_event.wait(self._interval)

    def pause(self) -> None:
        """Stop sampling until :meth:`resume`; the thread stays."""
        self._active.clear()

    def resume(self) -> None:
        self._active.set()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop now and wait for the thread to end."""
        self._stop_event.set()
        self._active.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop_event.is_set()


class Series:
    """A bounded, thread-safe time series: ``(time, {device: {field: bytes}})``."""

    def __init__(self, maxlen: int = 3600):
        self._points: deque = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def append(self, t: float, values: dict) -> None:
        with self._lock:
            self._points.append((t, values))

    def points(self, since: float | None = None) -> list:
        with self._lock:
            pts = list(self._points)
        return pts if since is None else [p for p in pts if p[0] >= since]

    def __len__(self) -> int:
        return len(self._points)


def device_point(usages) -> dict:
    """The per-device figures a timeline keeps, from ``read_devices()``."""
    return {d.id: {"allocated": d.allocated, "reserved": d.reserved,
                   "used_process": d.used_process, "total": d.total} for d in usages}


def now() -> float:
    return time.time()
