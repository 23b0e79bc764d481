"""Replay a recorded stream of the sidebar's comm messages from a real kernel.

Run inside a kernel (a notebook cell)::

    import runpy; runpy.run_path("tests/e2e/replay_kernel.py")["start"]("stream.json")

It registers the comm target ``jupyter_gpumem`` in this kernel (in place of
the product's, which is not loaded) and, when the sidebar opens its comm,
sends the recorded messages (scripts/record_stream.py writes them): ``hello``
first, then every ``devices`` and ``snapshot`` message in order, at once, with
their times moved so that the recording ends just before this cell ran. Each
snapshot pushed after a recorded cell carries that cell's start and end
(``cell``), so the timeline draws its bands. Requests are answered from the
recording: ``refresh`` and ``set_device`` with its last snapshot, ``purge``
with an error line (nothing to purge in a recording).
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

TARGET = "jupyter_gpumem"


def _shift(data: dict, offset: float) -> dict:
    """The message with every ``time`` field moved by ``offset`` seconds."""
    data = copy.deepcopy(data)
    _shift_own(data, offset)
    snap = data.get("snapshot")
    if isinstance(snap, dict):
        _shift_own(snap, offset)
        cluster = snap.get("cluster")
        if isinstance(cluster, dict):
            _shift_time(cluster, offset)
    return data


def _shift_own(part: dict, offset: float) -> None:
    """``part``'s own ``time`` and its devices' (in place)."""
    _shift_time(part, offset)
    for device in part.get("devices") or []:
        _shift_time(device, offset)


def _shift_time(part: dict, offset: float) -> None:
    if isinstance(part.get("time"), (int, float)):
        part["time"] += offset


def _wall_times(stream: dict) -> list[float]:
    """Wall-clock time of each message: its own ``time`` field where it has one."""
    started = float(stream.get("started") or 0.0)
    out = []
    for m in stream["messages"]:
        data = m["data"]
        t = data.get("time")
        if not isinstance(t, (int, float)) and isinstance(data.get("snapshot"), dict):
            t = data["snapshot"].get("time")
        out.append(float(t) if isinstance(t, (int, float)) else started + float(m["t"]))
    return out


def prepared(stream: dict, end_at: float) -> list[dict]:
    """The recorded messages, moved in time to end at ``end_at``, cells attached."""
    messages = stream["messages"]
    walls = _wall_times(stream)
    offset = end_at - max(walls)
    started = float(stream.get("started") or walls[0])
    cells = list(stream.get("cells") or [])
    out = []
    for m, wall in zip(messages, walls):
        data = _shift(m["data"], offset)
        if data.get("type") == "snapshot" and "reply_to" not in data and cells:
            # the snapshot a cell's end pushed: the first one after that end
            if m["t"] >= cells[0]["t_end"]:
                cell = cells.pop(0)
                data["snapshot"]["cell"] = {"start": started + cell["t"] + offset,
                                            "end": started + cell["t_end"] + offset}
        out.append(data)
    return out


def start(path: str) -> str:
    """Register the replaying comm target; return a line that says what it replays."""
    stream = json.loads(Path(path).read_text())
    messages = prepared(stream, end_at=time.time() - 1.0)
    snapshots = [m for m in messages if m.get("type") == "snapshot"]
    last = snapshots[-1] if snapshots else None

    def on_open(comm, open_msg):
        def on_msg(msg):
            data = (msg.get("content") or {}).get("data") or {}
            kind, rid = data.get("type"), data.get("id")
            if kind in ("refresh", "set_device") and last is not None:
                comm.send({**last, "reply_to": rid})
            elif kind == "purge":
                comm.send({"type": "error", "reply_to": rid,
                           "message": "a recorded stream: nothing to purge"})

        comm.on_msg(on_msg)
        for data in messages:
            comm.send(data)

    from comm import get_comm_manager

    get_comm_manager().register_target(TARGET, on_open)
    where = ", ".join(stream.get("gpus") or []) or "the host"
    return (f"replaying {len(messages)} messages recorded {stream.get('recorded_at')} "
            f"on {stream.get('device')} ({where})")
