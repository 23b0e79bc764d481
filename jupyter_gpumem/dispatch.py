"""The one pairing of IPython's cell events of a shell, and who hears each cell.

A session (jupyter_gpumem/session.py) makes one :class:`CellDispatch`: the shell's
only ``pre_run_cell``/``post_run_cell`` callbacks of the extension. Through it the
:class:`CellFollower` s (the ``watch on`` footer, the handoff queue) hear each outer
cell (:meth:`CellDispatch.follow_cells`), the hooks (the views', trace's) hear every
cell (:meth:`CellDispatch.hook_cells`), the record of the outer cells' spans is kept
(:attr:`CellDispatch.cells`), and the owner is told when an outer cell ends (the
views' refresh). A cell run from inside a cell is part of its outer cell, and a
"pre" or "post" without its partner is sorted out here, once for everyone.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from .core import cells as _cells
from .core.cells import CellEvents
from .core.scan import hidden as _hidden
from .core.trace import CellSpans
from .units import complain

#: the outer cells whose spans the session keeps (the panel's timeline marks them)
CELL_SPANS = 500


class CellFollower(Protocol):
    """What follows the outer cells of a shell through its session's one pairing of
    IPython's cell events (the ``watch on`` footer): a cell run from inside a cell is
    part of its outer cell, and a "pre" or "post" without its partner is sorted out by
    the session, once for everyone."""

    def cell_began(self, info: Any) -> Any:
        """An outer cell begins: what to keep for it (None: nothing)."""

    def cell_ended(self, kept: Any, result: Any) -> None:
        """The outer cell for which ``kept`` was kept ended with ``result``."""

    def cell_lost(self, kept: Any) -> None:
        """The cell ended unseen (its "post" never came), or the follower left while it
        ran: no end to report."""


class _CellRun:
    """An outer cell while it runs: its span and what each follower keeps for it."""

    __slots__ = ("span", "kept")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.kept: dict[Any, Any] = {}


class CellDispatch:
    """The cell events of ``shell``, heard once and passed on (see the module
    docstring); ``outer_ended(span, end, result)`` is called when an outer cell ends
    (main thread), before its followers and the hooks hear of it."""

    def __init__(self, shell: Any, outer_ended: Callable[[Any, float, Any], None]) -> None:
        self.shell = shell
        self.outer_ended = outer_ended
        #: (pre, post) of the views and the footer: called from :meth:`pre_run_cell` and
        #: :meth:`post_run_cell`, the shell's only pre/post_run_cell callbacks of the
        #: extension (trace's too: the magics give trace.start the session's hooks)
        self.hooks: list[tuple[Callable, Callable]] = []
        #: the :class:`CellFollower` s, told of each outer cell before the hooks above, in
        #: the order they came (a dict as an ordered set)
        self.followers: dict[CellFollower, None] = {}
        #: the shell's one pairing of IPython's cell events (each outer cell a _CellRun)
        self.pairing = CellEvents(shell)
        #: the outer cells' spans ``[start, end]`` (unix s; end None while the cell runs)
        #: with their execution counts (``span.count``), oldest first, and a count that
        #: moves whenever one begins or ends: the panel's timeline reads them from its
        #: thread, trace maps allocation times to cells with them (spans are begun and
        #: ended here only)
        self.cells = CellSpans(CELL_SPANS)
        self.version = 0
        _cells.hook_cells(shell, self.pre_run_cell, self.post_run_cell)

    def running(self) -> bool:
        """Whether a cell runs now."""
        return self.pairing.running()

    def hook_cells(self, pre: Callable, post: Callable) -> None:
        """Call ``pre(info)`` and ``post(result)`` around every cell, after the followers."""
        if (pre, post) not in self.hooks:
            self.hooks.append((pre, post))

    def unhook_cells(self, pre: Callable, post: Callable) -> None:
        if (pre, post) in self.hooks:
            self.hooks.remove((pre, post))

    def follow_cells(self, follower: CellFollower) -> None:
        """Tell ``follower`` of every outer cell from the next one on."""
        self.followers.setdefault(follower)

    def unfollow_cells(self, follower: CellFollower) -> list:
        """Stop telling ``follower``; what it kept for the cells running now (to let go)."""
        self.followers.pop(follower, None)
        return [run.kept.pop(follower) for run in self.pairing.payloads()
                if follower in run.kept]

    def kept_by(self, follower: CellFollower) -> Any:
        """What ``follower`` keeps for the outer cell running now, if any."""
        run = self.pairing.outer_payload()
        return run.kept.get(follower) if run is not None else None

    def close(self) -> None:
        """Forget the followers and the hooks, and leave the shell's events."""
        self.followers.clear()
        self.hooks.clear()
        _cells.unhook_cells(self.shell, self.pre_run_cell, self.post_run_cell)

    def _lose(self, runs: list) -> None:
        for run in runs:        # cells whose "post" never came: their end is unknown
            guarded(self.cells.end, run.span, run.span[0])
            for follower, kept in list(run.kept.items()):
                guarded(follower.cell_lost, kept)
            run.kept.clear()

    def pre_run_cell(self, info: Any = None) -> None:
        try:
            cell, ended = self.pairing.pre(info)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("cell events failed", exc)
            return
        self._lose(ended)
        run = None
        if cell.outer:      # a cell run from inside a cell is part of the outer one
            run = cell.payload = _CellRun(self.cells.begin(self.shell, info, time.time()))
        self.version += 1
        if run is not None:
            for follower in list(self.followers):
                kept = guarded(follower.cell_began, info)
                if kept is not None:
                    run.kept[follower] = kept
        for pre, _ in list(self.hooks):
            guarded(pre, info)

    def post_run_cell(self, result: Any = None) -> None:
        # first: which of _, __, ___ the cell's own code bound (before any view scans)
        guarded(_hidden.observe_underscores, self.shell,
                getattr(getattr(result, "info", None), "raw_cell", None))
        try:
            run, ended = self.pairing.post(result)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("cell events failed", exc)
            run, ended = None, []
        self._lose(ended)
        self._after_cell(run, result)
        if run is not None:
            for follower, kept in list(run.kept.items()):
                guarded(follower.cell_ended, kept, result)
            run.kept.clear()
        for _, post in list(self.hooks):
            guarded(post, result)

    def _after_cell(self, run: _CellRun | None, result: Any) -> None:
        try:
            span = run.span if run is not None else None
            now = time.time()
            if span is not None:
                self.cells.end(span, now, result)
            self.version += 1
            if self.pairing.running():
                return      # an inner cell's end: the outer cell's end brings the refresh
            self.outer_ended(span, now, result)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("refresh failed", exc)


def guarded(fn: Callable, *args: Any) -> Any:
    """``fn(*args)``; a failure is one line (as IPython's own events) and None."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - as IPython's own events: one line, go on
        complain(f"{getattr(fn, '__qualname__', 'a cell hook')} failed", exc)
        return None
