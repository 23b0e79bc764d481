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
