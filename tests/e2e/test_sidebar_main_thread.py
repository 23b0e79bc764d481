"""What the sidebar asks of a kernel in a real JupyterLab (comms over the kernel's
subshells on, ipykernel 7) runs on the kernel's main thread: a scan (the Refresh button)
and a purge asked while the kernel is idle, and a purge asked while a cell runs, which
waits for that cell's end. The kernel records the thread of each request it runs."""
from __future__ import annotations

import contextlib
import time

from lab_browser import (  # noqa: F401 - page: a fixture
    SIDEBAR, SIDEBAR_TAB, needs_chromium, notebook, open_notebook, page, run_cell,
    screenshot_on_failure, serve,
)

RECORD = """%load_ext jupyter_gpumem
import threading, torch
import jupyter_gpumem.views.comm as _comm
a = torch.ones(4 << 20, dtype=torch.uint8)
b = torch.ones(2 << 20, dtype=torch.uint8)
ran = []
_run = _comm._Channel.run
def _recorded(self, kind, fields, rid):
    ran.append((kind, threading.current_thread().name))
    return _run(self, kind, fields, rid)
_comm._Channel.run = _recorded
"""


NOTEBOOK = notebook(RECORD, "import time\ntime.sleep(8)",
                    "print(sorted(set(ran)), 'a' in dir(), 'b' in dir())")


def _purge(page, name: str) -> None:
    sidebar = page.locator(SIDEBAR)
    sidebar.locator(f'tr.jp-GpuMem-holder[data-name="{name}"] input[type=checkbox]').check()
    sidebar.locator("button.jp-GpuMem-purge").click()
    page.locator(".jp-Dialog button.jp-mod-accept").click()


@needs_chromium
def test_the_sidebars_scan_and_purges_run_on_the_kernels_main_thread(tmp_path, page):
    lab = contextlib.contextmanager(serve)(tmp_path, "jupyterlab", {"thread.ipynb": NOTEBOOK},
                                           user_settings={"defaultDevice": "cpu"})
    with lab as served, screenshot_on_failure(page, "main-thread-failure.png"):
        open_notebook(page, served['base'], "thread.ipynb")
        run_cell(page, 0)
        page.click(SIDEBAR_TAB)
        sidebar = page.locator(SIDEBAR)
        sidebar.locator('tr.jp-GpuMem-holder[data-name="a"]').wait_for(timeout=60000)
        sidebar.locator("button.jp-GpuMem-refresh").click()        # a scan, kernel idle
        _purge(page, "a")                                            # a purge, kernel idle
        sidebar.locator('tr.jp-GpuMem-holder[data-name="a"]').wait_for(state="detached",
                                                                        timeout=30000)
        # a purge asked while a cell runs: queued, run as the cell ends
        cell = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(1)
        cell.locator(".jp-InputPrompt").click()
        page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:run-cell-and-select-next"]'
                     ).click()
        page.wait_for_function("el => /\\[\\*\\]/.test(el.textContent)",
                               arg=cell.locator(".jp-InputPrompt").element_handle(), timeout=20000)
        t = time.monotonic()
        _purge(page, "b")
        sidebar.locator('tr.jp-GpuMem-holder[data-name="b"]').wait_for(state="detached",
                                                                        timeout=60000)
        waited = time.monotonic() - t
        said = run_cell(page, 2)
    assert "('purge', 'MainThread')" in said and "('refresh', 'MainThread')" in said, said
    assert said.count("'MainThread'") == said.count("('"), said   # no other thread ran one
    assert said.strip().endswith("False False"), said
    assert waited > 2, f"the purge asked during the 8 s cell ran before its end ({waited:.1f} s)"
