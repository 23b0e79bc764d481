"""What the watches of one shell keep: history, timeline, holder tracker and sampling.

A shell with the extension loaded has one :class:`WatchState`, its session's
(``session.watch``, made by :func:`state_for` on first use and closed with the
session); a watch outside any session (a script's ``jupyter_gpumem.watch()``, a
shell without the extension) has one of its own, which lives as long as the watch.

- :func:`history_for(shell) <history_for>`: the list of per-cell records
  (:class:`~.result.WatchResult`, oldest first, at most ``MAX_HISTORY``) kept while
  ``%gpumem watch on`` is on, plus ``%%gpuwatch`` cells run while it is off.
  Read it on the main thread; records are never changed once appended.
- :func:`series_for(shell) <series_for>`: the :class:`~..core.sampler.Series` the
  sampling thread fills while watched code runs: points
  ``(unix time, {device: {"allocated", "reserved", "used_process", "total"}})``
  as :func:`~..core.sampler.device_point` makes them, about every
  ``sample_interval`` seconds; none between cells.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from ..core import sampler as _sampler
from ..session import session_of
from .holders import HolderTracker
from .peaks import LEDGER, uninstall_all
from .result import WatchResult
from .sampling import PROCESS_SAMPLER, SamplerHub

MAX_HISTORY = 10000
SERIES_POINTS = 20000


class WatchState:
    """History, timeline, holder tracker and sampling hub of the watches of one shell
    (``session``: its session, which owns this state) or of one watch outside a session
    (a script's namespace)."""

    def __init__(self, shell: Any = None, namespace: dict | None = None, *,
                 session: Any = None) -> None:
        self.shell = shell
        self.namespace = namespace
        self.session = session
        self.tracker = HolderTracker()
        self.history: list[WatchResult] = []
        self.series = _sampler.Series(maxlen=SERIES_POINTS)
        #: the watches' sampling: on the session's thread, else the process's
        self.hub = SamplerHub(session.sampler if session is not None else PROCESS_SAMPLER)
        self.footer: Any = None   # the watch-on footer (views.footer) while it is on
        self.footer_device: str | None = None
        self.costs: deque = deque(maxlen=2000)   # seconds each footer cost (pre + post)
        #: the tracker's holders are as the last watch's end left them (no error since):
        #: a watch that starts right after may take them as they are (``Watch.start``)
        self.fresh = False
        #: the cell whose ``%%gpuwatch`` watch started (its number): that cell reports for
        #: itself, so the footer adds no summary of its own; a cell whose watch could not
        #: start gets the footer's
        self.self_reporting: int | None = None
        #: ``(cell number, its %%gpuwatch result)`` handed to the ``watch on`` footer,
        #: which records it as the cell's one record at the cell's end
        self.reported: tuple[int, WatchResult] | None = None

    @property
    def settings(self) -> Any:
        """The user's settings (the session's: the magics once loaded); None outside one."""
        return self.session.settings if self.session is not None else None

    def record(self, result: WatchResult) -> None:
        self.history.append(result)
        if len(self.history) > MAX_HISTORY:
            del self.history[: len(self.history) - MAX_HISTORY]

    def internal_ids(self) -> set[int]:
        """Objects of this extension a scan must not walk into (frames of ours hold them)."""
        objs = [self, self.tracker, self.history, self.series, self.costs, self.hub, LEDGER,
                self.footer, self.settings]
        return {id(o) for o in objs if o is not None}

    def close(self) -> None:
        """Stop the footer and the sampling, and take the peak patches out (the session
        closes)."""
        footer, self.footer = self.footer, None
        if footer is not None:
            footer.close()
        self.hub.close()
        uninstall_all()


def state_for(shell: Any) -> WatchState:
    """The watch state of a shell, kept by its session; a shell without the extension
    loaded gets a fresh one each time (it keeps no history: its cells are not watched)."""
    session = session_of(shell)
    if session is None:
        return WatchState(shell=shell)
    if session.watch is None or session.watch.shell is not shell:
        session.watch = WatchState(shell=shell, session=session)
    return session.watch


def history_for(shell: Any) -> list[WatchResult]:
    """The per-cell records of a shell, oldest first (see the module docstring)."""
    return state_for(shell).history


def series_for(shell: Any) -> _sampler.Series:
    """The sampled timeline of a shell (see the module docstring)."""
    return state_for(shell).series
