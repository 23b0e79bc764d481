"""The sidebar's comm path on a real CUDA device, through a real kernel.

A real ipykernel is started with jupyter_client and driven with the exact
messages the JupyterLab sidebar sends (labextension/src/channel.ts): a
``comm_open`` on target ``jupyter_gpumem`` (closed at once while the
extension is not loaded), the silent ``%load_ext jupyter_gpumem`` of the load
button, then ``set_device``, ``refresh`` and ``purge`` comm messages. A 1 GiB
CUDA tensor must be listed as a holder on ``cuda:0``; ``devices`` messages
must keep coming while a cell runs; the purge must bring the process back to
at most 2 MiB above its floor (measured before the tensor existed, after a
warm-up, with every cache in the kernel emptied: gpu_floor.py).
Prints its figures (run with ``-s``).

Skips, with the reason, where torch, CUDA, ipykernel or jupyter_client is absent.
``GPUMEM_COMM_TEST_DEVICE=cpu`` runs the same flow on host tensors (a check of
this script on a machine without a GPU; the 2 MiB floor check is for CUDA).
"""
from __future__ import annotations

import datetime
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (see GPU.md: wheels.sh)")
jupyter_client = pytest.importorskip(
    "jupyter_client", reason="jupyter_client is not installed (see GPU.md: wheels.sh)"
)

from gpu_floor import empty_caches_code  # noqa: E402

DEVICE = os.environ.get("GPUMEM_COMM_TEST_DEVICE", "cuda:0")
ON_CUDA = DEVICE.startswith("cuda")

pytestmark = pytest.mark.skipif(
    ON_CUDA and not torch.cuda.is_available(),
    reason="no CUDA device: the sidebar's GPU path needs one (torch.cuda.is_available() is False)",
)

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30
FLOOR_SLACK = 2 * MiB
TARGET = "jupyter_gpumem"
LOAD_EXTENSION_CODE = "%load_ext jupyter_gpumem"  # labextension/src/constants.ts


class Sidebar:
    """Talks to a kernel as the sidebar does, and records what comes back."""

    def __init__(self, kc):
        self.kc = kc
        self.comm_id = ""
        self.messages: list[dict] = []  # comm data from the kernel, in order
        self.closed: set[str] = set()
        self.next_id = 0

    # -- what the sidebar sends ------------------------------------------
    def open(self) -> None:
        self.comm_id = uuid.uuid4().hex
        self._send("comm_open", {"comm_id": self.comm_id, "target_name": TARGET, "data": {}})

    def request(self, data: dict) -> int:
        self.next_id += 1
        self._send("comm_msg", {"comm_id": self.comm_id, "data": {**data, "id": self.next_id}})
        return self.next_id

    def load_extension(self) -> dict:
        """What the load button does: a silent ``%load_ext``, no history."""
        msg_id = self.kc.execute(LOAD_EXTENSION_CODE, silent=True, store_history=False,
                                 allow_stdin=False, stop_on_error=False)
        return self._reply(msg_id)

    def _send(self, msg_type: str, content: dict) -> None:
        msg = self.kc.session.msg(msg_type, content)
        self.kc.shell_channel.send(msg)

    def _reply(self, msg_id: str) -> dict:
        while True:
            reply = self.kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]

    # -- what comes back ----------------------------------------------------
    def pump(self, timeout: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except Exception:  # queue.Empty
                return
            kind = msg["header"]["msg_type"]
            content = msg["content"]
            if kind == "comm_msg" and content.get("comm_id") == self.comm_id:
                self.messages.append(content["data"])
            elif kind == "comm_close":
                self.closed.add(content.get("comm_id"))

    def wait(self, predicate, timeout: float = 60, what: str = "", since: int = 0) -> dict:
        """The first message from index ``since`` on that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        seen = since
        while time.monotonic() < deadline:
            for data in self.messages[seen:]:
                if predicate(data):
                    return data
            seen = max(seen, len(self.messages))
            self.pump(0.5)
        raise AssertionError(f"no {what} in {timeout} s; got {[m.get('type') for m in self.messages]}")

    def run_cell(self, code: str) -> dict:
        """Run a cell as the notebook does (history on, so post_run_cell fires)."""
        msg_id = self.kc.execute(code, store_history=True)
        content = self._reply(msg_id)
        assert content["status"] == "ok", content
        return content


def _device(data: dict) -> dict:
    return next(d for d in data["devices"] if d["id"] == DEVICE)


def _holder(snapshot: dict, name: str):
    return next((h for h in snapshot["holders"] if h["name"] == name), None)


def _process_bytes(device: dict) -> int:
    """The process's memory on the device: NVML's figure, else the allocator's reserve."""
    used = device.get("used_process")
    return used if used is not None else (device.get("reserved") or 0)


@pytest.fixture
def sidebar():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        yield Sidebar(kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_cuda_tensor_listed_and_purged_through_the_comm(sidebar):
    figures: dict[str, object] = {"device": DEVICE, "date": datetime.date.today().isoformat()}
    if ON_CUDA:
        figures["gpu"] = torch.cuda.get_device_name(0)

    # Before %load_ext: the kernel has no such target and closes the comm at once.
    sidebar.open()
    deadline = time.monotonic() + 30
    while sidebar.comm_id not in sidebar.closed and time.monotonic() < deadline:
        sidebar.pump(0.5)
    assert sidebar.comm_id in sidebar.closed, "a kernel without the extension must close the comm"

    # The load button: silent %load_ext, then the comm again.
    reply = sidebar.load_extension()
    assert reply["status"] == "ok", reply
    # the floor below is read after this warm-up, with every cache emptied: a cache
    # left in it (a cuBLAS workspace, freed blocks) would be given back by the purge
    sidebar.run_cell(
        "import torch\n"
        + ("_warm = torch.ones(64, 64, device='cuda:0') @ torch.ones(64, 64, device='cuda:0')\n"
           "torch.cuda.synchronize()\n" if ON_CUDA else "")
        + empty_caches_code()
    )
    sidebar.open()
    hello = sidebar.wait(lambda d: d["type"] == "hello", what="hello")
    assert hello["device"] == "auto"

    rid = sidebar.request({"type": "set_device", "device": DEVICE})
    snap = sidebar.wait(lambda d: d["type"] == "snapshot" and d.get("reply_to") == rid,
                        what="snapshot for set_device")["snapshot"]
    assert snap["device"] == DEVICE
    floor = _device(snap)
    figures["floor_process_MiB"] = round(_process_bytes(floor) / MiB, 1)
    figures["floor_allocated_MiB"] = round((floor.get("allocated") or 0) / MiB, 1)

    # A 1 GiB tensor: the snapshot pushed after the cell lists it on the device.
    start = len(sidebar.messages)
    sidebar.run_cell(f"big = torch.ones({GiB // 4}, device={DEVICE!r})"
                     + ("\ntorch.cuda.synchronize()" if ON_CUDA else ""))
    pushed = sidebar.wait(
        lambda d: d["type"] == "snapshot" and "reply_to" not in d and _holder(d["snapshot"], "big"),
        what="snapshot after the cell", since=start,
    )["snapshot"]
    big = _holder(pushed, "big")
    assert big["devices"] == {DEVICE: GiB}, big
    assert big["unique"] == GiB and big["purge"] == "big"
    held = _device(pushed)
    figures["with_big_process_MiB"] = round(_process_bytes(held) / MiB, 1)
    assert _process_bytes(held) >= _process_bytes(floor) + GiB - FLOOR_SLACK

    # Device readings keep coming from the kernel's thread while a cell runs.
    start = len(sidebar.messages)
    sidebar.run_cell("import time; time.sleep(3)")
    sidebar.pump(0.5)
    during = [d for d in sidebar.messages[start:] if d["type"] == "devices"]
    figures["devices_msgs_in_3s_cell"] = len(during)
    assert len(during) >= 2
    if ON_CUDA:
        assert all((_device(d).get("allocated") or 0) >= GiB for d in during)

    # A refresh and a bad purge change nothing.
    rid = sidebar.request({"type": "refresh"})
    sidebar.wait(lambda d: d["type"] == "snapshot" and d.get("reply_to") == rid, what="refresh")
    rid = sidebar.request({"type": "purge", "names": ["big", "no_such_name"], "dry_run": False})
    err = sidebar.wait(lambda d: d.get("reply_to") == rid, what="reply to a bad purge")
    assert err["type"] == "error" and "no_such_name" in err["message"]

    # The purge: the tensor goes and the device is back to its floor.
    t = time.monotonic()
    rid = sidebar.request({"type": "purge", "names": ["big"], "dry_run": False})
    reply = sidebar.wait(lambda d: d["type"] == "purge_result" and d.get("reply_to") == rid,
                         what="purge_result")
    result = reply["result"]
    after = sidebar.wait(lambda d: d["type"] == "snapshot", what="snapshot after the purge",
                         since=next(i for i, m in enumerate(sidebar.messages) if m is reply) + 1,
                         )["snapshot"]
    figures["purge_seconds"] = round(time.monotonic() - t, 2)
    assert "big" in result["removed"]
    assert _holder(after, "big") is None
    figures["freed_MiB"] = {k: (None if v is None else round(v / MiB, 1))
                            for k, v in result["freed"].items()}
    settled = _device(after)
    figures["after_process_MiB"] = round(_process_bytes(settled) / MiB, 1)
    figures["after_allocated_MiB"] = round((settled.get("allocated") or 0) / MiB, 1)
    print("\ncomm GPU figures:", figures, file=sys.stderr)
    if ON_CUDA:
        assert _process_bytes(settled) <= _process_bytes(floor) + FLOOR_SLACK, figures
        assert (settled.get("allocated") or 0) <= (floor.get("allocated") or 0) + FLOOR_SLACK

    # The name is gone from the kernel.
    msg_id = sidebar.kc.execute("assert 'big' not in dir()", store_history=False)
    assert sidebar._reply(msg_id)["status"] == "ok"
