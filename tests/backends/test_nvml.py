"""How many NVML calls one device read costs, for 1, 2, 4 and 8 GPUs.

NVML cannot exist on this machine, so a fake ``pynvml`` module (the same
function names, record attributes and error codes as nvidia-ml-py) is put in
``sys.modules`` and counts every call; the real ``nvml.py``/``devices.py``
logic runs on it. A "read" is one ``devices.read_devices_now("cuda")``: what the
sampling threads of ``%%gpuwatch``, the panel and the sidebar do every 50 ms
to 1 s.

Device handles, UUIDs, names and the UUID -> index map are read once per
process; after that a read of N GPUs asks each GPU its memory info and its
list of compute processes, once per device however many callers want them
(the device line, the CuPy backend), and nothing else, except the list of
graphics processes of a device whose compute list does not show this
process, at most once a second. The real library is counted the same way in
``tests/gpu/test_nvml_gpu.py``; ``benchmarks/nvml_calls.py`` prints the
figures.
"""
from __future__ import annotations

import sys

import pytest

from jupyter_gpumem.core import devices
from jupyter_gpumem.backends import nvml
from counting_nvml import (
    GiB, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_NOT_SUPPORTED, PID, SCENARIOS, Clock, NVMLError,
    counted, install, uuid_of,
)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(nvml, "_clock", c)
    return c


def read(device: str = "cuda"):
    return devices.read_devices_now(device)


# -- the counts ---------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_a_read_costs_two_calls_per_gpu_after_the_first(monkeypatch, clock, n, scenario):
    fake = install(monkeypatch, n, scenario)
    first, calls, _ = counted(fake, read)
    # init, count, then per GPU: handle, UUID, name (once per process); memory info and the
    # compute list (per read); the graphics list where the process has no compute context
    without_context = sum(1 for i in range(n) if not any(p == PID for p, _ in fake.procs[i]))
    assert first == 2 + 3 * n + 2 * n + without_context, calls
    for _ in range(5):
        clock.now += 0.05
        total, calls, result = counted(fake, read)
        assert total == 2 * n, calls
        assert calls == {"nvmlDeviceGetMemoryInfo": n, "nvmlDeviceGetComputeRunningProcesses": n}
        assert [d.used_process for d in result] == [i * GiB if i % 2 else 0 for i in range(n)]
    clock.now += nvml.GRAPHICS_EVERY
    total, calls, _ = counted(fake, read)
    assert total == 2 * n + without_context, calls
    assert calls["nvmlDeviceGetGraphicsRunningProcesses"] == without_context


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_numbering_and_notes_cost_no_call_after_the_first_read(monkeypatch, clock, n):
    fake = install(monkeypatch, n, "nvml only", visible=",".join(
        uuid_of(i)[:12] for i in reversed(range(n))))
    read()
    total, calls, ids = counted(fake, lambda: (
        devices.selected_ids("cuda"), nvml.visible_indices(), nvml.order_note(),
        [nvml.index_for_uuid(uuid_of(i)) for i in range(n)], nvml.device_count(),
        nvml.available(), nvml.status()))
    assert total == 0, calls
    assert ids[1] == list(reversed(range(n))) and ids[3] == list(range(n))


def test_callers_outside_a_read_get_fresh_figures(monkeypatch, clock):
    fake = install(monkeypatch, 2)
    assert nvml.process_used(1) == GiB
    fake.procs[1] = [(PID, 3 * GiB)]
    total, calls, value = counted(fake, lambda: nvml.process_used(1))
    assert value == 3 * GiB and calls == {"nvmlDeviceGetComputeRunningProcesses": 1}
    fake.used[1] = 5 * GiB
    assert nvml.read_device(1).used == 5 * GiB


def test_one_read_asks_each_device_once_whatever_asks(monkeypatch, clock):
    fake = install(monkeypatch, 4, "torch + cupy")
    read()

    def many_callers():
        with nvml.reading():
            for _ in range(3):
                for i in range(4):
                    nvml.read_device(i), nvml.process_used(i), nvml.process_used(i, pid=1)
                with nvml.reading():                      # a nested one shares the figures
                    devices.read_devices_now("cuda")

    total, calls, _ = counted(fake, many_callers)
    assert calls == {"nvmlDeviceGetMemoryInfo": 4, "nvmlDeviceGetComputeRunningProcesses": 4}
    total, calls, _ = counted(fake, many_callers)          # the next reading asks again
    assert total == 8, calls


def test_each_thread_has_its_own_reading(monkeypatch, clock):
    import threading

    fake = install(monkeypatch, 2)
    seen = []
    with nvml.reading():
        assert nvml.process_used(1) == GiB
        fake.procs[1] = [(PID, 2 * GiB)]
        assert nvml.process_used(1) == GiB         # the same reading: the same figure
        t = threading.Thread(target=lambda: seen.append(nvml.process_used(1)))
        t.start()
        t.join()
    assert seen == [2 * GiB] and nvml.process_used(1) == 2 * GiB


# -- the readings are those of the code before caching ------------------------------------

def test_readings_match_direct_reads(monkeypatch, clock):
    fake = install(monkeypatch, 4, "torch", visible="3,1", order=[3, 1])
    fake.procs[3] = [(PID, 2 * GiB), (7, GiB)]
    fake.graphics[1] = [(PID, GiB)]                # compute and graphics: the same figure
    for _ in range(2):
        a, b = read()
        assert (a.id, a.nvml_index, a.uuid, a.name) == ("cuda:0", 3, uuid_of(3), "NVIDIA H200")
        assert (a.total, a.used_all, a.free, a.used_process) == (141 * GiB, 3 * GiB, 138 * GiB, 2 * GiB)
        assert (b.nvml_index, b.uuid, b.used_process, b.other_processes) == (1, uuid_of(1), GiB, 0)


def test_a_graphics_only_context_is_seen_within_a_second(monkeypatch, clock):
    fake = install(monkeypatch, 1)
    fake.procs[0] = []
    assert nvml.process_used(0) == 0
    fake.graphics[0] = [(PID, GiB)]
    clock.now += nvml.GRAPHICS_EVERY
    assert nvml.process_used(0) == GiB


def test_unknown_figure_in_the_compute_list_falls_back_to_graphics(monkeypatch, clock):
    fake = install(monkeypatch, 1)
    fake.procs[0] = [(PID, None)]
    assert nvml.process_used(0) is None
    fake.graphics[0] = [(PID, GiB)]
    clock.now += nvml.GRAPHICS_EVERY
    assert nvml.process_used(0) == GiB


def test_a_device_without_graphics_lists_is_not_asked_again(monkeypatch, clock):
    fake = install(monkeypatch, 2)
    fake.graphics_error = NVML_ERROR_NOT_SUPPORTED
    read()
    for _ in range(3):
        clock.now += nvml.GRAPHICS_EVERY
        total, calls, _ = counted(fake, read)
        assert total == 4, calls


# -- a driver that goes away --------------------------------------------------------------

def test_a_driver_that_goes_away_gives_none_then_comes_back(monkeypatch, clock):
    fake = install(monkeypatch, 2, "nvml only")
    assert [d.used_all for d in read()] == [0, GiB]
    fake.gone = NVML_ERROR_GPU_IS_LOST
    du = read()
    assert all(d.used_all is None and d.used_process is None for d in du)
    assert "NVML went away" in nvml.status() and "GPU is lost" in nvml.status()
    # meanwhile nothing is asked: a sampler does not hammer a missing driver
    total, calls, du = counted(fake, read)
    assert total == 0 and du == [] and nvml.read_device(0) is None
    clock.now += nvml.RETRY_EVERY
    total, calls, du = counted(fake, read)           # one try: nvmlInit, still failing
    assert calls == {"nvmlInit": 1} and du == []
    fake.gone = None
    clock.now += nvml.RETRY_EVERY
    du = read()
    assert [d.used_all for d in du] == [0, GiB] and [d.used_process for d in du] == [0, GiB]
    assert nvml.status() is None and fake.calls["nvmlShutdown"] == 1
    total, calls, _ = counted(fake, read)
    assert total == 4, calls


def test_an_error_that_does_not_mean_gone_keeps_the_cache(monkeypatch, clock):
    fake = install(monkeypatch, 2)
    read()
    real = fake.nvmlDeviceGetMemoryInfo

    def not_supported(h):
        fake.calls["nvmlDeviceGetMemoryInfo"] += 1
        if h[1] == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return real.__wrapped__(fake, h)

    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", not_supported)
    a, b = read()
    assert a.used_all is None and a.uuid == uuid_of(0) and b.used_all == GiB
    assert nvml.status() is None
    total, calls, _ = counted(fake, read)
    assert total == 4 and "nvmlDeviceGetHandleByIndex" not in calls


def test_one_device_that_cannot_be_read_at_start_is_tried_again_later(monkeypatch, clock):
    fake = install(monkeypatch, 2, "nvml only")
    real = fake.nvmlDeviceGetUUID
    broken = {"on": True}

    def uuid(h):
        if broken["on"] and h[1] == 1:
            fake.calls["nvmlDeviceGetUUID"] += 1
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return real(h)

    monkeypatch.setattr(fake, "nvmlDeviceGetUUID", uuid)
    assert nvml.index_for_uuid(uuid_of(1)) is None and nvml.read_device(1) is None
    assert nvml.read_device(0).uuid == uuid_of(0)
    broken["on"] = False
    total, _, _ = counted(fake, lambda: nvml.index_for_uuid(uuid_of(1)))
    assert total == 0                                  # not before a second has passed
    clock.now += nvml.RETRY_EVERY
    assert nvml.index_for_uuid(uuid_of(1)) == 1 and nvml.read_device(1).used == GiB


def test_without_pynvml_nothing_is_asked_twice(monkeypatch, clock):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml raises ImportError
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    assert not nvml.available() and "NVML unavailable" in nvml.status()
    clock.now += 10 * nvml.RETRY_EVERY
    assert nvml.read_device(0) is None and nvml.visible_indices() == []
    assert nvml.process_used(0) is None and nvml.index_for_uuid(uuid_of(0)) is None
