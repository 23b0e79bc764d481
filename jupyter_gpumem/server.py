"""The Jupyter server extension: every kernel of the server and what it holds on the GPUs.

``GET {base_url}api/gpumem/kernels`` (authenticated and authorized by the server, as
its own kernel API is) answers with every running kernel of the server: its notebook
or console path (the session manager's), its pid where the kernel manager knows it
(a local provisioner; "pid unknown" for the others: remote kernels), its children,
and their GPU memory per device (NVML's per-process figures, children included); and
the processes on the GPUs that are no kernel of this server nor a kernel's child
(orphans, other users', this user's other ones), named as ``%gpumem --processes``
names them. ``POST {base_url}api/gpumem/orphans`` with ``{"dry_run": bool}`` ends this
user's orphans that a kernel left (``%gpumem purge --orphans``), for a frontend with no
kernel of the extension at hand. The JSON: docs/PROTOCOL.md, "Server extension".

Enabled on ``pip install`` by ``jupyter-config/jupyter_server_config.d/jupyter_gpumem.json``;
never imported by the IPython extension.
"""
from __future__ import annotations

import asyncio
import json
import os
import time

import psutil
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .api import __version__
from .backends import nvml
from .core import orphans as _orphans
from .core import processes as _processes

SCHEMA = "jupyter_gpumem.kernels/1"
KERNELS_PATH = "api/gpumem/kernels"
ORPHANS_PATH = "api/gpumem/orphans"
MAX_BODY = 4096


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


def _children(pid: int) -> list[int]:
    try:
        return sorted(p.pid for p in psutil.Process(pid).children(recursive=True))
    except (psutil.Error, OSError):
        return []


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


def report(kernels: list[dict], server_pid: int | None = None) -> dict:
    """The endpoint's answer for ``kernels`` (``{"id", "name", "execution_state", "pid",
    "sessions": [{"path", "type"}]}`` each, as the server knows them)."""
    server_pid = os.getpid() if server_pid is None else server_pid
    refs = {k["pid"]: _processes.KernelRef(k["pid"], _path(k), k["id"])
            for k in kernels if k.get("pid")}
    ctx = _processes.context(me=server_pid, kernels=refs, server_pid=server_pid)
    dps = _processes.read_all(ctx)
    by_kernel: dict[str, list[dict]] = {}
    others = []
    for dp in dps:
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
        rows.append({"id": k["id"], "name": k.get("name"), "path": _path(k),
                     "type": _type(k), "sessions": k.get("sessions", []),
                     "execution_state": k.get("execution_state"), "pid": pid,
                     "pid_note": None if pid else "pid unknown (a kernel this server does "
                     "not run itself: a remote provisioner)",
                     "children": _children(pid) if pid else [],
                     "gpu": gpu, "gpu_bytes": sum(gpu.values()),
                     "processes": [{"pid": p["pid"], "device": p["device"],
                                    "bytes": p["bytes"], "relation": p["relation"],
                                    "label": p["label"], "command": p["command"]}
                                   for p in procs]})
    rows.sort(key=lambda r: (-r["gpu_bytes"], r["path"] or "", r["id"]))
    others.sort(key=lambda p: (-(p["bytes"] or 0), p["pid"]))
    message = None
    if not dps:
        message = ("no GPU: NVML sees no device" if nvml.available()
                   else nvml.status() or "NVML unavailable")
    return {"schema": SCHEMA, "version": __version__, "time": time.time(),
            "server_pid": server_pid, "gpu": bool(dps), "message": message,
            "devices": _devices(dps), "kernels": rows, "others": others,
            "orphans": [p for p in others if p["relation"] == "orphan"]}


def _path(k: dict) -> str | None:
    sessions = k.get("sessions") or []
    return sessions[0].get("path") if sessions else None


def _type(k: dict) -> str | None:
    sessions = k.get("sessions") or []
    return sessions[0].get("type") if sessions else None


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


class KernelsHandler(APIHandler):
    """``GET api/gpumem/kernels``."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self):
        kernels = await server_kernels(self.serverapp)
        data = await asyncio.get_running_loop().run_in_executor(None, report, kernels)
        self.finish(json.dumps(data))


class OrphansHandler(APIHandler):
    """``POST api/gpumem/orphans`` ``{"dry_run": bool}``: ``%gpumem purge --orphans``."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self):
        body = self.request.body or b"{}"
        if len(body) > MAX_BODY:
            raise web.HTTPError(400, "request too large")
        try:
            data = json.loads(body)
        except ValueError:
            raise web.HTTPError(400, "the body must be JSON") from None
        if not isinstance(data, dict) or set(data) - {"dry_run"}:
            raise web.HTTPError(400, 'the body must be {"dry_run": true|false}')
        dry_run = data.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise web.HTTPError(400, '"dry_run" must be true or false')
        ctx = _processes.context(me=os.getpid(), server_pid=os.getpid())
        result = await asyncio.get_running_loop().run_in_executor(
            None, lambda: _orphans.purge_orphans(dry_run=dry_run, ctx=ctx))
        self.finish(json.dumps(result.to_json()))


def _load_jupyter_server_extension(serverapp) -> None:
    web_app = serverapp.web_app
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, KERNELS_PATH), KernelsHandler),
                                 (url_path_join(base, ORPHANS_PATH), OrphansHandler)])
    serverapp.log.info("jupyter_gpumem: %s", url_path_join(base, KERNELS_PATH))
