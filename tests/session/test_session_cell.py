"""The snapshot the live views get after a cell says which cell it follows (``cell``)."""
from __future__ import annotations

import time

import pytest

from conftest import run
from jupyter_gpumem.session import session_of

torch = pytest.importorskip("torch")


class _Shown:
    """A live view as the session sees one (views/comm.py and views/panel.py are two)."""

    device = "cpu"

    def __init__(self) -> None:
        self.snapshots: list[dict] = []
        self.errors: list[str] = []

    def show_snapshot(self, data: dict) -> None:
        self.snapshots.append(data)

    def show_error(self, text: str) -> None:
        self.errors.append(text)


def test_the_snapshot_after_a_cell_carries_that_cells_start_end_and_number(ip):
    run(ip, "%load_ext jupyter_gpumem")
    session = session_of(ip)
    view = _Shown()
    session.add_view(view)
    try:
        before = time.time()
        run(ip, "import torch\nw = torch.ones(1024)\ntime_sink = sum(range(100000))")
        after = time.time()
        assert not view.errors and view.snapshots, "a terminal shell refreshes in post_run_cell"
        cell = view.snapshots[-1]["cell"]
        assert before <= cell["start"] < cell["end"] <= after
        assert cell["execution_count"] == ip.execution_count - 1
        assert any(h["name"] == "w" for h in view.snapshots[-1]["holders"])
        session.refresh_now()   # a purge's refresh, say: it follows no cell
        assert "cell" not in view.snapshots[-1]
        run(ip, "v = w")
        assert view.snapshots[-1]["cell"]["execution_count"] == ip.execution_count - 1
    finally:
        session.remove_view(view)


def test_one_pairing_of_the_cell_events_walks_the_stack_once_a_cell(ip, monkeypatch):
    """The session pairs a cell's events for everyone who follows the cells (the footer,
    the views, trace): with all of them on, a cell walks the stack for the frames of the
    running cells once, and only up to the innermost one; the footer's watch is the
    session's outer cell's."""
    from jupyter_gpumem.core import cells
    from jupyter_gpumem.watch.state import state_for

    run(ip, "%gpumem watch on --device cpu")
    run(ip, "%gpumem trace on --device cpu")
    walks = []
    real = cells._running_cell_frames
    monkeypatch.setattr(cells, "_running_cell_frames",
                        lambda first_only=False: (walks.append(first_only), real(first_only))[1])
    footer = state_for(ip).footer
    seen = []
    ip.user_ns["seen"] = lambda: seen.append(footer.watch)
    try:
        run(ip, "x = 1")
        run(ip, "seen()")
        run(ip, "get_ipython().run_cell('seen()')\nseen()")     # a cell inside a cell
        assert footer.watch is None                 # no cell runs now
    finally:
        monkeypatch.undo()
        ip.user_ns.pop("seen", None)
        run(ip, "%gpumem trace off")
        run(ip, "%gpumem watch off")
    # one walk per outer cell, up to the innermost frame; the nested cell walks it whole
    assert walks == [True, True, True, False]
    assert seen[0] is not None and seen[0].label == f"In [{ip.execution_count - 4}]"
    assert seen[1] is seen[2] is not None and seen[1] is not seen[0]   # the outer cell's
