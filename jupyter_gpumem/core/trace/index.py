"""A feed's snapshot (the format of ``torch.cuda.memory._snapshot()``), indexed: the active
blocks of each device by address, and its history of allocator events."""
from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

from .sites import Resolver

#: the events of a feed's history (``free_completed`` follows each ``free_requested``)
ALLOC, FREE = "alloc", "free_requested"


class Block(NamedTuple):
    addr: int
    size: int
    frames: list
    state: str


class DeviceIndex:
    """One device's part of a snapshot: active blocks by address, and its history."""

    def __init__(self, index: int, blocks: list[Block], trace: list) -> None:
        self.index = index
        self.blocks = sorted(blocks)
        self.addrs = [b.addr for b in self.blocks]
        self.by_addr = {b.addr: b for b in self.blocks}
        self.trace = trace
        self.last_alloc: dict[int, int] = {}
        for i, e in enumerate(trace):
            if e.get("action") == ALLOC:
                self.last_alloc[e.get("addr")] = i
        self._times: list | None = None
        #: ((after, before), site) of the blocks whose events left the ring (see queries)
        self.lost_site: tuple | None = None
        self._nearest: dict[int, int | None] = {}

    def block_at(self, ptr: int) -> Block | None:
        b = self.by_addr.get(ptr)
        if b is not None:
            return b
        i = bisect_right(self.addrs, ptr) - 1
        if i >= 0 and ptr < self.blocks[i].addr + self.blocks[i].size:
            return self.blocks[i]
        return None

    def nearest_cell_alloc(self, i: int, res: Resolver) -> int | None:
        """The last allocation before event ``i`` whose frames are in a cell (the
        answers are remembered along the way, so all the blocks together cost one pass)."""
        memo = self._nearest
        visited = []
        found = None
        j = i - 1
        while j >= 0:
            if j in memo:
                found = memo[j]
                break
            visited.append(j)
            e = self.trace[j]
            if e.get("action") == ALLOC and e.get("frames") and res.pick(e["frames"])[2] is not None:
                found = j
                break
            j -= 1
        for v in visited:
            memo[v] = found
        return found

    def oldest_time(self) -> float | None:
        """When the oldest event kept happened (unix seconds), else None."""
        for e in self.trace:
            t = e.get("time_us")
            if t:
                return t / 1e6
        return None

    def times(self) -> list:
        if self._times is None:
            self._times = [e.get("time_us") or 0 for e in self.trace]
        return self._times


class SnapshotIndex:
    def __init__(self, data: dict) -> None:
        self.data = data
        by_dev: dict[int, list[Block]] = {}
        for seg in data.get("segments") or ():
            dev = int(seg.get("device", 0))
            out = by_dev.setdefault(dev, [])
            addr = int(seg.get("address", 0))
            for b in seg.get("blocks") or ():
                size = int(b.get("size", 0))
                at = int(b.get("address", addr))
                if b.get("state") == "active_allocated":
                    out.append(Block(at, size, b.get("frames") or [], "active_allocated"))
                addr = at + size
        traces = data.get("device_traces") or []
        self.devices: dict[int, DeviceIndex] = {}
        for dev in set(by_dev) | set(range(len(traces))):
            trace = traces[dev] if dev < len(traces) else []
            if by_dev.get(dev) or trace:
                self.devices[dev] = DeviceIndex(dev, by_dev.get(dev, []), trace)

