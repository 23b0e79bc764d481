"""The holders table's byte columns in a real browser, at every sidebar width a user can
drag to: a byte figure ("Frees", "Shared") is never cut.

A real JupyterLab on loopback serves this tree's sidebar; Chromium (Playwright, never a
downloaded browser) opens a notebook whose kernel holds host tensors with the widest
figures the sidebar writes (``1023.9 MiB``, ``1023.9 KiB``, and the ``160.0 MiB`` once
seen cut as ``160.0 M…``); the splitter left of the right area is dragged to the
narrowest sidebar JupyterLab allows, its default, a wide one and the widest. At each,
every byte cell shows its whole text (the name column gives the room). The big tensors
are ``torch.empty``: address space, no resident memory.
"""
from __future__ import annotations

import pytest

from lab_browser import (  # noqa: F401 - page: a fixture
    ARTIFACTS, SIDEBAR, SIDEBAR_TAB, needs_chromium, page, screenshot_on_failure,
)
from lab_browser import notebook
from lab_browser import open_notebook
from lab_browser import run_cell as _run_cell
from lab_browser import serve as _serve

MiB = 1 << 20
KiB = 1 << 10

SOURCE = f"""import torch
big = torch.ones(40 * {MiB})  # float32: 160.0 MiB
wide = torch.empty({1023 * MiB + 900 * KiB}, dtype=torch.uint8)
kib = torch.empty({1023 * KiB + 900}, dtype=torch.uint8)
held = torch.empty({1023 * MiB + 900 * KiB}, dtype=torch.uint8)
also = [held]"""

NOTEBOOK = notebook(SOURCE)

# Every byte cell of the holders table whose text does not fit, with its width.
CUT_BYTES = r"""
() => {
  const root = document.querySelector('#jupyter-gpumem-sidebar');
  const out = [];
  for (const el of root.querySelectorAll('.jp-GpuMem-holders td.jp-GpuMem-bytes')) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const text = range.getBoundingClientRect();
    const box = el.getBoundingClientRect();
    const pad = parseFloat(getComputedStyle(el).paddingRight) || 0;
    if (el.scrollWidth > el.clientWidth + 0.5 || text.left < box.left - 0.5
        || text.right > box.right - pad + 0.5) {
      out.push(`${el.textContent} in ${box.width.toFixed(1)} px`);
    }
  }
  return out;
}
"""


@pytest.fixture
def lab(tmp_path):
    yield from _serve(tmp_path, "jupyterlab", {"columns.ipynb": NOTEBOOK})


def _drag_right_area_to(page, x: float) -> int:
    """Drag the splitter left of the right area to ``x``; the sidebar's width after."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
    box = handle.bounding_box()
    assert box, "no splitter left of the right area"
    hx, hy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(hx, hy)
    page.mouse.down()
    page.mouse.move(x, hy, steps=8)
    page.mouse.up()
    page.wait_for_timeout(300)  # one frame of layout, and the container query after it
    return page.evaluate(f"() => document.querySelector('{SIDEBAR}').clientWidth")


def _texts(page) -> list[str]:
    return page.evaluate(
        "() => [...document.querySelectorAll('#jupyter-gpumem-sidebar "
        ".jp-GpuMem-holders td.jp-GpuMem-bytes')].map(e => e.textContent)")


@needs_chromium
def test_byte_figures_are_never_cut_at_any_sidebar_width(lab, page):
    with screenshot_on_failure(page, "sidebar-columns-failure.png"):
        open_notebook(page, lab['base'], "columns.ipynb")
        assert _run_cell(page, 0).strip() == ""
        page.click(SIDEBAR_TAB)
        sidebar = page.locator(SIDEBAR)
        sidebar.locator("button.jp-GpuMem-load").click(timeout=30000)
        sidebar.locator('tr.jp-GpuMem-holder[data-name="big"]').wait_for(timeout=60000)
        sidebar.locator('tr.jp-GpuMem-holder[data-name="kib"]').wait_for(timeout=60000)
        default = page.evaluate(f"() => document.querySelector('{SIDEBAR}').clientWidth")
        viewport = page.viewport_size["width"]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        widths = []
        # narrowest (the handle dragged to the window's right edge), default, wide, widest
        for x in (viewport - 2, viewport - default, viewport - 520, 2):
            width = _drag_right_area_to(page, x)
            widths.append(width)
            texts = _texts(page)
            assert {"160.0 MiB", "1023.9 MiB", "1023.9 KiB"} <= set(texts), texts
            cut = page.evaluate(CUT_BYTES)
            sidebar.screenshot(path=str(ARTIFACTS / f"sidebar-columns-{width}.png"))
            assert cut == [], f"sidebar {width} px: cut {cut}"
        assert min(widths) <= default < max(widths), widths
        assert max(widths) >= 600, widths
        print(f"sidebar widths checked (px): {widths}")
