"""Edges of %%gpuwatch and the ``watch on`` footer: intervals, top-level await,
cell events IPython does not pair, output without a final newline.

A real IPython shell and real torch tensors on the CPU (``--device cpu``);
the last test drives a real kernel (ipykernel over ZMQ), where an async cell
runs inside the kernel's own event loop.
"""
from __future__ import annotations

import gc
import importlib
import os
import re
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import kernel_messages, raises_fatal, run  # noqa: E402
from conftest import sampling_threads  # noqa: E402
from IPython.core.error import UsageError  # noqa: E402

watch_mod = importlib.import_module("jupyter_gpumem.watch.scope")
from jupyter_gpumem.core import sampler as core_sampler  # noqa: E402
from jupyter_gpumem.watch.holders import HolderTracker  # noqa: E402
from jupyter_gpumem.watch.peaks import LEDGER, RssCounter  # noqa: E402
from jupyter_gpumem.watch.sampling import SamplerHub  # noqa: E402
from jupyter_gpumem.watch.state import state_for  # noqa: E402

MB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
BAD_INTERVALS = ("inf", "-inf", "nan", "1e-9", "7200", "1e400")

from test_watch import _magics, wip  # noqa: E402,F401 - the shared shell




@pytest.fixture
def thread_tracebacks(monkeypatch):
    """Every exception that ended a thread (what threading prints into the cell's output)."""
    seen: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    return seen


def _run_async(coro):
    """Drive a coroutine to its end outside any event loop, as IPython's own tests do."""
    try:
        from IPython.core.async_helpers import _pseudo_sync_runner
    except ImportError:  # pragma: no cover - older IPython
        import asyncio

        return asyncio.run(coro)
    return _pseudo_sync_runner(coro)


# -- 1. intervals ------------------------------------------------------------------------------
def test_intervals_out_of_range_are_usage_errors_everywhere(wip, thread_tracebacks):
    pytest.importorskip("ipywidgets")
    from jupyter_gpumem.views import panel as panel_mod

    ran = []
    wip.user_ns["ran"] = ran
    for value in BAD_INTERVALS:
        res = wip.run_cell(f"%%gpuwatch --device cpu --interval={value}\nran.append(1)",
                           store_history=True)
        assert isinstance(res.error_in_exec, UsageError), value
        assert "--interval" in str(res.error_in_exec) and "3600" in str(res.error_in_exec)
        res = wip.run_cell(f"%gpumem watch on --device cpu --interval={value}", store_history=True)
        assert isinstance(res.error_in_exec, UsageError), value
        res = wip.run_cell(f"%gpumem panel --device cpu --interval={value}", store_history=True)
        assert isinstance(res.error_in_exec, UsageError), value
    for value in ("inf", "nan", "1e9"):
        res = wip.run_cell(f"%gpumem panel --device cpu --window={value}", store_history=True)
        assert isinstance(res.error_in_exec, UsageError), value
    assert ran == [] and state_for(wip).footer is None
    assert panel_mod.current(wip) is None
    assert _magics(wip).sample_interval == 0.05
    # the range's ends are fine
    run(wip, "%%gpuwatch --device cpu --interval 0.001\nran.append(1)")
    run(wip, "%%gpuwatch --device cpu --interval 3600\nran.append(2)")
    assert ran == [1, 2] and thread_tracebacks == []


def test_the_sample_interval_setting_is_validated(wip, thread_tracebacks, capsys):
    from traitlets import TraitError

    m = _magics(wip)
    for value in ("float('inf')", "float('nan')", "0", "-1", "1e6"):
        run(wip, f"%config GpuMemMagics.sample_interval = {value}")   # one logged line, no raise
        assert m.sample_interval == 0.05, value
    with pytest.raises(TraitError, match="sample_interval"):
        m.sample_interval = float("inf")
    run(wip, "%config GpuMemMagics.sample_interval = 0.02")
    assert m.sample_interval == 0.02
    capsys.readouterr()
    run(wip, "%gpumem watch on --device cpu")
    assert "sampling every 20 ms" in capsys.readouterr().out
    assert thread_tracebacks == []


def test_the_python_api_rejects_intervals_out_of_range():
    import jupyter_gpumem

    for value in (float("inf"), float("nan"), 0.0, 1e-6, 1e5):
        with pytest.raises(ValueError, match="interval"):
            jupyter_gpumem.watch(device="cpu", interval=value)


def test_a_sampler_thread_never_dies_with_a_traceback(thread_tracebacks):
    sampler = core_sampler.SharedSampler(read=lambda selection: [], name="jupyter_gpumem-test")
    calls = []
    s = sampler.subscribe(lambda: calls.append(1), 0.01, name="test")
    time.sleep(0.05)
    s.interval = float("inf")        # Event.wait(inf) raises OverflowError: it is bounded
    time.sleep(0.1)
    assert s.is_alive() and s.failure is None and s.interval == core_sampler.MAX_INTERVAL
    s.stop()
    assert not s.is_alive() and calls and sampler.thread is None

    failures = []
    s = sampler.subscribe(raises_fatal("gone"), 0.05, name="test", on_failure=failures.append)
    thread = sampler.thread
    s.join(2)
    assert not s.is_alive() and s.stopped
    assert s.failure == "Fatal: gone" and failures == ["Fatal: gone"]
    thread.join(2)
    assert not thread.is_alive() and sampler.thread is None    # it was the last subscriber
    assert thread_tracebacks == []


def test_a_sampler_that_stops_is_said_in_the_report_not_in_a_traceback(wip, monkeypatch,
                                                                       thread_tracebacks):
    monkeypatch.setattr(SamplerHub, "_tick", raises_fatal("no more readings"))
    run(wip, "import time")
    run(wip, "%%gpuwatch -o r --device cpu --interval 0.01\ntime.sleep(0.1)")
    r = wip.user_ns["r"]
    assert any("sampling stopped: Fatal: no more readings" in m for m in r.messages), r.messages
    assert thread_tracebacks == []
    monkeypatch.undo()
    run(wip, "%%gpuwatch -o r2 --device cpu --interval 0.01\ntime.sleep(0.1)")   # it restarts
    assert wip.user_ns["r2"].device("cpu").samples >= 3
    assert not any("sampling stopped" in m for m in wip.user_ns["r2"].messages)


# -- 2. top-level await in %%gpuwatch -----------------------------------------------------------
def test_gpuwatch_runs_a_cell_with_top_level_await(wip, capsys):
    run(wip, "import asyncio, torch")
    res = run(wip, "%%gpuwatch -o r --device cpu\n"
                   "await asyncio.sleep(0.01)\n"
                   "t = torch.ones(1_000_000)\n"
                   "await asyncio.sleep(0.01, result=t.sum())")
    r = wip.user_ns["r"]
    assert r.change("t").change == "created" and r.change("t").after == 4_000_000
    assert r.wall >= 0.02 and r.source == "%%gpuwatch"
    assert res.result == 1_000_000 and wip.user_ns["Out"][res.execution_count] == 1_000_000
    out = capsys.readouterr().out
    assert out.startswith("%%gpuwatch") and re.search(r"\nnew: t 3\.8 MiB", out)


@pytest.mark.skipif(not RssCounter.available(), reason="no resettable peak RSS here")
def test_an_async_gpuwatch_cell_keeps_its_exact_peak(wip):
    run(wip, "import asyncio, torch\nfrom jupyter_gpumem.watch.peaks import read_rss")
    run(wip, "%%gpuwatch -o r --device cpu\n"
             "base = read_rss()['rss'][0]\n"
             "await asyncio.sleep(0)\n"
             "big = torch.ones(200 * 2**20 // 4)\n"
             "await asyncio.sleep(0)\n"
             "del big")
    r, base = wip.user_ns["r"], wip.user_ns["base"]
    assert r.device("cpu").peak_rss - base >= 190 * MB


def test_an_async_gpuwatch_cell_that_raises_reports_then_raises(wip, capsys):
    run(wip, "import asyncio, torch")
    res = wip.run_cell("%%gpuwatch -o r --device cpu\n"
                       "await asyncio.sleep(0)\n"
                       "held = torch.ones(1000)\n"
                       "raise MemoryError('out of memory')", store_history=True)
    assert isinstance(res.error_in_exec, MemoryError)
    r = wip.user_ns["r"]
    assert r.error["oom"] and r.change("held").after == 4000
    out = capsys.readouterr()
    assert "raised MemoryError" in out.out and "MemoryError" in out.out + out.err


def test_an_async_gpuwatch_cell_inside_watch_on_gives_one_report(wip, capsys):
    run(wip, "import asyncio, torch")
    run(wip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    run(wip, "%%gpuwatch --device cpu\nawait asyncio.sleep(0)\nw = torch.ones(1000)")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("%%gpuwatch") and any(ln.startswith("new: w ") for ln in lines)
    footers = [ln for ln in lines if ("tensors (peak" in ln or "tensors ·" in ln)
               and not ln.startswith("cpu: ")]   # not the report's own device line
    assert footers == []                      # the cell's one report is its own
    assert sum("new: w 3.9 KiB" in ln for ln in lines) == 1, lines
    assert watch_mod.history_for(wip)[-1].source == "%%gpuwatch"   # the report shown


def test_a_terminal_still_waits_for_the_end_of_an_awaiting_gpuwatch_cell(wip):
    manager = wip.input_transformer_manager
    assert manager.check_complete("%%gpuwatch\nawait asyncio.sleep(0)\n")[0] == "incomplete"
    assert manager.check_complete("%%gpuwatch\nawait asyncio.sleep(0)\n\n")[0] == "complete"


def test_run_cell_magic_called_with_an_awaiting_cell_runs_it(wip):
    run(wip, "import asyncio")
    run(wip, "get_ipython().run_cell_magic('gpuwatch', '-o r --device cpu',\n"
             "                            'await asyncio.sleep(0)\\nz9 = 9')")
    assert wip.user_ns["z9"] == 9 and wip.user_ns["r"].source == "%%gpuwatch"


def test_with_autoawait_off_an_awaiting_cell_is_a_syntax_error_as_in_ipython(wip):
    run(wip, "import asyncio\nz8 = 0")
    run(wip, "%autoawait off")
    try:
        res = wip.run_cell("%%gpuwatch --device cpu\nz8 = 8\nawait asyncio.sleep(0)",
                           store_history=True)
    finally:
        run(wip, "%autoawait on")
    assert isinstance(res.error_in_exec, SyntaxError) and wip.user_ns["z8"] == 0


# -- 3. pre_run_cell / post_run_cell, which IPython does not pair -----------------------------
def test_footer_survives_a_cell_that_awaits_run_cell_async(wip, capsys):
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    run(wip, "code = 'inner = torch.ones(1000)'\n"
             "await get_ipython().run_cell_async(code, transformed_cell=code)\n"
             "outer = torch.ones(1000)")          # only "pre" fires for the inner cell
    out = capsys.readouterr().out
    assert out.count("tensors") == 1 and "inner" in out and "outer" in out
    run(wip, "later = torch.ones(1000)")
    assert "new: later" in capsys.readouterr().out
    run(wip, "%gpumem watch status")
    assert "watch is on" in capsys.readouterr().out


def test_a_nested_empty_run_cell_does_not_close_the_outer_watch(wip, capsys):
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    run(wip, "get_ipython().run_cell('')\nmade = torch.ones(1000)")   # only "post" fires
    out = capsys.readouterr().out
    assert out.count("tensors") == 1 and "new: made" in out
    run(wip, "again = torch.ones(1000)")
    assert "new: again" in capsys.readouterr().out


def test_unpaired_cells_outside_any_cell_do_not_stop_the_footer(wip, capsys):
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    _run_async(wip.run_cell_async("a = 1", transformed_cell="a = 1"))     # "pre" only
    wip.run_cell("b = 2", silent=True)                                     # neither
    wip.events.trigger("post_run_cell", None)                              # "post" without "pre"
    _run_async(wip.run_cell_async("c = 3", transformed_cell="c = 3"))     # "pre" only
    capsys.readouterr()
    run(wip, "after = torch.ones(1000)")
    assert "new: after" in capsys.readouterr().out
    run(wip, "%gpumem watch off")
    assert LEDGER.open_count() == 0
    assert not sampling_threads()


# -- 4. the footer on a line of its own ----------------------------------------------------------
def test_footer_starts_on_a_line_of_its_own(wip, capsys):
    run(wip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    run(wip, "print('x', end='')")
    assert capsys.readouterr().out.startswith("x\n+0 B tensors")
    run(wip, "print('y')")
    assert capsys.readouterr().out.startswith("y\n+0 B tensors")     # no blank line
    run(wip, "pass")
    assert capsys.readouterr().out.startswith("+0 B tensors")
    run(wip, "import sys\nsys.stdout.write('partial')\nprint('', end='')")
    assert capsys.readouterr().out.startswith("partial\n+0 B tensors")


# -- a real kernel -------------------------------------------------------------------------------
class _Kernel:
    def __init__(self, kc):
        self.kc = kc

    def _cell(self, code: str, timeout: float = 120):
        """(type, content) of each iopub message of the cell, up to its idle status (not
        yielded)."""
        msg_id = self.kc.execute(code)
        for msg in kernel_messages(self.kc.get_iopub_msg, timeout):
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                return
            yield kind, content
        raise TimeoutError("the kernel did not finish")

    def messages(self, code: str, timeout: float = 120) -> list[tuple[str, str, str]]:
        """The cell's output messages in order: (type, stream name, text), and
        ("idle", "", "") at the end."""
        seen = []
        for kind, content in self._cell(code, timeout):
            if kind == "stream":
                seen.append((kind, content["name"], content["text"]))
            elif kind in ("display_data", "execute_result", "error"):
                seen.append((kind, "", ""))
        return seen + [("idle", "", "")]

    def execute(self, code: str, timeout: float = 120) -> tuple[str, list[str]]:
        """stdout of the cell, and the names of the errors it raised."""
        out, errors = [], []
        for kind, content in self._cell(code, timeout):
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "error":
                errors.append(f"{content['ename']}: {content['evalue']}")
        return "".join(out), errors


def test_in_a_real_kernel_await_footer_and_newlines(monkeypatch):
    pytest.importorskip("ipykernel")
    from jupyter_client.manager import start_new_kernel

    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        k = _Kernel(kc)
        assert k.execute("%load_ext jupyter_gpumem\nimport asyncio, torch")[1] == []
        out, errors = k.execute("%%gpuwatch -o r --device cpu\n"
                                "await asyncio.sleep(0.01)\nt = torch.ones(1_000_000)")
        assert errors == []
        out, errors = k.execute("print(r.change('t').after, r.wall >= 0.01)")
        assert (out.strip(), errors) == ("4000000 True", [])
        assert k.execute("%gpumem watch on --device cpu")[1] == []
        out, errors = k.execute("print('x', end='')")
        assert errors == [] and out.startswith("x\n+0 B tensors"), out
        # the footer is a stream message of its own, after the cell's text on both streams
        # (a cell that wrote nothing too), and before the kernel is idle again
        seen = k.messages("import sys\nprint('a')\nprint('b', file=sys.stderr)\nprint('c', end='')")
        streams = [(name, text) for kind, name, text in seen if kind == "stream"]
        assert [name for name, _ in streams][-1] == "stdout", seen
        assert "".join(t for n, t in streams if n == "stdout").startswith("a\nc\n+0 B tensors"), seen
        assert "".join(t for n, t in streams if n == "stderr") == "b\n", seen
        assert streams[-1][1].startswith("\n+0 B tensors"), seen   # after stderr's text; c ended no line
        assert seen[-1][0] == "idle", seen
        seen = k.messages("y = 1")
        assert [(kind, text.split(" ")[0]) for kind, _, text in seen] == [
            ("stream", "+0"), ("idle", "")], seen
        # the footer waits for the kernel's own flush of stderr (after the cell's hooks,
        # before its reply), so the main thread does not wait for it at that flush: a hook
        # after the footer's finds it waiting; it is out before the kernel is idle, and the
        # stream's own flush is back
        assert k.execute("pending = []\nget_ipython().events.register('post_run_cell', "
                         "lambda r: pending.append('flush' in vars(sys.stderr)))")[1] == []
        seen = k.messages("z = 1")
        assert [(kind, text.split(" ")[0]) for kind, _, text in seen] == [
            ("stream", "+0"), ("idle", "")], seen
        out, errors = k.execute("print(pending[-1], 'flush' in vars(sys.stderr))")
        assert (out.split()[:2], errors) == (["True", "False"], []), out
        out, errors = k.execute("code = 'inner = torch.ones(1000)'\n"
                                "await get_ipython().run_cell_async(code, transformed_cell=code)")
        assert errors == [] and "new: inner" in out, out
        out, errors = k.execute("later = torch.ones(1000)")
        assert errors == [] and "new: later" in out, out
        out, errors = k.execute("%gpumem watch status")
        assert "watch is on" in out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_gpuwatch_honours_a_trailing_semicolon_like_time(ip):
    """``%%gpuwatch`` whose last line ends with ``;`` shows no value and keeps none in Out."""
    from conftest import run

    run(ip, "import torch")
    result = run(ip, "%%gpuwatch --device cpu\nt = torch.ones(10)\nt;")
    assert result.result is None
    assert result.execution_count not in ip.user_ns["Out"]
    result = run(ip, "%%gpuwatch --device cpu\nt")
    assert result.result is ip.user_ns["t"]   # without ';' the value stays the cell's result


def test_plot_in_a_terminal_says_where_the_png_went(tmp_path):
    """A terminal IPython shows no image: ``%gpumem plot`` names the file instead of
    printing ``<IPython.core.display.Image object>``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("matplotlib")
    cells = ("%load_ext jupyter_gpumem\nimport torch\n%gpumem watch on --device cpu\n"
             "t = torch.ones(1000)\n%gpumem plot\nexit\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--simple-prompt"],
                         input=cells, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(root), "MPLBACKEND": "Agg"})
    assert "display.Image object" not in out.stdout, out.stdout
    line = next(ln for ln in out.stdout.splitlines() if "saved it to" in ln)
    path = line.split("saved it to ", 1)[1].split(" ", 1)[0]
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    os.unlink(path)
