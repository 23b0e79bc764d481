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
