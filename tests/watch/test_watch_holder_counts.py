"""A raising ``%%gpuwatch`` cell's holders: "+N more" counts every holder not shown (not
only those kept in the report's capped list), and a "free them" command that names fewer
holders than were listed says so."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402
from test_watch import wip  # noqa: E402,F401 - the shared shell, its watch state fresh

from jupyter_gpumem.watch.result import HolderEntry, WatchResult, watch_html  # noqa: E402
from jupyter_gpumem.watch.state import history_for  # noqa: E402


def _holders(ip, n: int) -> None:
    """``n`` names, each a tensor of a little over 1 MiB, h00 the smallest."""
    run(ip, "import torch\n" + "\n".join(f"h{i:02d} = torch.ones({(1 << 18) + 1000 * i})"
                                         for i in range(n)))


@pytest.mark.parametrize("n", [32, 61])
def test_more_counts_every_holder_not_shown(wip, capsys, n):
    _holders(wip, n)
    capsys.readouterr()
    res = wip.run_cell("%%gpuwatch -o r --device cpu\nraise ValueError('boom')",
                       store_history=True)
    assert isinstance(res.error_in_exec, ValueError)
    out = capsys.readouterr().out
    r = wip.user_ns["r"]
    assert len(r.holders) == 12 and r.holders_total == n
    top = [f"h{i:02d}" for i in range(n - 1, n - 6, -1)]
    assert f"+{n - 5} more · free them: %gpumem purge {' '.join(top)}\n" in out, out
    assert "largest)" not in out          # the command names all five shown
    assert f"+{n - 5} more" in r._repr_html_()


def test_verbose_list_says_what_is_left_out_and_what_the_command_names(wip, capsys):
    _holders(wip, 32)
    capsys.readouterr()
    wip.run_cell("%%gpuwatch -v -o r --device cpu\nraise ValueError('boom')", store_history=True)
    out = capsys.readouterr().out
    listed = [ln.split()[0] for ln in out.splitlines() if ln.startswith("  h")]
    assert len(listed) == 12, out
    assert "  +20 more holders, not listed\n" in out, out
    assert "free them: %gpumem purge h31 h30 h29 h28 h27 (the 5 largest)\n" in out, out
    html = wip.user_ns["r"]._repr_html_()
    assert "+20 more holders, not listed" in html and "(the 5 largest)" in html


def test_purge_note_when_a_listed_holder_has_no_purge():
    """A holder among those shown that the command cannot name: "k of the m listed"."""
    holders = [HolderEntry("a", 5 << 20, purge="a"), HolderEntry("b", 4 << 20, purge=None),
               HolderEntry("c", 3 << 20, purge="c")]
    r = WatchResult("cell", "%%gpuwatch", holders=holders, purge_names=["a", "c"],
                    error={"type": "ValueError", "message": "x", "oom": False})
    assert r.purge_command == "%gpumem purge a c"
    assert "free them: %gpumem purge a c (2 of the 3 listed)" in r.verbose_text()
    assert "+" not in repr(r).split("biggest holders:")[1].split("·")[0]
    # all of them named: no note
    r.purge_names = ["a", "b", "c"]
    r.holders[1].purge = "b"
    assert r.purge_note(3) == ""


def test_warn_at_candidates_say_what_the_command_names(wip, capsys):
    """``--warn-at``'s purge candidates list five holders; the command names only the one
    that frees memory worth a purge (the rest together are under 1 MiB): it says so."""
    run(wip, "import torch\nbig = torch.ones(2_000_000)\n"
             + "\n".join(f"s{i} = torch.ones(100)" for i in range(6)))
    run(wip, "%gpumem watch on --device cpu --warn-at 1%")
    capsys.readouterr()
    run(wip, "k = 1")
    out = capsys.readouterr().out
    assert "purge candidates: big 7.6 MiB, s" in out, out
    assert "→ %gpumem purge big (the largest)\n" in out, out


def test_an_out_of_memory_report_says_its_free_them_command_once(wip, capsys):
    run(wip, "import torch\nkeep = torch.ones(1 << 20)")
    capsys.readouterr()
    wip.run_cell("%%gpuwatch --device cpu\ndef step():\n    a = torch.ones(1 << 22)\n"
                 "    raise MemoryError('out of memory')\nstep()", store_history=True)
    out = capsys.readouterr().out
    assert "biggest holders: last traceback 16.0 MiB, keep 4.0 MiB" in out, out
    assert out.count("free them:") == 1, out
    # the notebook's form of the same report (HTML) likewise
    html = watch_html(history_for(wip)[-1])
    short = html.split("<details")[0]
    assert "biggest holders: last traceback 16.0 MiB" in short, short
    assert short.count("free them:") == 1, short
