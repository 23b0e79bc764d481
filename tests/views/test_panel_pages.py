"""The live panel under real use, in-process (a real shell, real widgets, real torch
tensors on the CPU): many holders a page at a time, checks that always count, requests
from another thread handed to the main thread, the holders marked while a cell runs, an
old purge result cleared once memory changed, Out rows in numeric order, a confirmation
that names the notebook. A real kernel behind a real server: tests/views/test_panel_server.py."""
from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ipywidgets")

from conftest import run  # noqa: E402
from jupyter_gpumem.views import panel as panel_mod  # noqa: E402
from jupyter_gpumem.views import panel_render  # noqa: E402
from jupyter_gpumem.views.panel_table import PAGE, display_key  # noqa: E402
from panel_driving import open_panel, purge_checked, shown_rows  # noqa: E402


@pytest.fixture
def shell(ip):
    run(ip, "import torch, time")
    yield ip
    panel_mod.close(ip)


def _in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn()))
    t.start()
    t.join(30)
    return out.get("v")


def test_many_holders_show_a_page_at_a_time_and_out_in_numeric_order(shell):
    run(shell, "vals = [torch.ones(16) for _ in range(130)]\n"
               "for i in range(130): globals()[f'n{i}'] = torch.ones(16)")
    panel = open_panel(shell)
    names = [h["name"] for h in panel.snapshot["holders"]]
    assert len(names) >= 130
    assert len(shown_rows(panel)) == PAGE, "one page of rows, not a widget per holder"
    table = panel.holders_table
    assert table.pages() == -(-len(table.shown) // PAGE)
    # same size: numbers in names read as numbers (n2 before n10 before n100)
    order = [h["name"] for h in table.holders if h["name"].startswith("n")]
    assert order.index("n2") < order.index("n10") < order.index("n100")
    assert [h["name"] for h in table.holders] == [h["name"] for h in sorted(
        table.holders, key=display_key)]
    assert panel.holders_table.prev.disabled and not panel.holders_table.next.disabled
    panel.holders_table.next.click()
    assert table.page == 1
    assert shown_rows(panel)[0] == (table.shown[PAGE].get("label") or table.shown[PAGE]["name"])
    # the filter: a part of a name; the page starts over
    panel.holders_table.filter.value = "n12"
    assert table.page == 0
    assert set(shown_rows(panel)) == {"n12"} | {f"n{i}" for i in range(120, 130)}
    assert "11 of" in panel.holders_table.where.value


def test_out_rows_sort_numerically():
    holders = [{"name": f"Out[{i}]", "unique": 64} for i in (100, 2, 11, 1)]
    holders.append({"name": "big", "unique": 128})
    assert [h["name"] for h in sorted(holders, key=display_key)] == [
        "big", "Out[1]", "Out[2]", "Out[11]", "Out[100]"]


def test_a_check_on_another_page_or_from_another_thread_always_counts(shell):
    run(shell, "\n".join(f"v{i} = torch.ones(16)" for i in range(PAGE + 20)))
    panel = open_panel(shell)
    first = panel.checkbox("v1")
    _in_thread(lambda: setattr(first, "value", True))    # a widget message on a subshell
    assert panel.checked() == ["v1"]
    assert panel.purge_button.description == "Purge 1 checked" and not panel.purge_button.disabled
    late = panel.checkbox(f"v{PAGE + 10}")               # its page is shown
    assert panel.holders_table.page == 1
    late.value = True
    assert sorted(panel.checked()) == sorted(["v1", f"v{PAGE + 10}"])
    assert panel.purge_button.description == "Purge 2 checked"
    panel.holders_table.go(0)                            # drawing a page is no one's check
    assert panel.checkbox("v1").value is True and len(panel.checked()) == 2
    # a row that appears after a cell can be checked at once and counts
    run(shell, "fresh = torch.ones(2**20)")
    panel.checkbox("fresh").value = True
    assert "fresh" in panel.checked() and panel.purge_button.description == "Purge 3 checked"
    panel.holders_table.uncheck.click()
    assert panel.checked() == [] and panel.purge_button.disabled


def test_select_all_of_out_purges_every_value_in_one_confirmation(shell):
    for i in range(40):
        run(shell, f"torch.full((64,), {i}.0)")
    run(shell, "keep = torch.ones(2**18)")
    panel = open_panel(shell)
    outs = [h["purge"] for h in panel.snapshot["holders"] if h["name"].startswith("Out[")]
    assert len(outs) == 40
    panel.holders_table.filter.value = "Out["
    panel.holders_table.check_all.click()
    assert sorted(panel.checked()) == sorted(outs)
    panel.purge_button.click()
    assert "(40 names)" in panel.confirm_text.value and "and 30 more" in panel.confirm_text.value
    panel.confirm_button.click()
    assert not [h for h in panel.snapshot["holders"] if h["name"].startswith("Out[")]
    assert "keep" in shell.user_ns
    assert not [v for v in shell.history_manager.output_hist.values() if torch.is_tensor(v)]
    assert panel.checked() == [] and "purged Out[" in panel.status.value


def test_a_click_from_another_thread_runs_on_the_main_thread(shell, monkeypatch):
    from jupyter_gpumem import refresh

    run(shell, "x = torch.ones(2**18)")
    panel = open_panel(shell)
    threads = []
    real = refresh.build_many_steps

    def spy(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(refresh, "build_many_steps", spy)
    # while a cell runs: a click on Refresh is queued, says so, and can be cancelled
    shell.user_ns.update(_panel=panel, _in_thread=_in_thread)
    run(shell, "_in_thread(_panel.refresh_button.click)\n"
               "queued_said = _panel.status.value\n"
               "cancel_shown = _panel.cancel_queued.layout.display\n"
               "_panel.cancel_queued.click()\n"
               "cancelled_said = _panel.status.value\n"
               "_in_thread(_panel.refresh_button.click)")
    assert "refresh queued: runs when the cell ends" in shell.user_ns["queued_said"]
    assert shell.user_ns["cancel_shown"] is None
    assert "cancelled: nothing changed" in shell.user_ns["cancelled_said"]
    # the second click ran after the cell (and the refresh after the cell), both here
    assert len(threads) >= 2 and set(threads) == {threading.main_thread()}
    assert panel.cancel_queued.layout.display == "none"


def test_holders_are_marked_from_before_the_running_cell(shell):
    panel = open_panel(shell, "--device cpu --interval 0.05")
    assert "from before the running cell" not in panel.holders_title.value
    shell.user_ns["_panel"] = panel
    run(shell, "t0 = time.time()\n"
               "while 'from before' not in _panel.holders_title.value and time.time() - t0 < 5:\n"
               "    time.sleep(0.02)\n"
               "during = (_panel.holders_title.value, _panel.bars.value)")
    title, bars = shell.user_ns["during"]
    assert "from before the running cell" in title
    assert "tracked tensors, from before the running cell" in bars
    assert "from before the running cell" not in panel.holders_title.value   # after it


def test_a_purge_result_goes_once_memory_changed(shell):
    run(shell, "a = torch.ones(2**18)\nb = torch.ones(2**18)")
    panel = open_panel(shell)
    purge_checked(panel, "a")
    assert "freed" in panel.result.value
    run(shell, "c = 1")                     # nothing changed: the result stays
    assert "freed" in panel.result.value
    run(shell, "grown = torch.ones(2**20)")  # memory changed: an old result is not news
    assert panel.result.value == ""


def test_the_confirmation_names_the_notebook(shell, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/ana/work/train.ipynb")
    run(shell, "a = torch.ones(2**18)")
    panel = open_panel(shell)
    panel.checkbox("a").value = True
    panel.purge_button.click()
    assert "the kernel of <b data-notebook='1'>/home/ana/work/train.ipynb</b>" in \
        panel.confirm_text.value
    panel.cancel_button.click()
    assert "a" in shell.user_ns


def test_colours_follow_the_theme_and_nothing_has_a_fixed_width():
    dev = {"id": "cpu", "kind": "cpu", "total": 100 << 20, "used_process": 10 << 20,
           "used_all": 50 << 20, "free": 50 << 20}
    html = panel_render.device_bar_html(dev, attributed=1 << 20)
    assert "var(--jp-layout-color3" in html and "var(--jp-border-color1" in html
    assert "var(--jp-ui-font-color1" in html
    svg = panel_render.timeline_svg([(time.time(), {"cpu": {"used_process": 1}})], "cpu",
                                    window=60)
    assert "width:100%" in svg and "width='560'" not in svg
    row = panel_render.holder_row_html({"name": "x", "unique": 1, "shared": 0})
    assert "min-width:" in row and ";width:" not in row.replace("min-width", "").replace(
        "max-width", "")
