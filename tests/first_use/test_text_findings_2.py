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
        run(ip, "%gpumem watch off\n%config GpuMemMagics.warn_at = None")
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
        run(ip, "%gpumem watch off\n%config GpuMemMagics.warn_at = None")
    assert sum("new: a 4.0 MiB" in x for x in lines) == 1, lines
    assert sum(x.startswith("%%gpuwatch · In [") for x in lines) == 1, lines
    assert sum("new: b 4.0 MiB" in x for x in plain) == 1, plain    # a plain cell keeps its footer
    assert sum("new: c 4.0 MiB" in x for x in warned) == 1, warned
    assert sum(x.startswith("warning: cpu is") for x in warned) == 1, warned   # the warning stays


def test_a_gpuwatch_cell_whose_watch_cannot_start_gets_the_footers_report(ip, capsys,
                                                                        monkeypatch):
    """The footer stays quiet only for a %%gpuwatch cell whose own watch started: one that
    could not start (a fault injected into its start) runs unwatched, and the footer's
    line is then the cell's one report."""
    from jupyter_gpumem.magics import watched_cell

    def broken(*args, **kwargs):
        raise RuntimeError("no watch today")

    run(ip, "import torch")
    run(ip, "%gpumem watch on --device cpu")
    try:
        monkeypatch.setattr(watched_cell, "Watch", broken)
        lines = _out(capsys, ip, "%%gpuwatch --device cpu\nd = torch.ones(1 << 20)")
        monkeypatch.undo()
        after = _out(capsys, ip, "%%gpuwatch --device cpu\ne = torch.ones(1 << 20)")
    finally:
        run(ip, "%gpumem watch off")
    assert sum("new: d 4.0 MiB" in x for x in lines) == 1, lines
    assert not any(x.startswith("%%gpuwatch · In [") for x in lines), lines
    assert sum("new: e 4.0 MiB" in x for x in after) == 1, after   # its own report, once
    assert sum(x.startswith("%%gpuwatch · In [") for x in after) == 1, after


# -- trace names lines as typed, and a %%time cell's lines with its number -------------------
def _sites(ip, capsys, names: str) -> dict[str, str]:
    capsys.readouterr()
    ip.run_line_magic("gpumem", f"{names} --device cpu")
    out = {}
    for line in capsys.readouterr().out.splitlines():
        parts = line.split()
        if parts and parts[0] in names.split() and "Tensor" in line:
            out[parts[0]] = line.split("]", 1)[1].strip() if "cell [" not in line else \
                line[line.index("cell ["):]
    return out


def test_trace_names_a_magic_line_as_typed_and_a_timed_cell_by_its_number(ip, capsys):
    run(ip, "import torch")
    run(ip, "%gpumem trace on --lines --device cpu")
    try:
        k2 = run(ip, "%time k2 = torch.ones(1 << 15)").execution_count
        k3 = run(ip, "%%time\nk3 = torch.ones(1 << 15)\nk4 = torch.ones(1 << 16)").execution_count
        k5 = run(ip, "%%timeit -n1 -r1\nglobal k5\nk5 = torch.ones(1 << 15)").execution_count
        sites = _sites(ip, capsys, "k2 k3 k4 k5")
    finally:
        run(ip, "%gpumem trace off")
    assert sites["k2"] == f"cell [{k2}] line 1: %time k2 = torch.ones(1 << 15)", sites
    assert sites["k3"] == f"cell [{k3}] line 1: k3 = torch.ones(1 << 15)", sites
    assert sites["k4"] == f"cell [{k3}] line 2: k4 = torch.ones(1 << 16)", sites
    assert sites["k5"] == f"cell [{k5}] line 2: k5 = torch.ones(1 << 15)", sites
    assert not any("get_ipython()" in s or "<timed exec>" in s for s in sites.values()), sites


def test_the_allocator_historys_frames_of_a_timed_cell_name_the_cell(ip):
    """The GPU path reads frames from torch's allocator history (dicts, innermost
    first): the same frames, taken from a real %%time cell, name the cell's line."""
    from jupyter_gpumem.core.cells import CellNames
    from jupyter_gpumem.core.trace.sites import Resolver
    run(ip, "import traceback\ndef grab():\n"
            "    return [{'filename': f.filename, 'line': f.lineno, 'name': f.name}\n"
            "            for f in reversed(traceback.extract_stack()[:-1])]")
    n = run(ip, "%%time\nx = 1\nframes = grab()").execution_count
    site = Resolver(CellNames(ip)).site(ip.user_ns["frames"])
    assert (site.cell, site.line, site.source) == (n, 2, "frames = grab()"), site
    run(ip, "def grab2():\n    return grab()")
    m = run(ip, "%time frames = grab2()").execution_count
    site = Resolver(CellNames(ip)).site(ip.user_ns["frames"], outer=True)
    assert (site.cell, site.source) == (m, "%time frames = grab2()"), site


# -- every option of %gpumem trace is in the guide -------------------------------------------
def test_every_trace_option_is_documented_in_the_guide():
    from pathlib import Path
    from jupyter_gpumem.magics import trace
    guide = (Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md").read_text()
    options = [s for a in trace._parser()._actions for s in a.option_strings
               if s.startswith("--") and s != "--help"]
    assert "--max-entries" in options and "--stacks" in options, options
    missing = [o for o in options if f"`{o}" not in guide]
    assert not missing, f"in `%gpumem trace`'s help, not in docs/GUIDE.md: {missing}"


# -- the plot: one measure per axis, legends that say what, labels clear of markers ----------
def test_the_plot_keeps_the_process_apart_from_the_tensors_and_labels_clear(ip):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    run(ip, "import torch, time")
    run(ip, "%gpumem history --clear")
    run(ip, "%gpumem watch on --device cpu --interval 0.01")
    try:
        for i in range(4):
            run(ip, f"t{i} = torch.ones({(i + 1) << 18})\ntime.sleep(0.05)")
        fig = ip.run_line_magic("gpumem", "plot -o")
    finally:
        run(ip, "%gpumem watch off")
    by_axes = [{ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
               for ax in fig.axes]
    process = [i for i, labels in enumerate(by_axes) if any("process" in k for k in labels)]
    tensors = [i for i, labels in enumerate(by_axes) if any("tensors" in k for k in labels)]
    assert len(process) == 1 and len(tensors) == 1 and process != tensors, by_axes
    # no axis mixes the process's measure with the tensors'
    assert not any("tensors" in k for k in by_axes[process[0]]), by_axes
    assert not any("process" in k for k in by_axes[tensors[0]]), by_axes
    peak = [k for k in by_axes[process[0]] if k.endswith("cell peak")]
    assert peak == ["cpu RSS of the process (exact high-water), cell peak"], by_axes
    for i in (process[0], tensors[0]):       # each legend says each measure
        legend = [t.get_text() for t in fig.axes[i].get_legend().get_texts()]
        assert legend == list(by_axes[i]), legend
    assert "process" in fig.axes[process[0]].get_ylabel()
    assert "tensors" in fig.axes[tensors[0]].get_ylabel()
    # the tensors' curve fills its own axis: its top is the tensors' largest value
    top = max(max(ln.get_ydata()) for ln in by_axes[tensors[0]].values())
    assert fig.axes[tensors[0]].get_ylim()[1] < 2 * top, (fig.axes[tensors[0]].get_ylim(), top)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [t for ax in fig.axes for t in ax.texts if t.get_text().startswith("[")]
    assert len(labels) == 4, [t.get_text() for t in labels]
    for ax in fig.axes:
        for ln in ax.lines:
            if ln.get_marker() in ("v", "o"):
                pts = ax.transData.transform(list(zip(ln.get_xdata(), ln.get_ydata())))
                for t in labels:
                    box = t.get_window_extent(renderer).expanded(1.0, 1.0)
                    hit = [p for p in pts if box.x0 - 4 <= p[0] <= box.x1 + 4
                           and box.y0 - 4 <= p[1] <= box.y1 + 4]
                    assert not hit, (t.get_text(), ln.get_label(), hit)
