"""Device numbering: CUDA_VISIBLE_DEVICES to NVML indices, per-process figures.

There is no GPU here, so NVML is a fake shaped like ``pynvml`` (the same
function names and record attributes); the real path runs in
``tests/gpu/test_multi_gpu.py``.
"""
from __future__ import annotations

import mmap
import os
import sys
import time
import types

import pytest

from jupyter_gpumem.core import devices
from jupyter_gpumem.backends import nvml
from jupyter_gpumem.backends import AcceleratorInfo

GiB = 1 << 30
UUIDS = ["GPU-4a3b2c1d-0000-1111-2222-333344445555",
         "GPU-4a3b9999-0000-1111-2222-333344445555",
         "GPU-7f000000-aaaa-bbbb-cccc-ddddeeeeffff"]


class FakeNvml(types.SimpleNamespace):
    """Three GPUs; this process uses 1 GiB on physical GPU 1 (compute and graphics)."""

    class NVMLError(Exception):
        pass

    def __init__(self, names=("NVIDIA H200",) * 3, pid=4242, used_memory=GiB):
        super().__init__()
        self.names, self.pid, self.used_memory = names, pid, used_memory

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.names):
            raise self.NVMLError("Invalid Argument")
        return ("handle", i)

    def nvmlDeviceGetUUID(self, h):
        return UUIDS[h[1]].encode()

    def nvmlDeviceGetName(self, h):
        return self.names[h[1]]

    def nvmlDeviceGetMemoryInfo(self, h):
        used = 3 * GiB if h[1] == 1 else 0
        return types.SimpleNamespace(total=141 * GiB, used=used, free=141 * GiB - used)

    def _procs(self, h):
        if h[1] != 1:
            return []
        return [types.SimpleNamespace(pid=self.pid, usedGpuMemory=self.used_memory),
                types.SimpleNamespace(pid=1, usedGpuMemory=2 * GiB)]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._procs(h)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return self._procs(h)


@pytest.fixture
def fake(monkeypatch):
    nv = FakeNvml()
    monkeypatch.setattr(nvml, "_pynvml", lambda: nv)
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    monkeypatch.setattr(devices.os, "getpid", lambda: nv.pid)
    monkeypatch.setattr(nvml.os, "getpid", lambda: nv.pid)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return nv


CUDA_VISIBLE_DEVICES_CASES = [
    (None, [0, 1, 2]),
    ("1", [1]),
    ("2,0", [2, 0]),
    (" 1 , 2 ", [1, 2]),
    ("0,7,1", [0]),                      # stops at the first device that does not exist
    ("1,1,2", [1]),                      # and at a repeat
    ("-1", []),
    ("", []),
    (UUIDS[2], [2]),                     # a full UUID
    ("GPU-7f00", [2]),                   # an unambiguous prefix
    ("7f00", [2]),                       # the prefix without GPU-
    ("GPU-4a3b,1", []),                  # an ambiguous prefix matches nothing
    ("GPU-4a3b9,0", [1, 0]),
    ("MIG-0000,0", []),
]


@pytest.mark.parametrize("env, expected", CUDA_VISIBLE_DEVICES_CASES)
def test_cuda_visible_devices_maps_to_nvml_indices(fake, env, expected):
    assert nvml.visible_indices(env) == expected


def test_the_mapping_follows_the_environment_once_the_devices_are_known(fake, monkeypatch):
    nvml.read_device(0)                          # handles and UUIDs are now kept
    for env, expected in CUDA_VISIBLE_DEVICES_CASES * 2:
        if env is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
        assert nvml.visible_indices() == expected, env
        assert [a.id for a in devices.accelerators()] == [f"cuda:{i}" for i in range(len(expected))]
        assert [d.nvml_index for d in devices.read_devices_now("cuda")] == expected, env


def test_accelerators_are_numbered_within_cuda_visible_devices(fake, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    accs = devices.accelerators()
    assert [a.id for a in accs] == ["cuda:0", "cuda:1"]
    first, second = devices.read_devices_now("cuda")
    assert (first.id, first.nvml_index, first.uuid) == ("cuda:0", 1, UUIDS[1])
    assert (second.id, second.nvml_index, second.uuid) == ("cuda:1", 2, UUIDS[2])
    assert first.used_process == GiB and first.other_processes == 2 * GiB
    assert second.used_process == 0


def test_a_framework_uuid_wins_over_position(fake, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    du = devices._accelerator_usage(AcceleratorInfo("cuda:0", "cuda", uuid=UUIDS[2]))
    assert du.nvml_index == 2 and du.notes == []


def test_process_in_both_nvml_lists_counts_once(fake):
    assert nvml.process_used(1) == GiB
    assert nvml.process_used(0) == 0


def test_unknown_per_process_figure_is_none(fake):
    fake.used_memory = None
    assert nvml.process_used(1) is None


def test_mixed_gpus_without_pci_order_say_numbering_may_differ(fake, monkeypatch):
    fake.names = ("NVIDIA H200", "NVIDIA A100 80GB PCIe", "NVIDIA H200")
    du = devices._accelerator_usage(AcceleratorInfo("cuda:1", "cuda"))
    assert du.nvml_index == 1 and any("CUDA_DEVICE_ORDER" in n for n in du.notes)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert devices._accelerator_usage(AcceleratorInfo("cuda:1", "cuda")).notes == []


def test_without_nvml_everything_is_none(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(nvml, "_pynvml", missing)
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    assert nvml.visible_indices("1") == [] and nvml.process_used(0) is None
    assert "NVML unavailable" in nvml.status()


def test_dataparallel_and_its_module_count_once(ip):
    from conftest import run

    run(ip, "import torch\nm = torch.nn.Linear(512, 512)\ndp = torch.nn.DataParallel(m)")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    weights = (512 * 512 + 512) * 4
    for name in ("m", "dp"):
        h = snap.holder(name)
        assert (h.unique, h.shared, h.devices) == (0, weights, {"cpu": weights})
    assert snap.holder("dp").largest_path == "dp.module.weight"
    assert next(d for d in snap.devices if d.id == "cpu").attributed == weights
    result = ip.run_line_magic("gpumem", "purge dp --device cpu -o")
    assert any(s.by == "m" for s in result.still_held)


def test_distributed_data_parallel_counts_once(ip, tmp_path):
    import torch.distributed as dist

    from conftest import run

    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        run(ip, "import torch\nm = torch.nn.Linear(512, 512)\n"
                "ddp = torch.nn.parallel.DistributedDataParallel(m)")
        snap = ip.run_line_magic("gpumem", "--device cpu -o")
        weights = (512 * 512 + 512) * 4
        assert snap.holder("m").total == weights
        assert snap.holder("ddp").shared == weights and "m" in snap.holder("ddp").shared_with
        ip.run_line_magic("gpumem", "purge ddp m --device cpu")
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_host_figures_are_read_fresh_from_kept_proc_files_and_a_forked_child_reads_its_own():
    total, avail, rss = devices._host_memory()
    with open("/proc/self/statm") as f:
        expect = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert total > avail > 0 and abs(rss - expect) < 16 << 20
    assert total == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert abs(devices.process_rss() - devices.process_memory()[0]) < 16 << 20, \
        "statm's resident set is status's VmRSS"
    grown = _resident(64 << 20)
    assert devices._host_memory()[2] >= rss + (48 << 20), "read again, not a kept figure"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child grows by 128 MiB while the parent waits: it must see it
        try:
            before = devices._host_memory()[2]
            more = _resident(128 << 20)  # noqa: F841
            os.write(write, str(devices._host_memory()[2] - before).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert int(os.read(read, 64)) >= 96 << 20, "the child read the parent's figures"
    grown.close()


def _resident(nbytes: int) -> mmap.mmap:
    """Fresh pages, each touched: resident (freed heap memory could be reused)."""
    m = mmap.mmap(-1, nbytes)
    for at in range(0, nbytes, mmap.PAGESIZE):
        m[at] = 1
    return m


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_proc_reads_keep_the_interpreter_lock_with_the_c_core():
    """In a kernel each time the main thread lets go of the lock, the busy I/O thread
    may keep it for as long as a message takes to send: a footer's /proc reads keep it."""
    import threading

    from jupyter_gpumem.core.scan import native

    core = native.CORE
    if core is None or not hasattr(core, "pread_held"):
        pytest.skip("the C core is not built here (or JUPYTER_GPUMEM_PURE_SCAN=1), or lacks its /proc readers")
    assert devices._pread is core.pread_held
    with open("/proc/self/cmdline", "rb") as f:
        assert devices.read_proc("/proc/self/cmdline") == f.read()
    devices.read_proc("/proc/self/status")   # opened now: opening a file lets go of the lock
    devices.process_memory()
    ran, go, stop = [0], threading.Lock(), threading.Event()
    go.acquire()

    def other():
        with go:
            while not stop.is_set():
                ran[0] += 1
                time.sleep(0)   # lets go of the lock at once: it runs only when main lets go

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)     # no forced switch: the other thread runs only if main lets go
    thread = threading.Thread(target=other, daemon=True)
    try:
        thread.start()
        go.release()
        before = ran[0]
        for _ in range(200):
            devices.read_proc("/proc/self/status")
            devices.process_memory()
        held = ran[0] - before
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:   # the control: reads that let go of the lock let the other thread in, once
            before, deadline = ran[0], time.monotonic() + 10.0   # it is scheduled (a busy machine)
            while ran[0] == before and time.monotonic() < deadline:
                os.pread(fd, 16384, 0)
            released = ran[0] - before
        finally:
            os.close(fd)
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        thread.join(5)
    assert held == 0, f"the other thread ran {held} times during reads that keep the lock"
    assert released > 0, "os.pread lets go of the lock: the check can see it"


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc")
def test_the_peak_resident_set_resets_through_the_kept_descriptor():
    from jupyter_gpumem.watch.peaks import RssCounter

    if not RssCounter.available():
        pytest.skip("/proc/self/clear_refs is not writable here")
    grown = _resident(64 << 20)
    grown.close()
    rss, hwm = devices.process_memory()
    assert hwm >= rss + (32 << 20), "the 64 MiB came and went: the peak is above the resident set"
    RssCounter().reset()
    RssCounter().reset()          # again, through the same kept descriptor
    rss, hwm = devices.process_memory()
    assert hwm - rss < 16 << 20
