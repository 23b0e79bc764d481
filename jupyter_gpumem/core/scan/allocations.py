"""Rule: one allocation, one key (:func:`one_allocation`), and what keeps its proof cheap
from scan to scan (:class:`Apart`).

Two storage objects can share memory: a tensor made from another's numpy view
(``torch.from_numpy(a.numpy()[:2])``) or through DLPack borrows the other's bytes, and
keeps them alive. Live allocations never overlap, so a storage whose bytes begin at or
lie inside another's on the same device is that allocation. Most scans meet no such
pair, and proving it is a pass over every storage the names reach (a model's optimizer
state: some 100,000). A warm scan proves only what it has not proven before: the
storages it found apart are kept, as spans, from one scan to the next; a root whose
record was proven is not looked at again, and a new root's storages are each checked
against the spans kept (:meth:`Apart.check`). The flow: docs/ARCHITECTURE.md#the-scan-in-core.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from itertools import chain, islice, repeat
from operator import add, attrgetter, gt, itemgetter, lt, ne, sub
from typing import Any

_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_NBYTES = _SECOND
_STORAGES = attrgetter("storages")


def one_allocation(reach: list, also: list = ()) -> list:
    """Rule: one allocation, one key. A storage whose bytes begin at or lie inside
    another's on the same device is that allocation: its key becomes the allocation's,
    with the allocation's bytes (the largest storage at the lowest address). Applied
    once per scan to every root's storages (each a :class:`~jupyter_gpumem.core.scan.Reach`),
    warm or walked: each name is then blamed for what it keeps alive, and a purge
    predicts what it frees (tests/core/scan/test_allocations.py). ``also``: the
    reach of another scan of the same moment whose allocations count too (a purge's scan
    of what stays, which may meet only the borrowing storage, keyed as the first scan
    keyed it). The usual scan has neither (checked in C-level passes, :func:`apart`);
    only then are the storages looked at one by one."""
    if apart([r.storages for r in (*reach, *also) if r.storages])[0]:
        return reach
    return _rekey(reach, also)


def _rekey(reach: list, also: list = ()) -> list:
    """``reach`` with each storage that lies in another's allocation under that
    allocation's key and bytes (where none does: ``reach`` itself)."""
    infos: dict = {}
    for r in (*reach, *also):
        for key, value in r.storages.items():
            have = infos.get(key)
            if have is None or have[1] < value[0][1]:
                infos[key] = value[0]
    by_device: dict = {}
    for key, info in infos.items():
        if _is_span(key):
            by_device.setdefault(key[0], []).append((key[1], -info[1], key))
    owner_of: dict = {}
    for items in by_device.values():
        if len(items) < 2:
            continue
        items.sort()
        owner, end = None, -1
        for ptr, minus, key in items:
            if owner is not None and ptr + -minus <= end:
                owner_of[key] = owner
            elif ptr >= end:
                owner, end = key, ptr + -minus
    changed = {k for r in reach for k, v in r.storages.items()
               if k in owner_of or v[0][1] != infos[k][1]}
    if not changed:
        return reach
    out = []
    for r in reach:
        if changed.isdisjoint(r.storages):
            out.append(r)
            continue
        storages: dict = {}
        for key, (info, node, text) in r.storages.items():
            key = owner_of.get(key, key)
            if key not in storages:
                storages[key] = (infos[key], node, text)
        out.append(replace(r, storages=storages))
    return out


def _is_span(key: Any) -> bool:
    """Whether a storage key is a span of memory: ``(device, address)``."""
    return len(key) == 2 and type(key[1]) is int


def apart(found: list[dict]) -> tuple[bool, dict, dict]:
    """Whether the storages in ``found`` (each root's ``key -> (info, ...)``) have one size
    per key and no two of them overlap on a device: then :func:`one_allocation` changes
    nothing. In C-level passes (a model's thousands of storages). With it, what was
    read: key -> bytes, and per device the spans' starts and ends, sorted."""
    size_of = _size_of(found)
    spans = None if size_of is None else _sorted_spans(size_of)
    return spans is not None, size_of or {}, spans or {}


def _size_of(found: list[dict]) -> dict | None:
    """key -> bytes of the storages in ``found``; None where one key has two sizes (a
    storage at another's address)."""
    items = list(chain.from_iterable(map(dict.items, found)))
    keys = list(map(_FIRST, items))
    sizes = list(map(_NBYTES, map(_FIRST, map(_SECOND, items))))
    size_of = dict(zip(keys, sizes))
    if len(size_of) != len(keys) and any(map(ne, map(size_of.__getitem__, keys), sizes)):
        return None
    return size_of


def _sorted_spans(size_of: dict) -> dict | None:
    """Per device, the starts and the ends of the spans among ``size_of``'s keys, sorted;
    None where two of them meet."""
    out = {}
    for device, pairs in _spans(size_of).items():
        pairs.sort()
        starts, ends = list(map(_FIRST, pairs)), list(map(_SECOND, pairs))
        if any(map(gt, ends, islice(starts, 1, None))):
            return None
        out[device] = (starts, ends)
    return out


class Apart:
    """Storages proven apart (one size per key, no two overlapping), kept from scan to
    scan by the warm scan: a set of spans of which every subset is apart too, whatever
    has been freed since. A kept record proven against it carries its generation
    (``Kept.apart``); a rebuild starts a new one.

    ``sizes``: key -> bytes of every storage proven; ``runs``: per device, one or two
    lists of spans ``(starts, ends)``, each sorted by start between two sentinels
    (``ends`` never decrease, the spans being apart): most of them, then what the last
    scans added, merged into the first as it grows."""

    #: new storages a scan checks one list at a time; more: every storage is checked
    NEW = 8192
    #: stale spans (of storages no longer met) allowed beside the live ones, as a share
    STALE = 2
    __slots__ = ("gen", "sizes", "runs")

    def __init__(self) -> None:
        self.gen = 0
        self.sizes: dict = {}
        self.runs: dict = {}

    def check(self, reach: list, records: list) -> bool:
        """Whether the scan's storages (``reach``, root by root; ``records``: the warm
        scan's record where the root's was reused, else None) are apart. Records proven
        before are skipped; the others' storages are checked against the spans kept and
        added. Where that cannot prove it (a span meets one kept, or too many kept are
        stale), every storage is checked (:func:`apart`) and the spans rebuilt."""
        gen = self.gen
        new = [r.storages for r, got in zip(reach, records)
               if r.storages and (got is None or got.apart != gen)]
        if sum(map(len, new)) <= self.NEW and not self._stale(reach) and self._add(new):
            for got in records:
                if got is not None:
                    got.apart = gen
            return True
        return self._rebuild(reach, records)

    def _stale(self, reach: list) -> bool:
        """Whether the spans kept outnumber those of ``reach``'s storages too much (the
        rest of them are storages since gone). (The storages counted only where it can
        matter: a pass over every root.)"""
        return (len(self.sizes) > self.NEW and
                len(self.sizes) > self.STALE * sum(map(len, map(_STORAGES, reach))) + self.NEW)

    def _rebuild(self, reach: list, records: list) -> bool:
        self.gen += 1
        ok, sizes, spans = apart([r.storages for r in reach if r.storages])
        self.sizes, self.runs = {}, {}
        if not ok:
            return False   # (the next scan checks every storage again)
        self.sizes = sizes
        for device, (starts, ends) in spans.items():
            self.runs[device] = [_run(starts, ends)]
        for got in records:
            if got is not None:
                got.apart = self.gen
        return True

    def _add(self, found: list[dict]) -> bool:
        """Add ``found``'s storages where none meets a kept one nor another of them (in
        C-level passes, as :func:`apart`)."""
        size_of = _size_of(found)
        if size_of is None:
            return False   # one key, two sizes: a storage at another's address
        had = list(map(self.sizes.get, size_of))
        if had.count(None) != len(had):
            if any(map(ne, had, size_of.values())) and any(map(_differs, had, size_of.values())):
                return False   # a key kept with another size
            size_of = {k: n for (k, n), h in zip(size_of.items(), had) if h is None}
        spans = _sorted_spans(size_of)
        if spans is None:
            return False   # two of them meet
        for device, (starts, ends) in spans.items():
            if any(_meet(run, starts, ends) for run in self.runs.get(device, ())):
                return False
        for device, (starts, ends) in spans.items():
            self._add_run(device, starts, ends)
        self.sizes.update(size_of)
        return True

    def _add_run(self, device: Any, starts: list, ends: list) -> None:
        """Sorted spans apart from those kept, into ``device``'s newest run (made anew
        from both, which sorts as fast as a merge), or with the rest once it has grown
        to an eighth of them. (Spans apart: their ends sort as their starts do.)"""
        runs = self.runs.setdefault(device, [])
        if not runs:
            runs.append(_run(starts, ends))
            return
        last = runs[-1] if len(runs) > 1 else ([_LOW, _HIGH], [_LOW, _HIGH])
        merged = len(last[0]) + len(starts) > max(self.NEW, (len(runs[0][0]) >> 3))
        group = runs if merged else [last]
        new = _run(sorted(chain(starts, *(r[0][1:-1] for r in group))),
                   sorted(chain(ends, *(r[1][1:-1] for r in group))))
        runs[:] = [new] if merged else [runs[0], new]


def _spans(size_of: dict) -> dict:
    """The spans among ``size_of``'s keys, by device: ``device -> [(start, end), ...]``
    (C-level passes where every key is a span of one device, as most often)."""
    keys = list(size_of)
    if keys and set(map(len, keys)) == {2}:
        devices = set(map(_FIRST, keys))
        starts = list(map(_SECOND, keys))
        if len(devices) == 1 and set(map(type, starts)) == {int}:
            return {devices.pop(): list(zip(starts, map(add, starts, size_of.values())))}
    spans: dict = {}
    for key, n in size_of.items():
        if _is_span(key):
            spans.setdefault(key[0], []).append((key[1], key[1] + n))
    return spans


#: before and after every run's spans: no span meets them
_LOW, _HIGH = -1, 1 << 80


def _run(starts: list, ends: list) -> tuple[list, list]:
    return [_LOW] + starts + [_HIGH], [_LOW] + ends + [_HIGH]


def _differs(had: Any, n: int) -> bool:
    return had is not None and had != n


def _meet(run: tuple[list, list], starts: list, ends: list) -> bool:
    """Whether a span ``[starts[i], ends[i])`` meets one of ``run``'s (C-level passes:
    each one's place among the run's starts, then its neighbours on either side)."""
    run_starts, run_ends = run
    at = list(map(bisect_right, repeat(run_starts), starts))
    if any(map(gt, map(run_ends.__getitem__, map(sub, at, repeat(1))), starts)):
        return True   # the span before it ends inside it
    return any(map(lt, map(run_starts.__getitem__, at), ends))   # the next starts inside


def by_allocation(reach: list, records: list, warm: Any) -> list:
    """:func:`one_allocation` of a scan's reach; with a warm scan's state, proven through
    its :class:`Apart` (``records``: each root's reused record, or None), where only what
    no earlier scan proved is looked at."""
    if warm is None:
        return one_allocation(reach)
    if warm.apart.check(reach, records):
        return reach
    return _rekey(reach)
