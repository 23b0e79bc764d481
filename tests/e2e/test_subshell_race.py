"""JupyterLab can hand the sidebar's comm a kernel subshell it is deleting: its comm
handler shares one subshell per comm target and kernel, and once the last comm of the
target closes it deletes that subshell after the kernel's answer to its creation, even
when a new comm took it meanwhile. The sidebar's first comm, opened before
``%load_ext``, is refused by the kernel; if the subshell's creation is answered late (a
loaded machine), the comm the sidebar opens after ``%load_ext`` gets the subshell that is
then deleted, and ipykernel drops every request sent over it ("Unknown subshell_id"): the
scan and the purge went unanswered (the sidebar said so after 10 s).

Here the kernel answers subshell creations 4 s late (a startup file slows its control
handler; JupyterLab, the server, the comms and the subshells are real), which makes the
race certain: a scan and a purge from the sidebar must still be answered."""
from __future__ import annotations

import contextlib
import time

from lab_browser import (  # noqa: F401 - page: a fixture
    SIDEBAR, SIDEBAR_TAB, needs_chromium, notebook, open_notebook, page, run_cell,
    screenshot_on_failure, serve,
)

#: how late the kernel answers a subshell's creation (s)
LATE = 4

SLOW_CREATION = f"""
import asyncio
import torch    # (cell 0 then runs at once, well inside the late answer)
_kernel = get_ipython().kernel
_create = _kernel.control_handlers["create_subshell_request"]
async def _late(socket, ident, parent):
    await asyncio.sleep({LATE})
    await _create(socket, ident, parent)
_kernel.control_handlers["create_subshell_request"] = _late
del _late
"""

NOTEBOOK = notebook("%load_ext jupyter_gpumem\nimport torch\n"
                    "a = torch.ones(4 << 20, dtype=torch.uint8)\n"
                    "b = torch.ones(2 << 20, dtype=torch.uint8)",
                    "'a' in dir(), 'b' in dir()")


@needs_chromium
def test_a_sidebar_handed_a_deleted_subshell_is_still_answered(tmp_path, page):
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-late-subshells.py").write_text(SLOW_CREATION)
    lab = contextlib.contextmanager(serve)(tmp_path, "jupyterlab", {"race.ipynb": NOTEBOOK},
                                           user_settings={"defaultDevice": "cpu"})
    with lab as served, screenshot_on_failure(page, "subshell-race-failure.png"):
        open_notebook(page, served["base"], "race.ipynb")     # the first comm: refused
        run_cell(page, 0)                                      # %load_ext: a new comm
        page.click(SIDEBAR_TAB)
        sidebar = page.locator(SIDEBAR)
        sidebar.locator('tr.jp-GpuMem-holder[data-name="a"]').wait_for(timeout=60000)
        # the late creations answered one after the other (the kernel's control thread
        # takes them in turn), and the deletion after them: the subshell is gone
        time.sleep(2 * LATE + 3)
        sidebar.locator("button.jp-GpuMem-refresh").click()
        sidebar.locator('tr.jp-GpuMem-holder[data-name="b"] input[type=checkbox]').check()
        sidebar.locator("button.jp-GpuMem-purge").click()
        page.locator(".jp-Dialog button.jp-mod-accept").click()
        sidebar.locator('tr.jp-GpuMem-holder[data-name="b"]').wait_for(state="detached",
                                                                        timeout=20000)
        said = run_cell(page, 1)
        log = served["log"].read_text()
    assert "(True, False)" in said, said
    assert "Unknown subshell_id" not in log, log[-3000:]   # no request dropped
