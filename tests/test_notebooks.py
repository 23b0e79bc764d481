"""The demo notebooks run top to bottom in a real kernel (nbclient)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def execute(name: str, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    return nb


def text_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(out["text"])
        data = out.get("data", {})
        parts.append(data.get("text/plain", ""))
        parts.append(data.get("text/html", ""))
    return "\n".join(parts)


def test_quickstart_runs_and_says_what_it_should(monkeypatch):
    nb = execute("quickstart.ipynb", monkeypatch)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    report = text_of(cells[3])
    assert "loss" in report and "model" in report and "Out[" in report
    assert "keeps its autograd graph alive" in report
    assert "model.0.weight" in text_of(cells[4])
    assert "would remove loss" in text_of(cells[5])
    assert "removed loss" in text_of(cells[6])
    assert "opt still holds" in text_of(cells[8])
    final = text_of(cells[-1])
    assert "'model'" not in final and "'loss'" not in final


def test_quickstart_shows_none_of_a_new_users_rough_edges(monkeypatch):
    """What a new user first meets (issue "What a new user meets"): no "refused
    introspection" note, one phrase per fact, hints that name their holder once, no
    phantom Out entry, no footer line for the product's own commands, no text of an
    image object."""
    nb = execute("quickstart.ipynb", monkeypatch)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    everything = "\n".join(text_of(c) for c in cells)
    for rough in ("refused introspection", "no accelerator found", "holds no tensor memory",
                  "opt: `opt`", "loss: `loss`", "IPython.core.display.Image object",
                  "raised UsageError", "warn at 0%"):
        assert rough not in everything, rough
    watched = next(c for c in cells if c.source.startswith("%%gpuwatch"))
    report = text_of(watched)
    assert "new: w 4.0 MiB" in report and "Out[" not in report, report
    assert not [o for o in watched.outputs if o.get("output_type") == "execute_result"]
    status = next(c for c in cells if c.source == "%gpumem watch status")
    lines = [ln for ln in text_of(status).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("watch is on"), lines   # no footer line
    # every report shows once, though a cell both prints it and returns it with -o
    snap_cell = cells[-1]
    assert sum(o.get("output_type") == "execute_result" for o in snap_cell.outputs) == 1
