"""The live panel on a real CUDA device (issue 4's GPU acceptance).

While one cell allocates and frees GPU memory in steps for about twelve
seconds, the panel's background thread keeps reading the device (its
recorded series, ``Panel.series``) at its default interval of one second:
the series must show every step up and every step down. A second test
purges a checked name through the panel's widgets and sees the device's
memory come back. Both print their figures (run with ``-s`` to see them
live; they are also in the junit/terminal report on failure).

Skips, with the reason, where torch, CUDA, IPython or ipywidgets is absent.
"""
from __future__ import annotations

import datetime
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("IPython", reason="IPython is not installed (see GPU.md: wheels.sh)")
pytest.importorskip("ipywidgets", reason="ipywidgets is not installed (see GPU.md: wheels.sh)")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: the panel's GPU path needs one")

from gpu_floor import empty_caches, empty_caches_after_each_test  # noqa: E402,F401

MiB = 1 << 20
STEP = 512 * MiB
HOLD = 2.0  # seconds per step: at least one reading at the panel's 1 s interval
STEPS = 3
SLACK = 8 * MiB

STEPS_CELL = f"""\
_blocks = []
for _ in range({STEPS}):
    _blocks.append(torch.empty({STEP}, dtype=torch.uint8, device="cuda:0"))
    torch.cuda.synchronize()
    time.sleep({HOLD})
while _blocks:
    _blocks.pop()
    torch.cuda.synchronize()
    time.sleep({HOLD})
del _blocks
"""


def run(sh, code: str):
    result = sh.run_cell(code, store_history=True)
    assert result.error_before_exec is None and result.error_in_exec is None, code
    return result


@pytest.fixture
def gpu_shell(ip):
    from jupyter_gpumem.views import panel as panel_mod

    run(ip, "import time, torch\n_warm = torch.ones(1, device='cuda:0') @ torch.ones(1, device='cuda:0')\n"
            "torch.cuda.synchronize()")
    # every test starts with no cache (whatever ran before): the floor is the floor,
    # and the steps' memory has to come from the device
    empty_caches()
    yield ip
    panel_mod.close(ip)


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / MiB:9.1f}"


def _collapse(levels: list[int]) -> list[int]:
    out: list[int] = []
    for level in levels:
        if not out or out[-1] != level:
            out.append(level)
    return out


def test_panel_series_shows_the_steps_of_a_running_cell(gpu_shell, capsys):
    from jupyter_gpumem.views import panel as panel_mod

    ip = gpu_shell
    run(ip, "%gpumem panel --device cuda:0")
    panel = panel_mod.current(ip)
    assert panel is not None and panel.interval == 1.0
    time.sleep(2.5)  # readings before the cell: the floor
    start = time.time()
    run(ip, STEPS_CELL)
    end = time.time()
    points = panel.series.points()
    before = [v["cuda:0"] for t, v in points if t < start]
    inside = [(t - start, v["cuda:0"]) for t, v in points if start <= t <= end]
    assert before, "no reading before the cell"
    floor = before[-1]
    levels = [round((d["allocated"] - floor["allocated"]) / STEP) for _, d in inside]

    with capsys.disabled():
        print(f"\n{datetime.date.today()} · {torch.cuda.get_device_name(0)} · torch "
              f"{torch.__version__} · step {STEP // MiB} MiB held {HOLD} s, "
              f"panel interval {panel.interval} s")
        print(f"floor: allocated {_mib(floor['allocated'])} MiB, reserved "
              f"{_mib(floor['reserved'])} MiB, process (NVML) {_mib(floor['used_process'])} MiB")
        print("   t s   allocated MiB   reserved MiB   process MiB   level")
        for (t, d), level in zip(inside, levels):
            print(f"{t:6.2f}   {_mib(d['allocated'])}       {_mib(d['reserved'])}      "
                  f"{_mib(d['used_process'])}    {level}")

    assert len(inside) >= 2 * STEPS * HOLD - 3, "the thread did not read during the cell"
    for (_, d), level in zip(inside, levels):  # every reading sits on a step
        assert abs(d["allocated"] - floor["allocated"] - level * STEP) <= SLACK, d
    steps = _collapse(levels)
    while steps and steps[0] == 0:  # a reading may fall before the first allocation
        steps.pop(0)
    assert steps == [1, 2, 3, 2, 1, 0], levels
    top = max(d["reserved"] for _, d in inside)
    assert top - floor["reserved"] >= STEPS * STEP - SLACK  # the allocator kept what it got
    if floor["used_process"] is not None:  # NVML sees the process grow by the steps too
        grown = max(d["used_process"] for _, d in inside) - floor["used_process"]
        assert grown >= STEPS * STEP - SLACK, grown
    assert "data-line='allocated'" in panel.timeline.value
    assert "data-segment='allocated'" in panel.bars.value


def test_purging_a_checked_name_frees_the_device(gpu_shell, capsys):
    from jupyter_gpumem.views import panel as panel_mod

    ip = gpu_shell
    baseline = torch.cuda.memory_allocated(0)   # what lives before big and small (caches emptied)
    run(ip, "big = torch.empty(1024 * 2**20, dtype=torch.uint8, device='cuda:0')\n"
            "small = torch.empty(64 * 2**20, dtype=torch.uint8, device='cuda:0')\n"
            "torch.cuda.synchronize()")
    run(ip, "%gpumem panel --device cuda:0")
    panel = panel_mod.current(ip)
    names = [h["name"] for h in panel.snapshot["holders"]]
    assert names[:2] == ["big", "small"], names
    allocated_before = torch.cuda.memory_allocated(0)
    panel.checkbox("big").value = True
    panel.purge_button.click()
    assert "big" in ip.user_ns  # only asked so far
    panel.confirm_button.click()
    allocated_after = torch.cuda.memory_allocated(0)
    freed = panel.result.value
    with capsys.disabled():
        print(f"\n{datetime.date.today()} · {torch.cuda.get_device_name(0)} · allocated "
              f"{_mib(allocated_before)} -> {_mib(allocated_after)} MiB; panel says: "
              f"{freed.split('· freed')[1].split('<')[0].strip() if '· freed' in freed else freed}")
    assert "big" not in ip.user_ns and "small" in ip.user_ns
    # the purge also empties cuBLAS workspaces (allocated through torch's allocator),
    # so the drop is big's 1 GiB plus any of those; what stays above the baseline is small
    assert allocated_before - allocated_after >= 1024 * MiB
    assert abs(allocated_after - baseline - 64 * MiB) < MiB   # blocks are rounded up a little
    assert [h["name"] for h in panel.snapshot["holders"]][:1] == ["small"]
    assert "data-purge-result" in freed and "freed" in freed
    run(ip, "del small")
