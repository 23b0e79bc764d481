"""Background sampling of device counters (tqdm's monitor thread is the model).

A :class:`SharedSampler` is one daemon thread that calls its subscribers
(:class:`Subscription`), each at its own interval, pausable; the session owns one per
shell. It starts with the first subscription and ends, joined, with the last; subscribers
due at one tick share one reading per selection (:meth:`SharedSampler.read`). Sampling
threads read device counters only: they never touch the user's namespace, print or
display, and a subscriber's failure ends that subscriber only
(:attr:`Subscription.failure`, its ``on_failure``). :func:`check_interval` is the one
check of a sampling interval. See docs/ARCHITECTURE.md#one-owner-per-shell.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Callable
from ..backends.base import is_a

MIN_INTERVAL = 0.001   # seconds; below this a sampler only burns a core
MAX_INTERVAL = 3600.0  # seconds; above this a timeline has nothing to show
#: share of its interval a subscriber may be called early, to share a tick with others
EARLY = 0.2


def check_interval(value: object, what: str = "the interval", minimum: float = MIN_INTERVAL,
                   maximum: float = MAX_INTERVAL) -> float:
    """``value`` as seconds, finite and within ``[minimum, maximum]``; ValueError otherwise."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if is_a(value, bool) or not math.isfinite(seconds) or not minimum <= seconds <= maximum:
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


def _failure(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - a str() that raises
        return type(exc).__name__


class Subscription:
    """One subscriber of a :class:`SharedSampler`: ``fn()`` every ``interval`` seconds
    on the sampler's thread until :meth:`stop`.

    It reads like the thread it once was: :meth:`is_alive`, :meth:`join`,
    :attr:`failure`, :attr:`errors` (exceptions ``fn`` raised; it goes on).
    :meth:`pause` keeps it, idle, until :meth:`resume`, whose first call comes
    one interval later: whoever resumes it has just read the counters, so a cell
    shorter than that never shares the interpreter with this subscriber.
    """

    def __init__(self, sampler: "SharedSampler", fn: Callable[[], object], interval: float,
                 name: str, on_failure: Callable[[str], object] | None) -> None:
        self.sampler = sampler
        self.fn = fn
        self.name = name
        self.on_failure = on_failure
        self._interval = _bounded(interval)
        #: monotonic time of the next call; None while paused (the sampler's lock guards it)
        self.due: float | None = None
        #: the next call comes no earlier than ``due`` (the first one after a resume)
        self.strict = True
        self.calls = 0
        self.errors = 0
        #: why it ended on its own (``"Type: message"``); None while it runs or after stop()
        self.failure: str | None = None
        self._ended = threading.Event()

    @property
    def interval(self) -> float:
        """Seconds between two calls; whatever is set is brought into [1 ms, 1 h]."""
        return self._interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        self.sampler._set_interval(self, _bounded(seconds))

    @property
    def active(self) -> bool:
        return self.due is not None and not self._ended.is_set()

    @property
    def stopped(self) -> bool:
        """Ended: stopped, failed, or its sampler closed."""
        return self._ended.is_set()

    def pause(self) -> None:
        """No calls until :meth:`resume`; the subscription (and the thread) stay."""
        self.sampler._pause(self)

    def resume(self) -> None:
        """Calls again, the first one interval from now (nothing if it runs already)."""
        self.sampler._resume(self)

    def stop(self, timeout: float = 2.0) -> None:
        """End it now; the last subscription's end ends the thread (joined, up to ``timeout``)."""
        self.sampler._unsubscribe(self, timeout)

    def is_alive(self) -> bool:
        thread = self.sampler.thread
        return not self._ended.is_set() and thread is not None and thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait until it has ended (stopped, failed or closed)."""
        self._ended.wait(timeout)

    def __repr__(self) -> str:
        state = ("failed" if self.failure else "stopped") if self.stopped else \
            ("active" if self.active else "paused")
        return f"<Subscription {self.name!r} every {self._interval:g} s, {state}>"


class SharedSampler:
    """One sampling thread for any number of :class:`Subscription` s (see the module
    docstring). ``read(selection)`` reads the devices (``devices.read_devices``);
    during a tick :meth:`read` makes that reading once per selection for every
    subscriber called in the tick."""

    def __init__(self, read: Callable[[str], Any] | None = None,
                 name: str = "jupyter_gpumem-sampler") -> None:
        self.name = name
        self._read = read
        self._lock = threading.Lock()
        self._subs: list[Subscription] = []
        self._wake = threading.Event()     # the running thread's own (each thread has one)
        self._thread: threading.Thread | None = None
        self._ending: list[threading.Thread] = []   # threads told to end, not yet joined
        self._planned = math.inf    # monotonic time the thread wakes next on its own
        self._local = threading.local()  # .memo: selection -> (reading, error) during a tick
        self._closed = False
        #: why the last thread ended on its own; None once a new one runs
        self.failure: str | None = None
        #: ticks: wake-ups that called someone; calls: subscribers called; reads: readings
        #: asked through :meth:`read` in a tick; readings: the device readings made for them
        self.stats = {"ticks": 0, "calls": 0, "reads": 0, "readings": 0}

    # -- subscribers (any thread) --------------------------------------------------------------
    def subscribe(self, fn: Callable[[], object], interval: float, *, name: str = "",
                  on_failure: Callable[[str], object] | None = None,
                  active: bool = True) -> Subscription:
        """Call ``fn()`` every ``interval`` seconds from the thread (started if need be),
        the first time one interval from now; paused until resumed unless ``active``.
        A closed sampler gives a subscription that has ended already."""
        sub = Subscription(self, fn, interval, name, on_failure)
        with self._lock:
            if self._closed:
                sub._ended.set()
                return sub
            if active:
                sub.due = time.monotonic() + sub._interval
            self._subs.append(sub)
            if self._thread is None:
                self._wake = threading.Event()
                thread = threading.Thread(target=self._run, args=(self._wake,),
                                          name=self.name, daemon=True)
                self.failure = None
                self._planned = math.inf
                self._thread = thread
                try:
                    thread.start()
                except BaseException:   # "can't start new thread": nothing half made stays
                    self._thread = None
                    self._subs.remove(sub)
                    raise
            elif active:
                self._woken(sub.due)
        return sub

    def _set_interval(self, sub: Subscription, seconds: float) -> None:
        with self._lock:
            if seconds == sub._interval:
                return
            sub._interval = seconds
            if sub.due is not None and not sub._ended.is_set():
                sub.due, sub.strict = time.monotonic() + seconds, True
                self._woken(sub.due)

    def _pause(self, sub: Subscription) -> None:
        with self._lock:
            sub.due = None      # the thread need not wake for it: at its wake-up, nothing is due

    def _resume(self, sub: Subscription) -> None:
        with self._lock:
            if sub.due is None and not sub._ended.is_set():
                sub.due, sub.strict = time.monotonic() + sub._interval, True
                self._woken(sub.due)

    def _woken(self, due: float) -> None:
        """Under the lock: wake the thread if ``due`` comes before its own next wake-up."""
        if due < self._planned:
            self._planned = due
            self._wake.set()

    def _unsubscribe(self, sub: Subscription, timeout: float | None = 2.0,
                     failure: str | None = None) -> None:
        with self._lock:
            if sub._ended.is_set():
                return
            if sub in self._subs:
                self._subs.remove(sub)
            sub.due = None
            sub.failure = failure
            sub._ended.set()
            thread = self._retire() if not self._subs else None
        self._join(thread, timeout)

    def _retire(self) -> threading.Thread | None:
        """Under the lock: tell the thread to end; it (to join) or None."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._ending = [t for t in self._ending if t.is_alive()] + [thread]
            self._wake.set()
        return thread

    def _join(self, thread: threading.Thread | None, timeout: float | None) -> None:
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout)
        if not thread.is_alive():
            with self._lock:
                if thread in self._ending:
                    self._ending.remove(thread)

    # -- the thread ----------------------------------------------------------------------------
    @property
    def thread(self) -> threading.Thread | None:
        """The sampling thread while one runs."""
        return self._thread

    @property
    def subscriptions(self) -> list[Subscription]:
        with self._lock:
            return list(self._subs)

    def read(self, selection: str) -> Any:
        """The devices of ``selection`` (``read(selection)`` of the constructor): in a tick,
        one reading shared by every subscriber of the tick (an error too: each is told);
        elsewhere a reading now."""
        memo = getattr(self._local, "memo", None)
        if memo is None:
            return self._read(selection)
        self.stats["reads"] += 1
        hit = memo.get(selection)
        if hit is None:
            self.stats["readings"] += 1
            try:
                hit = (self._read(selection), None)
            except Exception as exc:  # noqa: BLE001 - each subscriber says so its own way
                hit = (None, exc)
            memo[selection] = hit
        if hit[1] is not None:
            raise hit[1]
        return hit[0]

    def _run(self, wake: threading.Event) -> None:
        me = threading.current_thread()
        try:
            self._loop(me, wake)
        except BaseException as exc:  # noqa: BLE001 - a thread's traceback lands in a cell
            failure = _failure(exc)
            with self._lock:
                subs = [] if self._thread is not me else list(self._subs)
                if self._thread is me:
                    self.failure = failure
                    self._subs.clear()
                    self._thread = None
            for sub in subs:
                self._ended_on_its_own(sub, failure)

    def _loop(self, me: threading.Thread, wake: threading.Event) -> None:
        lock, monotonic = self._lock, time.monotonic
        while True:
            with lock:
                if self._thread is not me:
                    return
                now = monotonic()
                due, planned = [], math.inf
                for sub in self._subs:
                    when = sub.due
                    if when is None:
                        continue
                    if when <= now or (not sub.strict and when - now <= sub._interval * EARLY):
                        due.append(sub)
                    elif when < planned:
                        planned = when
                self._planned = now if due else planned
                wake.clear()
            if due:
                self._tick(due, now)
            else:
                wake.wait(None if planned == math.inf else planned - now)

    def _tick(self, due: list[Subscription], now: float) -> None:
        local = self._local
        local.memo = {}
        try:
            for sub in due:
                with self._lock:
                    if sub.due is None or sub._ended.is_set():
                        continue        # paused or stopped since
                    interval = sub._interval
                    # on its grid of multiples of its interval: subscribers with the same
                    # interval (or multiples) come due at the same ticks and share readings
                    sub.due = max(round((now + interval) / interval) * interval,
                                  now + interval * (1 - EARLY))
                    sub.strict = False
                self.stats["calls"] += 1
                try:
                    sub.fn()
                except Exception:  # noqa: BLE001 - a sampler must never die noisily
                    sub.errors += 1
                except BaseException as exc:  # noqa: BLE001 - it ends; the others go on
                    self._unsubscribe(sub, None, _failure(exc))
                    self._tell(sub)
                else:
                    sub.calls += 1
                with self._lock:
                    # a call that took about its interval or longer still leaves the cell
                    # most of an interval: the thread never calls back to back
                    rest = time.monotonic() + interval * (1 - EARLY)
                    if sub.due is not None and sub.due < rest:
                        sub.due = rest
        finally:
            local.memo = None
        self.stats["ticks"] += 1

    def _ended_on_its_own(self, sub: Subscription, failure: str) -> None:
        with self._lock:
            sub.due = None
            sub.failure = failure
            sub._ended.set()
        self._tell(sub)

    @staticmethod
    def _tell(sub: Subscription) -> None:
        handler = sub.on_failure
        if handler is not None and sub.failure is not None:
            try:
                handler(sub.failure)
            except BaseException:  # noqa: BLE001
                pass

    def close(self, timeout: float = 2.0) -> None:
        """End every subscription and the thread (joined); nothing subscribes after."""
        with self._lock:
            self._closed = True
            subs, self._subs = self._subs, []
            for sub in subs:
                sub.due = None
                sub._ended.set()
            self._retire()
            ending = list(self._ending)
        for thread in ending:
            self._join(thread, timeout)

    @property
    def closed(self) -> bool:
        return self._closed


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
