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


def test_the_stack_is_walked_once_a_cell_for_every_pairing_of_its_events(ip, monkeypatch):
    """The session, the footer and the panel each pair a cell's events (CellEvents); the
    first to hear a cell's "pre" walks the stack for the frames of the running cells,
    the others take what it found for that same cell."""
    from jupyter_gpumem.core import monitor

    walks = []
    real = monitor._running_cell_frames
    monkeypatch.setattr(monitor, "_running_cell_frames",
                        lambda first_only=False: (walks.append(first_only), real(first_only))[1])
    first, second = monitor.CellEvents(ip), monitor.CellEvents(ip)
    seen = []

    def pre(info):
        seen.append((first.pre(info)[0], second.pre(info)[0]))

    def post(result):
        first.post(result), second.post(result)

    ip.events.register("pre_run_cell", pre)
    ip.events.register("post_run_cell", post)
    try:
        ip.run_cell("x = 1")
        ip.run_cell("y = 2")
    finally:
        ip.events.unregister("pre_run_cell", pre)
        ip.events.unregister("post_run_cell", post)
    # one walk per cell, not per pairing; with no cell of theirs open, up to the innermost
    assert walks == [True, True]
    (a1, b1), (a2, b2) = seen
    assert a1.frame == b1.frame is not None and a1.outer and b1.outer
    assert a1.info is not a2.info and a2.frame == b2.frame
