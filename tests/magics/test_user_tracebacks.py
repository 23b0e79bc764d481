"""A cell run by one of the cell magics that raises shows the user the user's own frames:
none of the product's (IPython leaves out a frame whose locals hold
``__tracebackhide__``). A wrapper that adds a frame between IPython and the user's code
must hide itself too."""
from __future__ import annotations

import re

import pytest

from conftest import run  # noqa: E402

CELLS = {
    "gpuwatch": "%%gpuwatch --device cpu\ndef step():\n    raise ValueError('bad batch')\nstep()",
    "gpuwatch -v": "%%gpuwatch -v --device cpu\nraise ValueError('bad batch')",
    "gpuwatch, awaiting": "%%gpuwatch --device cpu\nimport asyncio\nawait asyncio.sleep(0)\n"
                          "raise ValueError('bad batch')",
    "watch on": "def step():\n    raise ValueError('bad batch')\nstep()",
}


@pytest.mark.parametrize("kind", list(CELLS))
def test_a_raising_cell_shows_no_frame_of_the_product(ip, capsys, kind):
    run(ip, "%load_ext jupyter_gpumem")
    if kind == "watch on":
        run(ip, "%gpumem watch on --device cpu")
    capsys.readouterr()
    result = ip.run_cell(CELLS[kind], store_history=True)
    shown = capsys.readouterr().out
    if kind == "watch on":
        run(ip, "%gpumem watch off")
    assert isinstance(result.error_in_exec, ValueError), result
    assert "bad batch" in shown, shown
    frames = re.findall(r"File [^\n]*|[\w./-]+\.py:\d+", shown)
    ours = [f for f in frames if "jupyter_gpumem" in f]
    assert not ours, shown
