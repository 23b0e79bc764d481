"""Hostile inputs, round three: names that are not identifiers, keys of the user's own
types in ``Out``, streams whose ``write`` raises, odd device strings, and what
``%gpumem purge --all`` takes and keeps. Real shells, real kernels, real tensors."""
from __future__ import annotations

import os
import queue
import time
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402

N = 1 << 16
ROOT = Path(__file__).resolve().parent.parent


# -- streams whose write raises, in a real kernel ------------------------------------------
class _Kernel:
    """A kernel driven as a frontend does: cells, their replies, one comm."""

    def __init__(self, kc):
        self.kc = kc

    def reply(self, code: str, timeout: float = 30) -> dict | None:
        """The execute reply's content, or None when none came within ``timeout``."""
        msg_id = self.kc.execute(code)
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                msg = self.kc.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]
        return None

    def comm_open(self, target: str) -> str:
        comm_id = uuid.uuid4().hex
        msg = self.kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": target,
                                                "data": {}})
        self.kc.shell_channel.send(msg)
        return comm_id

    def comm_messages(self, comm_id: str, seconds: float) -> list[dict]:
        out, deadline = [], time.time() + seconds
        while time.time() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == comm_id:
                out.append(msg["content"]["data"])
        return out


RAISING_STREAMS = """
import sys
class Broken:
    def write(self, text):
        raise RuntimeError('this stream refuses text')
    def flush(self):
        pass
kept_out, kept_err = sys.stdout, sys.stderr
sys.stdout, sys.stderr = Broken(), Broken()
t = torch.ones(1000)
"""


def test_a_cell_that_breaks_both_streams_still_gets_its_reply_and_so_does_the_next(monkeypatch):
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    from jupyter_client.manager import start_new_kernel

    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        k = _Kernel(kc)
        assert k.reply("%load_ext jupyter_gpumem\nimport torch")["status"] == "ok"
        assert k.reply("%gpumem watch on --device cpu")["status"] == "ok"
        assert k.reply("%gpumem panel --device cpu --interval 0.2")["status"] == "ok"
        comm = k.comm_open("jupyter_gpumem")
        assert [m["type"] for m in k.comm_messages(comm, 2.0)][:1] == ["hello"]
        reply = k.reply(RAISING_STREAMS)
        assert reply is not None and reply["status"] == "ok", reply
        reply = k.reply("u = torch.ones(10)")
        assert reply is not None and reply["status"] == "ok", reply
        reply = k.reply("sys.stdout, sys.stderr = kept_out, kept_err\nprint(u.sum().item())")
        assert reply is not None and reply["status"] == "ok", reply
        assert k.reply("%gpumem watch status")["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_products_own_complaints_never_raise(ip, capsys):
    """The footer's error path, in a shell: a raising sys.stdout and sys.stderr cost the
    product its line (it goes to sys.__stderr__) and never the cell."""
    ip.run_line_magic("gpumem", "watch on --device cpu")
    try:
        r = run(ip, RAISING_STREAMS.replace("import sys", "import sys, torch"))
        assert r.success, r.error_in_exec
        r = run(ip, "z = 1")
        assert r.success, r.error_in_exec
    finally:
        run(ip, "sys.stdout, sys.stderr = kept_out, kept_err")
        ip.run_line_magic("gpumem", "watch off")
