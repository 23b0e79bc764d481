"""Deleting takes identity, not a name: a hidden holder (``_``, ``__``, ``___``, ``_N``)
is cleared only where the object there is the one IPython's own record holds (the
display hook's, the output history's), never a user's binding of the same name."""
from __future__ import annotations

import pytest

from conftest import purge, report, run

torch = pytest.importorskip("torch")


def _user_underscores(ip):
    run(ip, "import torch; a = torch.ones(1000); b = torch.ones(2000)")
    run(ip, "_ = a; __ = b; ___ = 7")
    run(ip, "torch.zeros(3000)")          # shown: the display hook's own record
    run(ip, "Out[4] = 2")
    assert ip.user_ns["_"] is ip.user_ns["a"]   # IPython left the user's names alone


def test_hidden_only_purge_leaves_the_users_underscores(ip):
    _user_underscores(ip)
    result = purge(ip, "")
    ns = ip.user_ns
    assert ns["_"] is ns["a"] and ns["__"] is ns["b"] and ns["___"] == 7
    assert not {"_", "__", "___"} & set(result.removed), result.removed
    # the shown result itself, IPython's own, went
    assert not any(isinstance(v, torch.Tensor) for v in ip.history_manager.output_hist.values())


def test_users_underscore_is_listed_as_a_users_name(ip):
    _user_underscores(ip)
    snap = report(ip)
    mine = [h for h in snap.holders if h.name == "_" and not h.hidden]
    assert mine, [(h.name, h.hidden) for h in snap.holders]
    assert mine[0].purge == "_"


def test_plain_values_in_user_underscores_survive(ip):
    run(ip, "import torch")
    run(ip, "torch.zeros(500)")
    run(ip, "_ = 'mine'; __ = [1, 2]; ___ = {'k': 1}")
    keep = ip.user_ns["__"], ip.user_ns["___"]
    purge(ip, "")
    assert ip.user_ns["_"] == "mine"
    assert ip.user_ns["__"] is keep[0] and ip.user_ns["___"] is keep[1]


def test_display_hooks_underscore_is_still_cleared(ip):
    run(ip, "import torch")
    run(ip, "torch.zeros(4000)")
    t = ip.user_ns["_"]
    assert ip.displayhook._ is t
    result = purge(ip, "")
    assert "_" in result.removed
    assert ip.user_ns["_"] is not t and ip.displayhook._ is not t
    del t


def test_purge_name_leaves_a_users_underscore_of_the_same_tensor(ip):
    """``purge x`` clears the hidden holders of x's tensor, not the user's ``_`` that
    happens to hold it too: that is a binding the user made (purge says it still holds)."""
    run(ip, "import torch; x = torch.ones(1000)")
    n = run(ip, "x").execution_count     # Out[n], _n and the hook's _ hold it
    run(ip, "_ = [x]; Out[99] = 1")
    mine = ip.user_ns["_"]
    result = purge(ip, "x")
    assert "x" not in ip.user_ns
    assert f"Out[{n}]" in result.removed and f"_{n}" in result.removed
    assert "_" not in result.removed
    assert ip.user_ns["_"] is mine and isinstance(mine[0], torch.Tensor)


def test_users_N_alias_is_not_cleared(ip):
    run(ip, "import torch")
    n = run(ip, "torch.zeros(100)").execution_count
    run(ip, f"_{n} = torch.ones(7)")    # the user rebinds _N (Out[N] is another tensor)
    mine = ip.user_ns[f"_{n}"]
    result = purge(ip, "")
    assert ip.user_ns[f"_{n}"] is mine
    assert f"_{n}" not in result.removed and f"Out[{n}]" in result.removed


@pytest.mark.parametrize("bind", ["_ = torch.ones(1000)", "for _ in [torch.ones(1000)]: pass",
                                  "import contextlib\nwith contextlib.nullcontext(torch.ones(1000)) as _: pass"])
def test_a_users_underscore_shown_stays_the_users(ip, bind):
    """Found by the generator: the user binds ``_``, then a cell shows it. IPython's display
    hook then records that very object (and leaves the name alone), so identity alone
    called the name IPython's and a hidden-only purge cleared the user's ``_``. The
    shell's record of who bound it (hidden.observe_underscores) keeps it the user's."""
    run(ip, "import torch\n" + bind)
    mine = ip.user_ns["_"]
    run(ip, "a = 1")
    run(ip, "_")                                   # shown: the hook's _ is the user's now
    assert ip.displayhook._ is mine and ip.user_ns["_"] is mine
    result = purge(ip, "")
    assert ip.user_ns["_"] is mine and "_" not in result.removed, result.removed
    assert [h.name for h in report(ip).holders if h.name == "_" and not h.hidden] == ["_"]
    result = purge(ip, "--all")                    # a name of the user's: --all takes it
    assert "_" in result.removed and ip.user_ns.get("_") is not mine


def test_a_cell_that_binds_and_shows_underscore_keeps_it_the_users(ip):
    run(ip, "import torch")
    run(ip, "_ = torch.ones(1000); _")
    mine = ip.user_ns["_"]
    assert ip.displayhook._ is mine
    assert "_" not in purge(ip, "").removed and ip.user_ns["_"] is mine


def test_underscore_is_ipythons_again_once_ipython_writes_it(ip):
    """After the user's ``_`` was shown, IPython's next display writes ``_`` again (its
    own rule): the name follows, and a hidden-only purge clears IPython's result."""
    run(ip, "import torch\n_ = torch.ones(1000)")
    run(ip, "_")
    run(ip, "torch.zeros(2000)")
    shown = ip.user_ns["_"]
    assert shown is ip.displayhook._ and shown.numel() == 2000
    assert "_" in purge(ip, "").removed and ip.user_ns["_"] is not shown


def test_a_local_underscore_in_a_cells_function_leaves_ipythons_underscore_its_own(ip):
    """Only the cell's own scope binds: a function's, a comprehension's ``_`` does not make
    the shown result the user's (a hidden-only purge still frees it)."""
    run(ip, "import torch")
    run(ip, "def f():\n    for _ in range(2):\n        pass\n[_ for _ in range(2)]\n"
            "torch.zeros(3000)")
    shown = ip.user_ns["_"]
    assert shown is ip.displayhook._ and shown.numel() == 3000
    assert "_" in purge(ip, "").removed and ip.user_ns["_"] is not shown
