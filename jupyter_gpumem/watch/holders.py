"""Which names a cell created, grew, shrank or deleted: holders tracked between cells.

The :class:`HolderTracker` keeps, for every root, the storages it reached when last
scanned, and per cell rescans only the roots that are new, rebound or whose cheap
signature changed; every root when the allocator (``ACC_TOLERANCE``) or the resident set
(``CPU_TOLERANCE``) moved by more than those explain, when a full scan fits the budget, or
when asked. It keeps no reference to user objects: only names, ids, storage keys and
bytes. Why and what it misses: docs/ARCHITECTURE.md#the-holders-between-cells.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.scan import hidden as _hidden
from ..core import scan as _scan
from ..core.scan import Root
from ..backends import active_backends
from ..core.snapshot import type_name
from ..backends.base import is_subtype

ACC_TOLERANCE = 2 << 20      # allocator bytes a cell may move without a full rescan
CPU_TOLERANCE = 64 << 20     # host resident-set growth that prompts a full rescan


@dataclass
class RootInfo:
    """What one root reached when it was last scanned (no reference to it)."""

    name: str
    label: str
    ident: Any
    sig: Any
    keys: dict = field(default_factory=dict)   # storage key -> (nbytes, device)
    hidden: bool = False
    purge: str | None = None
    type: str = ""
    kind: str = "user"
    aliases: tuple = ()

    def by_device(self, devices=None) -> dict[str, int]:
        out: dict[str, int] = {}
        for nbytes, dev in self.keys.values():
            if devices is None or dev in devices:
                out[dev] = out.get(dev, 0) + nbytes
        return out

    def nbytes(self, devices=None) -> int:
        return sum(self.by_device(devices).values())

    @property
    def purge_arg(self) -> str | None:
        """What ``%gpumem purge`` accepts for this root."""
        return _hidden.purge_arg(self.kind, self.purge)


@dataclass
class RootChange:
    """One root whose bytes differ between two updates."""

    name: str
    before: RootInfo | None
    after: RootInfo | None


@dataclass
class Update:
    """How one :meth:`HolderTracker.update` went (what changed: :meth:`HolderTracker.diff`
    against a copy of :attr:`HolderTracker.roots` taken before)."""

    mode: str                      # "none", "incremental" or "full"
    partial: bool = False
    seconds: float = 0.0
    reasons: list[str] = field(default_factory=list)


def identity(root: Root) -> Any:
    """What says a root is still the same object (the traceback root is rebuilt each time)."""
    entry = _hidden.kind_of(root)
    if entry is not None and entry.rebuilt and type(root.obj) is tuple:
        return tuple(id(o) for o in root.obj)
    return id(root.obj)


def signature(obj: Any, backends=None) -> Any:
    """A cheap fingerprint that changes when an object's memory likely did.

    Reads only C-level slots; never runs user code (the type is kept by id: comparing
    two classes could ask a metaclass's ``__eq__``).
    """
    return _signature(obj, _typed(active_backends() if backends is None else backends))


def _typed(backends) -> list[tuple[Any, tuple]]:
    """(backend, its tensor types) for the backends that have some."""
    return [(b, t) for b in backends for t in (b.tensor_types(),) if t]


_SIZED = (dict, list, tuple, set, frozenset)


def _signature(obj: Any, typed: list[tuple[Any, tuple]]) -> Any:
    tp = type(obj)
    tid = id(tp)
    try:
        for backend, types_ in typed:
            if is_subtype(tp, types_):
                keys = tuple((i.key, i.nbytes) for i in backend.storages(obj))
                fn, grad = backend.graph_and_grad(obj)
                if grad is not None:
                    grad = tuple((i.key, i.nbytes) for i in backend.storages(grad))
                return (tid, keys, grad, None if fn is None else id(fn))
        if is_subtype(tp, _SIZED):
            for base in _SIZED:
                if is_subtype(tp, base):
                    return (tid, base.__len__(obj))
    except Exception:  # noqa: BLE001 - an object that refuses: compare by type only
        return (tid,)
    return (tid,)


def _ids(extra_stop: Any) -> set[int] | None:
    """:meth:`HolderTracker.update`'s ``extra_stop`` as ids (a function is called now)."""
    return extra_stop() if callable(extra_stop) else extra_stop


class HolderTracker:
    """Per-root storages, kept up to date cheaply; see the module docstring."""

    def __init__(self) -> None:
        self.roots: dict[str, RootInfo] = {}
        self._keys: dict[tuple, list] = {}      # key -> [roots holding it, nbytes, device]
        self.totals: dict[str, int] = {}        # bytes per device reached by any root
        self.seeded = False
        #: moves whenever :attr:`roots` does (a root replaced, gone or rescanned in full):
        #: while it stands, a diff against an earlier copy of the roots finds nothing
        self.version = 0
        self.full_cost: float | None = None
        self.marks: dict[str, int] = {}

    # -- bookkeeping of storages ----------------------------------------------------------
    def _add(self, keys: dict) -> None:
        for key, (nbytes, dev) in keys.items():
            entry = self._keys.get(key)
            if entry is None:
                self._keys[key] = [1, nbytes, dev]
                self.totals[dev] = self.totals.get(dev, 0) + nbytes
            else:
                if entry[1] != nbytes:
                    self.totals[entry[2]] -= entry[1]
                    self.totals[dev] = self.totals.get(dev, 0) + nbytes
                    entry[1], entry[2] = nbytes, dev
                entry[0] += 1

    def _remove(self, keys: dict) -> None:
        for key in keys:
            entry = self._keys.get(key)
            if entry is None:
                continue
            entry[0] -= 1
            if entry[0] <= 0:
                del self._keys[key]
                self.totals[entry[2]] -= entry[1]

    def shared_bytes(self, info: RootInfo, devices=None) -> int:
        """Bytes of ``info`` that other roots reach too."""
        total = 0
        for key, (nbytes, dev) in info.keys.items():
            entry = self._keys.get(key)
            if entry is not None and entry[0] > 1 and (devices is None or dev in devices):
                total += nbytes
        return total

    def top(self, devices=None, n: int | None = None) -> list[RootInfo]:
        """Roots by bytes on ``devices``, largest first (only those holding some)."""
        infos = [i for i in self.roots.values() if i.nbytes(devices) > 0]
        infos.sort(key=lambda i: (-i.nbytes(devices), i.name))
        return infos if n is None else infos[:n]

    # -- updating -------------------------------------------------------------------------
    def update(self, roots: list[Root], *, shell: Any = None, namespace: dict | None = None,
               marks: dict[str, int] | None = None, force_full: bool = False,
               full_budget: float | None = None, time_limit: float = 3.0,
               extra_stop: "set[int] | Callable[[], set[int]] | None" = None) -> Update:
        """Bring the tracker up to date with ``roots``; return what changed since last time.

        ``marks`` are per-device measures that move with memory (allocator
        ``allocated`` for accelerators, resident set for ``cpu``); a move the
        rescanned roots do not explain prompts a full scan. ``extra_stop``: ids the
        walk never enters, or a function that gives them (called only if a root is
        walked, which most cells need not).
        """
        start = time.perf_counter()
        typed = _typed(active_backends())
        count0 = len(self.roots)
        fingerprints = {r.name: (identity(r), _signature(r.obj, typed)) for r in roots}
        reasons: list[str] = []
        partial = False
        scanned = 0
        full = force_full or not self.seeded
        if not full and full_budget is not None and self.full_cost is not None \
                and self.full_cost <= full_budget:
            full = True
            reasons.append("a full scan fits the time budget")
        if not full:
            totals0 = dict(self.totals)
            changed = [r for r in roots if r.name not in self.roots
                       or (self.roots[r.name].ident, self.roots[r.name].sig) != fingerprints[r.name]]
            gone = [n for n in self.roots if n not in fingerprints]
            for n in gone:
                self._remove(self.roots.pop(n).keys)
                self.version += 1
            if changed:
                result = _scan.scan(changed, devices=None, shell=shell, namespace=namespace,
                                    time_limit=time_limit, extra_stop=_ids(extra_stop))
                partial = result.partial
                scanned = len(changed)
                for root, reach in zip(changed, result.reach):
                    self._replace(self._info(root, reach, fingerprints[root.name]))
            why = self._unexplained(marks, totals0)
            if why:
                full = True
                reasons.append(why)
        if full:
            scanned, partial = self._full(roots, fingerprints, shell, namespace, time_limit,
                                          extra_stop)
            self.seeded = True
        if marks is not None:
            self.marks = dict(marks)
        mode = "full" if full else ("incremental" if scanned or count0 != len(self.roots)
                                    else "none")
        return Update(mode, partial, time.perf_counter() - start, reasons)

    def _unexplained(self, marks: dict[str, int] | None, totals0: dict[str, int]) -> str | None:
        if not marks or not self.marks:
            return None
        for dev, value in marks.items():
            if value is None or self.marks.get(dev) is None:
                continue
            measured = value - self.marks[dev]
            tracked = self.totals.get(dev, 0) - totals0.get(dev, 0)
            if dev == "cpu":
                if measured - tracked > CPU_TOLERANCE:
                    return "host memory grew more than the rescanned names explain"
            elif abs(measured - tracked) > ACC_TOLERANCE:
                return f"{dev}'s allocator moved more than the rescanned names explain"
        return None

    def _full(self, roots, fingerprints, shell, namespace, time_limit,
              extra_stop) -> tuple[int, bool]:
        t0 = time.perf_counter()
        result = _scan.scan(roots, devices=None, shell=shell, namespace=namespace,
                            time_limit=time_limit, extra_stop=_ids(extra_stop))
        new: dict[str, RootInfo] = {}
        for root, reach in zip(roots, result.reach):
            old = self.roots.get(root.name)
            if result.partial and not reach.storages and old is not None:
                new[root.name] = old   # not reached before the time limit: keep what we knew
                continue
            new[root.name] = self._info(root, reach, fingerprints[root.name])
        self.roots = {}
        self._keys = {}
        self.totals = {}
        self.version += 1
        for info in new.values():
            self.roots[info.name] = info
            self._add(info.keys)
        if not result.partial:
            self.full_cost = time.perf_counter() - t0
        return len(roots), result.partial

    def _replace(self, info: RootInfo) -> None:
        self.version += 1
        old = self.roots.get(info.name)
        if old is not None:
            self._remove(old.keys)
        self.roots[info.name] = info
        self._add(info.keys)

    @staticmethod
    def _info(root: Root, reach: _scan.Reach, fingerprint) -> RootInfo:
        keys = {k: (info.nbytes, info.device) for k, (info, _, _) in reach.storages.items()}
        label = root.name
        kind_type = _hidden.what(root)
        if kind_type is None:
            try:
                kind_type = type_name(root.obj)
            except Exception:  # noqa: BLE001
                kind_type = type(root.obj).__name__
        return RootInfo(root.name, label, fingerprint[0], fingerprint[1], keys, root.hidden,
                        root.purge, kind_type, root.kind, tuple(root.aliases))

    def diff(self, before: dict[str, RootInfo]) -> list[RootChange]:
        """Roots whose bytes differ between ``before`` (a copy of :attr:`roots`) and now."""
        out = []
        for name in list(before) + [n for n in self.roots if n not in before]:
            old, new = before.get(name), self.roots.get(name)
            if old is new:
                continue
            if (old.by_device() if old else {}) == (new.by_device() if new else {}):
                continue
            out.append(RootChange(name, old, new))
        return out
