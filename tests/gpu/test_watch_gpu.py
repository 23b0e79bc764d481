"""%%gpuwatch and `%gpumem watch on` on a real CUDA device (issue 3's GPU acceptance).

- a cell that allocates 2 GiB for a moment and frees it: peak >= 2 GiB above
  its start, change near zero;
- nested scopes (`watch on` around `with watch()` around `with watch()`, a
  `%%gpuwatch` cell under `watch on`, a user's `reset_peak_memory_stats()`
  inside): every scope's peak stays right, and the user's own
  `max_memory_allocated()` is not lowered by the scopes' resets;
- the sampler (NVML, every 50 ms) sees a transient that lasts 200 ms;
- after a forced out-of-memory error (`set_per_process_memory_fraction`), the
  report names the holders and its purge command brings the process back to
  at most 2 MiB above its floor (measured with every cache emptied: gpu_floor.py).

Each test prints its figures (run with ``-s``, or ``-rA`` to see them after
passing tests). Skips, with the reason, where torch, CUDA or IPython is absent.
"""
from __future__ import annotations

import datetime
import importlib

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("IPython", reason="IPython is not installed (see GPU.md: wheels.sh)")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: the GPU path of %%gpuwatch needs one")

from gpu_floor import (  # noqa: E402,F401
    assert_at_most_floor, empty_caches, empty_caches_after_each_test, floor, process_bytes)

MiB = 1 << 20
GiB = 1 << 30
DEV = "cuda:0"


def figures(test: str, **values) -> None:
    """Print one line of measured figures (MiB where bytes)."""
    when = datetime.datetime.now().isoformat(timespec="seconds")
    name = torch.cuda.get_device_name(0)
    text = ", ".join(f"{k}={v / MiB:.1f} MiB" if isinstance(v, int) and abs(v) >= MiB
                     else f"{k}={v}" for k, v in values.items())
    print(f"\n[figures {when} {name}] {test}: {text}")


def run(sh, code: str):
    result = sh.run_cell(code, store_history=True)
    assert result.error_before_exec is None and result.error_in_exec is None, code
    return result


def watch_mod():
    return importlib.import_module("jupyter_gpumem.watch.scope")


def raw_peak(index: int = 0) -> int:
    """The allocator's own peak, not the user view the extension restores."""
    return torch._C._cuda_memoryStats(index)["allocated_bytes"]["all"]["peak"]


@pytest.fixture
def gpu(ip):
    run(ip, "import time, torch, jupyter_gpumem\n"
            "_w = torch.ones(64, 64, device='cuda:0') @ torch.ones(64, 64, device='cuda:0')\n"
            "del _w")
    empty_caches()   # every test starts with no cache, whatever ran before
    yield ip
    run(ip, "%gpumem watch off")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    m = ip.magics_manager.registry["GpuMemMagics"]
    m.warn_at, m.auto_purge_hidden = None, False
    watch_mod().history_for(ip).clear()


def transient(gib: float) -> str:
    return (f"_t = torch.empty({int(gib * GiB)}, dtype=torch.uint8, device='cuda:0')\n"
            "_t.fill_(1)\ntorch.cuda.synchronize()\ndel _t\n")


def test_transient_2_gib_peak_and_no_change(gpu):
    run(gpu, "%%gpuwatch -o r --device cuda:0\n" + transient(2))
    d = gpu.user_ns["r"].device(DEV)
    figures("transient 2 GiB", allocated_before=d.allocated_before, peak=d.peak_allocated,
            peak_above_start=d.peak_allocated - d.allocated_before,
            allocated_delta=d.allocated_delta, reserved_delta=d.reserved_delta,
            sampled_process_peak=d.process_peak_sampled, samples=d.samples)
    assert d.peak_measure == "torch allocator, exact"
    assert d.peak_allocated - d.allocated_before >= 2 * GiB
    assert abs(d.allocated_delta) <= 1 * MiB
    print(gpu.user_ns["r"])


def test_nested_scopes_keep_the_outer_peak_right(gpu):
    run(gpu, "%gpumem watch on --device cuda:0")
    run(gpu, "with jupyter_gpumem.watch(device='cuda:0', report=False) as outer:\n"
             "    start = torch.cuda.memory_allocated()\n"
             + "".join("    " + ln + "\n" for ln in transient(3).splitlines()) +
             "    with jupyter_gpumem.watch(device='cuda:0', report=False) as inner:\n"
             + "".join("        " + ln + "\n" for ln in transient(1).splitlines()) +
             "        torch.cuda.reset_peak_memory_stats()\n"
             + "".join("        " + ln + "\n" for ln in transient(0.5).splitlines()) +
             "        user_peak_since_reset = torch.cuda.max_memory_allocated() - start\n"
             + "".join("    " + ln + "\n" for ln in transient(0.25).splitlines()))
    footer_block = watch_mod().history_for(gpu)[-1].device(DEV)
    run(gpu, "%%gpuwatch -o cellw --device cuda:0\n" + transient(1.5))
    footer_cell = watch_mod().history_for(gpu)[-1].device(DEV)
    ns = gpu.user_ns
    start = ns["start"]
    outer, inner = ns["outer"].result.device(DEV), ns["inner"].result.device(DEV)
    cellw = ns["cellw"].device(DEV)
    figures("nested scopes", outer_peak_above_start=outer.peak_allocated - start,
            inner_peak_above_start=inner.peak_allocated - start,
            user_peak_since_own_reset=ns["user_peak_since_reset"],
            footer_of_block_cell_above_start=footer_block.peak_allocated - start,
            gpuwatch_cell_peak_above_start=cellw.peak_allocated - cellw.allocated_before,
            footer_of_gpuwatch_cell=footer_cell.peak_allocated - footer_cell.allocated_before)
    assert 3 * GiB <= outer.peak_allocated - start < 3 * GiB + 64 * MiB
    assert 1 * GiB <= inner.peak_allocated - start < 1 * GiB + 64 * MiB
    assert 0.5 * GiB <= ns["user_peak_since_reset"] < 0.5 * GiB + 64 * MiB
    assert footer_block.peak_allocated - start >= 3 * GiB
    assert 1.5 * GiB <= cellw.peak_allocated - cellw.allocated_before < 1.5 * GiB + 64 * MiB
    assert footer_cell.peak_allocated - footer_cell.allocated_before >= 1.5 * GiB


def test_the_users_peak_reading_is_not_lowered_by_watching(gpu):
    run(gpu, "torch.cuda.reset_peak_memory_stats()\nbase = torch.cuda.memory_allocated()\n"
             + transient(4))
    run(gpu, "%gpumem watch on --device cuda:0")
    run(gpu, transient(0.1))
    run(gpu, "%%gpuwatch --device cuda:0\n" + transient(1))
    run(gpu, "%gpumem watch off")
    base = gpu.user_ns["base"]
    seen = torch.cuda.max_memory_allocated(0) - base
    flat = torch.cuda.memory_stats(0)["allocated_bytes.all.peak"] - base
    real = raw_peak(0) - base
    figures("user view", user_max_memory_allocated=seen, user_memory_stats_peak=flat,
            allocator_peak_after_resets=real)
    assert real < 2 * GiB            # the scopes did reset the allocator's peak...
    assert seen >= 4 * GiB and flat >= 4 * GiB   # ...and the user still reads the 4 GiB
    run(gpu, "torch.cuda.reset_peak_memory_stats()")
    assert torch.cuda.max_memory_allocated(0) - base < 2 * GiB   # until the user resets it


def test_sampler_sees_a_200_ms_transient(gpu):
    from jupyter_gpumem.backends import nvml

    if not nvml.available():
        pytest.skip(f"NVML is not available: {nvml.status()}")
    run(gpu, "torch.cuda.empty_cache()")
    run(gpu, "%%gpuwatch -o r --device cuda:0\n"
             "_t = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:0')\n_t.fill_(1)\n"
             "torch.cuda.synchronize()\ntime.sleep(0.2)\ndel _t\ntorch.cuda.empty_cache()")
    d = gpu.user_ns["r"].device(DEV)
    figures("200 ms transient", process_before=d.process_before,
            sampled_peak=d.process_peak_sampled,
            sampled_above_start=d.process_peak_sampled - d.process_before,
            process_after=d.process_after, samples=d.samples, wall_s=round(gpu.user_ns["r"].wall, 3))
    assert d.samples >= 3
    assert d.process_peak_sampled - d.process_before >= 1 * GiB - 16 * MiB
    assert abs(d.process_after - d.process_before) <= 16 * MiB
    assert "sampled every 50 ms" in gpu.user_ns["r"].verbose_text()


def test_out_of_memory_report_names_holders_and_its_purge_returns_to_the_floor(gpu):
    from jupyter_gpumem.backends import nvml

    if not nvml.available():
        pytest.skip(f"NVML is not available: {nvml.status()}")
    base = floor()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(8 * GiB / total, 0)
    run(gpu, "%gpumem watch on --device cuda:0")
    run(gpu, "a = torch.ones(2 * 2**30 // 4, device='cuda:0')")
    shown = run(gpu, "torch.ones(2**30 // 4, device='cuda:0')").execution_count
    res = gpu.run_cell("def step():\n"
                       "    act = torch.ones(3 * 2**30 // 4, device='cuda:0')\n"
                       "    more = torch.empty(10 * 2**30, dtype=torch.uint8, device='cuda:0')\n"
                       "    return act, more\n"
                       "out = step()", store_history=True)
    assert type(res.error_in_exec).__name__ == "OutOfMemoryError"
    r = watch_mod().history_for(gpu)[-1]
    names = [h.name for h in r.holders]
    figures("out of memory", floor=base, holders=[(h.name, f"{h.nbytes / MiB:.0f} MiB")
                                                    for h in r.holders],
            purge_command=r.purge_command)
    print(r)
    assert r.error["oom"] and r.error["type"] == "OutOfMemoryError"
    assert names[:3] == ["last traceback", "a", f"Out[{shown}]"]
    assert set(r.purge_names) >= {"last traceback", "a", f"Out[{shown}]"}
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    run(gpu, r.purge_command)                 # the next cell, as the report suggests
    run(gpu, "%gpumem watch off")
    after = process_bytes()
    figures("out of memory, after the suggested purge", floor=base, after=after,
            above_floor=after - base, allocated=torch.cuda.memory_allocated(0))
    assert_at_most_floor(after, base, "after the out-of-memory report's purge")
    assert "a" not in gpu.user_ns


def test_gpuwatch_reports_an_out_of_memory_error(gpu):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(4 * GiB / total, 0)
    gpu.run_cell("keep = torch.ones(2**30 // 4, device='cuda:0')", store_history=True)
    res = gpu.run_cell("%%gpuwatch -o r --device cuda:0\n"
                       "x = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda:0')",
                       store_history=True)
    r = gpu.user_ns["r"]
    figures("%%gpuwatch out of memory", holders=[(h.name, h.nbytes // MiB) for h in r.holders],
            purge_command=r.purge_command, cell_error=type(res.error_in_exec).__name__)
    assert r.error["oom"] and "keep" in r.purge_names
    gpu.run_cell("del keep", store_history=True)
