"""Memory that creeps up on reruns: the rule that flags a cell, free of IPython.

Each run of a cell (keyed across reruns) gives its device level before and after; a run
*grew* when it left at least :data:`MIN_GROWTH` more than it found and more than the
cell's previous run left. A cell whose last :attr:`RerunTracker.increases` runs each grew
is flagged, once per streak; a purge between two runs starts its record over. Only runs
that grew pay for an attribution. The rule in full:
docs/ARCHITECTURE.md#reruns-that-creep.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from ...units import fmt_bytes

#: the least growth per run that counts (bytes)
MIN_GROWTH = 1 << 20
#: the cells whose record is kept (the least recently run go first)
MAX_CELLS = 1000


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None).mallinfo2
    except (OSError, AttributeError):     # not glibc 2.33+: the resident set instead
        return None
    fn.restype, fn.argtypes = _MallInfo2, []
    return fn


_MALLINFO2 = _mallinfo2()


def host_allocated() -> int | None:
    """Bytes the C allocator has handed out and not taken back (glibc's ``mallinfo2``:
    in use in its arenas plus its mapped blocks; about a microsecond): host tensors'
    memory is in it, and unlike the resident set it drops at once when they are freed
    and does not stay flat when freed memory is reused. None where it is unknown."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


@dataclass
class Holding:
    """What one holder kept at an attribution: its purge argument (None: it cannot be
    typed), hidden or a user's name, and its bytes."""

    name: str
    purge: str | None
    hidden: bool
    nbytes: int


@dataclass
class Flag:
    """A cell flagged for creeping memory."""

    key: str
    label: str                    # how the cell reads: ``[12]``
    growth: list[int]             # what each run of the streak left more
    grown: list[tuple[Holding, int]] = field(default_factory=list)   # (holder, bytes more)
    command: str = "%gpumem purge"

    @property
    def total(self) -> int:
        return sum(self.growth)

    def line(self) -> str:
        each = ", ".join("+" + fmt_bytes(n) for n in self.growth)
        what = ", ".join(f"{h.name} +{fmt_bytes(n)}" for h, n in self.grown[:5]) or \
            "no name reaches it (see %gpumem)"
        return (f"jupyter_gpumem: cell {self.label} keeps more on each rerun ({each}; "
                f"{fmt_bytes(self.total)} in all): {what}; free it: {self.command}")


@dataclass
class _Series:
    after: int | None = None          # the level after the last run
    purges: int = -1
    growth: list[int] = field(default_factory=list)
    first: dict | None = None         # the attribution after the run before the streak's 2nd
    tracked: int | None = None        # tracked bytes at that attribution (host)
    runs: int = 0


def grown_holders(first: dict, last: dict) -> list[tuple[Holding, int]]:
    """Holders that keep more at ``last`` than at ``first`` (new ones included), most first."""
    out = []
    for name, h in last.items():
        before = first[name].nbytes if name in first else 0
        if h.nbytes - before >= MIN_GROWTH:
            out.append((h, h.nbytes - before))
    out.sort(key=lambda pair: -pair[1])
    return out


def command_for(grown: list[tuple[Holding, int]]) -> str:
    """The purge that frees what grew: the user's names it names, and a hidden-only purge
    for the hidden ones."""
    names = [h.purge for h, _ in grown if not h.hidden and h.purge]
    parts = [("%gpumem purge " + " ".join(dict.fromkeys(names)))] if names else []
    if any(h.hidden for h, _ in grown) or not parts:
        parts.append("%gpumem purge")
    return "; ".join(parts)


class RerunTracker:
    """The record of the cells' runs (see the module docstring)."""

    def __init__(self, increases: int = 2, min_growth: int = MIN_GROWTH) -> None:
        self.increases = max(int(increases), 1)
        self.min_growth = int(min_growth)
        self._cells: OrderedDict[str, _Series] = OrderedDict()
        #: the flags given so far: execution count -> the flag (``%gpumem history``)
        self.flags: dict[Any, Flag] = {}
        self.stats = {"runs": 0, "attributions": 0, "flags": 0}

    def ran(self, key: str, label: str, before: int | None, after: int | None, purges: int,
            attribute: Callable[[], tuple[dict, int | None]], count: Any = None) -> Flag | None:
        """One run of cell ``key`` left the level at ``after`` (it found ``before``);
        ``purges``: the shell's purge count now; ``attribute()``: (name -> Holding, the
        tracked bytes or None), called only for a run that grew. The flag, if this run
        completes a streak."""
        self.stats["runs"] += 1
        series = self._cells.pop(key, None) or _Series()
        self._cells[key] = series
        while len(self._cells) > MAX_CELLS:
            self._cells.popitem(last=False)
        series.runs += 1
        prev_after, series.after = series.after, after
        if series.purges != purges or before is None or after is None or prev_after is None:
            series.purges = purges
            series.growth, series.first, series.tracked = [], None, None
            return None
        left = after - before
        if left < self.min_growth or after - prev_after < self.min_growth:
            series.growth, series.first, series.tracked = [], None, None
            return None
        series.growth.append(left)
        self.stats["attributions"] += 1
        holders, tracked = attribute()
        if series.first is None:
            series.first, series.tracked = holders, tracked
            return None if self.increases > 1 else self._flag(key, label, series, {}, holders, count)
        if tracked is not None and series.tracked is not None and \
                tracked - series.tracked < self.min_growth * (len(series.growth) - 1):
            # the resident set grew, the tracked tensors did not: not a tensor leak
            series.growth, series.first, series.tracked = [left], holders, tracked
            return None
        if len(series.growth) < self.increases:
            return None
        return self._flag(key, label, series, series.first, holders, count)

    def _flag(self, key, label, series, first, last, count) -> Flag:
        grown = grown_holders(first, last)
        flag = Flag(key, label, list(series.growth[-self.increases:]), grown, command_for(grown))
        series.growth, series.first, series.tracked = [], None, None
        self.stats["flags"] += 1
        if count is not None:
            self.flags[count] = flag
        return flag
