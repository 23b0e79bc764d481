"""A fake ``pynvml`` that counts every call (the same function names, record attributes
and error codes as nvidia-ml-py), N alike H200s, and the frameworks' device lists beside
it: what tests/backends/test_nvml.py and benchmarks/nvml_calls.py count NVML calls on."""
from __future__ import annotations

import collections
import functools
import sys
import types

from jupyter_gpumem.core import devices
from jupyter_gpumem.backends import nvml
from jupyter_gpumem.backends import AcceleratorInfo

GiB = 1 << 30
PID = 4242

# nvidia-ml-py's error codes (nvml.h)
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    """Shaped like pynvml's: the error code is ``value``."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
                9: "Driver Not Loaded", 15: "GPU is lost"}.get(self.value, f"NVML error {self.value}")


def _api(fn):
    """An NVML entry point: every call is counted, and raises while the driver is away."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        self.calls[fn.__name__] += 1
        if self.gone is not None and fn.__name__ != "nvmlShutdown":
            raise NVMLError(self.gone)
        return fn(self, *args, **kwargs)
    return call


def uuid_of(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-{i:012x}"


class FakePynvml(types.ModuleType):
    """``n`` alike GPUs. ``procs[i]``: [(pid, bytes)] of device i's compute list."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED

    def __init__(self, n: int, pid: int = PID, name: str = "NVIDIA H200"):
        super().__init__("pynvml")
        self.n, self.pid = n, pid
        self.names = [name] * n
        self.calls: collections.Counter = collections.Counter()
        self.gone: int | None = None          # an error code every call raises meanwhile
        self.used = [i * GiB for i in range(n)]
        self.procs = {i: ([(pid, i * GiB)] if i % 2 else []) + [(1, GiB // 2)] for i in range(n)}
        self.graphics: dict[int, list] = {}
        self.graphics_error: int | None = None
        self.inits = 0

    def total_calls(self) -> int:
        return sum(self.calls.values())

    @_api
    def nvmlInit(self):
        self.inits += 1

    @_api
    def nvmlShutdown(self):
        self.inits = max(self.inits - 1, 0)

    @_api
    def nvmlDeviceGetCount(self):
        return self.n

    @_api
    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self.n:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return ("handle", i)

    @_api
    def nvmlDeviceGetUUID(self, h):
        return uuid_of(h[1])

    @_api
    def nvmlDeviceGetName(self, h):
        return self.names[h[1]]

    @_api
    def nvmlDeviceGetMemoryInfo(self, h):
        used = self.used[h[1]]
        return types.SimpleNamespace(total=141 * GiB, used=used, free=141 * GiB - used)

    @_api
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.procs[h[1]]]

    @_api
    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        if self.graphics_error is not None:
            raise NVMLError(self.graphics_error)
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.graphics.get(h[1], [])]


class FakeTorch:
    """A framework that initialised CUDA: its devices carry UUIDs, as torch's do."""

    name = "torch"

    def __init__(self, uuids: list[str]):
        self.uuids = uuids

    def accelerators(self):
        return [AcceleratorInfo(f"cuda:{i}", "cuda", "NVIDIA H200", u, 141 * GiB)
                for i, u in enumerate(self.uuids)]

    def usage(self, ids, detail=False):
        return {}


class FakeCupy:
    """Asks NVML, as CuPy's backend does, where this process has a context (twice a read)."""

    name = "cupy"

    def _in_use(self):
        return [o for o, i in enumerate(nvml.visible_indices()) if (nvml.process_used(i) or 0) > 0]

    def accelerators(self):
        return [AcceleratorInfo(f"cuda:{o}", "cuda") for o in self._in_use()]

    def usage(self, ids, detail=False):
        self._in_use()
        return {}


SCENARIOS = ("nvml only", "torch", "torch + cupy")


def install(monkeypatch, n: int, scenario: str = "torch", visible: str | None = None,
            order: list[int] | None = None) -> FakePynvml:
    """The fake ``pynvml`` in ``sys.modules``, a fresh NVML state, the scenario's frameworks."""
    fake = FakePynvml(n)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    monkeypatch.setattr(nvml.os, "getpid", lambda: PID)
    monkeypatch.setattr(devices.os, "getpid", lambda: PID)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    # torch numbers the visible devices: physical ``order`` (default: all of them)
    uuids = [uuid_of(i) for i in (range(n) if order is None else order)]
    active = {"nvml only": [], "torch": [FakeTorch(uuids)],
              "torch + cupy": [FakeTorch(uuids), FakeCupy()]}[scenario]
    monkeypatch.setattr(devices, "active_backends", lambda: list(active))
    return fake


class Clock:
    """``nvml``'s clock, moved by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def counted(fake: FakePynvml, fn) -> tuple[int, collections.Counter, object]:
    before = collections.Counter(fake.calls)
    result = fn()
    delta = fake.calls - before
    return sum(delta.values()), delta, result
