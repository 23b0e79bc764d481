"""The live panel (%gpumem panel), driven in-process through its real widgets.

A real InteractiveShell, real torch tensors on the CPU (``--device cpu``) and
real ipywidgets; where a test needs to see what the widgets send, their comms
record the messages (ipywidgets' DummyComm pattern) instead of dropping them.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ipywidgets")

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

from jupyter_gpumem.views import panel as panel_mod  # noqa: E402
from jupyter_gpumem.views import panel_render  # noqa: E402
from jupyter_gpumem.session import session_of  # noqa: E402
from panel_driving import open_panel, shown_rows  # noqa: E402

MiB = 1 << 20


SAMPLING = ("jupyter_gpumem-sampler", "jupyter_gpumem-panel")   # the session's, a panel's own


def _hooked(shell, owner) -> bool:
    """Whether a cell event of ``shell`` calls a method of ``owner`` (directly or through
    the session)."""
    session = session_of(shell)
    hooks = [fn for name in ("pre_run_cell", "post_run_cell")
             for fn in shell.events.callbacks[name]]
    if session is not None:
        hooks += [fn for pair in session.dispatch.hooks for fn in pair]
    return any(getattr(fn, "__self__", None) is owner for fn in hooks)


def _panel_threads() -> list[threading.Thread]:
    """Sampling threads alive (the panel's is its session's: nothing else here subscribes)."""
    return [t for t in threading.enumerate() if t.name in SAMPLING and t.is_alive()]


@pytest.fixture
def shell(ip):
    """conftest's shell, with torch imported; no panel or panel thread outlives a test."""
    run(ip, "import torch, time")
    yield ip
    panel_mod.close(ip)
    assert not _panel_threads()


def run(sh, code: str):
    result = sh.run_cell(code, store_history=True)
    assert result.error_before_exec is None and result.error_in_exec is None, code
    return result


def holder_names(panel) -> list[str]:
    return [h["name"] for h in panel.snapshot["holders"]]



class RecordingComm:
    """Stands in for ``comm.create_comm``: keeps every message a widget publishes."""

    def __init__(self):
        import comm.base_comm

        log = self.log = []

        class _Comm(comm.base_comm.BaseComm):
            def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
                log.append((self.comm_id, msg_type, data, threading.current_thread().name))

        self.cls = _Comm

    def __call__(self, *args, **kwargs):
        return self.cls(*args, **kwargs)

    def updates(self, widget) -> list[dict]:
        return [d["state"] for cid, kind, d, _ in self.log
                if cid == widget.model_id and kind == "comm_msg" and d.get("method") == "update"]


@pytest.fixture
def recorder(monkeypatch):
    import comm

    rec = RecordingComm()
    monkeypatch.setattr(comm, "create_comm", rec)
    return rec


# -- what the panel shows -----------------------------------------------------------------
def test_panel_shows_bars_timeline_and_holders_from_the_snapshot_schema(shell):
    out = f"Out[{shell.execution_count}]"
    run(shell, "x = torch.zeros(4 * 2**20 // 4)\ny = torch.ones(2**18)\ny")
    panel = open_panel(shell)
    assert panel.snapshot["schema"] == "jupyter_gpumem.snapshot/1"
    assert holder_names(panel)[:1] == ["x"]
    assert {"x", "y"} <= set(holder_names(panel))
    # the shown value is y itself: its Out entry is y's alias, not a row of its own
    y_row = next(h for h in panel.snapshot["holders"] if h["name"] == "y")
    assert out in y_row["aliases"] and out not in holder_names(panel)
    assert shown_rows(panel)[0] == "x"
    x_row = panel.table.children[3].value
    assert "data-holder='x'" in x_row and "4.0 MiB" in x_row
    checkbox = panel.checkbox("x")
    assert checkbox.value is False and checkbox.disabled is False
    bars = panel.bars.value
    assert "data-device='cpu'" in bars
    for key in ("tensors", "process_rest", "other_processes", "free"):
        assert f"data-segment='{key}'" in bars
    assert "title='tracked tensors: 5.0 MiB'" in bars  # x (4 MiB) + y (1 MiB)
    deadline = time.time() + 5
    # the sampling thread appends a reading, then draws it: wait for the drawing
    while "<svg" not in panel.timeline.value and time.time() < deadline:
        time.sleep(0.05)
    assert len(panel.series) >= 1
    assert "<svg" in panel.timeline.value and "data-line='used_process'" in panel.timeline.value
    assert "holders scanned at" in panel.footer.value


def test_bar_segments_follow_the_protocol_for_an_accelerator():
    dev = {"id": "cuda:0", "kind": "cuda", "name": "NVIDIA H200", "total": 10 * 1024 * MiB,
           "used_all": 3 * 1024 * MiB, "used_process": 2 * 1024 * MiB,
           "other_processes": 1024 * MiB, "free": 7 * 1024 * MiB, "allocated": 1024 * MiB,
           "reserved": 1536 * MiB, "non_framework": 512 * MiB, "notes": []}
    segments = {key: nbytes for key, _, nbytes, _ in panel_render.bar_segments(dev)}
    assert segments == {"allocated": 1024 * MiB, "reserved_free": 512 * MiB,
                        "non_framework": 512 * MiB, "other_processes": 1024 * MiB,
                        "free": 7 * 1024 * MiB}
    html = panel_render.device_bar_html(dev)
    for figure in ("1.0 GiB", "512.0 MiB", "7.0 GiB"):
        assert figure in html  # every segment carries its figure
    assert "flex:1 1 70.0%" in html  # free is 7 of 10 GiB wide (and gives way to small ones)


def test_host_bar_shows_this_process_on_a_scale_of_its_own():
    """A few MiB of tensors are under a pixel of 23.5 GiB of host memory: the process's
    own bar shows them as the share of the process they are."""
    dev = {"id": "cpu", "kind": "cpu", "name": "host", "total": 24 * 1024 * MiB,
           "used_all": 8 * 1024 * MiB, "used_process": 400 * MiB, "notes": []}
    html = panel_render.device_bar_html(dev, attributed=100 * MiB)
    device_bar, process_bar = html.split("data-bar='device'")[1].split("data-bar='process'")
    assert "flex:0 0 0.4%" in device_bar.split("data-segment='process_rest'")[0]  # 100 MiB of 24 GiB
    tensors, rest = process_bar.split("data-segment='process_rest'")
    assert "data-segment='tensors'" in tensors and "flex:0 0 25.0%" in tensors
    assert "flex:0 0 75.0%" in rest and "this process 400.0 MiB" in html


def _cluster_part(**overrides) -> dict:
    """A snapshot's ``cluster`` part (docs/PROTOCOL.md) for two workers' host memory."""
    w0, w1 = "tcp://10.0.0.5:40123", "tcp://10.0.0.6:40123"
    host = {"id": "cpu", "kind": "cpu", "name": "host memory", "total": 1000 * MiB,
            "used_all": 400 * MiB, "used_process": 300 * MiB, "other_processes": None,
            "free": 600 * MiB, "allocated": None, "reserved": None, "non_framework": None,
            "attributed": 64 * MiB, "notes": []}
    part = {"schema": "jupyter_gpumem.cluster/1", "scheduler": "tcp://10.0.0.2:8786",
            "partial": False, "messages": [], "held_bytes": 64 * MiB,
            "workers": [{"address": w0, "devices": [host]},
                        {"address": w1, "devices": [dict(host, id="cuda:0", kind="cuda",
                                                         allocated=8 * MiB, reserved=8 * MiB,
                                                         non_framework=0)]}],
            "missing": {}, "holders": [
                {"name": "x", "what": "Future", "keys": 1, "in_memory": 1, "total": 64 * MiB,
                 "workers": {w0: {"cpu": 64 * MiB}}, "aliases": ["Out[3]"], "shared_with": [],
                 "not_in_memory": {}, "purge": "x", "largest_path": "x"}],
            "unclaimed": [{"key": "k-1", "worker": w1, "bytes": MiB, "sizeof": MiB,
                           "held_by": ["another client Client-2"]}]}
    part.update(overrides)
    return part


def test_cluster_part_draws_worker_bars_and_the_cluster_holders():
    snap = {"cluster": _cluster_part()}
    bars = panel_render.cluster_bars_html(snap)
    assert "<b>worker 10.0.0.5:40123 cpu</b>" in bars and "<b>worker 10.0.0.6:40123 cuda:0</b>" in bars
    assert "data-worker='tcp://10.0.0.5:40123'" in bars
    assert "title='tracked tensors: 64.0 MiB'" in bars       # the worker's host tensors
    assert "title='allocated: 8.0 MiB'" in bars               # the worker's GPU
    assert "2 of 2 workers answered · 1 name holds 64.0 MiB" in bars
    table = panel_render.cluster_holders_html(snap)
    assert "data-cluster-holder='x'" in table and "worker 10.0.0.5:40123 cpu" in table
    assert "also Out[3]" in table and "%gpumem purge x --cluster" in table
    assert "held by no name of this notebook: 1 key, 1.0 MiB" in table
    assert "held by another client Client-2" in table
    partial = panel_render.cluster_bars_html({"cluster": _cluster_part(
        workers=[], missing={"tcp://10.0.0.5:40123": "did not answer within 1 s"})})
    assert "0 of 1 workers answered" in partial
    assert "worker 10.0.0.5:40123: did not answer within 1 s" in partial
    # no cluster part (no Dask, an older kernel) or one of another shape: nothing drawn
    for other in ({}, {"cluster": None}, {"cluster": {"schema": "x"}}):
        assert panel_render.cluster_bars_html(other) == ""
        assert panel_render.cluster_holders_html(other) == ""


def test_panel_shows_the_cluster_part_only_while_there_is_one(shell):
    panel = open_panel(shell)
    assert panel.cluster_bars.layout.display == "none" and panel.cluster_table.value == ""
    data = dict(panel.snapshot, cluster=_cluster_part())
    panel.apply_snapshot(data)
    assert panel.cluster_bars.layout.display is None and panel.cluster_table.layout.display is None
    assert "worker 10.0.0.5:40123 cpu" in panel.cluster_bars.value
    assert "data-cluster-holder='x'" in panel.cluster_table.value
    assert "worker" not in panel.bars.value        # the local bars stay the local ones
    panel.apply_snapshot({k: v for k, v in data.items() if k != "cluster"})
    assert panel.cluster_bars.layout.display == "none" and panel.cluster_bars.value == ""
    assert panel.cluster_table.layout.display == "none"


def test_timeline_keeps_steps_and_marks_cells():
    now = 1_800_000_000.0
    points = [(now - 30 + i, {"cuda:0": {"allocated": (1 if 10 <= i < 20 else 0) * 512 * MiB,
                                         "reserved": 512 * MiB, "used_process": None}})
              for i in range(30)]
    svg = panel_render.timeline_svg(points, "cuda:0", window=60, now=now,
                                    cells=[(now - 21, now - 9)])
    line = svg.split("data-line='allocated' points='")[1].split("'")[0]
    heights = {float(p.split(",")[1]) for p in line.split()}
    assert len(heights) == 2  # the low and the high plateau
    assert svg.count("data-cell='1'") == 1
    assert "data-line='used_process'" not in svg  # no NVML figure, no line


# -- purge through the widgets ----------------------------------------------------------------------
def test_check_purge_confirm_removes_names_from_kernel_and_table(shell):
    out = f"Out[{shell.execution_count}]"
    run(shell, "x = torch.zeros(2**20)\nkeep = torch.zeros(2**18)\ny = torch.ones(2**19)\ny")
    panel = open_panel(shell)
    xs = StorageWeakRef(shell.user_ns["x"].untyped_storage())
    ys = StorageWeakRef(shell.user_ns["y"].untyped_storage())
    panel.checkbox("x").value = True
    panel.checkbox("y").value = True
    assert panel.checked() == ["x", "y"]
    assert panel.purge_button.description == "Purge 2 checked"
    assert not panel.purge_button.disabled

    panel.purge_button.click()
    assert panel.confirm_box.layout.display is None  # the question is shown
    assert "<b>x, y</b>" in panel.confirm_text.value
    assert "6.0 MiB on cpu" in panel.confirm_text.value  # the dry run's prediction
    assert out in panel.confirm_text.value  # y's hidden holder goes too
    assert "x" in shell.user_ns and "y" in shell.user_ns  # nothing happens before confirming

    panel.confirm_button.click()
    assert "x" not in shell.user_ns and "y" not in shell.user_ns
    assert int(out[4:-1]) not in shell.history_manager.output_hist
    assert xs.expired() and ys.expired()
    assert "keep" in shell.user_ns
    assert set(holder_names(panel)) == {"keep"}
    assert shown_rows(panel) == ["keep"]
    assert panel.checked() == [] and panel.purge_button.disabled
    assert panel.confirm_box.layout.display == "none"
    assert "freed 6.0 MiB on cpu" in panel.result.value
    run(shell, "assert keep.sum() == 0")


def test_cancelling_the_confirmation_changes_nothing(shell):
    run(shell, "x = torch.zeros(2**20)\ny = torch.ones(2**19)")
    panel = open_panel(shell)
    x_before = shell.user_ns["x"]
    rows_before = shown_rows(panel)
    panel.checkbox("x").value = True
    panel.purge_button.click()
    assert panel.confirm_box.layout.display is None
    panel.cancel_button.click()
    assert shell.user_ns["x"] is x_before and "y" in shell.user_ns
    assert shown_rows(panel) == rows_before
    assert panel.confirm_box.layout.display == "none"
    assert "cancelled" in panel.status.value and "nothing changed" in panel.status.value
    assert panel.result.value == ""
    assert panel.checked() == ["x"]  # still checked: the user may purge after all


def test_a_failed_purge_deletes_nothing_and_says_why(shell):
    run(shell, "x = torch.zeros(2**20)\ny = torch.ones(2**19)")
    panel = open_panel(shell)
    panel.checkbox("x").value = True
    panel.checkbox("y").value = True
    panel.purge_button.click()
    shell.user_ns["x"] = 0  # x stops holding memory while the question is open
    panel.confirm_button.click()
    assert "y" in shell.user_ns and shell.user_ns["x"] == 0
    assert "nothing was deleted" in panel.status.value
    assert "holds no host memory" in panel.status.value
    assert panel.result.value == ""
    assert holder_names(panel) == ["y"]


def test_widget_updates_are_batched(shell, recorder):
    run(shell, "x = torch.zeros(2**20)")
    panel = open_panel(shell)
    first_row = panel.checkbox("x")
    first_row.value = True
    before = len(recorder.updates(first_row))
    run(shell, "z = torch.zeros(2**21)")  # z, larger, takes the first row: several traits change
    updates = recorder.updates(first_row)[before:]
    assert len(updates) == 1, updates  # one message for the row, not one per trait
    assert updates[0]["description"] == "z" and updates[0]["value"] is False
    assert updates[0]["tooltip"] == "purge z"
    assert panel.checkbox("x").value is True  # the check followed the name to its new row


# -- threads, refresh and the namespace --------------------------------------------------------------
def test_bars_move_while_a_cell_runs_and_holders_wait_for_its_end(shell, recorder, monkeypatch):
    from jupyter_gpumem.core import scan

    scans: list[str] = []

    def spy(real):
        def read(*args, **kwargs):
            scans.append(threading.current_thread().name)
            return real(*args, **kwargs)
        return read

    # (where the user's names are read: a scan's own pass over them, or the roots made
    # before a scan)
    monkeypatch.setattr(scan, "user_roots", spy(scan.user_roots))
    monkeypatch.setattr(scan, "collect_roots", spy(scan.collect_roots))
    panel = open_panel(shell, "--device cpu --interval 0.1")
    refreshes = panel.refreshes
    start = time.time()
    run(shell, "big = torch.ones(64 * 2**20 // 4)\ntime.sleep(0.6)\ndel big\ntime.sleep(0.4)")
    end = time.time()
    inside = [(t, v["cpu"]["used_process"]) for t, v in panel.series.points() if start < t < end]
    assert len(inside) >= 5, inside  # about ten readings of a one-second cell
    rss = [v for _, v in inside]
    assert max(rss) - min(rss) >= 48 * MiB  # the 64 MiB tensor shows up while the cell runs
    from_thread = [(d["state"]["value"], s) for cid, kind, d, s in recorder.log
                   if cid == panel.bars.model_id and kind == "comm_msg"]
    moved = [html for html, thread in from_thread if thread == "jupyter_gpumem-sampler"]
    assert len(moved) >= 2  # the bars moved during the cell: up with the tensor, down again
    assert panel.refreshes == refreshes + 1  # holders: once, after the cell
    assert scans and set(scans) == {"MainThread"}  # the namespace is read on the main thread only
    assert panel.sampler.errors == 0


def test_a_timeline_that_holds_still_is_not_sent_again(shell, recorder):
    panel = open_panel(shell)
    panel.sampler.stop()  # tick by hand from here
    panel._tick()
    drawn = panel._drawn
    sent = len(recorder.updates(panel.timeline))
    panel._tick()  # a moment later, nothing moved: no redraw, no message
    assert panel._drawn is drawn and len(recorder.updates(panel.timeline)) == sent
    run(shell, "pass")  # a cell began and ended: its band must show
    panel._tick()
    assert panel._drawn is not drawn and len(recorder.updates(panel.timeline)) == sent + 1
    assert panel.stats["ticks"] >= 3


def test_a_failing_refresh_never_breaks_the_cell(shell, monkeypatch):
    from jupyter_gpumem import refresh

    panel = open_panel(shell)

    def broken(**kwargs):
        raise RuntimeError("scan exploded")

    # the shell's session builds the snapshot after each cell for every view (its refresher)
    monkeypatch.setattr(refresh, "build_many_steps", broken)
    result = run(shell, "v = 1 + 1\nv")
    assert result.result == 2
    assert "scan failed: RuntimeError: scan exploded" in panel.status.value


def test_cell_marks_pair_nested_and_unpaired_cell_events(shell):
    from IPython.core.async_helpers import _pseudo_sync_runner

    # the shell is shared: the session's marks are a ring of 500, which the cells of
    # earlier tests in this process can have filled (a new mark then pushes one out)
    session_of(shell).cells.clear()
    panel = open_panel(shell)
    count, refreshes = len(panel.cell_spans()), panel.refreshes
    run(shell, "get_ipython().run_cell('')\n"          # IPython fires only "post" for it
               "get_ipython().run_cell('inner = 1')\n"  # a cell inside the cell
               "time.sleep(0.1)")
    assert len(panel.cell_spans()) == count + 1           # one mark: the outer cell
    start, end = panel.cell_spans()[-1]
    assert end is not None and end - start >= 0.1  # it ends with the outer cell
    assert panel.refreshes == refreshes + 1         # holders once, after the outer cell
    _pseudo_sync_runner(shell.run_cell_async("x = 1", transformed_cell="x = 1"))  # "pre" only
    run(shell, "y = 2")
    assert len(panel.cell_spans()) == count + 3
    assert all(end is not None for _, end in panel.cell_spans())   # no mark stays open
    assert not _hooked(shell, panel)    # the marks are the session's: the panel hooks nothing


def test_a_device_thread_that_stops_says_so_in_the_panel(shell, monkeypatch):
    class Fatal(BaseException):
        pass

    def tick(self):
        raise Fatal("no device")

    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    monkeypatch.setattr(panel_mod.Panel, "_tick", tick)
    panel = open_panel(shell, "--device cpu --interval 0.05")
    panel.sampler.join(2)
    assert not panel.sampler.is_alive() and seen == []     # no traceback in the cell's output
    assert "device readings stopped: Fatal: no device" in panel.status.value
    monkeypatch.undo()
    run(shell, "%gpumem panel")                              # shown again: it starts again
    assert panel.sampler.is_alive() and panel.sampler.failure is None


def test_timeline_adds_cells_from_gpuwatch_history_when_there_is_one(shell, monkeypatch):
    # the shell is shared: cells watched by earlier tests would be merged when the panel
    # opens, and the panel reads only history newer than what it merged
    panel_mod.history_for(shell).clear()
    session_of(shell).cells.clear()
    panel = open_panel(shell)
    now = time.time()
    monkeypatch.setattr(panel_mod, "history_for", lambda sh: [
        types.SimpleNamespace(start=now - 500, end=now - 499),  # before the panel existed
        {"start": now - 5, "end": now - 4}])
    run(shell, "pass")
    starts = [c[0] for c in panel.cell_spans()]
    assert starts[:2] == [now - 500, now - 5] and len(starts) >= 3  # ours: the last cell too
    assert starts == sorted(starts) and panel.cell_spans()[-1][1] is not None
    count = len(panel.cell_spans())
    monkeypatch.setattr(panel_mod, "history_for", lambda sh: [])
    run(shell, "pass")  # without that history the panel keeps the session's marks
    assert len(panel.cell_spans()) == count + 1 and panel.cell_spans()[-1][0] > now


def test_watched_spans_are_checked_against_the_cells_just_before_them():
    own = [[float(t), t + 0.2] for t in range(1000)]          # a thousand cells, in order
    watched = [[5.1, 5.15], [999.9, 1000.0], [1500.0, 1501.0], [-10.0, -9.0], [300.6, 300.7]]
    assert panel_mod._uncovered(own[::-1], watched) == [          # any order of ``own``
        [999.9, 1000.0], [1500.0, 1501.0], [-10.0, -9.0]]     # within half a second: covered
    assert panel_mod._uncovered([[0.0, 100.0], [100.1, 100.2]], [[50.0, 51.0]]) == []
    assert panel_mod._uncovered([[0.0, None]], [[0.3, None], [0.6, None]]) == [[0.6, None]]


# -- lifetime ------------------------------------------------------------------------------------------
def test_showing_again_reuses_the_running_panel(shell, capsys):
    panel = open_panel(shell)
    model_id = panel.widget.model_id
    run(shell, "%gpumem panel --device all --interval 0.5")
    again = panel_mod.current(shell)
    assert again is panel and panel.widget.model_id == model_id
    assert panel.device == "all" and panel.interval == 0.5
    assert len(_panel_threads()) == 1
    assert "all" in panel.title.value
    assert "jupyter_gpumem live panel" in capsys.readouterr().out  # the terminal's text


def test_closing_the_widget_stops_its_thread_and_hooks(shell):
    panel = open_panel(shell)
    thread = panel.sampler
    assert thread.is_alive()
    panel.widget.close()
    assert panel.closed and not thread.is_alive()
    assert panel_mod.current(shell) is None
    assert not _hooked(shell, panel) and panel not in session_of(shell).refresher.views
    assert panel.widget.comm is None and panel.bars.comm is None  # the models are closed
    refreshes = panel.refreshes
    run(shell, "after = torch.zeros(10)")
    assert panel.refreshes == refreshes
    fresh = open_panel(shell)
    assert fresh is not panel and fresh.sampler.is_alive()
    fresh.close_button.click()
    assert fresh.closed and not fresh.sampler.is_alive() and not _panel_threads()


def test_close_option(shell, capsys):
    panel = open_panel(shell)
    run(shell, "%gpumem panel --close")
    assert panel.closed and not _panel_threads()
    run(shell, "%gpumem panel --close")
    assert "no live panel is open" in capsys.readouterr().out


def test_unloading_the_extension_stops_the_thread(shell):
    panel = open_panel(shell)
    assert _panel_threads()
    run(shell, "%unload_ext jupyter_gpumem")
    assert panel.closed and not panel.sampler.is_alive() and not _panel_threads()
    assert not _hooked(shell, panel)
    run(shell, "%load_ext jupyter_gpumem")  # the fixture unloads again


def test_bad_options_are_usage_errors(shell):
    for line in ("%gpumem panel --interval 0", "%gpumem panel --device tpu",
                 "%gpumem panel --window 1", "%gpumem panel --interval inf",
                 "%gpumem panel --interval nan", "%gpumem panel --interval 1e9",
                 "%gpumem panel --window inf", "%gpumem panel --window nan"):
        result = shell.run_cell(line, store_history=True)
        assert type(result.error_in_exec).__name__ == "UsageError", line
    assert panel_mod.current(shell) is None


def test_without_ipywidgets_prints_the_text_report(shell, monkeypatch, capsys):
    run(shell, "x = torch.zeros(2**20)")
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets fails
    run(shell, "%gpumem panel --device cpu")
    out = capsys.readouterr().out
    assert "only it" in out and "\nx " in out  # the holders table of %gpumem
    assert "pip install ipywidgets" in out
    assert panel_mod.current(shell) is None and not _panel_threads()


def test_ipywidgets_is_imported_only_when_a_panel_is_made():
    code = ("import sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
            "sh = InteractiveShell.instance()\nsh.run_cell('%load_ext jupyter_gpumem')\n"
            "import jupyter_gpumem.views.panel\nassert 'ipywidgets' not in sys.modules, 'imported early'\n"
            "sh.run_cell('%gpumem panel --device cpu')\nassert 'ipywidgets' in sys.modules\n"
            "sh.run_cell('%unload_ext jupyter_gpumem')\nprint('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
