"""What the server reads of its kernels: one pass over NVML and the process table.

:func:`report` is the answer of ``GET api/gpumem/kernels`` for a list of kernels (as
:func:`server_kernels` gets them from the server): every kernel by notebook or console
path, its pid where the kernel manager knows it (a local provisioner; "pid unknown" for
the others: remote kernels), its descendants, their host memory (the resident set of
the kernel and its descendants, psutil) and their GPU memory per device (NVML's
per-process figures); and the processes on the GPUs that are no kernel of this server
nor a kernel's child, named as ``%gpumem --processes`` names them. Without NVML the
kernels are listed all the same, with ``"gpu": false`` and a plain message.

:class:`Readings` keeps the last pass for :data:`CACHE_SECONDS`: the sidebar's polling
and a Prometheus scrape that ask within a second share one NVML pass. No thread of its
own: a pass happens when asked.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil

from ..api import __version__
from ..backends import nvml
from ..core import processes as _processes
from ..core.processes import table as _table

SCHEMA = "jupyter_gpumem.kernels/1"
CACHE_SECONDS = 1.0
NO_NVML = "GPU figures need NVML (the NVIDIA driver); none here"
NO_DEVICE = "no GPU: NVML sees no device"
PID_NOTE = "pid unknown (a kernel this server does not run itself: a remote provisioner)"


def kernel_pid(kernel) -> int | None:
    """The pid of a kernel manager's kernel, where its provisioner is a local one."""
    provisioner = getattr(kernel, "provisioner", None)
    if provisioner is None or type(provisioner).__name__ != "LocalProvisioner":
        return None
    pid = getattr(provisioner, "pid", None)
    process = getattr(provisioner, "process", None)
    if pid is None and process is not None:
        pid = getattr(process, "pid", None)
    return pid if isinstance(pid, int) and pid > 0 else None


def user() -> str:
    """Whose server this is: JupyterHub's user where set, else the account."""
    hub = os.environ.get("JUPYTERHUB_USER")
    if hub:
        return hub
    try:
        return psutil.Process().username()
    except (psutil.Error, KeyError, OSError):
        return str(os.getuid())


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    except (OSError, IndexError, ValueError):
        return psutil.Process(pid).memory_info().rss


def rss(pids) -> int | None:
    """The resident memory of ``pids`` together (``None``: the first cannot be read);
    a process that ended meanwhile counts nothing."""
    total = 0
    for n, pid in enumerate(pids):
        try:
            total += _rss(pid)
        except (psutil.Error, OSError):
            if n == 0:
                return None
    return total


def _devices(dps) -> list[dict]:
    out = []
    with nvml.reading():
        for dp in dps:
            reading = nvml.read_device(dp.nvml_index) if dp.nvml_index is not None else None
            out.append({"device": dp.device, "nvml_index": dp.nvml_index,
                        "uuid": reading.uuid if reading else None,
                        "name": reading.name if reading else None,
                        "total": reading.total if reading else None,
                        "used": reading.used if reading else None,
                        "hidden": dp.hidden, "hidden_bytes": dp.hidden_bytes})
    return out


def path_of(k: dict) -> str | None:
    """A kernel's notebook or console path: its first session's."""
    sessions = k.get("sessions") or []
    return sessions[0].get("path") if sessions else None


def _type(k: dict) -> str | None:
    sessions = k.get("sessions") or []
    return sessions[0].get("type") if sessions else None


def _key(kernels: list[dict]) -> tuple:
    return tuple(sorted((k["id"], k.get("pid") or 0, path_of(k) or "") for k in kernels))


@dataclass
class Reading:
    """One pass: the devices' processes, the devices, each kernel's descendants and RSS."""

    key: tuple
    time: float
    seconds: float
    dps: list = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)
    tree: dict[int, list[int]] = field(default_factory=dict)
    rss: dict[int, int | None] = field(default_factory=dict)
    message: str | None = None


def read(kernels: list[dict], server_pid: int) -> Reading:
    """One pass over NVML and the process table for ``kernels``."""
    t0 = time.perf_counter()
    refs = {k["pid"]: _processes.KernelRef(k["pid"], path_of(k), k["id"])
            for k in kernels if k.get("pid")}
    table = _table.snapshot()       # the pass's one view of the process table
    ctx = _processes.context(me=server_pid, kernels=refs, server_pid=server_pid, table=table)
    with nvml.reading():
        dps = _processes.read_all(ctx)
        devices = _devices(dps)
    tree = {pid: table.descendants(pid) for pid in refs}
    sizes = {pid: rss([pid] + tree.get(pid, [])) for pid in refs}
    message = None
    if not dps:
        message = NO_DEVICE if nvml.available() else NO_NVML
    return Reading(_key(kernels), time.time(), time.perf_counter() - t0, dps, devices,
                   tree, sizes, message)


def build(kernels: list[dict], reading: Reading, server_pid: int) -> dict:
    """The endpoint's answer for ``kernels`` from ``reading``."""
    by_kernel: dict[str, list[dict]] = {}
    others = []
    for dp in reading.dps:
        for p in dp.processes:
            entry = {"device": dp.device, **p.to_json()}
            if p.relation in ("kernel", "kernel_child") and p.kernel_id:
                by_kernel.setdefault(p.kernel_id, []).append(entry)
            else:
                others.append(entry)
    rows = []
    for k in kernels:
        procs = by_kernel.get(k["id"], [])
        gpu: dict[str, int] = {}
        for p in procs:
            gpu[p["device"]] = gpu.get(p["device"], 0) + (p["bytes"] or 0)
        pid = k.get("pid")
        rows.append({"id": k["id"], "name": k.get("name"), "path": path_of(k),
                     "type": _type(k), "sessions": k.get("sessions", []),
                     "execution_state": k.get("execution_state"), "pid": pid,
                     "pid_note": None if pid else PID_NOTE,
                     "children": reading.tree.get(pid, []) if pid else [],
                     "host": {"rss": reading.rss.get(pid) if pid else None},
                     "gpu": gpu, "gpu_bytes": sum(gpu.values()),
                     "processes": [{"pid": p["pid"], "device": p["device"],
                                    "bytes": p["bytes"], "relation": p["relation"],
                                    "label": p["label"], "command": p["command"]}
                                   for p in procs]})
    rows.sort(key=lambda r: (-r["gpu_bytes"], r["path"] or "", r["id"]))
    others.sort(key=lambda p: (-(p["bytes"] or 0), p["pid"]))
    return {"schema": SCHEMA, "version": __version__, "time": reading.time,
            "server_pid": server_pid, "user": user(), "gpu": bool(reading.dps),
            "message": reading.message, "devices": reading.devices, "kernels": rows,
            "others": others, "orphans": [p for p in others if p["relation"] == "orphan"]}


def report(kernels: list[dict], server_pid: int | None = None) -> dict:
    """The endpoint's answer for ``kernels`` (``{"id", "name", "execution_state", "pid",
    "sessions": [{"path", "type"}]}`` each, as the server knows them), read now."""
    server_pid = os.getpid() if server_pid is None else server_pid
    return build(kernels, read(kernels, server_pid), server_pid)


class Readings:
    """The server's readings: at most one pass per :data:`CACHE_SECONDS` for the same
    kernels, whoever asks (the kernels endpoint, the metrics); a second caller while a
    pass runs waits for it instead of making its own."""

    def __init__(self, server_pid: int | None = None, seconds: float = CACHE_SECONDS):
        self.server_pid = os.getpid() if server_pid is None else server_pid
        self.seconds = seconds
        self.passes = 0
        self.last: Reading | None = None
        self.lock = threading.Lock()

    def reading(self, kernels: list[dict]) -> Reading:
        with self.lock:
            last = self.last
            if last is None or last.key != _key(kernels) or \
                    time.time() - last.time >= self.seconds:
                last = self.last = read(kernels, self.server_pid)
                self.passes += 1
            return last

    def report(self, kernels: list[dict]) -> dict:
        return build(kernels, self.reading(kernels), self.server_pid)

    def forget(self) -> None:
        """Read afresh at the next ask (after something ended processes)."""
        with self.lock:
            self.last = None


async def server_kernels(serverapp) -> list[dict]:
    """Every running kernel of the server, with its sessions and pid."""
    sessions: dict[str, list[dict]] = {}
    manager = getattr(serverapp, "session_manager", None)
    if manager is not None:
        for s in await manager.list_sessions():
            kid = (s.get("kernel") or {}).get("id")
            if kid:
                sessions.setdefault(kid, []).append({"path": s.get("path"),
                                                     "type": s.get("type"),
                                                     "name": s.get("name")})
    km = serverapp.kernel_manager
    out = []
    for kid in list(km.list_kernel_ids()):
        try:
            kernel = km.get_kernel(kid)
        except KeyError:
            continue
        out.append({"id": kid, "name": getattr(kernel, "kernel_name", None),
                    "execution_state": getattr(kernel, "execution_state", None),
                    "pid": kernel_pid(kernel), "sessions": sessions.get(kid, [])})
    return out
