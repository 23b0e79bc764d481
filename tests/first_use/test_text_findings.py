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
    assert "note: big still holds 4.0 MiB of the memory this purge meant to free: purge big too" in notes, lines
    assert not any("(big)" in line for line in notes), notes


def test_a_note_keeps_the_path_where_it_says_more_than_the_name(ip, capsys):
    run(ip, "import torch\nt = torch.ones(1 << 20)\nbox = {'k': t}")
    lines = _lines(capsys, ip, "purge t --device cpu")
    assert any(line.startswith("note: box still holds 4.0 MiB of the memory this purge meant to free (box['k'])")
               for line in lines), lines


def test_the_graph_hint_offers_item_only_for_one_element(ip, capsys):
    run(ip, "import torch\nw = torch.ones(16, 64, requires_grad=True)\n"
            "out = (w * 2).reshape(8, 2, 64)\nloss = (w * 3).sum()")
    lines = _lines(capsys, ip, "--device cpu")
    hints = [line for line in lines if line.startswith("hint:")]
    assert "hint: `out` keeps its autograd graph alive: store `out.detach()` instead" in hints, lines
    assert ("hint: `loss` keeps its autograd graph alive: store `loss.item()` or "
            "`loss.detach()` instead") in hints, lines


def test_a_comment_after_the_magic_is_a_comment(ip, capsys):
    run(ip, "import torch\nt = torch.ones(1 << 10)")
    lines = _lines(capsys, ip, "--device cpu  # who holds what")
    assert any(line.startswith("t ") for line in lines), lines
    lines = _lines(capsys, ip, "t --device cpu # the tensor's rows")
    assert any("t" in line for line in lines) and not any("malformed" in line for line in lines)


def test_a_list_of_losses_keeping_their_graphs_gets_the_hint(ip, capsys):
    """The classic leak: ``losses.append(loss)`` in a training loop keeps every step's
    graph; the list gets the hint its tensors would (``.item()`` where each has one
    element), plain data of tensors without graphs none."""
    run(ip, "import torch\nw = torch.ones(256, 256, requires_grad=True)\nlosses, outs = [], {}\n"
            "for i in range(3):\n"
            "    out = w * (i + 1)\n"
            "    losses.append(out.sum())\n"
            "    outs[i] = out\n"
            "del out\nplain = [torch.ones(1 << 16) for _ in range(3)]")
    lines = _lines(capsys, ip, "--device cpu")
    hints = [line for line in lines if line.startswith("hint:")]
    assert ("hint: `losses` keeps the autograd graphs of its tensors alive: store "
            "`.item()` or `.detach()` of each instead") in hints, lines
    assert ("hint: `outs` keeps the autograd graphs of its tensors alive: store "
            "`.detach()` of each instead") in hints, lines
    assert not any("`plain`" in line for line in hints), hints
