"""One notebook open in JupyterLab and in Notebook 7 at once, one kernel behind both (a
real server, Chromium): a purge from each frontend's sidebar succeeds within the bound and
the other frontend's sidebar follows; the kernel never logs a message it could not route
(``Unknown subshell_id``: the purge that went nowhere, silently)."""
from __future__ import annotations

import contextlib
import re

import pytest

from lab_browser import (  # noqa: F401 - page: a fixture
    SIDEBAR, SIDEBAR_TAB, TOKEN, needs_chromium, page, run_cell, screenshot_on_failure, serve,
)
from lab_browser import notebook
from lab_browser import open_notebook

#: how long a purge may take to answer, from the click on the dialog's button
BOUND_MS = 30000


NOTEBOOK = notebook(
    "%load_ext jupyter_gpumem\nimport torch\n"
    "a = torch.ones(4 << 20, dtype=torch.uint8)\n"
    "b = torch.ones(2 << 20, dtype=torch.uint8)\n"
    "c = torch.ones(1 << 20, dtype=torch.uint8)",
    "'a' in dir(), 'b' in dir(), 'c' in dir()",
)


def _row(sidebar, name: str):
    return sidebar.locator(f'tr.jp-GpuMem-holder[data-name="{name}"]')


def _purge(page, name: str) -> None:
    """Check ``name`` in this page's sidebar, purge it, and wait (within the bound) for
    its row to go or for the sidebar to say the purge failed."""
    sidebar = page.locator(SIDEBAR)
    _row(sidebar, name).locator("input[type=checkbox]").check()
    sidebar.locator("button.jp-GpuMem-purge").click()
    page.locator(".jp-Dialog button.jp-mod-accept").click()
    page.wait_for_function(
        "([sel, name]) => { const s = document.querySelector(sel); return !s.querySelector("
        "`tr.jp-GpuMem-holder[data-name=\"${name}\"]`) || /fail|no answer/i.test(s.innerText); }",
        arg=[SIDEBAR, name], timeout=BOUND_MS)
    assert _row(sidebar, name).count() == 0, sidebar.inner_text()


@needs_chromium
def test_a_purge_from_lab_and_from_notebook7_on_one_kernel(tmp_path, page):
    pytest.importorskip("notebook")
    lab_server = contextlib.contextmanager(serve)(
        tmp_path, "jupyterlab", {"two.ipynb": NOTEBOOK}, user_settings={"defaultDevice": "cpu"})
    with lab_server as served, screenshot_on_failure(page, "two-frontends-failure.png"):
        lab = page
        open_notebook(lab, served['base'], "two.ipynb")
        run_cell(lab, 0)
        lab.click(SIDEBAR_TAB)
        _row(lab.locator(SIDEBAR), "a").wait_for(timeout=60000)

        # the same notebook in Notebook 7, in a second window: the same kernel
        nb7 = lab.context.new_page()
        with screenshot_on_failure(nb7, "two-frontends-notebook7-failure.png"):
            nb7.goto(f"{served['base']}/notebooks/two.ipynb?token={TOKEN}")
            nb7.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90000)
            nb7.locator(".lm-MenuBar-item", has_text=re.compile(r"^View$")).click()
            nb7.locator(".lm-Menu-item", has_text="Right Sidebar").hover()
            nb7.locator(".lm-Menu-item", has_text="Show Kernel Memory").click()
            _row(nb7.locator(SIDEBAR), "a").wait_for(timeout=60000)

            _purge(nb7, "a")                                 # from Notebook 7
            _row(lab.locator(SIDEBAR), "a").wait_for(state="detached", timeout=BOUND_MS)
            lab.bring_to_front()
            _purge(lab, "b")                                 # from JupyterLab
            _row(nb7.locator(SIDEBAR), "b").wait_for(state="detached", timeout=BOUND_MS)
        assert run_cell(lab, 1).strip() == "(False, False, True)"
    log = served["log"].read_text()
    assert "Unknown subshell_id" not in log, log[-3000:]


@needs_chromium
def test_a_purge_after_a_second_lab_window_came_and_went(tmp_path, page):
    """The report's other trigger: a second JupyterLab window on the same notebook (its
    own kernel connection, its sidebar open) that closes again; a purge from the first
    window then still answers within the bound, and the kernel logs no message it could
    not route."""
    lab_server = contextlib.contextmanager(serve)(
        tmp_path, "jupyterlab", {"two.ipynb": NOTEBOOK}, user_settings={"defaultDevice": "cpu"})
    with lab_server as served, screenshot_on_failure(page, "second-window-failure.png"):
        open_notebook(page, served['base'], "two.ipynb")
        run_cell(page, 0)
        page.click(SIDEBAR_TAB)
        _row(page.locator(SIDEBAR), "a").wait_for(timeout=60000)
        second = page.context.new_page()
        open_notebook(second, served['base'], "two.ipynb")
        second.click(SIDEBAR_TAB)
        _row(second.locator(SIDEBAR), "a").wait_for(timeout=60000)
        second.close()
        page.bring_to_front()
        _purge(page, "a")
        _purge(page, "b")
        assert run_cell(page, 1).strip() == "(False, False, True)"
    log = served["log"].read_text()
    assert "Unknown subshell_id" not in log, log[-3000:]
