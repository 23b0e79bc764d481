"""Text that misled a newcomer, mended: each test is one finding of the first-hour review
(real shell, host tensors)."""
from __future__ import annotations

from conftest import run


def _lines(capsys, ip, line: str) -> list[str]:
    capsys.readouterr()
    ip.run_line_magic("gpumem", line)
    return capsys.readouterr().out.splitlines()


def test_a_host_purge_has_no_empty_allocated_column(ip, capsys):
    run(ip, "import torch\na = torch.ones(1 << 20)")
    lines = _lines(capsys, ip, "purge a --device cpu")
    header = next(line for line in lines if line.startswith("device"))
    assert header.split() == ["device", "measure", "before", "after", "freed"], lines


def test_a_note_does_not_repeat_the_name_it_names(ip, capsys):
    run(ip, "import torch\nbig = torch.ones(1 << 20)")
    run(ip, "big")                                 # Out[N] holds it too
    lines = _lines(capsys, ip, "purge --device cpu")
    notes = [line for line in lines if line.startswith("note:")]
    assert "note: big still holds 4.0 MiB of it: purge big too" in notes, lines
    assert not any("(big)" in line for line in notes), notes


def test_a_note_keeps_the_path_where_it_says_more_than_the_name(ip, capsys):
    run(ip, "import torch\nt = torch.ones(1 << 20)\nbox = {'k': t}")
    lines = _lines(capsys, ip, "purge t --device cpu")
    assert any(line.startswith("note: box still holds 4.0 MiB of it (box['k'])")
               for line in lines), lines
