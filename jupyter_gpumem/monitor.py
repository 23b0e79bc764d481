"""Background sampling of device counters (tqdm's monitor thread is the model).

A :class:`Sampler` is a daemon thread that calls a function every
``interval`` seconds until stopped; it stops at once (it waits on an
Event) and is joined on :meth:`Sampler.stop`. Sampling threads read device
counters only: they never touch the user's namespace, print or display.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable


class Sampler(threading.Thread):
    """Call ``fn()`` every ``interval`` seconds in a daemon thread.

    :meth:`pause` lets the thread wait, idle, until :meth:`resume` (starting a
    thread costs milliseconds on a busy machine, so a watch keeps one paused
    between cells instead of starting a new one each time).
    """

    def __init__(self, fn: Callable[[], object], interval: float, name: str = "jupyter_gpumem-sampler"):
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.interval = max(float(interval), 0.001)
        self._stop_event = threading.Event()
        self._active = threading.Event()
        self._active.set()
        self.errors = 0
        self.last_error: str | None = None

    def run(self) -> None:
        while not self._stop_event.is_set():
            if not self._active.is_set():
                self._active.wait()
                continue
            try:
                self.fn()
            except Exception as exc:  # noqa: BLE001 - a sampler must never die noisily
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._stop_event.wait(self.interval)

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
