"""A stand-in for ``pynvml`` (nvidia-ml-py) on a machine without a GPU: the one fake of the
process tests. Its devices and their per-process lists are read, at every call, from the
JSON file named by ``FAKE_NVML`` (so a test changes them while a server and its kernels,
each importing this module through ``PYTHONPATH``, run)::

    {"devices": [{"name": "NVIDIA H200", "total": 151..., "base": 0,
                  "compute": [[pid, bytes], ...], "graphics": [[pid, bytes], ...]}]}

A device's ``used`` is ``base`` plus every listed process that is still alive (as the
driver frees a context when its process ends, a listed pid that is gone drops out of the
lists); pid 0 stands for an entry NVML gives without a pid, and an entry
``[pid, bytes, "foreign"]`` for a pid of another PID namespace (listed whether or not a
process of that pid lives here).
"""
from __future__ import annotations

import json
import os
import types


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {3: "Not Supported", 12: "NVML Shared Library Not Found"}.get(
            self.value, f"NVML error {self.value}")


NVML_ERROR_NOT_SUPPORTED = 3


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _devices() -> list[dict]:
    path = os.environ.get("FAKE_NVML")
    if not path:
        raise NVMLError(12)
    try:
        with open(path) as f:
            return json.load(f)["devices"]
    except FileNotFoundError:
        return []


def _procs(h, kind: str) -> list:
    dev = _devices()[h[1]]
    return [types.SimpleNamespace(pid=e[0], usedGpuMemory=e[1]) for e in dev.get(kind, [])
            if len(e) > 2 or _alive(e[0])]


def nvmlInit():
    _devices()


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_devices())


def nvmlDeviceGetHandleByIndex(i):
    if not 0 <= i < len(_devices()):
        raise NVMLError(2)
    return ("handle", i)


def nvmlDeviceGetUUID(h):
    return f"GPU-{h[1]:08x}-1111-2222-3333-{h[1]:012x}"


def nvmlDeviceGetName(h):
    return _devices()[h[1]].get("name", "NVIDIA H200")


def nvmlDeviceGetMemoryInfo(h):
    dev = _devices()[h[1]]
    total = int(dev.get("total", 141 * 2**30))
    used = int(dev.get("base", 0))
    seen = {}
    for kind in ("compute", "graphics"):
        for p in _procs(h, kind):
            key = p.pid or id(p)
            seen[key] = max(seen.get(key, 0), p.usedGpuMemory or 0)
    used += sum(seen.values())
    return types.SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetComputeRunningProcesses(h):
    return _procs(h, "compute")


def nvmlDeviceGetGraphicsRunningProcesses(h):
    return _procs(h, "graphics")
