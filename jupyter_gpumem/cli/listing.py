"""``jupyter gpumem``: every kernel of this user's Jupyter servers by notebook path, with
its GPU bytes per device and its host memory, then the orphans and the other processes
on the GPUs as ``%gpumem --processes`` words them. Where no server answers, what NVML
and the process table alone say (the same proof of an orphan as the magic's)."""
from __future__ import annotations

import time

import psutil

from ..core import processes as _processes
from ..units import fmt_bytes, text_table
from .servers import Asked

SCHEMA = "jupyter_gpumem.terminal/1"


def _from_json(p: dict) -> _processes.GpuProcess:
    return _processes.GpuProcess(
        p["pid"], p.get("bytes"), p.get("relation", "own"), p.get("label", ""),
        p.get("user"), p.get("command", ""), p.get("started"), p.get("seconds"),
        p.get("ppid"), p.get("path"), p.get("kernel_id"), bool(p.get("purgeable")),
        list(p.get("lists") or []))


def _unasked_kernel(p: dict) -> None:
    """An ``own`` process that is the kernel of a server not asked: say so (its
    environment names the server that started it, still its parent, and its notebook)."""
    try:
        proc = psutil.Process(p["pid"])
        env, ppid = proc.environ(), proc.ppid()
        started_by = int(env.get(_processes.KERNEL_ENV, "") or 0)
    except (psutil.Error, OSError, ValueError):
        return
    if started_by and started_by == ppid:
        p["path"] = env.get(_processes.PATH_ENV) or None
        p["label"] = (f"kernel of the Jupyter server pid {ppid} (not asked): "
                      f"{p['path'] or 'path unknown'}")


def own_reading() -> tuple[list[dict], list[dict], list[str]]:
    """The devices and every process on them, read here (no server answered)."""
    from_here = _processes.report(ctx=_processes.context())
    devices, others = [], []
    for dp in from_here.devices:
        devices.append({"device": dp.device, "nvml_index": dp.nvml_index,
                        "hidden": dp.hidden, "hidden_bytes": dp.hidden_bytes})
        others += [{"device": dp.device, **p.to_json()} for p in dp.processes]
    notes = [f"{dp.device}: {dp.note}" for dp in from_here.devices if dp.note]
    return devices, others, notes + from_here.messages


def gather(asked: list[Asked]) -> dict:
    """The listing's JSON from the servers' answers (and a reading here where none came)."""
    servers, kernels, others, devices, messages = [], [], {}, [], []
    ours: set[int] = set()
    gpu = False
    for a in asked:
        info = a.info
        servers.append({"url": a.url, "pid": info.get("pid"), "root_dir": info.get("root_dir"),
                        "asked": a.ok, "error": a.error})
        if not a.ok:
            continue
        data = a.answer
        gpu = gpu or bool(data.get("gpu"))
        if data.get("message") and data["message"] not in messages:
            messages.append(data["message"])
        devices = devices or data.get("devices", [])
        for k in data.get("kernels", []):
            kernels.append({"server": a.url, **{key: k.get(key) for key in (
                "id", "name", "path", "type", "execution_state", "pid", "children", "host",
                "gpu", "gpu_bytes")}})
            ours.update([k["pid"]] + list(k.get("children") or []) if k.get("pid") else [])
        for p in data.get("others", []):
            others.setdefault((p["device"], p["pid"]), p)
    fallback = not any(a.ok for a in asked)
    if fallback:
        devices, found, notes = own_reading()
        gpu = bool(devices)
        messages += notes
        others = {(p["device"], p["pid"]): p for p in found}
    rest = [p for p in others.values() if p["pid"] not in ours]
    for p in rest:
        if p["relation"] == "own":
            _unasked_kernel(p)
    rest.sort(key=lambda p: (p["device"], -(p.get("bytes") or 0), p["pid"]))
    for d in devices:
        d["kernels_bytes"] = sum((k["gpu"] or {}).get(d["device"], 0) for k in kernels)
    return {"schema": SCHEMA, "time": time.time(), "fallback": fallback, "gpu": gpu,
            "servers": servers, "kernels": kernels, "devices": devices, "others": rest,
            "orphans": [p for p in rest if p["relation"] == "orphan"], "messages": messages}


def _server_line(s: dict) -> str:
    where = f" (pid {s['pid']}, root {s['root_dir']})" if s.get("pid") else ""
    line = f"Jupyter server {s['url']}{where}"
    return line + (f": not asked: {s['error']}" if s["error"] else "")


def text(data: dict) -> str:
    """The listing as aligned text."""
    devs = [d["device"] for d in data["devices"]]
    lines: list[str] = []
    if not data["servers"]:
        lines.append("no Jupyter server of this user is running: what NVML and the process "
                     "table say")
    for s in data["servers"]:
        lines.append(_server_line(s))
        mine = [k for k in data["kernels"] if k["server"] == s["url"]]
        if s["asked"] and not mine:
            lines.append("  no kernel running")
        if mine:
            rows = [[k["path"] or f"(no session) {k['id']}", str(k["pid"] or "?"),
                     k["execution_state"] or "?"]
                    + [fmt_bytes((k["gpu"] or {}).get(d, 0)) for d in devs]
                    + [fmt_bytes((k["host"] or {}).get("rss"))] for k in mine]
            lines += text_table(["notebook", "pid", "state"] + devs + ["host RSS"], rows,
                                set(range(3, 4 + len(devs))) | {1}, indent="  ")
    if data["fallback"] and data["servers"]:
        lines.append("no server answered: what NVML and the process table say")
    dps = []
    for d in data["devices"]:
        procs = [_from_json(p) for p in data["others"] if p["device"] == d["device"]]
        dps.append(_processes.DeviceProcesses(d["device"], d.get("nvml_index"), procs,
                                              hidden=d.get("hidden") or 0,
                                              hidden_bytes=d.get("hidden_bytes")))
    table = _processes.rows(dps)
    if data["devices"]:
        lines.append("")
        lines.append("orphans and other processes on the GPUs:" if table else
                     "no other process on the GPUs")
        lines += text_table(_processes.HEADERS, table, {1, 2}) if table else []
        lines.append("")
        for d in data["devices"]:
            used = (f"{fmt_bytes(d['used'])} used of {fmt_bytes(d['total'])}"
                    if d.get("used") is not None else "memory not read")
            name = f" {d['name']}" if d.get("name") else ""
            kernels = ("" if data["fallback"] else
                       f"; the kernels above {fmt_bytes(d['kernels_bytes'])}")
            lines.append(f"{d['device']}{name}: {used}{kernels}")
    if any(p.get("purgeable") for p in data["orphans"]):
        lines.append("`jupyter gpumem orphans` ends this user's orphans "
                     "(`--dry-run` first to see them)")
    lines += [f"note: {m}" for m in data["messages"]]
    return "\n".join(lines)
