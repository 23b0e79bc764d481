"""A ``%%gpuwatch`` cell run under ``%gpumem watch on``: the history keeps one record for
it, the cell's own report (source ``%%gpuwatch`` as docs/PROTOCOL.md lists it, the wall
time the report shows), whether the cell ran through or raised; the footer's warning
goes with that record."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402
from test_watch import wip  # noqa: E402,F401 - the shared shell, its watch state fresh

from jupyter_gpumem.watch.result import fmt_seconds  # noqa: E402
from jupyter_gpumem.watch.state import history_for  # noqa: E402


def _records(ip, n: int) -> list:
    return [r for r in history_for(ip) if r.execution_count == n]


def test_one_record_the_reports_own(wip, capsys):
    run(wip, "import torch\nimport time")
    run(wip, "%gpumem watch on --device cpu")
    res = run(wip, "%%gpuwatch -o r --device cpu\nx = torch.ones(1000)\ntime.sleep(0.02)")
    out = capsys.readouterr().out
    r = wip.user_ns["r"]
    (rec,) = _records(wip, res.execution_count)
    assert rec.source == "%%gpuwatch" and rec is r
    assert rec.wall == r.wall and f"· {fmt_seconds(r.wall)}\n" in out, out
    table = wip.run_line_magic("gpumem", "history -o")
    assert [x.source for x in table if x.execution_count == res.execution_count] == ["%%gpuwatch"]


def test_one_record_for_a_cell_that_raised(wip, capsys):
    run(wip, "import torch\nimport time")
    run(wip, "%gpumem watch on --device cpu")
    res = wip.run_cell("%%gpuwatch -o r --device cpu\nraise ValueError('boom')",
                       store_history=True)
    assert isinstance(res.error_in_exec, ValueError)
    # a cell after it: the footer's own record of a plain cell stays "watch on"
    after = run(wip, "y = 1")
    r = wip.user_ns["r"]
    (rec,) = _records(wip, res.execution_count)
    assert rec.source == "%%gpuwatch" and rec.wall == r.wall
    assert rec.error["type"] == "ValueError"
    (plain,) = _records(wip, after.execution_count)
    assert plain.source == "watch on"


def test_footer_warning_goes_with_the_record(wip, capsys):
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu --warn-at 1%")
    res = run(wip, "%%gpuwatch --device cpu\nz = torch.ones(1000)")
    assert "warning:" in capsys.readouterr().out
    (rec,) = _records(wip, res.execution_count)
    assert rec.source == "%%gpuwatch" and rec.warning and rec.warning.startswith("warning:")


def test_gpuwatch_without_the_footer_records_itself(wip):
    run(wip, "import torch")
    res = run(wip, "%%gpuwatch -o r --device cpu\nw = torch.ones(10)")
    (rec,) = _records(wip, res.execution_count)
    assert rec is wip.user_ns["r"] and rec.source == "%%gpuwatch"


def test_watch_off_inside_the_cell_keeps_its_record(wip):
    """The footer goes off while the %%gpuwatch cell runs: the cell records itself."""
    run(wip, "import torch")
    run(wip, "%gpumem watch on --device cpu")
    res = run(wip, "%%gpuwatch -o r --device cpu\nget_ipython().run_line_magic('gpumem', 'watch off')")
    (rec,) = _records(wip, res.execution_count)
    assert rec is wip.user_ns["r"]
