"""The sidebar under real use, in a real JupyterLab in Chromium (lab_browser.py):

- live while a cell runs, on any tab: a kernel's comm stays open across focus changes,
  so a busy kernel's bars keep moving after a switch to another notebook and back (at
  least 3 new readings during a 10 s cell), and its timeline keeps its history across
  three switches (its point count never falls);
- at scale: 2,300 holders (2,000 names and 300 values in ``Out``): the switch to that
  notebook and a refresh are measured side by side with a baseline (a switch to a small
  notebook) in the same page, with a PerformanceObserver of long tasks; only the rows on
  screen are in the DOM; filter ``Out[``, select all, one confirmation (it names the
  notebook, Enter defaults to Cancel) purges the 300 values;
- the figures are the text report's: the "Frees" and "Shared" columns of a row equal
  ``%gpumem``'s "only it" and "shared";
- the dark theme: every text of the sidebar reads at 4.5:1 or more against its
  background (computed styles), the timeline's axis colour too.

Screenshots (light and dark, wide and narrow) go to test-artifacts/.
The scale test is behind ``GPUMEM_E2E_LONG=1`` (about a minute more).
"""
from __future__ import annotations

import os
import re
import time

import pytest

from lab_browser import (  # noqa: F401 - page: a fixture
    ARTIFACTS, SIDEBAR, SIDEBAR_TAB, needs_chromium, page, screenshot_on_failure,
)
from lab_browser import notebook
from lab_browser import open_notebook
from lab_browser import run_cell
from lab_browser import wait_text
from lab_browser import serve as _serve

LONG = os.environ.get("GPUMEM_E2E_LONG") == "1"


TRAIN = notebook(
    "%load_ext jupyter_gpumem\nimport torch, time\nx = torch.ones(256, 1024)",
    "keep = []\nfor i in range(10):\n    keep.append(torch.ones(2048, 1024))\n    time.sleep(1)",
)
OTHER = notebook("%load_ext jupyter_gpumem\nimport torch\ny = torch.ones(128, 1024)")
MANY = notebook(
    "%load_ext jupyter_gpumem\nimport torch\n"
    "for i in range(2000):\n    globals()[f't{i}'] = torch.ones(64)\n"
    "Out.update({i: torch.ones(32) for i in range(1, 301)})",
    ("print(len(Out), sum(1 for k in list(globals()) if k.startswith('t') and k[1:].isdigit()))"),
    "print(len(Out))",
)

# Lumino's tab of a document in the main area, by its label
def _doc_tab(page, name: str):
    return page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text=name).first


def _open_from_browser(page, name: str) -> None:
    item = page.locator(".jp-DirListing-item", has_text=name).first
    item.dblclick()
    page.wait_for_function(
        "n => [...document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tab')]"
        ".some(t => t.textContent.includes(n) && t.classList.contains('lm-mod-current'))",
        arg=name, timeout=30000)
    wait_text(page, "#jp-main-statusbar", r"\| Idle", timeout=90000)


def _accept_kernel_dialog(page) -> None:
    """JupyterLab at times asks for the kernel of a notebook that names one: take it."""
    select = page.locator(".jp-Dialog button.jp-mod-accept")
    try:
        select.wait_for(timeout=3000)
    except Exception:  # noqa: BLE001 - no dialog: nothing to do
        return
    select.click()


def _shown(page, name: str) -> None:
    """Wait until the sidebar shows ``name``'s kernel, ready."""
    page.wait_for_function(
        "n => { const s = document.querySelector('#jupyter-gpumem-sidebar');"
        " return s && s.querySelector('.jp-GpuMem-kernel').textContent.startsWith(n)"
        " && s.querySelector('.jp-GpuMem-device'); }",
        arg=name, timeout=60000)


def _start_cell(page, index: int) -> None:
    """Run a cell of the notebook in focus without waiting for it to end."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(index)
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")
    page.wait_for_function("el => /\\[\\*\\]/.test(el.textContent)",
                           arg=cell.locator(".jp-InputPrompt").element_handle(), timeout=20000)


def _run_visible(page, index: int) -> str:
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    prompt.click()
    page.keyboard.press("Shift+Enter")
    page.wait_for_function("el => /\\[\\d+\\]/.test(el.textContent)",
                           arg=prompt.element_handle(), timeout=120000)
    return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


BAR = "#jupyter-gpumem-sidebar .jp-GpuMem-device[data-device='cpu'] .jp-GpuMem-bar"
POINTS = "#jupyter-gpumem-sidebar .jp-GpuMem-chartBox[data-device='cpu']"


@pytest.fixture
def lab(tmp_path):
    yield from _serve(tmp_path, "jupyterlab",
                      {"train.ipynb": TRAIN, "other.ipynb": OTHER, "many.ipynb": MANY})


@needs_chromium
def test_a_busy_kernel_stays_live_across_tab_switches_and_keeps_its_history(lab, page):
    with screenshot_on_failure(page, "live-failure.png"):
        open_notebook(page, lab['base'], "train.ipynb")
        run_cell(page, 0)
        page.click(SIDEBAR_TAB)
        _shown(page, "train.ipynb")
        _open_from_browser(page, "other.ipynb")
        _run_visible(page, 0)
        _shown(page, "other.ipynb")
        _doc_tab(page, "train.ipynb").click()
        _shown(page, "train.ipynb")

        # a 10 s cell that allocates 8 MiB a second; switch away and back at once
        _start_cell(page, 1)
        _doc_tab(page, "other.ipynb").click()
        _shown(page, "other.ipynb")
        _doc_tab(page, "train.ipynb").click()
        _shown(page, "train.ipynb")
        stale = page.locator(f"{SIDEBAR} .jp-GpuMem-staleNote")
        assert stale.is_visible() and "from before it" in stale.inner_text()
        seen, start = [], time.monotonic()
        while time.monotonic() - start < 7:
            label = page.locator(BAR).get_attribute("aria-label")
            if not seen or seen[-1] != label:
                seen.append(label)
            time.sleep(0.25)
        # at least 3 new readings in 7 s of the running cell, after the switch
        assert len(seen) >= 4, seen

        # its history is kept across three switches: the point count never falls
        counts = [int(page.locator(POINTS).get_attribute("data-points"))]
        for _ in range(3):
            _doc_tab(page, "other.ipynb").click()
            _shown(page, "other.ipynb")
            _doc_tab(page, "train.ipynb").click()
            _shown(page, "train.ipynb")
            counts.append(int(page.locator(POINTS).get_attribute("data-points")))
        assert counts == sorted(counts) and counts[0] >= 8, counts
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.locator(SIDEBAR).screenshot(path=str(ARTIFACTS / "sidebar-live-running.png"))


LONGTASKS = """
() => { window.__gpumemLong = [];
  new PerformanceObserver(l => { for (const e of l.getEntries()) window.__gpumemLong.push(e.duration); })
    .observe({ entryTypes: ['longtask'] }); }
"""

# after a click on a document tab: the time until the sidebar shows that kernel's table
# (from a mark set just before the click, so Playwright's own delay counts too), and the
# longest task meanwhile; -1 when it did not show within 5 s
MARK = "() => { window.__gpumemLong = []; window.__gpumemT0 = performance.now(); }"
SHOWN = """
async ([name, rows]) => {
  const done = () => {
    const s = document.querySelector('#jupyter-gpumem-sidebar');
    return s.querySelector('.jp-GpuMem-kernel').textContent.startsWith(name) &&
      s.querySelectorAll('tr.jp-GpuMem-holder').length >= rows;
  };
  while (!done() && performance.now() - window.__gpumemT0 < 5000) {
    await new Promise(r => requestAnimationFrame(r));
  }
  if (!done()) {
    const s = document.querySelector('#jupyter-gpumem-sidebar');
    return [-1, s.querySelectorAll('tr.jp-GpuMem-holder').length,
            s.querySelector('.jp-GpuMem-kernel').textContent,
            s.querySelector('.jp-GpuMem-status').textContent,
            document.querySelector('.jp-GpuMem-filterCount').textContent];
  }
  await new Promise(r => requestAnimationFrame(r));
  const t = performance.now() - window.__gpumemT0;
  await new Promise(r => setTimeout(r, 150));
  return [t, Math.max(0, ...window.__gpumemLong)];
}
"""


def _switch(page, name: str, rows: int):
    page.evaluate(MARK)
    _doc_tab(page, name).click()
    return page.evaluate(SHOWN, [name, rows])


@needs_chromium
@pytest.mark.skipif(not LONG, reason="a long scenario: set GPUMEM_E2E_LONG=1")
def test_2300_holders_switch_refresh_filter_select_all_and_one_purge(lab, page):
    with screenshot_on_failure(page, "scale-failure.png"):
        open_notebook(page, lab['base'], "many.ipynb")
        _accept_kernel_dialog(page)
        run_cell(page, 0)
        assert "300 2000" in run_cell(page, 1)
        page.click(SIDEBAR_TAB)
        _shown(page, "many.ipynb")
        wait_text(page, f"{SIDEBAR} .jp-GpuMem-filterCount", "2300 rows", timeout=90000)
        # only the rows on screen are in the DOM
        assert page.locator(f"{SIDEBAR} tr.jp-GpuMem-holder").count() < 80
        _open_from_browser(page, "other.ipynb")
        _run_visible(page, 0)
        _shown(page, "other.ipynb")
        page.evaluate(LONGTASKS)
        # side by side: the switch to the 2,300-holder notebook and to a 1-holder one
        # (the baseline: JupyterLab's own switch of documents, on this machine)
        _switch(page, "many.ipynb", 20)  # warm-up
        many, small = [], []
        for _ in range(3):
            small.append(_switch(page, "other.ipynb", 1))
            many.append(_switch(page, "many.ipynb", 20))
        print("switch [ms, longest task ms]: 2300 holders", many, "baseline", small)
        assert all(ms >= 0 for ms, _ in many + small), (many, small)
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        # the target: under 200 ms, no task over 100 ms; on a loaded machine the
        # baseline itself can pass it, so the sidebar's part is what is held to it
        assert med([ms for ms, _ in many]) < max(200, med([ms for ms, _ in small]) + 100), \
            (many, small)
        # long tasks: the 100 ms target, with 50 ms for this shared 2-core machine's noise
        # (the baseline's own switch has shown tasks of 170-290 ms here)
        assert med([t for _, t in many]) <= max(100, med([t for _, t in small])) + 50, \
            (many, small)

        # a refresh: the new snapshot drawn without a long task
        sidebar = page.locator(SIDEBAR)
        scanned = sidebar.locator(".jp-GpuMem-scanned").inner_text()
        page.evaluate("() => { window.__gpumemLong = []; }")
        time.sleep(1.1)
        t = time.monotonic()
        sidebar.locator("button.jp-GpuMem-refresh").click()
        page.wait_for_function(
            "s => document.querySelector('#jupyter-gpumem-sidebar .jp-GpuMem-scanned')"
            ".textContent !== s", arg=scanned, timeout=60000)
        refresh_s = time.monotonic() - t
        longest = page.evaluate("() => Math.max(0, ...window.__gpumemLong)")
        print(f"refresh round trip {refresh_s:.3f} s (kernel scan included), "
              f"longest task {longest:.0f} ms")
        assert longest <= 150, longest

        # figures: a row's Frees and Shared are the text report's "only it" and "shared"
        filt = sidebar.locator("input.jp-GpuMem-filter")
        filt.fill("t1999")
        row = sidebar.locator("tr.jp-GpuMem-holder[data-name='t1999']")
        frees = row.locator(".jp-GpuMem-frees").inner_text()
        shared = row.locator(".jp-GpuMem-sharedBytes").inner_text()
        assert frees == "256 B" and shared == "–", (frees, shared)  # torch.ones(64): 256 B

        # all of Out: filter, select all, one confirmation
        filt.fill("Out[")
        wait_text(page, f"{SIDEBAR} .jp-GpuMem-filterCount", "300 of 2300 rows", timeout=10000)
        first = sidebar.locator("tr.jp-GpuMem-holder").first.get_attribute("data-name")
        sidebar.locator("input.jp-GpuMem-checkAll").check()
        purge = sidebar.locator("button.jp-GpuMem-purge")
        assert purge.inner_text().startswith("Purge selected (300)")
        assert purge.is_visible(), "the purge button is in reach (sticky)"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        sidebar.screenshot(path=str(ARTIFACTS / "sidebar-select-all-out.png"))
        purge.click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(timeout=10000)
        assert "many.ipynb" in dialog.inner_text() and "300 names" in dialog.inner_text()
        # Enter defaults to Cancel
        page.keyboard.press("Enter")
        dialog.wait_for(state="detached", timeout=10000)
        assert first.startswith("Out[")
        purge.click()
        dialog.wait_for(timeout=10000)
        dialog.locator("button.jp-mod-warn").click()
        result = sidebar.locator(".jp-GpuMem-purgeResult")
        result.wait_for(timeout=60000)
        assert "Purged" in result.inner_text()
        _doc_tab(page, "many.ipynb").click()
        assert _run_visible(page, 2).strip() == "0"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "sidebar-scale.png"))


CONTRAST = """
() => {
  const parse = c => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const lum = ([r, g, b]) => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const over = (top, bottom) => { const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat(1); };
  const background = el => { const layers = [];
    for (let e = el; e; e = e.parentElement) { const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    let bg = [255, 255, 255, 1];
    for (const l of layers.reverse()) bg = over(l, bg);
    return bg; };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const out = []; let checked = 0;
  for (const el of document.querySelectorAll('#jupyter-gpumem-sidebar *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length || el.closest('[disabled]') || el.disabled) continue;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || Number(style.opacity) === 0) continue;
    const bg = background(el);
    const fg = over(parse(style.color), bg);
    const r = ratio(fg, bg); checked += 1;
    if (r < 4.5) out.push(`${el.className || el.tagName}: ${r.toFixed(2)} "${el.textContent.trim().slice(0, 30)}"`);
  }
  const root = getComputedStyle(document.body);
  const axis = parse(root.getPropertyValue('--jp-ui-font-color1').trim().replace(/^#(..)(..)(..)$/,
    (_, r, g, b) => `rgb(${parseInt(r, 16)}, ${parseInt(g, 16)}, ${parseInt(b, 16)})`));
  const page = background(document.querySelector('#jupyter-gpumem-sidebar'));
  return { failures: out, checked, axis: axis ? ratio(over(axis, page), page) : null };
}
"""


@needs_chromium
def test_dark_theme_contrast_and_screenshots(lab, page, tmp_path):
    themes = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    themes.mkdir(parents=True, exist_ok=True)
    with screenshot_on_failure(page, "dark-failure.png"):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        open_notebook(page, lab['base'], "other.ipynb")
        run_cell(page, 0)
        page.click(SIDEBAR_TAB)
        _shown(page, "other.ipynb")
        page.wait_for_selector(f"{SIDEBAR} tr.jp-GpuMem-holder", timeout=30000)
        light = page.evaluate(CONTRAST)
        page.locator(SIDEBAR).screenshot(path=str(ARTIFACTS / "sidebar-light-narrow.png"))
        (themes / "themes.jupyterlab-settings").write_text('{"theme": "JupyterLab Dark"}')
        page.reload()
        page.wait_for_function(
            "() => document.body.dataset.jpThemeLight === 'false'", timeout=60000)
        # the status bar item says host memory here (no GPU); a click opens the sidebar
        status = page.locator(".jp-GpuMem-statusItem")
        wait_text(page, ".jp-GpuMem-statusItem", r"^Host \d", timeout=60000)
        if not page.locator(SIDEBAR).is_visible():
            status.click()
        page.wait_for_selector(f"{SIDEBAR} tr.jp-GpuMem-holder", timeout=60000)
        time.sleep(2)  # a few readings for the timeline
        dark = page.evaluate(CONTRAST)
        page.locator(SIDEBAR).screenshot(path=str(ARTIFACTS / "sidebar-dark-narrow.png"))
        page.screenshot(path=str(ARTIFACTS / "sidebar-dark-wide.png"))
        print("contrast light:", light, "dark:", dark)
        assert light["failures"] == [], light
        assert dark["checked"] > 20 and dark["failures"] == [], dark
        assert dark["axis"] is not None and dark["axis"] >= 4.5, dark
        assert re.match(r"^Host \d", status.inner_text()), status.inner_text()
