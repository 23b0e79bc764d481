"""``%gpumem``'s line: ``$name`` and ``{expr}`` expanded as IPython expands a magic's
line, without IPython's copy of the whole namespace for a line that has neither."""
from __future__ import annotations

from IPython.core.magic import MAGIC_NO_VAR_EXPAND_ATTR

import jupyter_gpumem.magics.gpumem as gpumem_mod


def _lines_seen(ip, monkeypatch, cell: str) -> list[str]:
    seen: list[str] = []
    real = gpumem_mod.split_line

    def spy(line):
        seen.append(line)
        return real(line)

    monkeypatch.setattr(gpumem_mod, "split_line", spy)
    result = ip.run_cell(cell)
    assert result.success, result.error_in_exec
    return seen


def test_a_line_expands_names_and_expressions_in_the_frame_that_ran_the_magic(ip, monkeypatch):
    seen = _lines_seen(ip, monkeypatch, (
        "dev = 'cpu'\n"
        "%gpumem --device $dev -o\n"
        "%gpumem --device {dev.upper().lower()} -o\n"
        "def f():\n"
        "    mine = 'cpu'   # a local: the function's frame is read\n"
        "    get_ipython().run_line_magic('gpumem', '--device $mine -o')\n"
        "    %gpumem --device {mine} -o\n"
        "f()\n"))
    assert seen == ["--device cpu -o"] * 4


def test_a_line_without_either_is_read_as_it_is_and_ipython_does_not_expand_it(ip, monkeypatch):
    """IPython's expansion copies the user namespace for every line; the magic opts out
    of it and expands only a line that asks for it. A path with quotes and brackets is
    read as typed."""
    magic = ip.find_line_magic("gpumem")
    assert getattr(magic, MAGIC_NO_VAR_EXPAND_ATTR, False) is True
    seen = _lines_seen(ip, monkeypatch, "import torch\ncfg = {'a b': torch.ones(2)}\n%gpumem cfg['a b'] --device cpu -o\n")
    assert seen == ["cfg['a b'] --device cpu -o"]
