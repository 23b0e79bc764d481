"""The visualizer's file: a pickle of ``torch.cuda.memory._snapshot()``'s format, the cells'
frames named ``In[N]`` (https://pytorch.org/memory_viz opens it)."""
from __future__ import annotations

import os
import pickle
from typing import Any, Callable

from ..files import check_file, write_file
from ..cells import IN_RE, CellNames
from .index import ALLOC, FREE
from ...backends.base import is_a

#: the names the visualizer's file may have (it opens a pickle)
SUFFIXES = (".pickle", ".pkl")


def check_path(path: str) -> str:
    """The path to write, expanded; ``ValueError`` (one line) for a name without a
    pickle's suffix, or a path :func:`..files.check_file` refuses (a FIFO, a symlink, a
    directory, a missing folder)."""
    path = os.path.expanduser(str(path))
    if not path.lower().endswith(SUFFIXES):
        raise ValueError(f"{path}: the visualizer opens a pickle: name the file "
                         f"{' or '.join(SUFFIXES)} (e.g. {os.path.splitext(path)[0]}.pickle)")
    return check_file(path)


def dump(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` whole or not at all (:func:`..files.write_file`)."""
    write_file(check_path(path), lambda f: pickle.dump(data, f))


def rename_cells(data: dict, cells: CellNames) -> int:
    """Name the frames of notebook cells ``In[N]`` in a ``_snapshot()`` dict, in place
    (torch shares frame dicts between blocks and events: each is renamed once)."""
    done: set[int] = set()
    count = 0

    def fix(frames) -> None:
        nonlocal count
        for f in frames or ():
            if not is_a(f, dict) or id(f) in done:
                continue
            done.add(id(f))
            n = cells.number(f.get("filename"))
            if n is not None and not IN_RE.match(str(f.get("filename"))):
                f["filename"] = f"In[{n}]"
                count += 1

    for seg in data.get("segments") or ():
        fix(seg.get("frames"))
        for b in seg.get("blocks") or ():
            fix(b.get("frames"))
    for trace in data.get("device_traces") or ():
        for e in trace:
            fix(e.get("frames"))
    return count


def cell_frame(n: int) -> dict:
    """The one frame of a block recorded without stacks: its cell."""
    return {"filename": f"In[{n}]", "line": 0, "name": f"cell [{n}]"}


def frame_cells_by_time(data: dict, cell_at: Callable[[float], Any],
                        block_cells: dict | None = None) -> int:
    """Trace at cell depth: give each event and block that has no frame the frame of the
    cell during which it was allocated (from the event's ``time_us``), in place; a block
    gets its cell from ``block_cells`` (``(device, address)`` -> cell, what trace found
    for it), else its last allocation event's. Returns how many were given one."""
    frames: dict[int, list] = {}
    count = 0

    def of(n) -> list | None:
        if type(n) is not int:
            return None
        fr = frames.get(n)
        if fr is None:
            fr = frames[n] = [cell_frame(n)]
        return fr

    last: list[dict] = []
    for trace in data.get("device_traces") or ():
        at_addr: dict = {}
        for e in trace:
            e.setdefault("frames", [])    # torch leaves the key out where it took no stack
            if e["frames"] or not e.get("time_us"):
                continue
            if e.get("action") == ALLOC:
                fr = of(cell_at(e["time_us"] / 1e6))
                if fr is not None:
                    e["frames"] = fr
                    at_addr[e.get("addr")] = fr
                    count += 1
        last.append(at_addr)
    for seg in data.get("segments") or ():
        dev = int(seg.get("device", 0))
        at_addr = last[dev] if dev < len(last) else {}
        seg.setdefault("frames", [])
        for b in seg.get("blocks") or ():
            b.setdefault("frames", [])
            if not b.get("frames") and b.get("state") == "active_allocated":
                fr = of((block_cells or {}).get((dev, b.get("address")))) \
                    or at_addr.get(b.get("address"))
                if fr is not None:
                    b["frames"] = fr
                    count += 1
    return count


def host_snapshot(host: Any, cells: CellNames, cell_at: Callable[[float], Any]) -> dict:
    """A host recorder's records shaped like ``torch.cuda.memory._snapshot()``: one
    segment per live storage (its frames named ``In[N]``, each frame once; recorded
    without stacks, its cell's frame), the events as device 0's trace."""
    if host is None:
        return {"segments": [], "device_traces": [[]]}
    host.sweep()

    def frames(rec_frames, t) -> list:
        out, seen = [], set()
        for fr in rec_frames or ():
            if fr is None:
                continue
            n = cells.number(fr[0])
            name = f"In[{n}]" if n is not None else fr[0]
            if (name, fr[1], fr[2]) in seen:
                continue
            seen.add((name, fr[1], fr[2]))
            out.append({"filename": fr[0], "line": fr[1], "name": fr[2]})
        if not out and t is not None:
            n = cell_at(t)
            if type(n) is int:
                out.append(cell_frame(n))
        return out

    segments = []
    for ptr, r in sorted(host.live().items()):
        fr = frames((r.inner, r.cin, r.cout), r.time)
        kind = "large" if r.nbytes > (1 << 20) else "small"
        segments.append({
            "device": 0, "address": ptr, "total_size": r.nbytes, "allocated_size": r.nbytes,
            "active_size": r.nbytes, "requested_size": r.nbytes, "stream": 0,
            "segment_type": kind, "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": fr,
            "blocks": [{"address": ptr, "size": r.nbytes, "requested_size": r.nbytes,
                        "state": "active_allocated", "frames": fr}]})
    trace = []
    for action, ptr, nbytes, t, fr in host.events:
        entries = [action] if action == ALLOC else [FREE, "free_completed"]
        for act in entries:
            trace.append({"action": act, "addr": ptr, "size": nbytes, "stream": 0,
                          "time_us": int(t * 1e6),
                          "frames": frames(fr, t) if action == ALLOC else []})
    data = {"segments": segments, "device_traces": [trace], "allocator_settings": {}}
    rename_cells(data, cells)
    return data
