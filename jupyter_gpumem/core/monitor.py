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
import sys
import threading
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
                # whoever resumed it has just read the counters: the first sample comes
                # one interval later, so a cell shorter than that never shares the GIL
                # with this thread
                self._stop_event.wait(self._interval)
                continue
            try:
                self.fn()
            except Exception:  # noqa: BLE001 - a sampler must never die noisily
                self.errors += 1
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


# -- pairing IPython's cell events ---------------------------------------------------------------
class Cell:
    """One cell seen by :class:`CellEvents`; ``payload`` is what its user keeps for it."""

    __slots__ = ("info", "frame", "thread", "outer", "payload")

    def __init__(self, info: object, frame: int | None, outer: bool) -> None:
        self.info = info
        self.frame = frame      # id() of the run_cell_async frame that announced it (not the frame)
        self.thread = threading.get_ident()
        self.outer = outer      # no other cell of ours was running when it began
        self.payload: object = None

    def gone(self, frames: set[int]) -> bool:
        """Its announcing frame is not among ``frames`` (of this thread's stack)."""
        return (self.frame is not None and self.thread == threading.get_ident()
                and self.frame not in frames)


_RUN_CELL_ASYNC: list = []


def _run_cell_async_code():
    """The code of IPython's ``InteractiveShell.run_cell_async``, once a shell's IPython is
    imported (the core never imports it); None before, and where it cannot be read
    (then cells pair by their ExecutionInfo only)."""
    if not _RUN_CELL_ASYNC:
        module = sys.modules.get("IPython.core.interactiveshell")
        if module is None:
            return None
        try:
            _RUN_CELL_ASYNC.append(module.InteractiveShell.run_cell_async.__code__)
        except Exception:  # noqa: BLE001
            _RUN_CELL_ASYNC.append(None)
    return _RUN_CELL_ASYNC[0]


def _running_cell_frames() -> list[int]:
    """ids of the frames of IPython's ``run_cell_async`` on this stack, innermost first."""
    code = _run_cell_async_code()
    if code is None:
        return []
    ids = []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            ids.append(id(frame))
        frame = frame.f_back
    del frame
    return ids


def hook_cells(shell: object, pre: Callable, post: Callable) -> None:
    """Register ``pre`` and ``post`` for IPython's ``pre_run_cell`` / ``post_run_cell``."""
    events = getattr(shell, "events", None)
    if events is not None:
        events.register("pre_run_cell", pre)
        events.register("post_run_cell", post)


def unhook_cells(shell: object, pre: Callable, post: Callable) -> None:
    """Undo :func:`hook_cells` (what is not registered is left alone)."""
    events = getattr(shell, "events", None)
    if events is None:
        return
    for name, fn in (("pre_run_cell", pre), ("post_run_cell", post)):
        try:
            events.unregister(name, fn)
        except ValueError:
            pass


class CellEvents:
    """Pairs ``pre_run_cell`` with ``post_run_cell``, which IPython does not do.

    IPython fires "pre" without "post" for a cell run by awaiting
    ``run_cell_async`` (IPython's own tests do that at the top level; a cell
    can do it inside a cell) and "post" without "pre" for an empty cell run
    with ``run_cell('')``; ipykernel fires "post" with no result when an async
    cell is interrupted. So a "post" ends the cell whose ``ExecutionInfo`` it
    carries (``result.info is info``), and a cell whose "post" never came is
    dropped as soon as it is known to have ended: it was the last cell
    IPython finished (``shell.last_execution_result``), or the frame of
    ``run_cell_async`` that announced it is no longer on the stack of a later
    cell. A cell that begins while one of ours runs is nested (``outer`` is
    False): its enclosing cell counts for both. Main thread only.
    """

    def __init__(self, shell: object) -> None:
        self.shell = shell
        self._open: list[Cell] = []

    def running(self) -> bool:
        """True while an outer cell is open."""
        return any(c.outer for c in self._open)

    def outer_payload(self) -> object:
        for c in self._open:
            if c.outer:
                return c.payload
        return None

    def pre(self, info: object) -> tuple[Cell, list]:
        """A cell begins: (its :class:`Cell`, payloads of cells found to have ended unseen)."""
        frames = _running_cell_frames()
        current = frames[0] if frames else None
        enclosing = set(frames[1:])
        last = getattr(getattr(self.shell, "last_execution_result", None), "info", None)
        keep, ended = [], []
        for c in self._open:
            gone = ((last is not None and c.info is last)
                    or (current is not None and c.gone(enclosing)))
            (ended if gone else keep).append(c)
        if not any(c.outer for c in keep):
            ended += keep       # nested cells of an outer cell that ended: nothing to keep
            keep = []
        cell = Cell(info, current, outer=not keep)
        keep.append(cell)
        self._open = keep
        return cell, [c.payload for c in ended if c.payload is not None]

    def post(self, result: object) -> tuple[object, list]:
        """A cell ended: (payload of the cell it ends or None, payloads of cells ended with it)."""
        info = getattr(result, "info", None)
        index = None
        if info is not None:
            for i in range(len(self._open) - 1, -1, -1):
                if self._open[i].info is info:
                    index = i
                    break
        elif self._open:
            # no result to pair with: the outermost of our cells whose frame is gone ended
            live = set(_running_cell_frames())
            for i, c in enumerate(self._open):
                if c.gone(live):
                    index = i
                    break
        if index is None:
            return None, []     # a "post" without its "pre": nothing of ours ended
        cell, rest = self._open[index], self._open[index + 1:]
        del self._open[index:]
        return cell.payload, [c.payload for c in rest if c.payload is not None]

    def clear(self) -> list:
        """Forget every open cell; their payloads."""
        cells, self._open = self._open, []
        return [c.payload for c in cells if c.payload is not None]
