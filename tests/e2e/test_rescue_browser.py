"""The out-of-memory rescue through its button in a real browser: a real host
out-of-memory error in a kernel that JupyterLab runs (an address-space limit calibrated
to the kernel's size, as in tests/core/rescue/test_oom.py), the offer under the traceback, a click
on "Rescue and rerun" in Chromium, and the rerun's success shown under the button; once
with the memory held in the failing traceback's frame, once held by the exception the
failing one was raised while handling (a chained exception)."""
from __future__ import annotations

import contextlib

import pytest

from lab_browser import (  # noqa: F401 - page: a fixture
    needs_chromium, page, run_cell, screenshot_on_failure, serve,
)
from lab_browser import notebook
from lab_browser import open_notebook
from oom_cells import CHAINED, HELD, IN_FRAME, LIMIT, MiB, SETUP, SHOWN


def _notebook(failing: str) -> dict:
    return notebook(
        "%load_ext jupyter_gpumem\n%config GpuMemMagics.default_device = 'cpu'\n"
        + SETUP,
        SHOWN,
        LIMIT,
        failing,
        "print('done' in globals() or 'big' in globals(), other.numel() == "
        + str(8 * MiB) + ")",
    )


FAILED = ".jp-NotebookPanel .jp-Notebook .jp-Cell[data-windowed-list-index='3']"


@needs_chromium
@pytest.mark.parametrize("failing, holder", [(IN_FRAME, "last traceback (step(): t)"),
                                             (CHAINED, "sys.last_value.__context__")],
                         ids=["frame", "chained"])
def test_the_rescue_button_frees_the_holders_and_reruns_the_cell(tmp_path, page, monkeypatch,
                                                                  failing, holder):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")     # the kernel inherits it from the server
    lab = contextlib.contextmanager(serve)(tmp_path, "jupyterlab", {"oom.ipynb": _notebook(failing)})
    with lab as served, screenshot_on_failure(page, f"rescue-{holder[:8]}-failure.png"):
        open_notebook(page, served['base'], "oom.ipynb")
        for index in range(3):
            run_cell(page, index)
        offer = run_cell(page, 3)
        assert "can't allocate memory" in offer and "out of memory on the host" in offer, offer
        assert "Out[" in offer and holder in offer, offer
        # nothing was freed or rerun before the click
        assert run_cell(page, 4).split() == ["False", "True"]

        button = page.locator(FAILED).get_by_role("button", name="Rescue and rerun")
        button.wait_for(timeout=30000)
        button.click()
        page.wait_for_function(
            "sel => /the rerun succeeded/.test(document.querySelector(sel).innerText)",
            arg=FAILED, timeout=60000)
        said = page.locator(FAILED).inner_text()
        assert "rescue freed" in said, said
        freed = float(said.split("rescue freed ")[1].split(" ")[0])
        assert freed >= 2 * HELD - 1, said
        assert "done" in said, said         # the rerun's own output, under the button
        assert run_cell(page, 4).split() == ["True", "True"]
