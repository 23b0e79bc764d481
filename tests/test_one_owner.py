"""One owner per shell, one way to do each thing: settings parsed once, the magics' one
argument parser, the session as the one owner of what the extension keeps for a shell."""
from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from traitlets import TraitError

from conftest import run
from jupyter_gpumem import settings as settings_mod

torch = pytest.importorskip("torch")


def _magics(shell):
    return shell.magics_manager.registry["GpuMemMagics"]


@pytest.fixture
def watched(ip):
    yield ip
    run(ip, "%gpumem watch off")
    _magics(ip).warn_at = None


def test_warn_at_is_checked_when_set_and_parsed_once_not_every_cell(watched, capsys,
                                                                    monkeypatch):
    m = _magics(watched)
    with pytest.raises(TraitError, match="warn_at"):
        m.warn_at = "lots"
    assert m.warn_at is None and m.warn_share is None
    run(watched, "%config GpuMemMagics.warn_at = '150%'")      # refused: one logged line
    assert m.warn_at is None
    m.warn_at = "12.5%"
    assert m.warn_share == 0.125
    m.warn_at = 0.5
    assert m.warn_share == 0.5
    calls = []
    real = settings_mod.parse_share
    monkeypatch.setattr(settings_mod, "parse_share", lambda v: (calls.append(v), real(v))[1])
    run(watched, "import torch\n%gpumem watch on --device cpu")
    calls.clear()
    run(watched, "keep = torch.ones(1000)")
    run(watched, "x = 1")
    assert calls == [], "the footer reads the parsed share"
    m.warn_at = "1%"
    assert calls and set(calls) == {"1%"}, "parsed as it is set"
    calls.clear()
    capsys.readouterr()
    run(watched, "keep2 = torch.ones(1000)")
    assert "above 1%" in capsys.readouterr().out and calls == []


@pytest.mark.parametrize("line", ["tame off status", "tame --give-back off", "tame maybe",
                                  "tame --give-back=yes", "tame -h"])
def test_tame_refuses_what_it_does_not_know_with_its_usage(ip, line):
    with pytest.raises(UsageError, match=r"unknown arguments '.*': %gpumem tame"):
        ip.run_line_magic("gpumem", line)
