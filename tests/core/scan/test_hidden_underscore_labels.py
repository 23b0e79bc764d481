"""``_``, ``__``, ``___`` name a hidden holder only where the user's namespace binds
that name to that very object: once the user binds ``_`` themselves, the display
hook's own record (``displayhook._``, ``user_ns_hidden['_']``) reads "IPython's _",
in the text report and in the snapshot's holder names and aliases alike. The purge is
unchanged: it clears IPython's record and leaves the user's own ``_``."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import purge, report, run  # noqa: E402

UNDERS = ("_", "__", "___")


def _claims(snap, name):
    """The holders that list ``name`` as a plain name or alias."""
    return [h for h in snap.holders if h.name == name or name in h.aliases]


def _check_plain_names_are_the_users(ip, snap):
    for name in UNDERS:
        for h in _claims(snap, name):
            # a plain ``_`` is the user's binding of that very object
            assert not h.hidden or h.name != name, (name, h)
            if h.hidden:   # an alias of a hidden holder: the user's ``_`` is its object
                out = ip.user_ns.get("Out", {})
                objs = [v for k, v in out.items() if f"Out[{k}]" == h.name]
                assert objs and ip.user_ns.get(name) is objs[0], (name, h)


def test_users_own_underscore_is_not_an_alias_of_the_shown_output(ip):
    run(ip, "import torch")
    n = run(ip, f"torch.ones({1 << 20})").execution_count     # Out[n], _n and _
    run(ip, f"_ = torch.ones({1 << 18})")                        # the user's own _
    assert ip.user_ns["_"] is not ip.user_ns["Out"][n]
    assert ip.displayhook._ is ip.user_ns["Out"][n]             # IPython's own record
    snap = report(ip)
    out = next(h for h in snap.holders if h.name == f"Out[{n}]")
    assert "_" not in out.aliases and "IPython's _" in out.aliases, out.aliases
    assert f"_{n}" in out.aliases
    mine = [h for h in snap.holders if h.name == "_"]
    assert len(mine) == 1 and not mine[0].hidden and mine[0].total == 1 << 20
    text = repr(snap)
    assert f"Out[{n}] (_{n}, IPython's _)" in text, text
    assert f"Out[{n}] (_{n}, _)" not in text, text
    _check_plain_names_are_the_users(ip, snap)

    # another shown value: the hook moves Out[n] to its ``__``; the user's _ stays
    m = run(ip, "torch.ones(3)").execution_count
    snap = report(ip)
    out = next(h for h in snap.holders if h.name == f"Out[{n}]")
    later = next(h for h in snap.holders if h.name == f"Out[{m}]")
    assert "IPython's __" in out.aliases and not set(UNDERS) & set(out.aliases), out.aliases
    assert "IPython's _" in later.aliases and not set(UNDERS) & set(later.aliases)
    assert len(_claims(snap, "_")) == 1
    _check_plain_names_are_the_users(ip, snap)
    # (IPython's user_ns_hidden['_'] still holds Out[n] too: IPython did not update it
    # once the user bound ``_``; it is IPython's record, and reads so)
    text = repr(snap)
    assert f"Out[{n}] (_{n}, IPython's " in text and f"Out[{m}] (_{m}, IPython's _" in text, text

    # the purge is as it was: IPython's records go, the user's own _ stays
    mine_t = ip.user_ns["_"]
    result = purge(ip, "")
    assert ip.user_ns["_"] is mine_t
    assert not set(UNDERS) & set(result.removed), result.removed
    assert ip.displayhook._ is not ip.user_ns["Out"].get(m, None) or m not in ip.user_ns["Out"]
    assert not any(isinstance(v, torch.Tensor) for v in ip.history_manager.output_hist.values())
    assert not isinstance(ip.displayhook._, torch.Tensor)
    assert not isinstance(ip.displayhook.__, torch.Tensor)


def test_underscore_still_names_the_shown_output_while_the_user_has_not_rebound_it(ip):
    run(ip, "import torch")
    n = run(ip, f"torch.ones({1 << 16})").execution_count
    snap = report(ip)
    out = next(h for h in snap.holders if h.name == f"Out[{n}]")
    assert "_" in out.aliases and "IPython's _" not in out.aliases, out.aliases
    assert f"Out[{n}] (_{n}, _" in repr(snap)


def test_a_hook_record_outside_out_reads_as_ipythons(ip):
    """The hook's ``_`` with no Out entry left (``del Out[n]``) is a holder of its own:
    named "IPython's _" while the user's ``_`` is another object, and still purged."""
    run(ip, "import torch")
    n = run(ip, f"torch.ones({1 << 16})").execution_count
    run(ip, f"del Out[{n}], _{n}")
    run(ip, "_ = torch.ones(100)")
    hook = ip.displayhook._
    assert isinstance(hook, torch.Tensor) and ip.user_ns["_"] is not hook
    snap = report(ip)
    names = [h.name for h in snap.holders]
    assert "IPython's _" in names, names
    assert [h.hidden for h in snap.holders if h.name == "_"] == [False], names
    theirs = next(h for h in snap.holders if h.name == "IPython's _")
    assert theirs.hidden and theirs.label == "IPython's _" and theirs.total == 4 << 16
    assert "IPython's _" in repr(snap)
    mine = ip.user_ns["_"]
    result = purge(ip, "")
    assert ip.user_ns["_"] is mine and "_" not in result.removed
    assert not isinstance(ip.displayhook._, torch.Tensor)


def test_the_command_offered_for_ipythons_record_keeps_the_users_underscore(ip):
    """Its purge argument is "IPython's _", never the bare ``_`` (which names the user's
    own tensor): the command a view offers for it, pasted, clears IPython's record and
    keeps the user's ``_``."""
    run(ip, "import torch")
    n = run(ip, f"torch.ones({1 << 16})").execution_count
    run(ip, f"del Out[{n}], _{n}")
    run(ip, "_ = torch.ones(100)")
    theirs = next(h for h in report(ip).holders if h.name == "IPython's _")
    assert theirs.purge == "IPython's _", theirs.purge
    mine = ip.user_ns["_"]
    run(ip, "%gpumem purge \"IPython's _\" --device cpu")
    assert ip.user_ns["_"] is mine
    assert not isinstance(ip.displayhook._, torch.Tensor)



def test_a_free_them_command_naming_ipythons_record_can_be_pasted():
    """Each name of an offered purge command reads back as itself in a magic line."""
    from jupyter_gpumem.magics.args import split_line
    from jupyter_gpumem.watch.result import _magic_arg

    names = ["IPython's _", "last traceback", "t", "Out[13]", "cfg['a b']", 'd["k"]']
    assert split_line(" ".join(_magic_arg(n) for n in names)) == names
    assert _magic_arg("IPython's _") == '"IPython\'s _"'
