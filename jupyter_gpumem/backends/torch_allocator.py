"""PyTorch's CUDA caching allocator, read from ``torch.cuda.memory_snapshot()``.

Pure logic over the snapshot's plain lists and dicts (no torch import), so the same code
classifies a live allocator and a recorded one: segments and their pools, cuBLAS/cuBLASLt
workspaces, the cached free blocks, and what a purge gives back to the device. What each
is and how it is told apart: docs/ARCHITECTURE.md#the-cuda-caching-allocator.
"""
from __future__ import annotations

import os
import re
from bisect import bisect_right
from typing import Iterable

from .base import Internal
from ..units import fmt_bytes
from .base import is_a

MiB = 1 << 20
DEFAULT_POOL = (0, 0)
INACTIVE, ACTIVE, PENDING = 0, 1, 2
_STATES = {"inactive": INACTIVE, "active_allocated": ACTIVE, "active_pending_free": PENDING}
#: expandable segments map physical memory in pages of this size (small, large pool)
_PAGE = {True: 2 * MiB, False: 20 * MiB}
_CONFIG_RE = re.compile(r":([0-9]+):([0-9]+)")


# -- workspace sizes ------------------------------------------------------------------------
def parse_workspace_config(text: str | None) -> int | None:
    """Bytes of ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs, summed), as torch
    parses it; ``None`` when unset or unparsable (torch then uses its default)."""
    if not text:
        return None
    pairs = _CONFIG_RE.findall(text)
    if not pairs:
        return None
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def default_workspace_sizes(major: int | None, hip: bool = False) -> tuple[int, ...]:
    """torch's default cuBLAS workspace size for a GPU of compute capability ``major``:
    32 MiB on Hopper (9.x; 10.x to 12.x in the torch versions that chose so), else
    ``:4096:2:16:8``. Where torch versions differ (10.x to 12.x), both sizes."""
    small = 4096 * 1024 * 2 + 16 * 1024 * 8
    if hip:
        return (32 * MiB, 128 * MiB)
    if major == 9:
        return (32 * MiB,)
    if major is not None and 10 <= major <= 12:
        return (32 * MiB, small)
    return (small,)


def workspace_sizes(major: int | None, *, hip: bool = False, env=None,
                    cublas: int | None = None, cublaslt: int | None = None) -> dict[int, str]:
    """Workspace size in bytes -> what a block of that size is. ``cublas``/``cublaslt``:
    the sizes torch reports where it has a reader (newer versions)."""
    env = os.environ if env is None else env
    out: dict[int, str] = {}
    if cublas is not None:
        blas_sizes: tuple[int, ...] = (int(cublas),)
    else:
        configured = parse_workspace_config(env.get("CUBLAS_WORKSPACE_CONFIG") or (
            env.get("HIPBLAS_WORKSPACE_CONFIG") or env.get("ROCBLAS_WORKSPACE_CONFIG") if hip else None))
        blas_sizes = (configured,) if configured else default_workspace_sizes(major, hip)
    if cublaslt is not None:
        lt_sizes: tuple[int, ...] = (int(cublaslt),)
    else:
        text = env.get("CUBLASLT_WORKSPACE_SIZE") or (env.get("HIPBLASLT_WORKSPACE_SIZE") if hip else None)
        try:
            lt_sizes = (int(text) * 1024,) if text else (() if hip else (1024 * 1024,))
        except ValueError:
            lt_sizes = () if hip else (1024 * 1024,)
    for size in blas_sizes:
        if size:
            out[size] = "cuBLAS workspace"
    for size in lt_sizes:
        if size:
            out[size] = "cuBLAS/cuBLASLt workspace" if size in out else "cuBLASLt workspace"
    return out


# -- the allocator of one device ------------------------------------------------------------
class Segment:
    """One segment: base address, size, pool, expandable or not, small pool or not, and
    its blocks as ``(address, size, requested size, state)``."""

    __slots__ = ("base", "total", "pool", "expandable", "small", "blocks")

    def __init__(self, base, total, pool, expandable, small, blocks):
        self.base, self.total, self.pool = base, total, pool
        self.expandable, self.small, self.blocks = expandable, small, blocks

    @property
    def end(self) -> int:
        return self.base + self.total


class PoolFigures:
    """What one pool's segments hold, before the names are known."""

    __slots__ = ("segments", "free_segments", "free_segments_bytes", "free_pages",
                 "free_in_use", "free_in_use_blocks", "pending", "pending_blocks",
                 "candidates", "active", "free")

    def __init__(self) -> None:
        self.segments = self.free_segments = self.free_segments_bytes = self.free_pages = 0
        self.free_in_use = self.free_in_use_blocks = self.pending = self.pending_blocks = 0
        self.free = 0
        self.candidates: list[tuple[int, int, str]] = []   # blocks of a workspace's size
        self.active: list[tuple[int, int]] = []            # every active block


class AllocatorView:
    """The segments of one device, read once from a ``memory_snapshot()`` list.

    Kept by :class:`~jupyter_gpumem.backends.pytorch.TorchBackend` until the
    allocator's counters move; classifying against the names' storages is a
    cheap second step (:meth:`internals`), done for every snapshot.

    ``empty_cache()`` gives back the wholly free segments of the default pool and
    of private pools whose CUDA graph is gone (``released``: pools the caller
    knows to be so); a live graph's pool keeps its blocks.
    """

    def __init__(self, segments: Iterable[dict], index: int, sizes: dict[int, str]) -> None:
        self.index = index
        self.sizes = dict(sizes)
        self.segments: list[Segment] = []
        for seg in segments:
            if seg.get("device", index) != index:
                continue
            base = int(seg.get("address", 0))
            pool = seg.get("segment_pool_id")
            pool = tuple(int(x) for x in pool) if is_a(pool, (tuple, list)) else DEFAULT_POOL
            blocks = []
            addr = base
            for b in seg.get("blocks") or ():
                size = int(b.get("size", 0))
                at = int(b.get("address", addr))
                req = b.get("requested_size")
                blocks.append((at, size, int(req) if req is not None else size,
                               _STATES.get(b.get("state"), ACTIVE)))
                addr = at + size
            self.segments.append(Segment(base, int(seg.get("total_size", addr - base)), pool,
                                         bool(seg.get("is_expandable")),
                                         seg.get("segment_type") == "small", tuple(blocks)))
        self.segments.sort(key=lambda s: s.base)
        self._bases = [s.base for s in self.segments]
        self.largest_free = 0
        self.pools: dict[tuple, PoolFigures] = {}
        for seg in self.segments:
            fig = self.pools.get(seg.pool)
            if fig is None:
                fig = self.pools[seg.pool] = PoolFigures()
            fig.segments += 1
            states = [b[3] for b in seg.blocks]
            free = sum(b[1] for b in seg.blocks if b[3] == INACTIVE)
            fig.free += free
            for b in seg.blocks:
                if b[3] == INACTIVE:
                    self.largest_free = max(self.largest_free, b[1])
                    continue
                fig.active.append((b[0], b[1]))
                if b[3] == PENDING:
                    fig.pending += b[1]
                    fig.pending_blocks += 1
                else:
                    label = self.sizes.get(b[1]) or self.sizes.get(b[2])
                    if label:
                        fig.candidates.append((b[0], b[1], label))
            if all(st == INACTIVE for st in states):
                fig.free_segments += 1
                fig.free_segments_bytes += seg.total
            elif seg.expandable:
                pages = _free_pages(seg, lambda b: b[3] == INACTIVE)
                fig.free_pages += pages
                fig.free_in_use += free - pages
                fig.free_in_use_blocks += states.count(INACTIVE)
            else:
                fig.free_in_use += free
                fig.free_in_use_blocks += states.count(INACTIVE)

    @property
    def graph_pools(self) -> set:
        """The private pools of CUDA graphs (``(N, 0)``) on this device."""
        return {p for p in self.pools if p != DEFAULT_POOL and p[0] != 0}

    # -- who owns a block -----------------------------------------------------------------
    def segment_of(self, ptr: int) -> Segment | None:
        i = bisect_right(self._bases, ptr) - 1
        if i >= 0 and ptr < self.segments[i].end:
            return self.segments[i]
        return None

    def _released(self, released) -> set:
        return {DEFAULT_POOL} | (set(released) & set(self.pools))

    def workspaces(self, reached: "Reached", released=()) -> dict[str, list[tuple[int, int]]]:
        """Label -> the workspace blocks ``(address, size)``: blocks of a workspace's size
        that no name's storage lies in, in the pools ``empty_cache()`` gives back."""
        out: dict[str, list] = {}
        for pool in self._released(released):
            for addr, size, label in self.pools[pool].candidates if pool in self.pools else ():
                if not reached.inside(addr, size):
                    out.setdefault(label, []).append((addr, size))
        return out

    def internals(self, dev: str, reached: "Reached", *, clears_workspaces: bool = True,
                  sizes_note: dict | None = None, released=()) -> list[Internal]:
        """The allocator's internals on this device (see the module docstring)."""
        out: list[Internal] = []
        for label, blocks in sorted(self.workspaces(reached, released).items()):
            n = len(blocks)
            each = {size for _, size in blocks}
            size_text = fmt_bytes(blocks[0][1]) + " each" if len(each) == 1 else "sizes vary"
            out.append(Internal(
                label + ("s" if n > 1 else ""), dev, sum(s for _, s in blocks), "torch", count=n,
                freed_by_purge=clears_workspaces, kind="allocated", blocks=tuple(blocks),
                note=(f"one per cuBLAS handle and stream (the autograd engine's thread has "
                      f"its own), {size_text}{(sizes_note or {}).get(label, '')}; found as "
                      f"the unnamed blocks of that size; purge clears them")
                + ("" if clears_workspaces else "; this torch cannot clear them")))
        pools = self._released(released)
        figs = [self.pools[p] for p in pools if p in self.pools]
        pending = sum(f.pending for f in figs)
        if pending:
            out.append(Internal(
                "freed blocks waiting for their streams", dev, pending, "torch",
                count=sum(f.pending_blocks for f in figs), freed_by_purge=True, kind="allocated",
                note="freed tensors that another stream may still use (record_stream): "
                     "free once that stream's work is done"))
        for pool, fig in sorted(self.pools.items()):
            if pool in pools:
                continue
            graph = pool[0] != 0
            what = "CUDA graph private pool" if graph else "torch.cuda.MemPool"
            kept_blocks = tuple(b for b in fig.active if not reached.inside(*b))
            kept = sum(size for _, size in kept_blocks)
            why = ("freed once the CUDA graph that owns it is deleted (then a purge gives "
                   "it back)" if graph else "freed when the MemPool is deleted")
            if kept:
                out.append(Internal(
                    f"{what} {pool}: kept blocks", dev, kept, "torch", count=fig.segments,
                    freed_by_purge=False, kind="allocated", blocks=kept_blocks,
                    note=f"intermediate and workspace blocks the pool keeps for replay; {why}"
                    if graph else f"blocks allocated in the pool that no name reaches; {why}"))
            if fig.free:
                out.append(Internal(
                    f"{what} {pool}: cached free blocks", dev, fig.free, "torch",
                    count=fig.segments, freed_by_purge=False, kind="cached", note=why))
        dead = sorted(pools - {DEFAULT_POOL})
        tail = (f"; with the pools of deleted CUDA graphs {', '.join(map(str, dead))}"
                if dead else "")
        free_segments = sum(f.free_segments_bytes + f.free_pages for f in figs)
        if free_segments:
            out.append(Internal(
                "allocator cache: free segments", dev, free_segments, "torch",
                count=sum(f.free_segments for f in figs), freed_by_purge=True, kind="cached",
                note="cached by torch for reuse; `%gpumem purge` empties the cache "
                     "(torch.cuda.empty_cache)" + tail))
        in_use = sum(f.free_in_use for f in figs)
        if in_use:
            out.append(Internal(
                "allocator cache: free space in segments in use", dev, in_use, "torch",
                count=sum(f.free_in_use_blocks for f in figs), freed_by_purge=False,
                kind="cached",
                note="free blocks inside segments that also hold live tensors: the device gets "
                     "them back only once every tensor of the segment is freed" + tail))
        return out

    def returned(self, freed: "Reached", reached: "Reached", clears_workspaces: bool = True,
                 released=()) -> int:
        """Bytes ``empty_cache()`` gives back to the device once the storages in ``freed``
        and (when ``clears_workspaces``) the workspace blocks are freed: the segments
        then wholly free, of the default pool and of the ``released`` pools (their graph
        is gone), and the whole pages inside free ranges of expandable segments. A live
        graph's pool keeps its blocks."""
        pools = self._released(released)
        going: set[int] = set()
        if clears_workspaces:
            for blocks in self.workspaces(reached, released).values():
                going.update(addr for addr, _ in blocks)
        total = 0
        for seg in self.segments:
            if seg.pool not in pools:
                continue

            def is_free(b, _going=going):
                return b[3] != ACTIVE or b[0] in _going or freed.inside(b[0], b[1])

            if seg.expandable:
                total += _free_pages(seg, is_free)
            elif all(is_free(b) for b in seg.blocks):
                total += seg.total
        return total


def _free_pages(seg: Segment, is_free) -> int:
    """Bytes of the whole pages of an expandable segment inside its free ranges."""
    page = _PAGE[seg.small]
    total = 0
    start = None
    end = seg.base
    for b in seg.blocks + ((seg.end, 0, 0, ACTIVE),):   # a sentinel closes the last range
        if b[1] and is_free(b):
            if start is None or b[0] != end:
                if start is not None:
                    total += _pages_in(seg.base, start, end, page)
                start = b[0]
            end = b[0] + b[1]
        else:
            if start is not None:
                total += _pages_in(seg.base, start, end, page)
            start = None
            end = b[0] + b[1]
    return total


def _pages_in(base: int, start: int, end: int, page: int) -> int:
    first = -(-(start - base) // page)
    last = (end - base) // page
    return max(last - first, 0) * page


class Reached:
    """The storage pointers of one device, to ask whether one lies in a block."""

    __slots__ = ("ptrs", "_sorted")

    def __init__(self, ptrs: Iterable[int]) -> None:
        self.ptrs = ptrs if is_a(ptrs, (set, frozenset)) else set(ptrs)
        self._sorted: list[int] | None = None

    @classmethod
    def of(cls, keys: Iterable, dev: str) -> "Reached":
        """From storage keys ``(device, pointer)``: the pointers on ``dev``."""
        return cls({k[1] for k in keys if len(k) == 2 and k[0] == dev and type(k[1]) is int})

    def inside(self, addr: int, size: int) -> bool:
        if addr in self.ptrs:   # a storage starts where its block starts: the usual case
            return True
        if not self.ptrs:
            return False
        if self._sorted is None:
            self._sorted = sorted(self.ptrs)
        i = bisect_right(self._sorted, addr + size - 1) - 1
        return i >= 0 and self._sorted[i] >= addr
