"""What a new user meets in a real browser: the live panel (``%gpumem panel``) and the
sidebar side by side on host tensors (JupyterLab, Chromium, 1400x900), a purge from
each view reaching the other; the panel's title follows the sidebar's rule, its
timeline has round ticks on both axes and a process line from its opening (watch not
on), a small segment is seen, its disabled purge button is grey and its confirmation
opens in view, and an old purge's result goes after a later purge. Screenshots go to
the ignored artifacts folder."""
from __future__ import annotations

import contextlib
import re
import time

from lab_browser import (  # noqa: F401 - page: a fixture
    ARTIFACTS, SIDEBAR, SIDEBAR_TAB, needs_chromium, page, run_cell,
    screenshot_on_failure, serve,
)
from lab_browser import notebook
from lab_browser import open_notebook
from lab_browser import wait_text


NOTEBOOK = notebook(
    "%load_ext jupyter_gpumem\nimport torch\n"
    "a = torch.ones(16 << 20, dtype=torch.uint8)\n"
    "b = torch.ones(6 << 20, dtype=torch.uint8)\n"
    "c = torch.ones(2 << 20, dtype=torch.uint8)",
    "%gpumem panel",
    "d = 1",
    "'a' in dir(), 'b' in dir(), 'c' in dir()",
)

#: the output of the notebook's second cell (the panel), for querySelector and Playwright
PANEL = ".jp-NotebookPanel .jp-Notebook .jp-Cell[data-windowed-list-index='1'] .jp-OutputArea-output"

#: the panel's figures read in one go in the page (its widgets redraw about once a second)
PANEL_STATE = r"""
sel => {
  const root = document.querySelector(sel);
  if (!root) return null;
  const svg = root.querySelector('svg[data-device]');
  const purge = [...root.querySelectorAll('button')].find(b => /^Purge/.test(b.textContent.trim()));
  const seg = root.querySelector("[data-bar='device'] [data-segment='tensors']");
  const style = purge ? getComputedStyle(purge) : null;
  return {
    text: root.innerText,
    title: (root.querySelector('b') || {}).textContent,
    yticks: svg ? svg.querySelectorAll('[data-ytick]').length : 0,
    xticks: svg ? svg.querySelectorAll('[data-xtick]').length : 0,
    process: svg ? (svg.querySelector("[data-line='used_process']") || {getAttribute: () => ''})
      .getAttribute('points').trim().split(/\s+/).filter(Boolean).length : 0,
    segment: seg ? seg.getBoundingClientRect().width : -1,
    purgeText: purge ? purge.textContent.trim() : null,
    purgeDisabled: purge ? purge.disabled : null,
    purgeBackground: style ? style.backgroundColor : null,
    purgeClass: purge ? purge.className : null,
  };
}
"""


def _panel(page) -> dict:
    return page.evaluate(PANEL_STATE, PANEL)


def _check_in_panel(page, name: str) -> None:
    page.evaluate("""([sel, name]) => {
      const root = document.querySelector(sel);
      [...root.querySelectorAll('input[type=checkbox]')].find(
        i => (i.closest('label') || i.parentElement).textContent.trim() === name).click();
    }""", [PANEL, name])


def _orange(css: str) -> bool:
    r, g, b = (int(v) for v in re.findall(r"\d+", css)[:3])
    return r > 180 and 100 < g < 200 and b < 100


@needs_chromium
def test_panel_and_sidebar_together_a_purge_from_each(tmp_path, page):
    lab = contextlib.contextmanager(serve)(tmp_path, "jupyterlab", {"first.ipynb": NOTEBOOK})
    with lab as served, screenshot_on_failure(page, "first-use-failure.png"):
        _scenario(served, page)


def _scenario(lab, page) -> None:
    open_notebook(page, lab['base'], "first.ipynb")
    run_cell(page, 0)
    run_cell(page, 1)
    page.wait_for_function(
        "sel => { const r = document.querySelector(sel); return r && r.querySelector("
        "\"svg[data-device] [data-line='used_process']\") && /\\bc\\b/.test(r.innerText); }",
        arg=PANEL, timeout=60000)
    time.sleep(3)      # a few readings, no watch on
    state = _panel(page)
    # 17: the sidebar's title rule on a machine without a GPU
    assert state["title"] == "Host memory", state["title"]
    # 18: round ticks on both axes, the process line from the panel's opening
    assert state["yticks"] >= 3 and state["xticks"] >= 3, state
    assert state["process"] >= 2, state
    # 19: 16 MiB of tensors on a host bar of many GiB is still seen
    assert state["segment"] >= 3, state
    # 16: the disabled purge button is grey, not orange
    assert state["purgeDisabled"] and not _orange(state["purgeBackground"]), state

    # the sidebar beside it
    page.click(SIDEBAR_TAB)
    sidebar = page.locator(SIDEBAR)
    sidebar.locator('tr.jp-GpuMem-holder[data-name="a"]').wait_for(timeout=30000)
    assert sidebar.locator(".jp-GpuMem-title").inner_text().lower() == "host memory"
    page.wait_for_function(
        "() => { const c = document.querySelector('#jupyter-gpumem-sidebar "
        ".jp-GpuMem-chartBox[data-device=cpu]'); return c && +c.dataset.xticks >= 3 "
        "&& +c.dataset.yticks >= 3; }", timeout=20000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "first-use-panel-and-sidebar.png"))

    # a purge from the panel: its question opens in view, the sidebar follows
    _check_in_panel(page, "a")
    page.wait_for_function(
        "sel => [...document.querySelectorAll(sel + ' button')].some("
        "b => b.textContent.trim() === 'Purge 1 checked' && !b.disabled)",
        arg=PANEL, timeout=20000)
    time.sleep(0.5)    # its style comes in the same update
    state = _panel(page)
    assert not state["purgeDisabled"] and _orange(state["purgeBackground"]), state
    page.locator(PANEL).locator("button", has_text=re.compile(r"^\s*Purge 1 checked")).click()
    confirm = page.locator(PANEL).locator("button", has_text="Yes, purge")
    confirm.wait_for(timeout=20000)
    box = confirm.bounding_box()
    assert box and 0 <= box["y"] and box["y"] + box["height"] <= 900, box
    confirm.click()
    wait_text(page, PANEL, r"purge at \d\d:\d\d:\d\d: removed a", timeout=30000, inner=True)
    t = time.monotonic()
    sidebar.locator('tr.jp-GpuMem-holder[data-name="a"]').wait_for(state="detached", timeout=30000)
    from_panel = time.monotonic() - t

    # a later cell: the result stays and says when it ran
    run_cell(page, 2)
    assert "purge at" in _panel(page)["text"]

    # a purge from the sidebar: the panel follows, and the old result goes
    sidebar.locator('tr.jp-GpuMem-holder[data-name="b"] input[type=checkbox]').check()
    sidebar.locator("button.jp-GpuMem-purge").click()
    page.locator(".jp-Dialog button.jp-mod-accept").click()
    t = time.monotonic()
    try:
        page.wait_for_function(
            "sel => { const r = document.querySelector(sel); return ![...r.querySelectorAll("
            "'input[type=checkbox]')].some(i => (i.closest('label') || i.parentElement)"
            ".textContent.trim() === 'b'); }",
            arg=PANEL, timeout=30000)
    except Exception as exc:   # what each view and the server said, for the failure's reader
        raise AssertionError(
            f"the panel still lists b {time.monotonic() - t:.0f} s after the sidebar's purge\n"
            f"sidebar: {sidebar.inner_text()[:1500]}\npanel: {_panel(page)['text'][:1500]}\n"
            f"server log: {lab['log'].read_text()[-3000:]}") from exc
    from_sidebar = time.monotonic() - t
    page.wait_for_function("sel => !/purge at/.test(document.querySelector(sel).innerText)",
                           arg=PANEL, timeout=30000)
    page.screenshot(path=str(ARTIFACTS / "first-use-after-purges.png"))
    assert run_cell(page, 3).strip() == "(False, False, True)"
    print(f"purge reached the other view in {from_panel:.1f} s (panel -> sidebar), "
          f"{from_sidebar:.1f} s (sidebar -> panel)")
