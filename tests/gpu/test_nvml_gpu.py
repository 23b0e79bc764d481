"""NVML on a real GPU: the kept handles give the same figures, for two calls per GPU.

``nvml.py`` reads the device count, handles, UUIDs and names once per process
and, per read, only each device's memory info and compute processes. Here,
against the real library:

- every figure (total, used, free, UUID, name, this process) equals an
  uncached read done the way the code did before (handle, UUID, name, memory
  info, compute and graphics lists, on every call), and the devices map to
  the NVML index of their UUID;
- a later read sees a 1 GiB allocation and its release (nothing is kept
  from one read to the next but what cannot change);
- a wrapper around the real ``pynvml`` counts the calls: after the first
  read, a read of the visible GPUs makes exactly two per GPU (the graphics
  list, asked once a second at most, held off here);
- in a child with ``CUDA_VISIBLE_DEVICES`` set to the last GPU's UUID (and to
  a prefix of it), ``cuda:0`` is that physical GPU, before and after torch
  starts, and a read costs two calls whatever the number of GPUs.

Skips, with the reason, without torch, CUDA or NVML. Figures are printed
(run with ``-s``) for benchmarks/RESULTS.md.

Run on the GPU machine: ``python3 -m pytest -q -s tests/gpu/test_nvml_gpu.py``.
"""
from __future__ import annotations

import collections
import datetime
import os
import statistics
import sys
import textwrap
import time
import types

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
if not torch.cuda.is_available():   # asks the driver without creating a CUDA context
    pytest.skip("no CUDA device: runs on the GPU machine", allow_module_level=True)

from jupyter_gpumem.core import devices
from jupyter_gpumem.backends import nvml  # noqa: E402

if not nvml.available():
    pytest.skip(f"NVML is not available: {nvml.status()}", allow_module_level=True)

from conftest import child_result  # noqa: E402
from gpu_floor import empty_caches_after_each_test  # noqa: E402,F401

MiB = 1 << 20
GiB = 1 << 30


def figures(test: str, **values) -> None:
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    text = ", ".join(f"{k}={v}" for k, v in values.items())
    print(f"\n[figures {when} {pynvml_name()}] {test}: {text}")


def pynvml_name() -> str:
    return _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Counting(types.ModuleType):
    """The real ``pynvml``, every ``nvml*`` call counted (what our code calls, not pynvml's own)."""

    def __init__(self, real):
        super().__init__("pynvml")
        self._real = real
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name):
        value = getattr(self._real, name)
        if name.startswith("nvml") and callable(value):
            calls = self.calls

            def counted(*args, **kwargs):
                calls[name] += 1
                return value(*args, **kwargs)
            return counted
        return value

    def since(self, before: collections.Counter) -> collections.Counter:
        return self.calls - before


@pytest.fixture
def counting(monkeypatch):
    """``nvml.py`` started afresh on a counting wrapper of the real library; put back after."""
    wrapper = Counting(pynvml)
    monkeypatch.setitem(sys.modules, "pynvml", wrapper)
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    yield wrapper
    nvml._shutdown()          # this fresh start's nvmlInit; the process's own stays


def cuda_ready() -> None:
    """torch's context on cuda:0, so its devices carry UUIDs (as in a notebook that uses it)."""
    torch.ones(1, device="cuda:0")
    torch.cuda.synchronize()


def uncached(index: int, pid: int | None = None) -> dict:
    """One physical device read the way nvml.py did before it kept anything."""
    nv = pynvml
    pid = os.getpid() if pid is None else pid
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    lists = [list(nv.nvmlDeviceGetComputeRunningProcesses(h))]
    try:
        lists.append(list(nv.nvmlDeviceGetGraphicsRunningProcesses(h)))
    except Exception:  # noqa: BLE001 - as before: a device without graphics lists
        pass
    # per list, this process's bytes (None where the driver gives no figure); the
    # larger list wins, an unknown one counts only when no list knows any bytes
    sums = [None if None in values else sum(map(int, values))
            for values in ([p.usedGpuMemory for p in procs if p.pid == pid] for procs in lists)]
    known = max((v for v in sums if v is not None), default=0)
    return {"uuid": _text(nv.nvmlDeviceGetUUID(h)), "name": _text(nv.nvmlDeviceGetName(h)),
            "total": int(mem.total), "used": int(mem.used), "free": int(mem.free),
            "process": None if None in sums and not known else known}


def ours(du) -> dict:
    """A device line's NVML figures, keyed as ``uncached`` (its name may be torch's)."""
    return {"uuid": du.uuid, "total": du.total, "used": du.used_all, "free": du.free,
            "process": du.used_process}


def nvml_part(reading: dict) -> dict:
    return {k: v for k, v in reading.items() if k != "name"}


def stable(read, attempts: int = 20):
    """``read()`` between two uncached reads that agree (the card at rest), and that reading."""
    for _ in range(attempts):
        before = {i: uncached(i) for i in range(pynvml.nvmlDeviceGetCount())}
        got = read()
        after = {i: uncached(i) for i in range(pynvml.nvmlDeviceGetCount())}
        if before == after:
            return got, before
        time.sleep(0.05)
    pytest.fail("the card never stayed still for one read (another process allocating?)")


def test_readings_equal_uncached_reads(counting):
    cuda_ready()
    x = torch.ones(GiB // 4, device="cuda:0")
    torch.cuda.synchronize()
    devices.read_devices_now("cuda")                        # the first read keeps the handles
    for _ in range(3):
        usages, ref = stable(lambda: devices.read_devices_now("cuda"))
        by_uuid = {r["uuid"]: i for i, r in ref.items()}
        assert [d.id for d in usages] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        for ordinal, du in enumerate(usages):
            torch_uuid = "GPU-" + str(torch.cuda.get_device_properties(ordinal).uuid)
            assert du.nvml_index == by_uuid[torch_uuid], (du.id, torch_uuid)
            assert ours(du) == nvml_part(ref[du.nvml_index]), du.id
        direct, ref = stable(lambda: {i: (nvml.read_device(i), nvml.process_used(i))
                                      for i in range(nvml.device_count())})
        for i, (dev, proc) in direct.items():
            assert (dev.uuid, dev.name, dev.total, dev.used, dev.free, proc) == tuple(
                ref[i][k] for k in ("uuid", "name", "total", "used", "free", "process"))
    du = usages[0]
    figures("readings against uncached reads", devices=len(usages),
            nvml_index=du.nvml_index, total_MiB=du.total // MiB, used_MiB=du.used_all // MiB,
            this_process_MiB=du.used_process // MiB)
    assert du.used_process >= GiB
    del x


def test_a_later_read_sees_an_allocation_and_its_release(counting):
    cuda_ready()
    torch.cuda.empty_cache()
    base, _ = stable(lambda: devices.read_devices_now("cuda:0")[0].used_process)
    x = torch.ones(GiB // 4, device="cuda:0")
    torch.cuda.synchronize()
    held, ref = stable(lambda: devices.read_devices_now("cuda:0")[0])
    assert held.used_process - base >= GiB and ours(held) == nvml_part(ref[held.nvml_index])
    del x
    torch.cuda.empty_cache()
    after, _ = stable(lambda: devices.read_devices_now("cuda:0")[0].used_process)
    figures("a read after each change", before_MiB=base // MiB,
            with_1GiB_MiB=held.used_process // MiB, after_MiB=after // MiB)
    assert abs(after - base) <= 16 * MiB


def test_a_read_costs_two_calls_per_gpu(counting, monkeypatch):
    cuda_ready()
    physical = pynvml.nvmlDeviceGetCount()
    visible = torch.cuda.device_count()
    devices.read_devices_now("cuda")
    first = counting.since(collections.Counter())
    assert first["nvmlInit"] == 1 and first["nvmlDeviceGetCount"] == 1, first
    for once in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName"):
        assert first[once] == physical, first
    assert first["nvmlDeviceGetMemoryInfo"] == visible, first
    assert first["nvmlDeviceGetComputeRunningProcesses"] == visible, first
    assert first["nvmlDeviceGetGraphicsRunningProcesses"] <= visible, first

    monkeypatch.setattr(nvml, "GRAPHICS_EVERY", 3600.0)   # the once-a-second list held off
    times = []
    for _ in range(50):
        before = collections.Counter(counting.calls)
        t0 = time.perf_counter()
        devices.read_devices_now("cuda")
        times.append(time.perf_counter() - t0)
        calls = counting.since(before)
        assert calls == {"nvmlDeviceGetMemoryInfo": visible,
                         "nvmlDeviceGetComputeRunningProcesses": visible}, calls
    monkeypatch.setattr(nvml, "GRAPHICS_EVERY", 0.0)
    before = collections.Counter(counting.calls)
    devices.read_devices_now("cuda")
    with_graphics = counting.since(before)
    assert sum(with_graphics.values()) <= 3 * visible, with_graphics

    reference = []
    for _ in range(50):
        t0 = time.perf_counter()
        [uncached(i) for i in range(visible)]
        reference.append(time.perf_counter() - t0)
    figures("NVML calls per read", physical_gpus=physical, visible_gpus=visible,
            first_read=sum(first.values()), later_read=2 * visible,
            with_graphics_list=sum(with_graphics.values()),
            read_median_us=round(statistics.median(times) * 1e6, 1),
            uncached_nvml_only_median_us=round(statistics.median(reference) * 1e6, 1))


CHILD = textwrap.dedent("""
    import collections, json, sys, types
    import pynvml as real

    class Counting(types.ModuleType):
        def __init__(self):
            super().__init__("pynvml")
            self.calls = collections.Counter()
        def __getattr__(self, name):
            value = getattr(real, name)
            if name.startswith("nvml") and callable(value):
                def counted(*a, **k):
                    self.calls[name] += 1
                    return value(*a, **k)
                return counted
            return value

    wrapper = sys.modules["pynvml"] = Counting()
    from jupyter_gpumem.backends import nvml
    from jupyter_gpumem.core import devices

    def read():
        before = collections.Counter(wrapper.calls)
        du = devices.read_devices_now("cuda")
        return du, sum((wrapper.calls - before).values())

    out = {}
    du, _ = read()                              # no framework: NVML and the variable alone
    du, calls = read()
    out["nvml_only"] = {"ids": [d.id for d in du], "index": du[0].nvml_index,
                        "uuid": du[0].uuid, "calls": calls}
    import torch
    x = torch.ones(1 << 28, device="cuda")      # 1 GiB on cuda:0
    torch.cuda.synchronize()
    du, _ = read()
    du, calls = read()
    out["torch"] = {"ids": [d.id for d in du], "index": du[0].nvml_index, "uuid": du[0].uuid,
                    "calls": calls, "used_process": du[0].used_process,
                    "torch_uuid": str(torch.cuda.get_device_properties(0).uuid),
                    "physical": {i: nvml.process_used(i) for i in range(nvml.device_count())}}
    print("RESULT " + json.dumps(out))
    """)


@pytest.mark.parametrize("form", ["uuid", "prefix"])
def test_cuda_visible_devices_by_uuid_maps_to_that_gpu(form):
    last = pynvml.nvmlDeviceGetCount() - 1
    uuid = _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(last)))
    value = uuid if form == "uuid" else uuid[:len("GPU-") + 8]   # as CUDA's docs abbreviate
    out = child_result(CHILD, set_env={"CUDA_VISIBLE_DEVICES": value}, any_exit=True)
    figures(f"CUDA_VISIBLE_DEVICES={value}", result=out)
    for part in ("nvml_only", "torch"):
        got = out[part]
        assert got["ids"] == ["cuda:0"] and got["index"] == last and got["uuid"] == uuid, got
        assert got["calls"] == 2, got               # one visible GPU: memory info, processes
    assert uuid.endswith(out["torch"]["torch_uuid"])
    assert out["torch"]["used_process"] >= GiB
    assert out["torch"]["physical"][str(last)] == out["torch"]["used_process"]
    others = {i: v for i, v in out["torch"]["physical"].items() if i != str(last)}
    assert not any(others.values()), others
