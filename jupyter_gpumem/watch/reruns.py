"""Creeping memory on reruns, in a shell: a follower of the session's outer cells that
gives :class:`~jupyter_gpumem.core.rescue.reruns.RerunTracker` its figures.

Each outer cell is known across reruns by the frontend's cell id (ipykernel hands
IPython the execute request's ``cellId``: ``info.cell_id``) or else its source. Its
level before and after: the frameworks' allocated bytes on the accelerators the
session's default device selects, or on the host the bytes the C allocator has handed
out (``mallinfo2``; the resident set where that is unknown), read once per cell, at
its end: the level the previous cell left is this one's start. A run that grew pays for one snapshot (the attribution); a
flagged cell gets one line right after it, and ``%gpumem history`` lists the flags.
"""
from __future__ import annotations

from typing import Any

from ..backends import active_backends
from ..core import devices as _devices
from ..core import snapshot as _snapshot
from ..core.rescue.reruns import Flag, Holding, RerunTracker, host_allocated
from ..units import complain


def cell_key(info: Any) -> str | None:
    """How a cell is known across reruns: the frontend's cell id, else its source."""
    cell_id = getattr(info, "cell_id", None)
    if type(cell_id) is str and cell_id:
        return "id:" + cell_id
    source = getattr(info, "raw_cell", None)
    return "src:" + source if type(source) is str and source.strip() else None


class CellLevels:
    """Reads the level a cell leaves: cheap, every cell."""

    def __init__(self, device: str) -> None:
        self.device = _devices.parse_device(device)
        ids = _devices.selected_ids(self.device)
        self.ids = [i for i in ids if i != "cpu"]
        self.host = not self.ids
        self.measured = "cpu" if self.host else self.device

    def read(self) -> int | None:
        """The level now (bytes), or None where it cannot be read."""
        if self.host:
            value = host_allocated()
            return value if value is not None else _devices.process_rss()
        total = None        # the frameworks' allocator counters only: no NVML per cell
        for backend in active_backends():
            try:
                usages = backend.usage(self.ids)
            except Exception:  # noqa: BLE001 - one framework must not hide the others
                continue
            for usage in usages.values():
                if usage.allocated is not None:
                    total = (total or 0) + usage.allocated
        return total


def attribution(session: Any, device: str) -> tuple[dict, int | None]:
    """What each holder keeps now (the same scan as ``%gpumem``), and the tracked bytes."""
    snap = _snapshot.build(shell=session.shell, device=_devices.select(device, present=False),
                           time_limit=session.time_limit,
                           warm=session.warm)
    holders = {h.name: Holding(h.label if h.hidden else h.name, h.purge or (
        None if h.hidden else h.name), h.hidden, h.total) for h in snap.holders}
    tracked = [du.attributed for du in snap.devices if du.attributed is not None]
    return holders, sum(tracked) if tracked else None


class RerunWatch:
    """The session's follower for reruns (``session.reruns``)."""

    def __init__(self, session: Any, increases: int = 2) -> None:
        self.session = session
        self.tracker = RerunTracker(increases)
        self._levels: CellLevels | None = None
        self._device = None
        #: the level after the last run read, and the purge count then
        self._last: int | None = None
        self._last_purges = -1
        session.follow_cells(self)

    def levels(self) -> CellLevels:
        device = self.session.default_device
        if self._levels is None or self._device != device:
            self._levels, self._device = CellLevels(device), device
        return self._levels

    # -- the follower ---------------------------------------------------------------
    def cell_began(self, info: Any) -> Any:
        key = cell_key(info)
        if key is None:
            return None
        # the level the last cell left stands for this one's start (one reading per cell:
        # between two cells nothing of the user's runs but callbacks)
        before = self._last if self._last_purges == self.session.purges else None
        return key, before

    def cell_ended(self, kept: Any, result: Any) -> None:
        key, before = kept
        self.ran(key, before, getattr(result, "execution_count", None))

    def cell_lost(self, kept: Any) -> None:
        pass

    # -- a run (a cell's, or a rescue's rerun of it) -------------------------------------
    def ran(self, key: str, before: int | None, count: Any) -> Flag | None:
        levels = self.levels()
        after = levels.read()
        self._last, self._last_purges = after, self.session.purges
        label = f"[{count}]" if type(count) is int else "(this cell)"
        try:
            flag = self.tracker.ran(key, label, before, after, self.session.purges,
                                    lambda: attribution(self.session, levels.measured),
                                    count if type(count) is int else None)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("rerun tracking failed", exc)
            return None
        if flag is not None:
            print(flag.line())
        return flag

    def close(self) -> None:
        self.session.unfollow_cells(self)
