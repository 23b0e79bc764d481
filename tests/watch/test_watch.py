"""%%gpuwatch, %gpumem watch|history|plot and jupyter_gpumem.watch() on the CPU.

Real IPython shell, real torch tensors on the host (``--device cpu``), real
peak counters: the process's peak resident set (VmHWM) and tracemalloc.
"""
from __future__ import annotations

import contextlib
import csv
import gc
import json
import sys
import time
import tracemalloc

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402
from conftest import sampling_threads  # noqa: E402

import importlib  # noqa: E402

watch_mod = importlib.import_module("jupyter_gpumem.watch.scope")
from jupyter_gpumem.views import footer as watch_footer  # noqa: E402
from jupyter_gpumem.watch import sampling as watch_sampling  # noqa: E402
from jupyter_gpumem.watch.state import state_for  # noqa: E402
from jupyter_gpumem.watch.holders import HolderTracker  # noqa: E402
from jupyter_gpumem.watch.peaks import LEDGER, RssCounter, _PATCHES, _TRACEMALLOC_ORIG  # noqa: E402

MB = 1 << 20
needs_rss = pytest.mark.skipif(not RssCounter.available(),
                               reason="no resettable peak RSS (/proc/self/clear_refs) here")


def _magics(shell):
    return shell.magics_manager.registry["GpuMemMagics"]


@pytest.fixture
def wip(ip):
    """The shared shell, with this module's watch state fresh before and after."""
    def fresh():
        state = state_for(ip)
        watch_footer.stop_footer(state)
        state.history.clear()
        state.tracker = HolderTracker()
        state.footer_device = None
        state.reported = None
        m = _magics(ip)
        m.watch = False
        m.warn_at = None
        m.auto_purge_hidden = False
        m.sample_interval = 0.05
    fresh()
    yield ip
    fresh()
    gc.collect()


# -- %%gpuwatch: names and bytes -----------------------------------------------------------------
def test_each_framework_watch_names_its_own_allocator_as_the_measure():
    """A JAX or CuPy watch is not measured by "the torch allocator": the measure names
    the frameworks that report the device's allocated figure."""
    from jupyter_gpumem.backends import FrameworkUsage
    from jupyter_gpumem.core.devices import DeviceUsage
    from jupyter_gpumem.watch.result import DeviceWatch, WatchResult, allocator_measure

    def usage(*names):
        return DeviceUsage("cuda:0", "cuda", frameworks=[FrameworkUsage(n, allocated=1 << 20)
                                                         for n in names])

    assert allocator_measure(usage("jax")) == "jax allocator"
    assert allocator_measure(usage("cupy", "torch")) == "cupy + torch allocators"
    assert allocator_measure(DeviceUsage("cuda:0", "cuda", frameworks=[FrameworkUsage("jax")])) \
        == "no framework allocator"
    assert "torch" not in DeviceWatch("cuda:0", "cuda").allocated_measure
    d = DeviceWatch("cuda:0", "cuda", allocated_before=0, allocated_after=1 << 20,
                    allocated_measure=allocator_measure(usage("cupy")))
    text = WatchResult("cell", "%%gpuwatch", devices=[d]).verbose_text()
    assert "cupy allocator" in text and "torch" not in text


def test_gpuwatch_names_created_grown_and_deleted_with_bytes(wip, capsys):
    run(wip, "import torch\nold = torch.ones(1_000_000)\nxs = [torch.ones(1000)]\n"
             "keep = torch.ones(2_000)\nfor_alias = torch.ones(3_000)")
    run(wip, "%%gpuwatch -o r --device cpu\n"
             "x = torch.ones(25_000_000)\n"            # 100 MB, new
             "xs.append(torch.ones(250_000))\n"        # +1 MB inside a list
             "keep = torch.cat([keep, keep])\n"        # rebound, twice the size
             "alias = for_alias\n"                     # a new name, no new memory
             "del old")                                 # -4 MB
    r = wip.user_ns["r"]
    out = capsys.readouterr().out
    assert "%%gpuwatch" in out and "new" in out and "x" in out
    assert r.change("x").change == "created" and r.change("x").after == 100_000_000
    assert r.change("xs").change == "grew" and r.change("xs").delta == 1_000_000
    assert r.change("keep").change == "grew" and (r.change("keep").before, r.change("keep").after) \
        == (8_000, 16_000)
    assert r.change("old").change == "deleted" and r.change("old").before == 4_000_000
    alias = r.change("alias")
    assert alias.change == "created" and alias.after == 12_000 and alias.shared == 12_000
    cpu = r.device("cpu")
    assert cpu.allocated_delta == 100_000_000 + 1_000_000 + 8_000 - 4_000_000
    assert cpu.peak_allocated is None and "no allocator peak for tensors on cpu" in r.verbose_text()
    assert r.wall > 0 and r.execution_count is not None


def test_gpuwatch_result_has_text_html_and_json_forms(wip):
    run(wip, "import torch")
    run(wip, "%%gpuwatch -o r --device cpu\nt = torch.ones(1_000_000)")
    r = wip.user_ns["r"]
    data = json.loads(json.dumps(r.to_json()))
    assert data["schema"] == "jupyter_gpumem.watch/1"
    assert data["changes"][0]["name"] == "t" and data["changes"][0]["after"] == 4_000_000
    assert data["devices"][0]["id"] == "cpu" and data["devices"][0]["allocated_delta"] == 4_000_000
    assert "<table" in r._repr_html_() and "t" in r._repr_html_()
    assert repr(r).startswith("%%gpuwatch")
    assert "new: t 3.8 MiB" in r.footer()


def test_gpuwatch_value_lands_in_out_and_is_counted(wip):
    run(wip, "import torch")
    res = run(wip, "%%gpuwatch -o r --device cpu\ntorch.ones(500_000)")
    n = res.execution_count
    assert isinstance(wip.user_ns["Out"][n], torch.Tensor)
    c = wip.user_ns["r"].change(f"Out[{n}]")
    assert c is not None and c.after == 2_000_000 and c.hidden


def test_gpuwatch_runs_in_the_user_namespace_and_handles_magics_inside(wip):
    run(wip, "%%gpuwatch --device cpu\na = 1\n%time b = a + 1")
    assert wip.user_ns["b"] == 2


def test_gpuwatch_bad_arguments_are_usage_errors(wip):
    from IPython.core.error import UsageError

    for line in ("--interval -1", "-o 1x", "--device tpu", "--bogus"):
        res = wip.run_cell(f"%%gpuwatch {line}\npass", store_history=True)
        assert isinstance(res.error_in_exec, UsageError), line
    for line in ("on --warn-at 150%", "on --warn-at lots", "maybe", "on --interval 0"):
        res = wip.run_cell(f"%gpumem watch {line}", store_history=True)
        assert isinstance(res.error_in_exec, UsageError), line


# -- when the cell raises ------------------------------------------------------------------------
def test_report_comes_when_the_cell_raises_and_names_the_holders(wip, capsys):
    run(wip, "import torch\nbig = torch.ones(5_000_000)")
    res = wip.run_cell(
        "%%gpuwatch -o r --device cpu\n"
        "def step():\n"
        "    activations = torch.ones(10_000_000)\n"
        "    raise MemoryError('out of memory')\n"
        "step()", store_history=True)
    out = capsys.readouterr()
    r = wip.user_ns["r"]
    assert r.error == {"type": "MemoryError", "message": "out of memory", "oom": True}
    names = [h.name for h in r.holders]
    assert names[:2] == ["last traceback", "big"]        # the frame's local is the biggest
    assert r.holders[0].nbytes == 40_000_000 and r.holders[1].nbytes == 20_000_000
    assert r.purge_command == "%gpumem purge 'last traceback' big"
    assert "free them: %gpumem purge 'last traceback' big" in out.out
    assert isinstance(res.error_in_exec, MemoryError)     # the cell's own error, as usual
    assert "Traceback" in out.out + out.err or "MemoryError" in out.out + out.err


def test_footer_after_an_out_of_memory_error_gives_a_purge_that_frees_it(wip, capsys):
    from torch.multiprocessing.reductions import StorageWeakRef

    run(wip, "import torch\nfrom torch.multiprocessing.reductions import StorageWeakRef\n"
             "keep = torch.ones(1000)\nbig = torch.ones(5_000_000)\n"
             "ref_big = StorageWeakRef(big.untyped_storage())")
    run(wip, "%gpumem watch on --device cpu")
    res = wip.run_cell("def step():\n"
                       "    activations = torch.ones(10_000_000)\n"
                       "    get_ipython().user_ns['ref_act'] = StorageWeakRef(activations.untyped_storage())\n"
                       "    raise MemoryError('out of memory')\n"
                       "step()", store_history=True)
    assert isinstance(res.error_in_exec, MemoryError)
    # the cell got as far as the weak reference, and the failed frame still holds the
    # activations: only then does their expiry below say that the purge freed them
    ref_act = wip.user_ns["ref_act"]
    assert isinstance(ref_act, StorageWeakRef) and not ref_act.expired()
    assert not wip.user_ns["ref_big"].expired()
    del ref_act
    out = capsys.readouterr().out
    assert "raised MemoryError" in out and "biggest holders: last traceback 38.1 MiB" in out
    r = watch_mod.history_for(wip)[-1]
    assert r.error["oom"] and r.purge_command == "%gpumem purge 'last traceback' big"
    run(wip, r.purge_command)         # the next cell, as a user would
    assert wip.user_ns["ref_act"].expired() and wip.user_ns["ref_big"].expired()
    assert torch.equal(wip.user_ns["keep"], torch.ones(1000))     # a name not named stays


# -- the footer ----------------------------------------------------------------------------------
def test_footer_line_after_every_cell(wip, capsys):
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    run(wip, "model = torch.ones(2_500_000)")
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("+9.5 MiB tensors (peak RSS") and "new: model 9.5 MiB" in line
    assert line.endswith(" ms") or line.endswith(" s")
    run(wip, "del model")
    assert "deleted: model 9.5 MiB" in capsys.readouterr().out
    run(wip, "pass")
    assert capsys.readouterr().out.startswith("+0 B tensors")
    records = watch_mod.history_for(wip)
    assert [r.source for r in records] == ["watch on"] * 3
    assert records[0].change("model").after == 10_000_000
    run(wip, "%gpumem watch off")
    assert not sampling_threads()
    capsys.readouterr()
    run(wip, "z = torch.ones(10)")
    assert capsys.readouterr().out == ""


def test_back_to_back_cells_start_from_the_last_end_unless_a_pause_or_purge_came(
        wip, capsys, monkeypatch):
    """Cells run one right after another (run-all) start from the last cell's end readings
    and names; after a pause, or a purge between cells (the sidebar's), the devices and
    the names are read again, and the purged name is nobody's cell's doing."""
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    reads = []
    real = watch_sampling.read_devices
    # the footer's own readings (the sampling thread's ticks pass their shared reading)
    monkeypatch.setattr(watch_sampling, "read_devices", lambda ids, read=None: (
        read is None and reads.append(list(ids)), real(ids, read))[1])

    def cell(code: str) -> int:
        del reads[:]
        run(wip, code)
        return len(reads)

    monkeypatch.setattr(watch_footer, "ARM_TTL", 0.5)    # "right after", on a slow machine too
    assert cell("a = torch.ones(250_000)") in (1, 2)
    assert cell("b = torch.ones(500_000)") == 1       # the start: the last cell's end
    first, second = watch_mod.history_for(wip)[-2:]
    assert second.devices[0].process_before == first.devices[0].process_after
    assert second.devices[0].allocated_before == first.devices[0].allocated_after
    assert [c.name for c in second.changes] == ["b"]
    time.sleep(1.0)
    assert cell("c = 1") == 2                          # read again after a pause
    from jupyter_gpumem import purge
    monkeypatch.setattr(watch_footer, "ARM_TTL", 600.0)   # however long the purge takes
    assert cell("pass") in (1, 2)
    purge(["b"], shell=wip)                           # between cells, as the sidebar does
    assert cell("d = torch.ones(10)") == 2
    last = watch_mod.history_for(wip)[-1]
    assert [c.name for c in last.changes] == ["d"] and "b" not in wip.user_ns
    capsys.readouterr()


def test_a_name_bound_between_cells_is_not_the_next_cells_doing(wip, capsys, monkeypatch):
    """A widget's callback binds a name between two cells: after a pause the next cell's
    footer does not list it (the tracker takes it in before the cell runs); a cell that
    starts at once after the last one (run-all) counts what came in between."""
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    run(wip, "pass")
    time.sleep(watch_footer.ARM_TTL * 2)
    wip.user_ns["by_callback"] = torch.ones(1000)        # as a callback would, between cells
    run(wip, "mine = torch.ones(2000)")
    assert [c.name for c in watch_mod.history_for(wip)[-1].changes] == ["mine"]
    monkeypatch.setattr(watch_footer, "ARM_TTL", 600.0)   # "at once", however slow the machine
    wip.user_ns["at_once"] = torch.ones(1000)
    run(wip, "pass")
    assert [c.name for c in watch_mod.history_for(wip)[-1].changes] == ["at_once"]
    capsys.readouterr()


def test_watch_trait_turns_the_footer_on(wip, capsys):
    run(wip, "%config GpuMemMagics.watch = True")
    run(wip, "import torch\nq = torch.ones(1000)")
    assert "new: q" in capsys.readouterr().out
    run(wip, "%config GpuMemMagics.watch = False")
    run(wip, "q2 = torch.ones(1000)")
    assert "q2" not in capsys.readouterr().out


def test_footer_counts_a_cell_run_from_inside_a_cell_once(wip, capsys):
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    run(wip, "get_ipython().run_cell('inner = torch.ones(1000)')\nouter = torch.ones(1000)")
    out = capsys.readouterr().out
    assert out.count("tensors") == 1 and "inner" in out and "outer" in out


def test_in_place_change_of_same_length_is_found_through_host_memory(wip, capsys):
    run(wip, "import torch\nd = {'a': torch.ones(10)}")
    run(wip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    run(wip, "d['a'] = torch.ones(50_000_000)")      # same dict, same length, +200 MB
    r = watch_mod.history_for(wip)[-1]
    assert r.change("d") is not None and r.change("d").delta == 200_000_000 - 40
    assert r.holders_mode == "full"


# -- nesting and the peak counters ---------------------------------------------------------------
def _transient(mb: int) -> None:
    t = torch.ones(mb * MB // 4)
    del t


@needs_rss
def test_nested_scopes_keep_each_peak_right_with_the_real_rss_counter(wip):
    wip.user_ns["_transient"] = _transient
    run(wip, "import jupyter_gpumem, resource\nfrom jupyter_gpumem.watch.peaks import read_rss")
    run(wip, "%gpumem watch on --device cpu")
    run(wip, "base = read_rss()['rss'][0]\n_transient(400)\n"
             "user_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024")
    run(wip, "with jupyter_gpumem.watch(device='cpu', report=False) as outer:\n"
             "    _transient(300)\n"
             "    with jupyter_gpumem.watch(device='cpu', report=False) as inner:\n"
             "        _transient(100)\n"
             "    _transient(50)")
    run(wip, "%%gpuwatch -o cellw --device cpu\n_transient(150)")
    ns = wip.user_ns
    base = ns["base"]
    outer, inner = ns["outer"].result.device("cpu"), ns["inner"].result.device("cpu")
    assert 290 * MB <= outer.peak_rss - base < 400 * MB
    assert 90 * MB <= inner.peak_rss - base < 290 * MB
    footer = watch_mod.history_for(wip)
    block_cell, gpuwatch_cell = footer[-2].device("cpu"), footer[-1].device("cpu")
    assert block_cell.peak_rss - base >= 290 * MB            # the footer saw the outer block
    assert 140 * MB <= ns["cellw"].device("cpu").peak_rss - base < 290 * MB
    assert gpuwatch_cell.peak_rss >= ns["cellw"].device("cpu").peak_rss
    # the user's own reading was never lowered by the resets
    assert resource_maxrss() >= ns["user_peak"]


def resource_maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@needs_rss
def test_a_scope_started_from_the_last_close_reads_only_what_it_must(monkeypatch):
    """LEDGER.open with the last close's readings (cells back to back): a counter whose
    peak was its current value starts from it unread; one whose peak was above is read
    and reset as usual; either way the scope's peak covers what comes after."""
    reads = []
    real = RssCounter.read
    monkeypatch.setattr(RssCounter, "read", lambda self: (reads.append(1), real(self))[1])
    first = LEDGER.open(["cpu"])
    LEDGER.close(first, ["cpu"])
    (rss, hwm), = first.end[RssCounter.key].values()
    del reads[:]
    flat = {RssCounter.key: {"rss": (rss, rss)}}
    second = LEDGER.open(["cpu"], readings=flat)
    assert reads == [] and second.start[RssCounter.key] == {"rss": rss}
    _transient(64)
    LEDGER.close(second, ["cpu"])
    assert second.peak(RssCounter.key, "rss") >= rss + 60 * MB
    del reads[:]
    above = {RssCounter.key: {"rss": (rss, rss + 64 * MB)}}
    third = LEDGER.open(["cpu"], readings=above)
    assert reads                                   # read now: the old peak is not this one's
    LEDGER.close(third, ["cpu"])
    assert LEDGER.open_count() == 0


@contextlib.contextmanager
def _tracing():
    """numpy, with tracemalloc tracing inside the block (the test skips without numpy)."""
    np = pytest.importorskip("numpy")
    tracemalloc.start()
    try:
        yield np
    finally:
        tracemalloc.stop()


def test_nested_scopes_and_a_user_reset_with_tracemalloc():
    import jupyter_gpumem

    with _tracing() as np:
        a = np.ones(200 * MB // 8)
        del a                                   # the user's own peak, before any scope
        with jupyter_gpumem.watch(device="cpu", report=False) as outer:
            b = np.ones(300 * MB // 8)
            del b
            with jupyter_gpumem.watch(device="cpu", report=False) as inner:
                c = np.ones(100 * MB // 8)
                del c
                tracemalloc.reset_peak()        # the user starts measuring again, inside
                d = np.ones(20 * MB // 8)
                del d
                user_since_reset = tracemalloc.get_traced_memory()[1]
            e = np.ones(10 * MB // 8)
            del e
        o, i = outer.result.device("cpu"), inner.result.device("cpu")
        assert 300 * MB <= o.peak_traced < 310 * MB
        assert 100 * MB <= i.peak_traced < 110 * MB
        assert 20 * MB <= user_since_reset < 25 * MB   # the user's view: since their reset
        assert tracemalloc.get_traced_memory()[1] < 25 * MB


def test_the_user_view_of_a_peak_is_restored_after_scopes_reset_it():
    import jupyter_gpumem

    with _tracing() as np:
        a = np.ones(200 * MB // 8)
        del a
        with jupyter_gpumem.watch(device="cpu", report=False) as w:
            b = np.ones(50 * MB // 8)
            del b
        assert 50 * MB <= w.result.device("cpu").peak_traced < 60 * MB
        assert _TRACEMALLOC_ORIG["get_traced_memory"]()[1] < 100 * MB   # the counter was reset
        assert tracemalloc.get_traced_memory()[1] >= 200 * MB            # what the user reads


def test_a_reset_that_bypasses_the_wrappers_is_reported():
    import jupyter_gpumem

    with _tracing() as np:
        with jupyter_gpumem.watch(device="cpu", report=False, interval=0.01) as w:
            b = np.ones(50 * MB // 8)
            del b
            time.sleep(0.2)                      # the sampler sees the peak
            _TRACEMALLOC_ORIG["reset_peak"]()    # as if torch._C were called directly
        assert any("bypassed jupyter_gpumem" in m for m in w.result.messages)
        assert w.result.device("cpu").peak_traced >= 50 * MB   # kept by the sampler's folds


# -- plot, history, export -----------------------------------------------------------------------
def test_plot_renders_under_agg_with_one_marker_per_cell(wip):
    import matplotlib

    matplotlib.use("Agg")
    run(wip, "import torch, time")
    run(wip, "%gpumem watch on --device cpu --interval 0.01")
    for i in range(3):
        run(wip, f"t{i} = torch.ones({(i + 1) * 1_000_000})\ntime.sleep(0.05)")
    run(wip, "%gpumem watch off")
    fig = wip.run_line_magic("gpumem", "plot -o")
    markers = [ln for ln in fig.axes[0].lines if ln.get_label().endswith("cell peak")]
    assert len(markers) == 1 and len(markers[0].get_xdata()) == 3   # the "off" cell is not kept
    sampled = [ln for ln in fig.axes[0].lines if "sampled" in ln.get_label()]
    assert sampled and len(sampled[0].get_xdata()) >= 6
    from jupyter_gpumem.views.plot import png

    assert png(fig).startswith(b"\x89PNG")
    run(wip, "%%gpuwatch --plot --device cpu\nu = torch.ones(1000)")


def test_plot_without_history_is_a_usage_error(wip):
    from IPython.core.error import UsageError

    res = wip.run_cell("%gpumem plot", store_history=True)
    assert isinstance(res.error_in_exec, UsageError)


def test_history_table_and_save_as_csv_and_json(wip, tmp_path, capsys):
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    run(wip, "h1 = torch.ones(1_000_000)")
    run(wip, "del h1")
    run(wip, "%gpumem watch off")
    capsys.readouterr()
    run(wip, "%gpumem history")
    table = capsys.readouterr().out
    assert "new: h1 3.8 MiB" in table and "deleted: h1 3.8 MiB" in table
    run(wip, f"%gpumem history --save {tmp_path / 'h.json'}")
    data = json.loads((tmp_path / "h.json").read_text())
    assert [d["schema"] for d in data] == ["jupyter_gpumem.watch/1"] * 2
    assert data[0]["changes"][0] == {**data[0]["changes"][0], "name": "h1", "after": 4_000_000}
    run(wip, f"%gpumem history --save {tmp_path / 'h.csv'}")
    with open(tmp_path / "h.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and rows[0]["device"] == "cpu" and rows[0]["allocated_delta"] == "4000000"
    res = wip.run_cell(f"%gpumem history --save {tmp_path / 'h.txt'}", store_history=True)
    from IPython.core.error import UsageError

    assert isinstance(res.error_in_exec, UsageError)


def test_history_to_tensorboard(wip, tmp_path):
    from IPython.core.error import UsageError
    from jupyter_gpumem.watch.export import summary_writer

    run(wip, "import torch")
    run(wip, "%%gpuwatch --device cpu\nk = torch.ones(1000)")
    try:
        summary_writer(str(tmp_path / "probe")).close()
    except ImportError:
        res = wip.run_cell(f"%gpumem history --tensorboard {tmp_path}", store_history=True)
        assert isinstance(res.error_in_exec, UsageError)
        assert "not installed" in str(res.error_in_exec)
        return
    had_tensorflow = "tensorflow" in sys.modules
    run(wip, f"%gpumem history --tensorboard {tmp_path / 'tb'}")
    events = list((tmp_path / "tb").iterdir())
    assert events and events[0].stat().st_size > 0
    assert had_tensorflow or "tensorflow" not in sys.modules   # it would take the GPU


# -- thresholds ----------------------------------------------------------------------------------
def test_warn_at_names_candidates_and_auto_purge_clears_only_hidden_holders(wip, capsys):
    from torch.multiprocessing.reductions import StorageWeakRef

    run(wip, "import torch\nmine = torch.ones(1_000_000)")
    ref = StorageWeakRef(wip.user_ns["mine"].untyped_storage())
    run(wip, "%gpumem watch on --device cpu --warn-at 1% --auto-purge-hidden")
    capsys.readouterr()
    res = run(wip, "torch.full((2_000_000,), 2.0)")
    n = res.execution_count
    out = capsys.readouterr().out
    assert "warning: cpu is" in out and "above 1%" in out
    assert f"Out[{n}] 7.6 MiB (hidden)" in out and "mine 3.8 MiB" in out
    assert f"auto-purge of hidden holders and caches: removed Out[{n}]" in out
    assert n not in wip.user_ns["Out"]
    assert torch.equal(wip.user_ns["mine"], torch.ones(1_000_000))   # a user's name stays
    assert not ref.expired()                       # and its memory was never freed


# -- from scripts --------------------------------------------------------------------------------
def test_watch_in_a_function_reports_its_locals(capsys):
    import jupyter_gpumem

    def work():
        with jupyter_gpumem.watch(device="cpu") as w:
            a = torch.ones(1_000_000)
            b = torch.ones(10)
        return w, a, b

    w, _, _ = work()
    assert w.result.change("a").after == 4_000_000 and w.result.source == "watch()"
    assert "watch() · block" in capsys.readouterr().out


def test_watch_at_module_level_of_a_script_and_when_the_block_raises(capsys):
    import jupyter_gpumem.watch.scope  # noqa: F401 - the submodule shadows the function; still callable

    ns = {"__name__": "__main__"}
    code = ("import jupyter_gpumem, torch\n"
            "w = jupyter_gpumem.watch(device='cpu', report=False)\n"
            "with w:\n"
            "    g = torch.ones(2_000_000)\n"
            "try:\n"
            "    with jupyter_gpumem.watch(device='cpu', report=False) as w2:\n"
            "        h = torch.ones(3_000_000)\n"
            "        raise MemoryError('out of memory')\n"
            "except MemoryError as exc:\n"
            "    caught = exc\n")
    exec(compile(code, "<script>", "exec"), ns)
    assert ns["w"].result.change("g").after == 8_000_000
    r2 = ns["w2"].result
    assert r2.error["oom"] and r2.context == "script"
    assert r2.purge_command.startswith("jupyter_gpumem.purge(['h', 'g']")
    assert ns["caught"].args == ("out of memory",)


# -- loading and unloading -----------------------------------------------------------------------
def test_unload_removes_hooks_threads_and_patches(ip):
    import resource

    run(ip, "import torch")
    run(ip, "%gpumem watch on --device cpu")
    run(ip, "y = torch.ones(50_000_000)\ndel y")
    run(ip, "x = torch.ones(1000)")       # its scope resets the peak RSS the cell before set
    assert getattr(resource.getrusage, "__jupyter_gpumem__", False) or not RssCounter.available()
    run(ip, "%unload_ext jupyter_gpumem")
    names = [getattr(cb, "__qualname__", "") for cbs in ip.events.callbacks.values() for cb in cbs]
    assert not any(n.startswith("_Footer") for n in names)
    assert not sampling_threads()
    assert not getattr(resource.getrusage, "__jupyter_gpumem__", False)
    assert not _PATCHES.installed() and LEDGER.open_count() == 0
    assert not any(getattr(t, "__jupyter_gpumem__", False) for t in ip.input_transformers_cleanup)
    run(ip, "%load_ext jupyter_gpumem")


def test_the_sampler_runs_only_while_watched_code_runs(wip):
    from jupyter_gpumem.session import session_of

    run(wip, "import time, threading")
    stats = session_of(wip).sampler.stats
    calls, points = stats["calls"], len(watch_mod.series_for(wip))
    run(wip, "%%gpuwatch -o r --device cpu --interval 0.01\n"
             "alive = [t.name for t in threading.enumerate()]\ntime.sleep(0.1)")
    assert "jupyter_gpumem-sampler" in wip.user_ns["alive"]      # the shell's session's
    assert not sampling_threads()
    # what the code was given, not how much happened in 0.1 s: the watch's start and end
    # readings and one sample per call of the thread (its only subscriber here)
    samples = wip.user_ns["r"].device("cpu").samples
    assert samples == stats["calls"] - calls + 2 and samples >= 3
    assert len(watch_mod.series_for(wip)) - points == samples


def test_settings_changed_while_the_footer_is_on_count_from_the_next_cell(wip, capsys):
    """The footer keeps the settings it reads every cell until one of them changes:
    ``%config``, the trait and ``watch on`` again each count from the next cell."""
    run(wip, "%gpumem watch on --device cpu")
    run(wip, "x = 1")
    assert watch_mod.history_for(wip)[-1].interval == 0.05
    run(wip, "%config GpuMemMagics.sample_interval = 0.2")
    run(wip, "x = 2")
    assert watch_mod.history_for(wip)[-1].interval == 0.2
    _magics(wip).warn_at = "1%"
    capsys.readouterr()
    run(wip, "import torch\nkeep = torch.ones(1000)")
    out = capsys.readouterr().out
    assert "warning: cpu is" in out and "above 1%" in out, out
    run(wip, "%gpumem watch on --device cpu --warn-at off")
    capsys.readouterr()
    run(wip, "del keep")
    assert "warning" not in capsys.readouterr().out
    footer = state_for(wip).footer
    run(wip, "%gpumem watch off")
    assert footer._observed is None and footer._kept is None    # nothing left observed
    notifiers = _magics(wip)._trait_notifiers.get("warn_at", {}).get("change", [])
    assert footer._forget not in notifiers


def test_between_watched_cells_the_sampler_pauses_on_its_own(wip, capsys):
    """With ``watch on`` the sampling subscription outlives a cell (a cell right after
    finds it running), pauses at its first tick with no cell running, and then is not
    called until the next cell."""
    _magics(wip).sample_interval = 0.5      # no tick between the cell's end and the check
    run(wip, "%gpumem watch on --device cpu")
    run(wip, "x = 1")
    lane = state_for(wip).hub
    sub = lane.sub
    assert sub.active and not lane.open                 # kept running past the cell's end
    deadline = time.monotonic() + 5
    while sub.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sub.active and not sub.stopped           # paused itself, thread kept
    calls = sub.calls
    time.sleep(1.2)                                     # two intervals: nobody is called
    assert sub.calls == calls
    run(wip, "y = 2")
    assert lane.sub is sub and sub.active               # resumed by the next cell
    capsys.readouterr()


def test_gpuwatch_report_is_short_and_exact_with_v(wip, capsys):
    run(wip, "import torch")
    capsys.readouterr()
    run(wip, "%%gpuwatch --device cpu\nshort_t = torch.ones(1_000_000)")
    short = capsys.readouterr().out
    run(wip, "%%gpuwatch -v --device cpu\nlong_t = torch.ones(1_000_000)")
    long = capsys.readouterr().out
    # plain words first: what the device gained, which names changed, where the rest is
    assert "new: short_t 3.8 MiB" in short and "exact figures: %%gpuwatch -v" in short
    assert "VmHWM" not in short and "tracked tensors: the scan" not in short
    assert len(short.splitlines()) <= 4
    # -v: every exact figure and how it was measured
    assert "VmHWM" in long and "long_t" in long and "exact figures" not in long
    run(wip, "%%gpuwatch -o r --device cpu\nhtml_t = torch.ones(1_000_000)")
    html = wip.user_ns["r"]._repr_html_()
    summary, details = html.split("<details>")   # the exact figures one click away
    assert "new: html_t 3.8 MiB" in summary and "VmHWM" not in summary
    assert details.startswith("<summary>exact figures</summary>") and "VmHWM" in details
