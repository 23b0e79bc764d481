"""What trace answers (the :class:`Tracer`'s queries): the site of each block, what no name
reaches grouped by site, the lines of a cell; read from one snapshot of the feed, kept
until its counters move.

A block's site comes, in this order, from its own frames (trace at line depth), from the
history's event that allocated it (its frames; without frames, the cell that ran at its
``time_us``, from the record of cell spans), from what an earlier snapshot found for it
(:meth:`Queries.carry_over`: the history is a ring, and a live block's event may leave
it), from the blocks that existed when trace was turned on, and last from when it must
have been allocated (after the last snapshot, before the oldest event kept): the cell
when only one ran then.
"""
from __future__ import annotations

import time
from bisect import bisect_right
from typing import Any, Iterable, Mapping

from ..cells import BETWEEN as AT_BETWEEN, CellNames
from .index import ALLOC, FREE, Block, DeviceIndex, SnapshotIndex
from .sites import BEFORE, BETWEEN, ROUNDING_NOTE, CellLines, LineAlloc, Resolver, Site, SiteGroup
from ...backends.base import is_a

NEAREST_NOTE = ("allocated on a thread with no Python frame (a C++ thread such as autograd's "
                "backward, or a cuBLAS workspace of that thread); the line is the cell's last "
                "line that allocated before it")


UNNUMBERED = Site(None, None, how="unknown",
                  note="allocated while code ran outside the numbered cells (run without "
                       "history, as a widget's or the sidebar's requests are)")


def split_key(key: Any) -> tuple[str | None, int | None]:
    """``(device, pointer)`` of a storage key, or ``(None, pointer)`` for a bare pointer."""
    if is_a(key, tuple) and len(key) == 2 and type(key[1]) is int:
        return str(key[0]), key[1]
    if type(key) is int:
        return None, key
    return None, None


class Queries:
    """The queries of :class:`~.tracer.Tracer` (which holds the state they read:
    ``feed``, ``spans``, ``cells``, ``depth``, ``before``, ``host``, ...)."""

    # -- the CUDA snapshot ----------------------------------------------------------------
    def index(self) -> SnapshotIndex | None:
        if self.cuda != "on":
            return None
        key = self.feed.key()
        if key is not None and self._index is not None and self._index[0] == key:
            return self._index[1]
        taken = time.time()
        allocs = self.feed.allocations()
        idx = SnapshotIndex(self.feed.snapshot())
        after = self.feed.key()
        self._index = (after, idx) if after is not None and after == key else None
        self.carry_over(idx)
        self._refreshed_at, self._allocs_at_refresh = taken, allocs
        return idx

    def segments(self) -> list | None:
        """The allocator's segments from the snapshot trace keeps (what
        ``torch.cuda.memory_snapshot()`` returns), so other readers need not ask torch
        for a second one while trace is on (torch's includes the whole history)."""
        idx = self.index()
        return None if idx is None else idx.data.get("segments")

    def carry_over(self, idx: SnapshotIndex) -> None:
        """Keep the sites of live blocks that have no frames of their own for when their
        events have left the feed's ring of events."""
        res = Resolver(self.cells)
        keep: dict[tuple, Site] = {}
        unknown: set = set()
        for dev in idx.devices.values():
            for b in dev.blocks:
                if b.frames and res.pick(b.frames)[0] is not None:
                    continue      # its own Python frames tell
                k = (dev.index, b.addr, b.size)
                site = self.block_site(dev, b, res)
                if site.how == "unknown":
                    unknown.add(k)
                elif site.how != "before":
                    keep[k] = site
        self._carry, self._unknown = keep, unknown

    def _cell_at(self, t: float) -> int | None:
        n = self.spans.at(t)
        return n if type(n) is int else None

    def from_history(self, dev: DeviceIndex, i: int, res: Resolver) -> Site | None:
        e = dev.trace[i]
        site = res.site(e.get("frames"))
        if site is not None:
            return site
        t = e.get("time_us")
        where = self.spans.at(t / 1e6) if t else None
        if where == AT_BETWEEN:
            return BETWEEN
        cell = where if type(where) is int else None
        if t and where is None and self.depth == "cell":
            return UNNUMBERED
        if self.depth == "lines":
            # no Python frame: the cell line that allocated last before it, in the same cell
            k = dev.nearest_cell_alloc(i, res)
            if k is not None:
                p = dev.trace[k]
                tk = p.get("time_us")
                if cell is None or not tk or self._cell_at(tk / 1e6) in (cell, None):
                    n, filename, line, name = res.pick(p.get("frames"))[2]
                    return Site(n, line, CellNames.source(filename, line), filename, name,
                                None, how="nearest", note=NEAREST_NOTE)
        if cell is not None:
            if self.depth == "cell":
                return Site(cell, None, how="time",
                            note="the cell that ran when it was allocated (trace at cell "
                                 "depth: `%gpumem trace on --lines` for the line)")
            return Site(cell, None, how="cell",
                        note="allocated on a thread with no Python frame while this cell ran")
        return None

    def block_site(self, dev: DeviceIndex, b: Block, res: Resolver) -> Site:
        if b.frames:
            site = res.site(b.frames)
            if site is not None:
                return site
        i = dev.last_alloc.get(b.addr)
        if i is not None:
            site = self.from_history(dev, i, res)
            if site is not None:
                return site
        k = (dev.index, b.addr, b.size)
        site = self._carry.get(k)
        if site is not None:
            return site
        if (b.addr, b.size) in self.before.get(dev.index, ()):
            return BEFORE
        if len(dev.trace) < self.max_entries:
            # the history holds every event since trace was on, and not this block's
            return BEFORE
        if k not in self._unknown:
            site = self._lost_event(dev)
            if site is not None:
                return site
        return Site(None, None, how="unknown",
                    note=f"no record: allocated before the oldest of the {self.max_entries:,} "
                         f"events kept, on a thread with no Python frame (raise --max-entries)")

    def _lost_event(self, dev: DeviceIndex) -> Site | None:
        """A block whose allocation left the ring since the last snapshot: it was
        allocated after that snapshot and before the oldest event kept; the cell, when
        one alone ran in that time."""
        lo = self._refreshed_at if self._refreshed_at is not None else self.started
        hi = dev.oldest_time()
        memo = dev.lost_site
        if memo is not None and memo[0] == (lo, hi):
            return memo[1]
        site = None
        cells = self.spans.overlapping(lo, hi) if hi is not None and hi >= lo else []
        if len(cells) == 1 and type(getattr(cells[0], "count", None)) is int:
            site = Site(cells[0].count, None, how="time",
                        note="its event has left the history kept; the only cell that ran "
                             "between the last look and the oldest event kept")
        dev.lost_site = ((lo, hi), site)     # the same for every such block of the device
        return site

    # -- queries --------------------------------------------------------------------------
    def host_site(self, r: Any) -> Site | None:
        """The site of a host recorder's record (``None``: no record)."""
        if r is None:
            return None
        frames = [fr for fr in (r.inner, r.cin, r.cout) if fr is not None]
        if frames:
            return Resolver(self.cells).site(frames)
        where = self.spans.at(r.time)
        if where == AT_BETWEEN:
            return BETWEEN
        if type(where) is int:
            return Site(where, None, how="time")
        return None

    def site_of(self, key: Any, nbytes: int | None = None) -> Site | None:
        return self.sites_of([key]).get(key)

    def sites_of(self, keys: Iterable) -> dict:
        out: dict = {}
        idx = None
        res = Resolver(self.cells)
        for key in keys:
            dev, ptr = split_key(key)
            if ptr is None:
                continue
            if dev in (None, "cpu") and self.host is not None:
                site = self.host_site(self.host.record(ptr))
                if site is None and ptr in self.before_host:
                    site = BEFORE
                if site is not None:
                    out[key] = site
                    continue
            if dev == "cpu":
                continue
            if dev is not None and not dev.startswith("cuda"):
                continue
            if idx is None:
                idx = self.index()
                if idx is None:
                    continue
            ordinals = [int(dev[5:])] if dev and dev[5:].isdigit() else list(idx.devices)
            for o in ordinals:
                d = idx.devices.get(o)
                b = d.block_at(ptr) if d is not None else None
                if b is not None:
                    out[key] = self.block_site(d, b, res)
                    break
        return out

    def unattributed_sites(self, reached: Iterable | Mapping, device: str,
                           internals: Mapping[int, str] | None = None) -> list[SiteGroup]:
        """See :func:`jupyter_gpumem.core.trace.unattributed_sites`."""
        sizes: dict[int, int | None] = {}
        for k in reached or ():
            ptr = k if type(k) is int else k[1] if (
                is_a(k, tuple) and len(k) == 2 and k[0] == device and type(k[1]) is int) \
                else None
            if ptr is not None:
                n = reached.get(k) if is_a(reached, Mapping) else None
                sizes[ptr] = (sizes.get(ptr) or 0) + n if type(n) is int else sizes.get(ptr)
        ranges = sorted(sizes)
        internals = internals or {}
        groups: dict[tuple, SiteGroup] = {}

        def add(site: Site, size: int) -> None:
            g = groups.get(site.key())
            if g is None:
                groups[site.key()] = SiteGroup(site, size, 1, device)
            else:
                g.nbytes += size
                g.count += 1

        if device == "cpu":
            if self.host is not None:
                for ptr, r in self.host.live().items():
                    if ptr not in sizes and ptr not in internals:
                        add(self.host_site(r) or Site(None, None, how="unknown"), r.nbytes)
            return sorted(groups.values(), key=lambda g: (-g.nbytes, g.site.text))
        if not device.startswith("cuda:") or not device[5:].isdigit():
            return []
        idx = self.index()
        d = idx.devices.get(int(device[5:])) if idx is not None else None
        if d is None:
            return []
        res = Resolver(self.cells)
        rounding: dict[Any, SiteGroup] = {}
        for b in d.blocks:
            lo = bisect_right(ranges, b.addr - 1)
            hi = bisect_right(ranges, b.addr + b.size - 1)
            if hi > lo:       # names reach storages in this block: what is past them
                held = [sizes[p] for p in ranges[lo:hi]]
                past = b.size - sum(held) if all(type(n) is int for n in held) else 0
                if past > 0:
                    cell = self.block_site(d, b, res).cell
                    g = rounding.get(cell)
                    if g is None:
                        rounding[cell] = SiteGroup(
                            Site(cell, None, how="rounding", note=ROUNDING_NOTE), past, 1, device)
                    else:
                        g.nbytes += past
                        g.count += 1
                continue
            if b.addr in internals:
                continue      # shown as a framework internal already
            add(self.block_site(d, b, res), b.size)
        key = lambda g: (-g.nbytes, g.site.text)  # noqa: E731
        return sorted(groups.values(), key=key) + sorted(rounding.values(), key=key)

    def cell_lines(self, n: int, device: str | None = None, top: int | None = None) -> CellLines:
        totals: dict[tuple, int] = {}
        held: dict[tuple, int] = {}
        peaks: dict[str, LineAlloc] = {}
        note = None
        lines = self.depth == "lines"
        span = self.spans.span_of(n)
        if span is not None and span[1] is None:
            span = (span[0], time.time())
        idx = self.index() if device in (None, "all") or str(device).startswith("cuda") else None
        if idx is not None:
            res = Resolver(self.cells)
            for o, d in idx.devices.items():
                if device and device.startswith("cuda:") and device != f"cuda:{o}":
                    continue
                peak = self._device_cell(d, n, span, res, totals, held)
                if peak is not None:
                    peaks[f"cuda:{o}"] = peak
        if self.host is not None and device in (None, "all", "cpu"):
            if lines:
                for k, v in self.host.by_cell.get(n, {}).items():
                    totals[k] = totals.get(k, 0) + v
            elif span is not None:
                got = sum(e[2] for e in self.host.events
                          if e[0] == ALLOC and span[0] <= e[3] <= span[1])
                if got:
                    totals[(None, None)] = totals.get((None, None), 0) + got
            if device == "cpu":
                note = "the host keeps no history of frees: no peak line"
        items = sorted((LineAlloc(line, CellNames.source(fn, line), b)
                        for (fn, line), b in totals.items() if b > 0),
                       key=lambda la: (-la.bytes, la.line or 0))
        if top is not None:
            items = items[:top]
        peak = max(peaks.values(), key=lambda p: p.bytes) if peaks else None
        return CellLines(n, items, peak=peak, held={line: b for (fn, line), b in held.items() if b > 0},
                         peaks=peaks, note=note, lines=lines)

    def _device_cell(self, d: DeviceIndex, n: int, span, res: Resolver,
                     totals: dict, held: dict) -> LineAlloc | None:
        trace = d.trace
        if not trace:
            return None
        if span is not None and trace[-1].get("time_us"):
            times = d.times()
            lo = bisect_right(times, span[0] * 1e6 - 1)
            hi = bisect_right(times, span[1] * 1e6 + 1)
        elif self.depth == "cell":
            return None   # no time window: nothing says which events are the cell's
        else:
            lo, hi = 0, len(trace)
        whole = self.depth == "cell"
        running = best = 0
        best_at = None
        last = None
        owner: dict[int, tuple] = {}
        in_cell = False
        for i in range(lo, hi):
            e = trace[i]
            a = e.get("action")
            if a == ALLOC:
                at = None
                if whole:
                    at = (None, None)
                else:
                    inner, cin, cout = res.pick(e.get("frames"))
                    if inner is not None:
                        if cout is not None and cout[0] == n:
                            at = last = (cout[1], cout[2])
                    elif last is not None or span is not None:
                        at = last     # no Python frame: the line that allocated last before
                    if at is None and span is None:
                        continue      # no time window: only this cell's own events count
                size = int(e.get("size") or 0)
                in_cell = True
                running += size
                if at is not None:
                    totals[at] = totals.get(at, 0) + size
                    held[at] = held.get(at, 0) + size
                    owner[e.get("addr")] = (at, size)
                if running > best:
                    best, best_at = running, at or (None, None)
            elif a == FREE and in_cell:
                size = int(e.get("size") or 0)
                running -= size
                o = owner.pop(e.get("addr"), None)
                if o is not None:
                    held[o[0]] = held.get(o[0], 0) - o[1]
        if best_at is None:
            return None
        return LineAlloc(best_at[1], CellNames.source(best_at[0], best_at[1]), best)
