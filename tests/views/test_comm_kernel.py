"""The sidebar's comm in a real kernel (ipykernel 7.4 over ZMQ, jupyter_client), driven as
JupyterLab 4.6 drives it: the comm opened and its requests sent over a kernel subshell
(``create_subshell_request`` on the control channel, ``subshell_id`` in each message's
header), so they are handled on the subshell's thread while the main thread may run a
cell. Whatever reads or changes the namespace (a scan, a purge) must run on the main
thread, between cells (jupyter_gpumem/handoff.py): the kernel records the thread inside
the real purge and the real scan."""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("torch")

from jupyter_client.manager import start_new_kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TARGET = "jupyter_gpumem"

RECORD = """\
%load_ext jupyter_gpumem
import threading, time, torch
import jupyter_gpumem.core.purge as _P, jupyter_gpumem.refresh as _S
seen = []
_real_purge, _real_build = _P.purge, _S.build
def _rec_purge(*a, **k):
    seen.append(('purge', threading.current_thread().name, k.get('dry_run')))
    return _real_purge(*a, **k)
def _rec_build(*a, **k):
    seen.append(('scan', threading.current_thread().name, None))
    return _real_build(*a, **k)
_P.purge, _S.build = _rec_purge, _rec_build
x = torch.ones(2**18)
y = torch.ones(2**18)
"""


class Lab:
    """Just enough of JupyterLab's side: a subshell, a comm on it, the messages kept."""

    def __init__(self, kc):
        self.kc = kc
        self.iopub: list[dict] = []
        self.subshell: str | None = None

    def pull(self, until, timeout: float = 30.0) -> dict:
        """Read IOPub until ``until(msg)`` holds for a message read now or before; that message."""
        for msg in self.iopub:
            if until(msg):
                return msg
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing yet
                continue
            msg["received"] = time.monotonic()
            self.iopub.append(msg)
            if until(msg):
                return msg
        raise AssertionError(f"no such message within {timeout} s: "
                             f"{[m['msg_type'] for m in self.iopub[-20:]]}")

    def create_subshell(self) -> str:
        msg = self.kc.session.msg("create_subshell_request", {})
        self.kc.control_channel.send(msg)
        reply = self.kc.control_channel.get_msg(timeout=30)
        assert reply["content"]["status"] == "ok", reply["content"]
        self.subshell = reply["content"]["subshell_id"]
        return self.subshell

    def delete_subshell(self, subshell: str) -> None:
        msg = self.kc.session.msg("delete_subshell_request", {"subshell_id": subshell})
        self.kc.control_channel.send(msg)
        reply = self.kc.control_channel.get_msg(timeout=30)
        assert reply["content"]["status"] == "ok", reply["content"]

    def shell_send(self, msg_type: str, content: dict, subshell: bool = True) -> dict:
        msg = self.kc.session.msg(msg_type, content)
        if subshell and self.subshell is not None:
            msg["header"]["subshell_id"] = self.subshell
        self.kc.shell_channel.send(msg)
        return msg

    def open_comm(self, subshell: bool = True) -> str:
        comm_id = uuid.uuid4().hex
        self.shell_send("comm_open", {"comm_id": comm_id, "target_name": TARGET, "data": {}},
                        subshell)
        return comm_id

    def request(self, comm_id: str, data: dict) -> float:
        self.shell_send("comm_msg", {"comm_id": comm_id, "data": data})
        return time.monotonic()

    def reply(self, comm_id: str, type_: str, reply_to=None, timeout: float = 30.0) -> dict:
        def match(m):
            if m["msg_type"] != "comm_msg" or m["content"].get("comm_id") != comm_id:
                return False
            data = m["content"]["data"]
            return data.get("type") == type_ and (reply_to is None
                                                  or data.get("reply_to") == reply_to)
        msg = self.pull(match, timeout)
        return dict(msg["content"]["data"], received=msg["received"])

    def execute(self, code: str) -> str:
        msg_id = self.kc.execute(code)
        self.pull(lambda m: m["msg_type"] == "status" and m["parent_header"].get("msg_id")
                  == msg_id and m["content"]["execution_state"] == "idle", 120)
        errors = [m for m in self.iopub if m["msg_type"] == "error"
                  and m["parent_header"].get("msg_id") == msg_id]
        assert not errors, errors[0]["content"]["traceback"]
        return msg_id

    def value(self, expr: str):
        msg_id = self.kc.execute(f"print(repr({expr}))")
        out = []
        self.pull(lambda m: m["msg_type"] == "status" and m["parent_header"].get("msg_id")
                  == msg_id and m["content"]["execution_state"] == "idle", 60)
        for m in self.iopub:
            if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
                out.append(m["content"]["text"])
        return eval("".join(out))  # noqa: S307 - what our own kernel printed


@pytest.fixture
def lab(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.kernel_info()
        info = kc.get_shell_msg(timeout=30)["content"]
        features = info.get("supported_features") or []
        lab = Lab(kc)
        lab.features = features
        lab.execute(RECORD)
        yield lab
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_over_a_subshell_a_scan_and_a_purge_run_on_the_main_thread(lab):
    assert "kernel subshells" in lab.features, "ipykernel 7.4 supports subshells"
    lab.create_subshell()
    comm = lab.open_comm()
    hello = lab.reply(comm, "hello")
    assert hello["busy"] is False and isinstance(hello["timeline"], list)
    lab.request(comm, {"type": "set_device", "id": 1, "device": "cpu"})
    snap = lab.reply(comm, "snapshot", 1)["snapshot"]
    assert snap["cell_running"] is False
    assert any(h["name"] == "x" for h in snap["holders"])
    lab.request(comm, {"type": "purge", "id": "p0", "names": ["x"], "dry_run": True})
    result = lab.reply(comm, "purge_result", "p0")["result"]
    assert result["dry_run"] is True
    seen = lab.value("seen")
    assert ("scan", "MainThread", None) in seen and ("purge", "MainThread", True) in seen
    assert {thread for _, thread, _ in seen} == {"MainThread"}, seen
    # the kernel's answer to a ping, at once
    lab.request(comm, {"type": "hello", "id": "ping"})
    assert lab.reply(comm, "hello", "ping")["busy"] is False


def test_while_a_cell_runs_a_purge_is_queued_at_once_runs_after_the_cell_and_a_cancel_works(lab):
    lab.create_subshell()
    lab.execute("seen.clear()")
    cell = lab.kc.execute("print('cell started', flush=True)\ntime.sleep(4)\n"
                          "seen.append(('cell', 'end', None))")
    # the cell's own code runs (its first line printed): the kernel's "busy" status comes
    # before IPython starts the cell, and a loaded machine can keep them apart
    lab.pull(lambda m: m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == cell
             and "cell started" in m["content"].get("text", ""))
    # a view opened while the kernel is busy gets its hello at once, busy
    comm = lab.open_comm()
    hello = lab.reply(comm, "hello", timeout=3)
    assert hello["busy"] is True
    asked = lab.request(comm, {"type": "purge", "id": "p1", "names": ["x"]})
    queued = lab.reply(comm, "queued", "p1", timeout=3)
    assert queued["request"] == "purge" and queued["message"] == "queued: runs when the cell ends"
    print(f"queued reply after {queued['received'] - asked:.3f} s (the cell sleeps 4 s)")
    lab.request(comm, {"type": "purge", "id": "p2", "names": ["y"]})
    lab.reply(comm, "queued", "p2", timeout=3)
    lab.request(comm, {"type": "cancel", "id": "c2", "request": "p2"})
    cancelled = lab.reply(comm, "cancelled", "c2", timeout=3)
    assert cancelled["request"] == "p2"
    lab.request(comm, {"type": "cancel", "id": "c3", "request": "p2"})
    assert "no queued request" in lab.reply(comm, "error", "c3", timeout=3)["message"]
    # devices keep flowing from the sampling thread and say a cell runs
    devices = lab.reply(comm, "devices", timeout=3)
    assert devices["cell_running"] is True
    result = lab.reply(comm, "purge_result", "p1", timeout=30)
    assert result["result"]["removed"][:1] == ["x"]
    assert result["received"] - asked > 2.0, "the purge waited for the cell"
    idle = lab.pull(lambda m: m["msg_type"] == "status" and m["parent_header"].get("msg_id")
                    == cell and m["content"]["execution_state"] == "idle")
    assert idle is not None
    seen = lab.value("seen")
    assert seen[:2] == [("cell", "end", None), ("purge", "MainThread", False)], seen
    assert lab.value("('x' in globals(), 'y' in globals())") == (False, True)
    # a cancel of what already ran is an error
    lab.request(comm, {"type": "cancel", "id": "c1", "request": "p1"})
    assert lab.reply(comm, "error", "c1", timeout=5)["message"]


def test_on_the_main_shell_while_idle_a_request_is_answered_as_before(lab):
    comm = lab.open_comm()          # no subshell: the main thread handles it
    lab.reply(comm, "hello")
    lab.request(comm, {"type": "set_device", "id": 5, "device": "cpu"})
    assert lab.reply(comm, "snapshot", 5)["snapshot"]["device"] == "cpu"
    lab.request(comm, {"type": "purge", "id": 6, "names": ["y"]})
    assert "y" in lab.reply(comm, "purge_result", 6)["result"]["removed"]
    assert not [m for m in lab.iopub if m["msg_type"] == "comm_msg"
                and m["content"]["data"].get("type") == "queued"]


def test_after_cells_and_replies_from_the_main_thread_requests_still_come_over_the_subshell(lab):
    """The kernel's own messages (a snapshot after a cell, a reply run on the main thread)
    must not make ipykernel route the frontend's later requests to the busy main thread."""
    lab.create_subshell()
    comm = lab.open_comm()
    lab.reply(comm, "hello")
    lab.request(comm, {"type": "set_device", "id": "d", "device": "cpu"})
    lab.reply(comm, "snapshot", "d")          # answered on the main thread
    lab.execute("z = torch.ones(4)")
    lab.reply(comm, "snapshot")               # the snapshot after the cell, main thread
    cell = lab.kc.execute("time.sleep(6)")
    lab.pull(lambda m: m["msg_type"] == "status" and m["parent_header"].get("msg_id") == cell
             and m["content"]["execution_state"] == "busy")
    # the sampling thread's devices messages go out meanwhile (with the cell's parent)
    lab.reply(comm, "devices", timeout=3)
    time.sleep(2.2)
    lab.request(comm, {"type": "hello", "id": "ping"})
    assert lab.reply(comm, "hello", "ping", timeout=2)["busy"] is True
    asked = lab.request(comm, {"type": "refresh", "id": "r"})
    queued = lab.reply(comm, "queued", "r", timeout=2)
    assert queued["received"] - asked < 2
    lab.reply(comm, "snapshot", "r", timeout=30)


def test_requests_over_a_subshell_that_is_gone_are_answered_on_the_main_shell(lab):
    """JupyterLab can hand a new comm a subshell it is deleting: its comm handler shares one
    subshell per comm target and kernel, and a comm closed (the kernel refused it before
    %load_ext) while the subshell's creation is still unanswered deletes it after a new
    comm of the same target took it. The new comm's messages then name a subshell the
    kernel no longer has, and ipykernel drops each with "Unknown subshell_id": the sidebar
    saw no answer to a scan or a purge. A comm of ours is never routed to a subshell the
    kernel does not have: the main shell answers instead."""
    gone = lab.create_subshell()
    lab.delete_subshell(gone)
    comm = lab.open_comm(subshell=False)    # opened before its subshell was known
    lab.reply(comm, "hello")
    for rid in ("d", "r1", "r2"):   # each over the subshell that is gone
        lab.request(comm, {"type": "set_device", "id": rid, "device": "cpu"})
        assert lab.reply(comm, "snapshot", rid, timeout=20)["snapshot"]["device"] == "cpu"
    lab.request(comm, {"type": "purge", "id": "p", "names": ["y"]})
    assert "y" in lab.reply(comm, "purge_result", "p", timeout=20)["result"]["removed"]
    assert lab.value("'y' in globals()") is False
