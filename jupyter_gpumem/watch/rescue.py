"""The out-of-memory rescue: an offer right under the traceback, and the rescue itself.

When an outer cell ends with an out-of-memory error (:func:`jupyter_gpumem.core.rescue.oom.is_oom`),
the session's follower here (:class:`Rescues`, ``session.rescue``) reads what was asked
against what is free, scans once for what holds memory on that device, and shows the
offer: the hidden holders a rescue clears (the traceback's frames, ``Out``, ``_``, the
chained exceptions), the user's names that hold the most (named, never taken), and
``%gpumem rescue [NAME ...]``. Nothing is purged or rerun until the user asks.

:func:`rescue` (and :func:`rescue_async`, for a cell with top-level ``await``) purges
through ``session.purge`` (the names given first: a name refused leaves everything as it
was), then runs the failed cell's source, as typed, as IPython runs a cell (with
history), and says what was freed and whether the rerun succeeded. The rerun is a run
of the failed cell for the rerun record (:mod:`.reruns`).

The offer keeps no object of the user's: the source text, the cell's id, numbers and names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.rescue import oom as _oom
from ..core import devices as _devices
from ..core import snapshot as _snapshot
from ..core.rescue.oom import OomInfo
from ..units import complain, fmt_bytes
from .reruns import cell_key

#: the user's names an offer lists (the largest)
NAMES_SHOWN = 3
PREFIX = "jupyter_gpumem: "


class RescueError(ValueError):
    """Nothing to rescue, or the rescue was refused: nothing changed."""


@dataclass
class Offer:
    """What a rescue of one failed cell would do."""

    source: str
    cell_id: str | None
    key: str | None
    count: Any
    device: str
    info: OomInfo | None
    hidden: list[tuple[str, int]] = field(default_factory=list)     # (label, bytes)
    names: list[tuple[str, int]] = field(default_factory=list)
    frees: int | None = None
    awaits: bool = False

    def lines(self) -> list[str]:
        out = [PREFIX + line for line in (self.info.lines() if self.info else ["out of memory"])]
        if self.hidden:
            held = ", ".join(f"{label} {fmt_bytes(n)}" for label, n in self.hidden)
            frees = f" frees {fmt_bytes(self.frees)}" if self.frees is not None else ""
            out.append(f"  a rescue{frees}: hidden holders {held}")
        else:
            out.append("  no hidden holder keeps memory on this device")
        if self.names:
            out.append("  not taken unless named: " + ", ".join(
                f"{name} {fmt_bytes(n)}" for name, n in self.names))
        out.append("  %gpumem rescue [NAME ...]: clears the hidden holders (and the names "
                   "given), then runs this cell again; a rerun repeats what the cell did "
                   "before it failed")
        return out

    def text(self) -> str:
        return "\n".join(self.lines())


class Rescues:
    """The session's follower for out-of-memory errors (``session.rescue``): the pending
    offer, and how it is shown (``show``: the text, and a button where the magics give one)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.offer: Offer | None = None
        self.presenters: list[Callable[[Offer], Any]] = []
        session.follow_cells(self)

    def cell_began(self, info: Any) -> Any:
        return (getattr(info, "raw_cell", None), getattr(info, "cell_id", None), cell_key(info))

    def cell_ended(self, kept: Any, result: Any) -> None:
        error = getattr(result, "error_in_exec", None)
        if error is None or not _oom.is_oom(error):
            return
        source, cell_id, key = kept
        if type(source) is not str or not source.strip():
            return
        try:
            self.offer = make_offer(self.session, error, source, cell_id, key,
                                    getattr(result, "execution_count", None))
            del error
            self.show(self.offer)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("the rescue offer failed", exc)

    def cell_lost(self, kept: Any) -> None:
        pass

    def show(self, offer: Offer) -> None:
        if not self.presenters:
            print(offer.text())
        for present in list(self.presenters):
            try:
                present(offer)
            except Exception as exc:  # noqa: BLE001
                complain("the rescue offer failed", exc)

    def close(self) -> None:
        self.offer = None
        self.presenters.clear()
        self.session.unfollow_cells(self)


def make_offer(session: Any, error: BaseException, source: str, cell_id: str | None,
               key: str | None, count: Any) -> Offer:
    """Read the error and the device, scan once, and price the rescue (a dry run)."""
    info = _oom.read_oom(error)
    device = info.device if info is not None and info.device != "auto" else \
        session.default_device
    offer = Offer(source, cell_id, key, count, device, info)
    snap = _snapshot.build(shell=session.shell, device=_devices.select(device, present=False),
                           time_limit=session.time_limit,
                           warm=session.warm)
    offer.hidden = [(h.label, h.total) for h in snap.holders if h.hidden and h.total]
    users = sorted((h for h in snap.holders if not h.hidden and h.total), key=lambda h: -h.total)
    offer.names = [(h.name, h.total) for h in users[:NAMES_SHOWN]]
    if offer.hidden:
        try:
            dry = session.purge((), dry_run=True, device=device, time_limit=session.time_limit)
            offer.frees = sum(dry.predicted.values()) if dry.predicted else None
        except Exception:  # noqa: BLE001 - the holders' own figures stand
            offer.frees = None
    should = getattr(session.shell, "should_run_async", None)
    try:
        offer.awaits = bool(should(source, transformed_cell=session.shell.transform_cell(source),
                                   preprocessing_exc_tuple=None)) if should else False
    except Exception:  # noqa: BLE001 - not valid code: the rerun reports it as IPython would
        offer.awaits = False
    return offer


@dataclass
class RescueResult:
    """What a rescue did: the purges' results, the bytes freed, the rerun's outcome."""

    purges: list[Any]
    freed: int
    removed: list[str]
    success: bool | None = None
    error: str | None = None

    def lines(self) -> list[str]:
        gone = ", ".join(self.removed) or "nothing"
        out = [f"{PREFIX}rescue freed {fmt_bytes(self.freed)} (cleared: {gone})"]
        if self.success is not None:
            out.append(f"{PREFIX}the rerun " + ("succeeded" if self.success
                                                  else f"failed again: {self.error}"))
        return out


def _purge(session: Any, offer: Offer, names: list[str]) -> RescueResult:
    results = []
    if names:   # checked whole before anything goes: a PurgeError changes nothing
        results.append(session.purge(list(names), device=offer.device,
                                     time_limit=session.time_limit))
    results.append(session.purge((), device=offer.device, time_limit=session.time_limit))
    freed = sum(max(v or 0, 0) for r in results for v in r.freed.values())
    removed = list(dict.fromkeys(n for r in results for n in r.removed))
    return RescueResult(results, freed, removed)


def _pending(session: Any) -> Offer:
    rescues = getattr(session, "rescue", None)
    offer = rescues.offer if rescues is not None else None
    if offer is None:
        raise RescueError("no out-of-memory error to rescue from: %gpumem rescue follows a "
                          "cell that failed for lack of memory")
    return offer


def _before_rerun(session: Any, offer: Offer) -> tuple[Any, Any]:
    session.rescue.offer = None       # taken: a second rescue needs a new failure
    reruns = getattr(session, "reruns", None)
    before = reruns.levels().read() if reruns is not None and offer.key else None
    return reruns, before


def _after_rerun(session: Any, offer: Offer, done: RescueResult, result: Any,
                 reruns: Any, before: Any) -> RescueResult:
    error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
    done.success = error is None
    if error is not None:
        done.error = f"{type(error).__name__}: {_oom.first_line(error)}"
    if reruns is not None and offer.key:
        reruns.ran(offer.key, before, getattr(result, "execution_count", None))
    if error is not None and _oom.is_oom(error):
        try:
            session.rescue.offer = make_offer(session, error, offer.source, offer.cell_id,
                                              offer.key, offer.count)
            session.rescue.show(session.rescue.offer)
        except Exception as exc:  # noqa: BLE001
            complain("the rescue offer failed", exc)
    del error
    return done


def rescue(session: Any, names: list[str] = ()) -> RescueResult:
    """Purge the hidden holders (and ``names``), then rerun the failed cell (no ``await``
    in it, or no event loop running here: IPython runs it then)."""
    offer = _pending(session)
    done = _purge(session, offer, list(names))
    reruns, before = _before_rerun(session, offer)
    for line in done.lines():
        print(line)
    result = session.shell.run_cell(offer.source, store_history=True, cell_id=offer.cell_id)
    return _after_rerun(session, offer, done, result, reruns, before)


async def rescue_async(session: Any, names: list[str] = ()) -> RescueResult:
    """:func:`rescue` for a failed cell with top-level ``await``: awaited by IPython."""
    offer = _pending(session)
    done = _purge(session, offer, list(names))
    reruns, before = _before_rerun(session, offer)
    for line in done.lines():
        print(line)
    shell = session.shell
    result = await shell.run_cell_async(offer.source, store_history=True,
                                        transformed_cell=shell.transform_cell(offer.source),
                                        cell_id=offer.cell_id)
    return _after_rerun(session, offer, done, result, reruns, before)
