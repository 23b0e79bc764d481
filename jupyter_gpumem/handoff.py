"""The namespace is touched on the main thread only: :class:`MainThreadQueue` (rule 8).

A request that reads or changes the user's namespace may come in on any thread (a comm
message over a kernel subshell, a widget's click); :meth:`MainThreadQueue.submit` is the
one place that decides when and where it runs: at once on the main thread while no cell
runs, else queued (``Ticket.queued``, cancellable) and run on the main thread as the cell
ends, or handed to the kernel's event loop from another thread while it is idle. The
queue hears of the outer cells through its session (a
:class:`~jupyter_gpumem.dispatch.CellFollower`). Nothing here imports IPython or
ipykernel. The cases: docs/ARCHITECTURE.md#the-main-threads-queue.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

from .units import complain

#: a ticket's states: waiting, being run, run (its result or error kept), cancelled
PENDING, RUNNING, DONE, CANCELLED = "pending", "running", "done", "cancelled"


class Ticket:
    """One request handed to a :class:`MainThreadQueue`."""

    _ids = itertools.count(1)

    def __init__(self, queue: "MainThreadQueue", fn: Callable[[], Any], what: str) -> None:
        self.id = next(Ticket._ids)
        self.what = what
        #: True when it waits for a running cell (the caller says "queued")
        self.queued = False
        #: :data:`PENDING`, :data:`RUNNING`, :data:`DONE` or :data:`CANCELLED`
        self.state = PENDING
        #: what ``fn()`` returned, or the exception it raised (``error``), once done
        self.result: Any = None
        self.error: BaseException | None = None
        #: the thread it ran on (the main thread; tests read it)
        self.thread: threading.Thread | None = None
        self._fn = fn
        self._queue = queue
        self._done = threading.Event()

    def cancel(self) -> bool:
        """Drop it if it has not begun: True; False once it runs, ran or was cancelled."""
        return self._queue.cancel(self)

    @property
    def done(self) -> bool:
        """It ran (or failed) or was cancelled."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it is done (never on the main thread while it is queued there)."""
        return self._done.wait(timeout)

    def __repr__(self) -> str:
        return f"<Ticket {self.id} {self.what!r} {self.state}{' queued' if self.queued else ''}>"


class MainThreadQueue:
    """Runs what touches the user's namespace on the main thread, between cells (see the
    module docstring). One per session (``session.handoff``)."""

    def __init__(self, loop_of: Callable[[], Any] = lambda: None,
                 thread: threading.Thread | None = None) -> None:
        #: the main thread: the one that runs the cells (the one that made the queue)
        self.thread = thread if thread is not None else threading.current_thread()
        #: gives the main thread's event loop (an object with a thread-safe
        #: ``add_callback(fn)``, as tornado's IOLoop) or None
        self._loop_of = loop_of
        self._lock = threading.Lock()
        self._pending: list[Ticket] = []
        self._cells: set[int] = set()      # tokens of the outer cells open now
        self._tokens = itertools.count(1)
        self._closed = False
        #: what ran so far, how many were queued behind a cell, how many were cancelled
        self.stats = {"ran": 0, "queued": 0, "cancelled": 0}

    # -- state ---------------------------------------------------------------------
    @property
    def cell_running(self) -> bool:
        """True while an outer cell runs (any thread may ask)."""
        return bool(self._cells)

    def pending(self) -> list[Ticket]:
        with self._lock:
            return list(self._pending)

    def on_main_thread(self) -> bool:
        return threading.current_thread() is self.thread

    # -- submit and cancel (any thread) --------------------------------------------
    def submit(self, fn: Callable[[], Any], *, what: str) -> Ticket:
        """Run ``fn()`` on the main thread, between cells: at once when called on the
        main thread while no cell runs; else queued, run as the running cell ends (or on
        the main thread's event loop at once when the kernel is idle)."""
        ticket = Ticket(self, fn, what)
        with self._lock:
            if self._closed:
                ticket.state = CANCELLED
                ticket._done.set()
                return ticket
            now = self.on_main_thread() and not self._cells
            if not now:
                ticket.queued = bool(self._cells)
                self._pending.append(ticket)
                if ticket.queued:
                    self.stats["queued"] += 1
                hand = not self._cells
        if now:
            self.drain()        # what waited goes first
            self._run(ticket)
            return ticket
        if hand and not self._call_soon(self.drain):
            ticket.queued = True    # no loop to hand it to: it waits for the next cell's end
        return ticket

    def cancel(self, ticket: Ticket) -> bool:
        with self._lock:
            if ticket.state != PENDING:
                return False
            ticket.state = CANCELLED
            if ticket in self._pending:
                self._pending.remove(ticket)
            self.stats["cancelled"] += 1
        ticket._done.set()
        return True

    # -- the main thread -------------------------------------------------------------
    def drain(self) -> int:
        """Run what waits, in order, if this is the main thread and no cell runs; how many ran."""
        if not self.on_main_thread():
            return 0
        ran = 0
        while True:
            with self._lock:
                if self._cells or not self._pending:
                    return ran
                ticket = self._pending.pop(0)
            self._run(ticket)
            ran += 1

    def _run(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.state != PENDING:
                return
            ticket.state = RUNNING
        ticket.thread = threading.current_thread()
        try:
            ticket.result = ticket._fn()
        except BaseException as exc:  # noqa: BLE001 - the caller reads it from the ticket
            ticket.error = exc
            if not isinstance(exc, Exception):
                raise           # KeyboardInterrupt, SystemExit: not ours to swallow
            complain(f"{ticket.what} failed", exc)
        finally:
            ticket.state = DONE
            ticket._fn = None
            self.stats["ran"] += 1
            ticket._done.set()

    def _call_soon(self, fn: Callable[[], Any]) -> bool:
        try:
            loop = self._loop_of()
            if loop is None:
                return False
            loop.add_callback(fn)
            return True
        except Exception as exc:  # noqa: BLE001 - a loop gone (kernel shutting down)
            complain("handing a request to the main thread failed", exc)
            return False

    # -- the session's cell events (main thread; a CellFollower) ------------------------
    def cell_began(self, info: Any) -> int:
        token = next(self._tokens)
        with self._lock:
            self._cells.add(token)
        return token

    def cell_ended(self, kept: Any, result: Any) -> None:
        with self._lock:
            self._cells.discard(kept)
        self.drain()

    def cell_lost(self, kept: Any) -> None:
        """A cell whose end never came (IPython's unpaired events): what waited for it
        runs now, unless another cell runs (never left waiting for an end that is gone)."""
        with self._lock:
            self._cells.discard(kept)
        self.drain()

    def close(self) -> None:
        """Cancel what waits; later submits are cancelled at once."""
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, []
        for ticket in pending:
            with self._lock:
                if ticket.state != PENDING:
                    continue
                ticket.state = CANCELLED
            ticket._done.set()
