"""A recording comm on the sidebar's comm target: the sidebar's requests delivered as
ipykernel's CommManager delivers them, every message the kernel would send kept (the
model is ipywidgets' DummyComm). Used by the comm's, the cluster's and the sidebar
frontend's tests."""
from __future__ import annotations

import json
import threading
import uuid

import comm as comm_pkg
from comm.base_comm import BaseComm

from jupyter_gpumem.views import comm as gpucomm


class RecordingComm(BaseComm):
    """A comm whose messages are kept instead of sent to a frontend."""

    def __init__(self, **kwargs):
        self.sent: list[tuple[str, dict, str]] = []
        super().__init__(**kwargs)

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        json.dumps(data)  # what the kernel sends must be JSON
        self.sent.append((msg_type, data, threading.current_thread().name))

    def messages(self, type_=None):
        out = [d for kind, d, _ in self.sent if kind == "comm_msg"]
        return [d for d in out if type_ is None or d.get("type") == type_]

    def clear(self):
        self.sent.clear()


def open_sidebar() -> RecordingComm:
    """Open a comm on the target the way ipykernel's CommManager does."""
    manager = comm_pkg.get_comm_manager()
    comm_id = uuid.uuid4().hex
    c = RecordingComm(comm_id=comm_id, primary=False, target_name=gpucomm.TARGET)
    manager.register_comm(c)
    manager.targets[gpucomm.TARGET](
        c, {"content": {"comm_id": comm_id, "target_name": gpucomm.TARGET, "data": {}}}
    )
    return c


def close_sidebar(c: RecordingComm) -> None:
    """Close a sidebar's comm the way the frontend does (a ``comm_close`` from it: the
    kernel's ``Comm.close()`` alone tells the comm's callbacks nothing)."""
    c.handle_close({"content": {"comm_id": c.comm_id, "data": {}}})


def send(c: RecordingComm, data) -> list[dict]:
    """Deliver one request from the sidebar; return the replies it caused."""
    start = len(c.sent)
    c.handle_msg({"content": {"comm_id": c.comm_id, "data": data}})
    return [d for kind, d, _ in c.sent[start:] if kind == "comm_msg" and d["type"] != "devices"]
