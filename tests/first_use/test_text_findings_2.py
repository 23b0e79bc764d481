"""More text that misled a newcomer, mended: each test is one finding of the first-hour
review (real shell, host tensors, real kernels where a frontend matters)."""
from __future__ import annotations

import shlex
import sys

from conftest import run
from jupyter_gpumem.backends import nvml
from jupyter_gpumem.core import processes


def _out(capsys, ip, code: str, expect_error: bool = False) -> list[str]:
    capsys.readouterr()
    run(ip, code, expect_error=expect_error)
    return capsys.readouterr().out.splitlines()


# -- a suggested purge command names only what is shown ---------------------------------------
_EIGHT = "\n".join(f"x{i} = torch.ones({i + 1} << 16)" for i in range(8))


def _command_names(line: str, marker: str) -> list[str]:
    return shlex.split(line.split(marker, 1)[1].strip())


def test_a_raising_cell_suggests_purging_only_the_holders_it_shows(ip, capsys):
    run(ip, "import torch")
    lines = _out(capsys, ip, f"%%gpuwatch --device cpu\n{_EIGHT}\nraise ValueError('boom')",
                 expect_error=True)
    line = next(x for x in lines if x.startswith("biggest holders:"))
    assert "+3 more" in line, line                           # eight holders, five shown
    shown = [part.split()[0] for part in line.split("biggest holders:")[1].split("+")[0].split(",")]
    named = _command_names(line, "free them: %gpumem purge")
    assert named and set(named) <= set(shown), (named, shown)
    assert "x0" not in named and "x1" not in named, line


def test_warn_at_suggests_purging_only_the_candidates_it_shows(ip, capsys):
    run(ip, f"import torch\n{_EIGHT}")
    run(ip, "%gpumem watch on --device cpu --warn-at 0.1%")
    try:
        lines = _out(capsys, ip, "y = 1")
    finally:
        run(ip, "%gpumem watch off")
    line = next(x for x in lines if x.startswith("warning:"))
    shown = [part.split()[0] for part in line.split("purge candidates:")[1].split("→")[0].split(",")]
    named = _command_names(line, "→ %gpumem purge")
    assert len(shown) == 5 and named and set(named) <= set(shown), (named, shown)


# -- --processes without NVML cannot know, and says so ---------------------------------------
def test_processes_without_nvml_say_they_cannot_know(ip, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # no NVML library at all
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    capsys.readouterr()
    ip.run_line_magic("gpumem", "--processes")
    lines = capsys.readouterr().out.splitlines()
    assert "none" not in lines and not any(x.startswith("none") for x in lines), lines
    assert any(x.startswith("cannot know") for x in lines), lines
    assert any(x.startswith("note:") and "NVML" in x for x in lines), lines
    r = ip.run_line_magic("gpumem", "--processes -o")
    assert "cannot know" in r._repr_html_() and "no other process" not in r._repr_html_()


def test_processes_say_none_only_where_a_list_was_read():
    known = processes.DeviceProcesses("cuda:0", 0)
    unknown = processes.DeviceProcesses("cuda:1", 1, note="NVML gives no process list")
    assert processes.ProcessReport([known]).__repr__().splitlines()[1] == "none"
    mixed = processes.ProcessReport([known, unknown]).__repr__().splitlines()[1]
    assert mixed.startswith("none") and "cannot know on cuda:1" in mixed, mixed
    alone = processes.ProcessReport([unknown]).__repr__().splitlines()[1]
    assert alone.startswith("cannot know"), alone


# -- watch on and %%gpuwatch together: one report per cell -----------------------------------
def test_a_gpuwatch_cell_under_watch_on_is_reported_once(ip, capsys):
    run(ip, "import torch")
    run(ip, "%gpumem watch on --device cpu")
    try:
        lines = _out(capsys, ip, "%%gpuwatch --device cpu\na = torch.ones(1 << 20)")
        plain = _out(capsys, ip, "b = torch.ones(1 << 20)")
        run(ip, "%gpumem watch on --device cpu --warn-at 0.1%")
        warned = _out(capsys, ip, "%%gpuwatch --device cpu\nc = torch.ones(1 << 20)")
    finally:
        run(ip, "%gpumem watch off")
    assert sum("new: a 4.0 MiB" in x for x in lines) == 1, lines
    assert sum(x.startswith("%%gpuwatch · In [") for x in lines) == 1, lines
    assert sum("new: b 4.0 MiB" in x for x in plain) == 1, plain    # a plain cell keeps its footer
    assert sum("new: c 4.0 MiB" in x for x in warned) == 1, warned
    assert sum(x.startswith("warning: cpu is") for x in warned) == 1, warned   # the warning stays
