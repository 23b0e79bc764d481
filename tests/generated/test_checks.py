"""The generated cases' checks can fail: each meets a case it must refuse (the others
are shown failing by the open breaches in test_found.py); and the collector's frozen heap
that makes the examples cheap (checks.settle) holds nothing of an example."""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")

from .checks import comparable, fresh, run_recipe, same, unproven  # noqa: E402


def test_two_different_reports_are_not_the_same(ip):
    fresh(ip)
    ip.run_cell("a = gen.atom('k1', 8)", store_history=True)
    first = ip.run_line_magic("gpumem", "--device cpu -o")
    ip.run_cell("a = gen.atom('k2', 64)", store_history=True)
    second = ip.run_line_magic("gpumem", "--device cpu --full -o")
    assert comparable(first) != comparable(second)
    with pytest.raises(AssertionError):
        same(first, second)
    fresh(ip)


def test_a_proof_that_claims_more_than_a_walk_is_refused(ip, monkeypatch):
    """The small roots' proof is held to each name walked on its own (checks.unproven):
    a proof that says "leads nowhere" of a function whose default holds a tensor hides
    the name that holds it, and the check says so."""
    from jupyter_gpumem.core.scan import reach

    fresh(ip)
    ip.run_cell("def f(a=gen.atom('k1', 64)): return a\nholder = [f]\ndel f",
                store_history=True)
    # (the C core's proof asks _leads_nowhere of the function; the Python form's walk
    # of the roots together is _nothing_in)
    monkeypatch.setattr(reach.Reacher, "_leads_nowhere", lambda self, obj, known: True)
    monkeypatch.setattr(reach.Reacher, "_nothing_in", lambda self, together, until: True)
    warm = ip.run_line_magic("gpumem", "--device cpu -o")
    assert warm.holder("holder") is None   # (what the broken proof claims)
    walked = unproven(ip)
    assert walked.holder("holder") is not None
    with pytest.raises(AssertionError):
        same(warm, walked)
    fresh(ip)


def test_nothing_of_an_example_lives_when_the_next_one_freezes_the_heap(ip, monkeypatch):
    """Each example freezes the heap at its start (checks.settle): a full collection then
    walks what the example makes, no more. That holds only where no object of an earlier
    example is alive then (one in the permanent generation is collected no more): every
    atom of an example that leaves a traceback, an output, a caught exception and a module
    in sys.modules behind is freed by then."""
    from . import checks, traps

    kept: dict = {}
    real_reset = traps.reset

    def reset():
        kept.update(traps.WEAK)
        real_reset()

    monkeypatch.setattr(traps, "reset", reset)
    run_recipe(ip, [("raise", ("list", [("atom", "k1", 8)])),
                    ("show", ("closure", ("atom", "k2", 8))),
                    ("bind", "a", ("exc", ("atom", "k3", 64))),
                    ("bind", "b", ("module", "k4", ("atom", "k5", 8), True)),
                    ("scan",), ("purge", "a")])
    assert set(kept) == {"k1", "k2", "k3", "k5"}
    assert not [n for n in sys.modules if n.startswith(traps.MODULE_PREFIX)]
    at_settle: list = []
    real_settle = checks.settle

    def settle():
        at_settle.append(sorted(k for k, ref in kept.items() if not ref.expired()))
        real_settle()

    monkeypatch.setattr(checks, "settle", settle)
    run_recipe(ip, [("bind", "a", ("atom", "k1", 8)), ("scan",), ("purge", "a")])
    assert at_settle == [[]]


def test_a_named_purge_is_held_to_which_hidden_holders_go_both_ways(ip, monkeypatch):
    """The check of a named purge reads which hidden holders went (checks.purge_point): one
    kept that held only what its target held is refused, and so is one cleared that held
    nothing of it (each planted in the purge's plan)."""
    import jupyter_gpumem.core.purge  # noqa: F401  (the module the fault is planted in:)
    plan = sys.modules["jupyter_gpumem.core.purge.plan"]
    view = [("bind", "a", ("atom", "k1", 8)), ("show", ("list", [("viewof", "a")])),
            ("scan",), ("purge", "a")]
    other = [("bind", "a", ("atom", "k1", 8)), ("show", ("atom", "k2", 8)),
             ("scan",), ("purge", "a")]
    run_recipe(ip, view)
    run_recipe(ip, other)
    monkeypatch.setattr(plan, "hidden_to_clear", lambda *a, **k: [])
    with pytest.raises(AssertionError, match="kept a hidden holder of \\['k1'\\]"):
        run_recipe(ip, view)
    monkeypatch.setattr(plan, "hidden_to_clear",
                        lambda roots, *a, **k: [r for r in roots if r.hidden])
    with pytest.raises(AssertionError, match="cleared a hidden holder that holds nothing"):
        run_recipe(ip, other)
