"""What a new user meets on first use: notes, wording, help and output that must not
confuse (each test names the rough edge it keeps away)."""
from __future__ import annotations

import os.path
import sys

import pytest
from IPython.core.error import UsageError

torch = pytest.importorskip("torch")

import jupyter_gpumem  # noqa: E402
from jupyter_gpumem.core.scan import kinds as scan_kinds  # noqa: E402
from conftest import run  # noqa: E402


def refused_notes(messages):
    return [m for m in messages if " object(s) refused introspection" in m]


# -- 1. the "refused introspection" note ------------------------------------------------
def test_a_script_namespace_holding_the_package_refuses_nothing():
    ns = {"jupyter_gpumem": jupyter_gpumem, "join": os.path.join, "x": torch.ones(8)}
    snap = jupyter_gpumem.snapshot(ns, device="cpu")
    assert snap.holder("x") is not None
    assert refused_notes(snap.messages) == [], snap.messages


def test_a_usage_error_leaves_no_refused_note_in_later_reports(ip):
    ip.user_ns["x"] = torch.ones(8)
    res = ip.run_cell("%gpumem purge nosuch --device cpu")
    assert type(res.error_in_exec).__name__ == "UsageError"
    assert sys.last_traceback is not None
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert refused_notes(snap.messages) == [], snap.messages


class Stubborn:
    """An object whose reading fails (see the test below)."""


def test_the_refused_note_names_types_and_where_and_v_lists_all(ip, monkeypatch):
    real = scan_kinds.HANDLERS[scan_kinds.FUNCTION]

    def failing(walker, obj):
        if getattr(obj, "__name__", "").startswith("stubborn"):
            raise RuntimeError("cannot be read")
        return real(walker, obj)

    monkeypatch.setitem(scan_kinds.HANDLERS, scan_kinds.FUNCTION, failing)
    ip.user_ns["x"] = torch.ones(8)
    for i in range(5):
        exec(f"def stubborn{i}(): pass", ip.user_ns)
        ip.user_ns[f"box{i}"] = [ip.user_ns.pop(f"stubborn{i}")]
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    (note,) = refused_notes(snap.messages)
    assert note.startswith("5 object(s) refused introspection and were skipped: function in box")
    assert note.count("function in box") == 3 and note.endswith("(%gpumem -v lists all)"), note
    verbose = ip.run_line_magic("gpumem", "-v --device cpu -o")
    (note,) = refused_notes(verbose.messages)
    assert all(f"function in box{i}" in note for i in range(5)) and "-v" not in note, note
    assert snap.holder("x").unique == 32


# -- 2. no phantom Out entry -----------------------------------------------------------
@pytest.mark.parametrize("body", ["c.sum();", "import asyncio\nawait asyncio.sleep(0)\nc.sum();"])
def test_a_gpuwatch_cell_ending_in_a_semicolon_reports_no_out(ip, capsys, body):
    ip.user_ns["c"] = torch.ones(4)
    ip.run_cell_magic("gpuwatch", "--device cpu -o w", "c + 0")   # the shell's first count
    res = run(ip, "%%gpuwatch --device cpu -o w\n" + body)
    number = res.execution_count
    report = ip.user_ns["w"]
    assert number not in ip.user_ns["Out"]
    assert f"Out[{number}]" not in str(report), str(report)
    assert res.result is None
    # without the semicolon the value is Out[N], and the report says so
    res = run(ip, "%%gpuwatch --device cpu -o w\n" + body.rstrip(";"))
    assert res.execution_count in ip.user_ns["Out"]
    assert f"Out[{res.execution_count}]" in str(ip.user_ns["w"]), str(ip.user_ns["w"])


# -- 7. -o: the result alone is the output ---------------------------------------------
@pytest.mark.parametrize("line", ["--device cpu -o", "purge --device cpu -o",
                                  "history -o"])
def test_dash_o_shows_the_report_once(ip, capsys, line):
    ip.user_ns["x"] = torch.ones(8)
    capsys.readouterr()
    res = run(ip, f"%gpumem {line}")
    out = capsys.readouterr().out
    assert res.result is not None
    text = str(res.result).splitlines()[0]
    assert out.count(text) == 1, out
    run(ip, f"r = %gpumem {line}")
    assert capsys.readouterr().out == "" and ip.user_ns["r"] is not None


# -- 8. one phrase per fact ------------------------------------------------------------
def test_report_and_purge_say_the_same_of_a_name_that_holds_nothing(ip):
    ip.user_ns["nothing"] = [1, 2]
    said = []
    for line in ("nothing --device cpu", "purge nothing --device cpu"):
        with pytest.raises(UsageError) as info:
            ip.run_line_magic("gpumem", line)
        said.append(str(info.value).partition(" (")[0])
    assert said == ["'nothing' holds no host memory"] * 2, said


def test_no_accelerator_is_said_one_way_whatever_the_device_asked():
    notes = set()
    for device in ("auto", "cpu", "all"):
        snap = jupyter_gpumem.snapshot({}, device=device)
        notes |= {m for m in snap.messages if m.startswith("no accelerator")}
    assert notes == {"no accelerator: showing host tensors (device cpu)"}, notes


# -- 9. a share keeps the precision given ----------------------------------------------
@pytest.mark.parametrize("given, said", [("0.1%", "warn at 0.1%"), ("12.5%", "warn at 12.5%"),
                                         ("80%", "warn at 80%"), ("0.8", "warn at 80%")])
def test_warn_at_is_echoed_with_its_precision(ip, capsys, given, said):
    try:
        ip.run_line_magic("gpumem", f"watch on --warn-at {given} --device cpu")
        out = capsys.readouterr().out
        assert said + " ·" in out, out
        ip.run_line_magic("gpumem", "watch status")
        assert said + " ·" in capsys.readouterr().out
    finally:
        ip.run_line_magic("gpumem", "watch off --warn-at off")


# -- 10. tame status follows the settings ----------------------------------------------
def test_tame_status_follows_the_environment(ip, capsys, monkeypatch):
    from jupyter_gpumem.backends import tame as tame_mod
    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "TF_FORCE_GPU_ALLOW_GROWTH",
                 "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)
    try:
        ip.run_line_magic("gpumem", "tame")
        ip.run_line_magic("gpumem", "tame off")
        capsys.readouterr()
        status = ip.run_line_magic("gpumem", "tame status -o").frameworks
        assert status and not any("on demand" in v for v in status.values()), status
        assert all(v.endswith("take its pool up front; `%gpumem tame` still applies")
                   or v.endswith("too late for this process") for v in status.values()), status
        ip.run_line_magic("gpumem", "tame")
        status = ip.run_line_magic("gpumem", "tame status -o").frameworks
        assert all(v.endswith(("it will allocate on demand", "too late for this process"))
                   for v in status.values()), status
    finally:
        tame_mod.untame()


# -- 11. default_device is checked when set ----------------------------------------------
def test_a_bad_default_device_is_refused_when_set(ip):
    from traitlets import TraitError
    magics = ip.magics_manager.registry["GpuMemMagics"]
    with pytest.raises(TraitError, match=r"^GpuMemMagics.default_device: unknown device "
                       r"'bogus': use auto, all, cpu, cuda or cuda:N$"):
        magics.default_device = "bogus"
    assert magics.default_device == "auto"
    ip.run_line_magic("config", "GpuMemMagics.default_device = 'bogus'")
    assert magics.default_device == "auto"
    magics.default_device = "cpu"
    magics.default_device = "auto"


def test_a_bad_setting_in_the_config_is_one_line_and_keeps_the_default():
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    code = ("from traitlets.config import Config\n"
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "c = Config(); c.GpuMemMagics.default_device = 'bogus'\n"
            "c.GpuMemMagics.scan_time_limit = 7.0\n"
            "ip = InteractiveShell.instance(config=c)\n"
            "ip.run_line_magic('load_ext', 'jupyter_gpumem')\n"
            "ip.run_line_magic('gpumem', 'watch on')\n"
            "ip.run_cell('x = 1', store_history=True)\n"
            "m = ip.magics_manager.registry['GpuMemMagics']\n"
            "print('SETTINGS', m.default_device, m.scan_time_limit)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, env=env, timeout=120)
    assert "SETTINGS auto 7.0" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("jupyter_gpumem: GpuMemMagics.default_device: unknown device "
                                   "'bogus': use auto, all, cpu, cuda or cuda:N; the setting "
                                   "keeps 'auto'"), proc.stderr
    assert "failed" not in proc.stdout, proc.stdout


# -- 12. %gpumem? lists every subcommand -----------------------------------------------
def test_the_help_lists_every_subcommand_and_its_options(ip, capsys):
    from jupyter_gpumem.magics import gpumem as gpumem_magics
    doc = ip.find_line_magic("gpumem").__doc__
    lines = [line.strip() for line in doc.splitlines()]
    subcommands = {"purge", *gpumem_magics.SUBCOMMANDS}
    assert "trace" in subcommands
    for name in subcommands:
        assert any(line.startswith(f"%gpumem {name} ") for line in lines), (name, doc)
    assert any(line.startswith("%%gpuwatch ") for line in lines), doc
    # each option a subcommand's parser knows is in its help line
    for name, make in (("trace", "jupyter_gpumem.magics.trace:_parser"),
                       ("panel", "jupyter_gpumem.magics.panel:_parser"),
                       ("plot", "jupyter_gpumem.magics.watch:_plot_parser"),
                       ("history", "jupyter_gpumem.magics.watch:_history_parser"),
                       ("watch", "jupyter_gpumem.magics.watch:_watch_parser")):
        module, _, attr = make.partition(":")
        p = getattr(sys.modules[module], attr)()
        (line,) = [ln for ln in lines if ln.startswith(f"%gpumem {name} ")]
        for action in p._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":   # (every command has it)
                    assert flag in line, (name, flag, line)
    ip.run_line_magic("gpumem", "help")
    assert capsys.readouterr().out.strip() == gpumem_magics.USAGE


# -- 13. the plot ----------------------------------------------------------------------
def test_plot_labels_never_overlap_and_leave_out_the_plot_cells(ip, capsys, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    ip.user_ns["torch"] = torch
    run(ip, "%gpumem history --clear")    # the shell's records of earlier tests
    run(ip, "%gpumem watch on --device cpu --interval 0.01")
    try:
        run(ip, "import time\nbig = torch.ones(1 << 16)\ntime.sleep(0.3)")
        for i in range(12):
            run(ip, f"t{i} = torch.ones(64)")
        run(ip, f"%gpumem plot --save {tmp_path / 'a.png'}")
        fig = ip.run_line_magic("gpumem", "plot -o")
    finally:
        run(ip, "%gpumem watch off")
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().startswith("[")]
    shown = [t.get_text() for t in labels]
    # the cells that ran %gpumem (watch on, plot) are not on the plot: 13 cells of code
    peaks = [ln for ln in ax.lines if ln.get_label().endswith("cell peak")]
    assert len(peaks[0].get_xdata()) == 13, peaks[0].get_xdata()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (shown, a, b)
    assert shown, shown   # labelled, and no two labels overlap


def test_plot_in_a_shell_without_a_display_says_where_the_png_went(ip, capsys):
    import matplotlib
    matplotlib.use("Agg")
    ip.user_ns["torch"] = torch
    run(ip, "%gpumem watch on --device cpu --interval 0.01")
    try:
        run(ip, "t = torch.ones(64)")
        capsys.readouterr()
        run(ip, "%gpumem plot")
    finally:
        run(ip, "%gpumem watch off")
    out = capsys.readouterr().out
    assert "IPython.core.display.Image" not in out, out
    assert "no display here shows the figure: saved it to " in out, out
    path = out.split("saved it to ")[1].split()[0]
    assert open(path, "rb").read(4) == b"\x89PNG"
    os.unlink(path)


# -- 14. the product's own commands get no footer; a device that is not here ---------
def test_own_commands_get_no_footer_line(ip, capsys):
    ip.user_ns["torch"] = torch
    run(ip, "%gpumem watch on --device cpu")
    try:
        run(ip, "x = torch.ones(100)")
        assert "+400 B tensors" in capsys.readouterr().out
        run(ip, "%gpumem watch status")
        run(ip, "%gpumem purge nosuch --device cpu", expect_error=True)
        run(ip, "r = %gpumem --device cpu -o\n# a comment")
        out = capsys.readouterr()
        assert "raised UsageError" not in out.out + out.err, out
        assert out.out.splitlines() == [out.out.splitlines()[0]], out    # the status alone
        assert out.out.startswith("watch is on · device cpu")
        run(ip, "y = 1")
        assert " · " in capsys.readouterr().out
    finally:
        run(ip, "%gpumem watch off")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with no GPU")
@pytest.mark.parametrize("line", ["--device cuda:0", "--device cuda", "purge --device cuda:0",
                                  "watch on --device cuda:0", "panel --device cuda:1"])
def test_a_device_that_is_not_here_is_one_line(ip, line):
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("gpumem", line)
    assert str(info.value).startswith("no device cuda"), str(info.value)
    assert "this process sees no accelerator" in str(info.value)


# -- 20. a hint does not repeat the name -----------------------------------------------
def test_a_hint_names_its_holder_once(ip):
    model = torch.nn.Linear(64, 64)
    ip.user_ns["opt"] = torch.optim.SGD(model.parameters(), lr=0.1)
    ip.user_ns["torch"] = torch
    ip.user_ns["loss"] = model(torch.ones(2, 64)).square().mean()
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    text, html = str(snap), snap._repr_html_()
    hints = [ln for ln in text.splitlines() if ln.startswith("hint: ")]
    assert "hint: `opt` holds its parameters and their state: purge it together with its " \
        "model" in hints, hints
    assert any(ln.startswith("hint: `loss` keeps its autograd graph alive") for ln in hints)
    assert "opt: `opt`" not in text and "loss: `loss`" not in text, text
    assert "<b>opt</b>:" not in html and "<b>loss</b>:" not in html
    # a hint that does not name its holder still says whose it is
    run(ip, "torch.ones(1 << 10)")
    hints = [ln for ln in str(ip.run_line_magic("gpumem", "--device cpu -o")).splitlines()
             if ln.startswith("hint: Out[")]
    assert hints and ": a value shown as a cell's result stays in Out" in hints[0], hints
