"""A real ``jupyter server`` in a subprocess (127.0.0.1, a token, base URL ``/base/``) and
real kernels of it, driven over ZMQ with jupyter_client: for the server extension's
tests, on the CPU (NVML faked: ``fake_nvml``) and on a GPU."""
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
from jupyter_client import BlockingKernelClient

import gpu_holders as gh

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-for-the-test"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp: Path, fake_nvml: bool):
        self.tmp = tmp
        self.nvml = tmp / "nvml.json"
        self.dev = gh.device_file(tmp)
        gh.write_nvml(self.nvml, [])
        self.server_pid = None
        self.port = _port()
        self.base = f"http://127.0.0.1:{self.port}/base/"
        (tmp / "root" / "work").mkdir(parents=True)
        for name in ("a.ipynb", "work/b.ipynb", "c.ipynb"):
            (tmp / "root" / name).write_text(json.dumps(
                {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        self.runtime = tmp / "runtime"
        paths = [gh.FAKE_NVML_DIR] if fake_nvml else []
        paths += [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
               "JUPYTER_RUNTIME_DIR": str(self.runtime),
               "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_PLATFORM_DIRS": "1"}
        if fake_nvml:
            env.update(FAKE_NVML=str(self.nvml), JUPYTER_GPUMEM_DEVICE_FILES=self.dev)
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

    def connect(self, kid: str) -> BlockingKernelClient:
        """A client of kernel ``kid`` (again after a restart: the same ports)."""
        client = BlockingKernelClient(connection_file=str(self.runtime / f"kernel-{kid}.json"))
        client.load_connection_file()
        client.start_channels(hb=False)
        ready(client)
        self.clients.append(client)
        return client

    def session(self, path: str) -> tuple[str, BlockingKernelClient]:
        s = self.request("POST", "api/sessions", {"path": path, "type": "notebook",
                                                  "kernel": {"name": "python3"}})
        kid = s["kernel"]["id"]
        return kid, self.connect(kid)

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


def ready(client: BlockingKernelClient, timeout: float = 60) -> None:
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


def run(client: BlockingKernelClient, code: str, timeout: float = 120) -> str:
    """Run ``code`` in the kernel (``timeout`` seconds at most); its stdout (an error fails
    the test)."""
    out, errors = [], []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"]["traceback"]))
    reply = client.execute_interactive(code, output_hook=hook, timeout=timeout)
    assert reply["content"]["status"] == "ok" and not errors, errors
    return "".join(out)


def scrape(server: Server, token: str | None = TOKEN, scheme: str = "token") -> tuple[str, str]:
    """``GET api/gpumem/metrics`` of ``server``: its content type and text."""
    req = urllib.request.Request(server.base + "api/gpumem/metrics")
    if token:
        req.add_header("Authorization", f"{scheme} {token}")
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.headers["Content-Type"], r.read().decode()


def samples(text: str) -> dict[str, list]:
    """Every sample of a Prometheus text by its name: ``(labels, value)``."""
    from prometheus_client import parser

    out: dict[str, list] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out
