"""What a new user meets in the live panel (its Python side; the browser checks are in
tests/e2e/test_first_use_browser.py): each test names the rough edge it keeps away."""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ipywidgets")

from jupyter_gpumem.views import panel as panel_mod  # noqa: E402
from jupyter_gpumem.views import panel_render  # noqa: E402
from panel_driving import open_panel, purge_checked  # noqa: E402

MiB = 1 << 20


def run(sh, code: str):
    result = sh.run_cell(code, store_history=True)
    assert result.success, result.error_in_exec
    return result


@pytest.fixture
def shell(ip):
    run(ip, "import torch")
    yield ip
    panel_mod.close(ip)


# -- 15. an old purge's result goes once it is no longer the latest --------------------
def test_a_purge_result_says_when_and_goes_after_a_later_purge(shell):
    run(shell, "a = torch.ones(4 * 2**18)\nb = torch.ones(2**18)")
    panel = open_panel(shell)
    purge_checked(panel, "a")
    assert "freed 4.0 MiB on cpu" in panel.result.value
    assert re.search(r"purge at \d\d:\d\d:\d\d: removed", panel.result.value), panel.result.value
    assert re.search(r"purged a at \d\d:\d\d:\d\d", panel.status.value), panel.status.value
    run(shell, "c = 1")       # a later cell: the result stays, it says when it ran
    assert "freed 4.0 MiB on cpu" in panel.result.value
    run(shell, "%gpumem purge b --device cpu")   # a later purge, from another view
    assert panel.result.value == "" and "purged a" not in panel.status.value
    assert [h["name"] for h in panel.snapshot["holders"]] == []


# -- 16. the purge button's look; its confirmation opens where the click was ----------
def test_the_purge_button_is_grey_while_disabled_and_the_question_takes_its_place(shell):
    run(shell, "a = torch.ones(2**18)")
    panel = open_panel(shell)
    assert panel.purge_button.disabled and panel.purge_button.button_style == ""
    panel.checkbox("a").value = True
    assert not panel.purge_button.disabled and panel.purge_button.button_style == "warning"
    panel.purge_button.click()
    # the question's buttons come first, where the purge button was (now hidden); it
    # defaults to Cancel: first, highlighted
    children = list(panel.widget.children)
    assert children.index(panel.confirm_box) < children.index(_row_of(panel))
    assert list(panel.confirm_box.children[0].children) == [panel.cancel_button,
                                                            panel.confirm_button]
    assert panel.cancel_button.button_style == "primary"
    assert panel.confirm_button.button_style == "danger"
    assert panel.purge_button.layout.display == "none"
    panel.cancel_button.click()
    assert panel.purge_button.layout.display is None and panel.purge_button.button_style == "warning"


def _row_of(panel):
    return next(c for c in panel.widget.children
                if panel.purge_button in getattr(c, "children", ()))


# -- 17. one title rule for the panel and the sidebar ----------------------------------
@pytest.mark.parametrize("kinds, title", [(["cpu"], "Host memory"), (["cuda"], "GPU memory"),
                                          (["cuda", "cpu"], "GPU and host memory")])
def test_title_rule_is_the_sidebars(kinds, title):
    assert panel_render.title_for([{"id": k, "kind": k} for k in kinds]) == title
    source = open(panel_render.__file__.replace("jupyter_gpumem/views/panel_render.py",
                                                "labextension/src/sidebar.ts")).read()
    assert f"'{title}'" in source


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with no GPU")
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_the_panel_without_a_gpu_is_titled_host_memory(shell, device):
    panel = open_panel(shell, f"--device {device}")
    panel._tick()
    assert panel.title.value.startswith("<b>Host memory</b>"), panel.title.value


# -- 18. timeline ticks at round values, the process line from the panel's opening ----
def test_timeline_ticks_at_round_values_on_both_axes():
    now = 1_800_000_000.0
    points = [(now - 50 + i, {"cpu": {"used_process": (44 + i % 3) * MiB}}) for i in range(50)]
    svg = panel_render.timeline_svg(points, "cpu", window=60, now=now)
    yticks = [int(v) for v in re.findall(r"data-ytick='(\d+)'", svg)]
    assert yticks == [0, 20 * MiB, 40 * MiB, 60 * MiB], yticks
    assert re.findall(r"data-xtick='([\d.]+)'", svg) == ["0", "15", "30", "45", "60"]
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert {"0", "20 MiB", "40 MiB", "60 MiB", "now", "-15 s", "-30 s", "-1 min"} <= set(labels)


def test_the_process_line_is_drawn_from_the_panels_opening_watch_or_not(shell):
    panel = open_panel(shell)
    assert panel.session is not None
    from jupyter_gpumem.watch.state import state_for
    assert state_for(shell).footer is None     # no watch on
    panel._tick()
    coords = re.findall(r"data-line='used_process' points='([^']*)'", panel.timeline.value)
    assert coords and len(coords[0].split()) >= 2, panel.timeline.value


# -- 19. a small segment that holds bytes is seen --------------------------------------
def test_a_small_segment_gets_a_minimum_width():
    dev = {"id": "cpu", "kind": "cpu", "name": "host", "total": 23 * 1024 * MiB + 512 * MiB,
           "used_all": 4 * 1024 * MiB, "used_process": 400 * MiB, "free": 19 * 1024 * MiB}
    html = panel_render.device_bar_html(dev, attributed=24 * MiB)
    bar = html.split("data-bar='device'")[1].split("data-bar")[0]
    tensors = re.search(r"data-segment='tensors'[^>]*style='([^']*)'", bar).group(1)
    assert "flex:0 0 0.1%" in tensors and f"min-width:{panel_render.MIN_SEGMENT_PX}px" in tensors
    free = re.search(r"data-segment='free'[^>]*style='([^']*)'", bar).group(1)
    assert "flex:1 1" in free and "min-width:0" in free
