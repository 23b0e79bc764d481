"""The Jupyter server extension with a real ``jupyter server`` (a subprocess on 127.0.0.1
with a token and a base URL) and two real kernels: one with a child process, one whose
child's parent is killed to leave an orphan; another user's process besides. NVML's
per-process lists are the one thing faked (tests/fake_nvml/pynvml.py, through the
server's PYTHONPATH, which its kernels inherit).

Checked: the endpoint's kernel list, paths, pids (each kernel's own ``os.getpid()``) and
children; the GPU bytes per kernel (children included) and the others; the report of a
kernel of that server (``%gpumem --processes``) naming each process; the orphans' purge
(dry run through the server, for real from the kernel) and the figures after; no GPU.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

import gpu_holders as gh

pytest.importorskip("jupyter_server")
from jupyter_client import BlockingKernelClient  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "t0ken-for-the-test"
MiB, GiB = gh.MiB, gh.GiB


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.nvml = tmp / "nvml.json"
        self.dev = gh.device_file(tmp)
        gh.write_nvml(self.nvml, [])
        self.port = _port()
        self.base = f"http://127.0.0.1:{self.port}/base/"
        (tmp / "root" / "work").mkdir(parents=True)
        for name in ("a.ipynb", "work/b.ipynb"):
            (tmp / "root" / name).write_text(json.dumps(
                {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        self.runtime = tmp / "runtime"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([gh.FAKE_NVML_DIR, str(ROOT)]),
               "FAKE_NVML": str(self.nvml), "JUPYTER_GPUMEM_DEVICE_FILES": self.dev,
               "JUPYTER_RUNTIME_DIR": str(self.runtime),
               "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_PLATFORM_DIRS": "1"}
        self.log = open(tmp / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
             f"--port={self.port}", "--ip=127.0.0.1", "--ServerApp.base_url=/base/",
             f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={tmp / 'root'}",
             "--ServerApp.jpserver_extensions={'jupyter_gpumem': True}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                self.get("api/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.time() > deadline or self.proc.poll() is not None:
                    raise AssertionError((tmp / "server.log").read_text()[-3000:])
                time.sleep(0.2)
        self.clients: list[BlockingKernelClient] = []

    def request(self, method: str, path: str, body=None, token: str | None = TOKEN):
        req = urllib.request.Request(self.base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        if token:
            req.add_header("Authorization", f"token {token}")
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def session(self, path: str) -> tuple[str, BlockingKernelClient]:
        s = self.request("POST", "api/sessions", {"path": path, "type": "notebook",
                                                  "kernel": {"name": "python3"}})
        kid = s["kernel"]["id"]
        client = BlockingKernelClient(connection_file=str(self.runtime / f"kernel-{kid}.json"))
        client.load_connection_file()
        client.start_channels(hb=False)
        _ready(client)
        self.clients.append(client)
        return kid, client

    def stop(self):
        for c in self.clients:
            c.stop_channels()
        kids = [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for pid in kids:
            gh.end(pid)
        self.log.close()


def _ready(client: BlockingKernelClient, timeout: float = 60) -> None:
    """Wait for the kernel's kernel_info reply, then for its iopub to carry messages."""
    deadline = time.time() + timeout
    while True:
        client.kernel_info()
        try:
            if client.get_shell_msg(timeout=1)["msg_type"] == "kernel_info_reply":
                break
        except Exception:  # noqa: BLE001 - queue.Empty: not yet
            pass
        assert time.time() < deadline, "the kernel did not answer"
    while True:
        client.kernel_info()
        client.get_shell_msg(timeout=10)
        try:
            client.get_iopub_msg(timeout=0.5)
            break
        except Exception:  # noqa: BLE001 - iopub not connected yet
            assert time.time() < deadline, "the kernel's iopub stays silent"
    while True:
        try:
            client.get_iopub_msg(timeout=0.2)
        except Exception:  # noqa: BLE001 - drained
            return


def run(client: BlockingKernelClient, code: str) -> str:
    """Run ``code`` in the kernel; its stdout (an error fails the test)."""
    out, errors = [], []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"]["traceback"]))
    reply = client.execute_interactive(code, output_hook=hook, timeout=120)
    assert reply["content"]["status"] == "ok" and not errors, errors
    return "".join(out)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.stop()


HOLD_AND_CHILD = f"""
import os, subprocess, sys
dev = open({{dev!r}}, 'rb')
child = subprocess.Popen([sys.executable, '-c', {gh.HOLD!r}, {{dev!r}}, '300'],
                         stdout=subprocess.PIPE, text=True)
print(os.getpid(), child.stdout.readline().strip())
"""

ORPHANED = f"""
import os, signal, subprocess, sys, time
dev = open({{dev!r}}, 'rb')
parent = subprocess.Popen([sys.executable, '-c', {gh.PARENT!r}, {gh.HOLD!r}, {{dev!r}}, '300'],
                          stdout=subprocess.PIPE, text=True, start_new_session=True)
held = int(parent.stdout.readline())
os.kill(parent.pid, signal.SIGKILL); parent.wait()
print(os.getpid(), held)
"""


def test_endpoint_kernel_report_and_orphan_purge(server):
    with pytest.raises(urllib.error.HTTPError) as no_token:
        server.get("api/gpumem/kernels", token=None)
    assert no_token.value.code in (401, 403)

    kid_a, a = server.session("a.ipynb")
    kid_b, b = server.session("work/b.ipynb")
    pid_a, child_a = map(int, run(a, HOLD_AND_CHILD.format(dev=server.dev)).split())
    pid_b, orphan = map(int, run(b, ORPHANED.format(dev=server.dev)).split())
    deadline = time.time() + 10
    while psutil.Process(orphan).ppid() != 1 and time.time() < deadline:
        time.sleep(0.05)
    assert psutil.Process(orphan).ppid() == 1
    theirs = gh.another_users()
    try:
        gh.write_nvml(server.nvml, [(pid_a, 1 * GiB), (child_a, 300 * MiB), (pid_b, 2 * GiB),
                                    (orphan, 500 * MiB), (theirs.pid, 400 * MiB),
                                    (0, 60 * MiB)], base=10 * MiB)
        data = server.get("api/gpumem/kernels")
        assert data["schema"] == "jupyter_gpumem.kernels/1" and data["gpu"] is True
        assert data["server_pid"] == server.proc.pid
        assert [(k["id"], k["path"], k["pid"]) for k in data["kernels"]] == [
            (kid_b, "work/b.ipynb", pid_b), (kid_a, "a.ipynb", pid_a)]
        ka, kb = data["kernels"][1], data["kernels"][0]
        assert child_a in ka["children"] and orphan not in kb["children"]
        assert ka["gpu"] == {"cuda:0": GiB + 300 * MiB} and kb["gpu"] == {"cuda:0": 2 * GiB}
        assert sorted((p["pid"], p["relation"]) for p in ka["processes"]) == sorted(
            [(pid_a, "kernel"), (child_a, "kernel_child")])
        assert ka["pid_note"] is None and ka["type"] == "notebook"
        others = {p["pid"]: p for p in data["others"]}
        assert set(others) == {orphan, theirs.pid}
        assert others[orphan]["relation"] == "orphan" and others[orphan]["purgeable"]
        assert others[orphan]["path"] == "work/b.ipynb"
        assert others[theirs.pid]["relation"] == "other_user"
        assert [p["pid"] for p in data["orphans"]] == [orphan]
        assert data["devices"][0]["hidden"] == 1
        assert data["devices"][0]["used"] == 10 * MiB + 3 * GiB + 1260 * MiB

        # the report of a kernel of that server names every process
        out = run(a, "%load_ext jupyter_gpumem\n"
                     "import json; r = %gpumem --processes -o\n"
                     "print(json.dumps(r.to_json()))")
        [dev] = json.loads(out)["devices"]
        named = {p["pid"]: (p["relation"], p["path"], p["bytes"]) for p in dev["processes"]}
        assert named == {child_a: ("child", None, 300 * MiB),
                         pid_b: ("kernel", "work/b.ipynb", 2 * GiB),
                         orphan: ("orphan", "work/b.ipynb", 500 * MiB),
                         theirs.pid: ("other_user", None, 400 * MiB)}
        assert dev["this_process"] == GiB and dev["hidden"] == 1
        text = run(a, "r = %gpumem --processes -o\nprint(r)")
        assert "kernel of this server: work/b.ipynb" in text
        assert "orphan: left by a kernel of work/b.ipynb (parent gone)" in text

        dry = server.request("POST", "api/gpumem/orphans", {"dry_run": True})
        assert [t["pid"] for t in dry["targets"]] == [orphan] and dry["steps"] == []
        with pytest.raises(urllib.error.HTTPError) as bad:
            server.request("POST", "api/gpumem/orphans", {"dry_run": "yes"})
        assert bad.value.code == 400
        with pytest.raises(urllib.error.HTTPError) as bad:
            server.request("POST", "api/gpumem/orphans", {"pids": [theirs.pid]})
        assert bad.value.code == 400
        assert psutil.pid_exists(orphan)

        out = run(a, "r = %gpumem purge --orphans -o\nprint(json.dumps(r.to_json()))")
        result = json.loads(out.strip().splitlines()[-1])
        assert [(s["pid"], s["signal"], s["result"]) for s in result["steps"]] == [
            (orphan, "SIGTERM", "sent"), (orphan, "SIGTERM", "ended")]
        assert result["freed"] == {"cuda:0": 500 * MiB}
        after = server.get("api/gpumem/kernels")
        assert after["orphans"] == [] and [p["pid"] for p in after["others"]] == [theirs.pid]
        assert [k["gpu_bytes"] for k in after["kernels"]] == [2 * GiB, GiB + 300 * MiB]
        assert theirs.poll() is None and psutil.pid_exists(child_a)
    finally:
        theirs.kill()
        gh.end(orphan)


def test_no_gpu_and_the_pid_of_a_kernel_the_server_does_not_run(server):
    server.nvml.write_text('{"devices": []}')
    data = server.get("api/gpumem/kernels")
    assert data["gpu"] is False and data["kernels"] == []
    # the server read NVML's device count at its start (one device): a fresh report
    from jupyter_gpumem import server as ext
    remote = ext.report([{"id": "k1", "name": "python3", "pid": None,
                          "sessions": [{"path": "r.ipynb", "type": "notebook"}]}])
    assert remote["kernels"][0]["pid"] is None
    assert remote["kernels"][0]["pid_note"].startswith("pid unknown")


def test_kernel_pid_only_from_a_local_provisioner():
    from jupyter_client.provisioning import LocalProvisioner
    from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

    from jupyter_gpumem.server import kernel_pid

    class Remote(KernelProvisionerBase):   # a provisioner that runs kernels elsewhere
        has_process = True
        pid = 4242                          # whatever it says: not a pid of this machine

        async def poll(self): ...
        async def wait(self): ...
        async def send_signal(self, signum): ...
        async def kill(self, restart=False): ...
        async def terminate(self, restart=False): ...
        async def pre_launch(self, **kw): ...
        async def launch_kernel(self, cmd, **kw): ...
        async def cleanup(self, restart=False): ...

    class Kernel:
        def __init__(self, provisioner):
            self.provisioner = provisioner

    local = LocalProvisioner(kernel_id="k", kernel_spec=None, parent=None)
    local.pid = os.getpid()
    assert kernel_pid(Kernel(local)) == os.getpid()
    assert kernel_pid(Kernel(Remote(kernel_id="r", kernel_spec=None, parent=None))) is None
    assert kernel_pid(Kernel(None)) is None
