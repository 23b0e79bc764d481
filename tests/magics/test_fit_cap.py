"""``%%gpumem fit`` whose answer is the grid's top (``--max``): the note says the cap was
reached, not that the first prediction was "off by" many steps."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402

from jupyter_gpumem.core.fit import NO_MAX, Grid, search  # noqa: E402
from jupyter_gpumem.core.fit.result import Trial  # noqa: E402


def _linear(fixed: float, per: float, budget: float):
    """Trials of a step whose peak is ``fixed + per * size``, failing over ``budget``."""
    def one(size: int) -> Trial:
        d = fixed + per * size
        if d <= budget:
            return Trial(size=size, ok=True, peak=int(d), seconds=0.0, free=int(budget))
        return Trial(size=size, ok=False, peak=int(budget * 0.9), seconds=0.0, free=int(budget),
                     requested=int(d - budget * 0.9))
    return one


def _search(grid: Grid, budget: float = 64e9):
    return search(_linear(1e7, 1e5, budget), grid, lambda: int(budget), variable="bs",
                  device="cpu", measure="formula")


def test_max_reached_says_so_and_no_off_by():
    r = _search(Grid(1, 512, 8))
    assert r.largest == 512
    assert r.predicted > 512 * 100          # the memory would take far more
    assert not any("off by" in n for n in r.notes), r.notes
    (note,) = [n for n in r.notes if "--max" in n]
    assert note.startswith("512 is --max: larger sizes were not tried"), note
    assert f"the line predicts up to {r.predicted} would fit" in note
    assert "512 is --max: larger sizes were not tried" in repr(r)


def test_max_off_the_grid_names_the_top_multiple():
    r = _search(Grid(1, 500, 16))
    assert r.largest == 496
    assert not any("off by" in n for n in r.notes), r.notes
    assert any(n.startswith("496 is the largest multiple of 16 up to --max 500: larger sizes "
                            "were not tried") for n in r.notes), r.notes


def test_without_max_the_search_limit_is_named():
    r = _search(Grid(1, None, 1 << 16), budget=1e13)
    assert r.largest == Grid(1, None, 1 << 16).size(Grid(1, None, 1 << 16).count - 1)
    assert r.largest <= NO_MAX
    assert not any("off by" in n for n in r.notes), r.notes
    assert any(f"{r.largest} is the most the search tries without --max" in n for n in r.notes)


def test_answer_under_the_cap_gets_no_cap_note():
    budget = 1e7 + 1e5 * 300
    r = _search(Grid(1, 512, 8), budget=budget)
    assert r.largest == 296
    assert not any("--max" in n for n in r.notes), r.notes


def test_magic_capped_by_max(ip):
    run(ip, "import torch\ntorch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),"
        " torch.nn.Linear(64, 4))\nbs = 'mine'\n")
    r = ip.run_cell_magic("gpumem", "fit bs --max 64 --step 16 --device cpu",
                          "loss = model(torch.randn(bs, 32)).square().mean()\nloss.backward()\n")
    assert r.largest == 64
    assert not any("off by" in n for n in r.notes), r.notes
    assert "64 is --max: larger sizes were not tried" in repr(r)
