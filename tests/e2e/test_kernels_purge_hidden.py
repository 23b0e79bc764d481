"""The Kernels section's "Purge hidden" in a real browser: through the kernel's own
``jupyter_gpumem`` comm (a second one beside the sidebar's), after its confirmation.

A real JupyterLab on loopback (its server extension on, as installed) serves this tree's
sidebar; Chromium (Playwright, never a downloaded browser) runs a cell whose value, a
4 MiB host tensor, stays only in ``Out[1]``. The Kernels section lists the notebook; its
"Purge hidden" asks first (naming ``Out[1]``), then says what it freed, and another cell
shows ``Out[1]`` gone from the kernel while the names the user made stay. The comm goes
on the notebook's own connection (a second connection to a kernel whose comms the
notebook handles gets none), and the sidebar's comm keeps answering after it.
"""
from __future__ import annotations

import re

from lab_browser import (  # noqa: F401 - page: a fixture
    SIDEBAR, SIDEBAR_TAB, needs_chromium, page, screenshot_on_failure,
)
from lab_browser import notebook
from lab_browser import open_notebook
from lab_browser import wait_text
from lab_browser import accept_dialog
from lab_browser import run_cell as _run_cell
from lab_browser import serve as _serve

import pytest

NOTEBOOK = notebook(
    "%load_ext jupyter_gpumem\nimport torch\ntorch.ones(1024, 1024)",
    "1 in Out, 'torch' in dir()",
)


@pytest.fixture
def lab(tmp_path):
    yield from _serve(tmp_path, "jupyterlab", {"hidden.ipynb": NOTEBOOK})


@needs_chromium
def test_purge_hidden_from_the_kernels_section(lab, page):
    with screenshot_on_failure(page, "kernels-purge-hidden-failure.png"):
        open_notebook(page, lab['base'], "hidden.ipynb")
        assert "tensor" in _run_cell(page, 0)
        page.click(SIDEBAR_TAB)
        sidebar = page.locator(SIDEBAR)
        # the sidebar follows the notebook on its own comm: it lists Out[1]
        out1 = sidebar.locator('tr.jp-GpuMem-holder[data-name="Out[1]"]')
        out1.wait_for(timeout=60000)
        row = sidebar.locator(".jp-GpuMem-srvKernel", has_text="hidden.ipynb")
        sidebar.locator(".jp-GpuMem-kernelsRefresh").click()
        row.wait_for(timeout=30000)
        row.locator(".jp-GpuMem-srvKernelPurge").click()
        accept_dialog(page, "Purge the hidden holders?", "Out[1]")
        status = sidebar.locator(".jp-GpuMem-kernelsStatus")
        wait_text(page, "#jupyter-gpumem-sidebar .jp-GpuMem-kernelsStatus", "^Purged ",
                  timeout=60000)
        said = status.inner_text()
        assert re.fullmatch(r"Purged Out\[1\]: freed cpu [\d.]+ [KMG]iB\.", said), said
        assert _run_cell(page, 1).strip() == "(False, True)"
        # the sidebar's own comm still answers: the cell's snapshot has no Out[1]
        out1.wait_for(state="detached", timeout=30000)
        assert sidebar.locator("tr.jp-GpuMem-holder").count() == 0
