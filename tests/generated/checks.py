"""Run a recipe (tests/generated/recipe.py) in a real IPython shell and hold the product
to rule 9's invariants at every scan point and at the purge that ends it:

- no trap (tests/generated/traps.py) fires during ``%gpumem``, ``%gpumem NAME``,
  ``--full`` or a dry run, and a dry run changes nothing;
- the warm report equals ``--full`` byte for byte (text, HTML, JSON; the devices' own
  readings, taken anew by each call, aside), and ``--full`` with the small roots' proof
  off (each name walked on its own: a proof claims no more than a walk would), and
  every name is blamed for at least the bytes of the storages it reaches;
- ``purge NAME`` removes exactly NAME (and hidden holders), frees every watched storage
  only it held and keeps every one a surviving name holds; ``purge --all`` the same for
  every name that holds one; ``purge`` with no name keeps every user binding, the user's
  own ``_`` included, and frees what only hidden holders kept;
- (:func:`cold_report`) a fresh process that runs the same cells gives the same report.
"""
from __future__ import annotations

import ast
import collections
import gc
import json
import os
import re
import subprocess
import sys

from IPython.core.error import UsageError

from . import traps
from .recipe import Model, cell_of, program

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: names IPython binds by itself (``_``, ``__``, ``___``, ``_N``, ``_i``, ``_iN``, ...)
IPYTHON_NAME = re.compile(r"_{1,3}|_\d+|_i{1,3}|_i\d+")
#: the snapshot's JSON fields that are readings or timings, taken anew by each call
READINGS = ("time", "scan_seconds", "devices", "unattributed", "internals")


def fresh(ip) -> None:
    """The shell as a new session's: empty namespace and output history, cell 1 next, no
    last error; ``gen`` (the traps), ``collections`` and ``torch`` hidden names of it."""
    ip.reset(new_session=True)
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        if hasattr(sys, name):
            delattr(sys, name)
    ip.InteractiveTB.tb = None
    traps.forget_modules()
    gc.collect()
    traps.reset()
    for name, value in (("gen", traps), ("collections", collections), ("torch", traps.torch)):
        ip.user_ns[name] = ip.user_ns_hidden[name] = value


#: a full collection that walks the whole heap again (what was frozen too) every so many
#: :func:`settle` calls (0.2 to 0.4 s each; what waits for it meanwhile: some 50 objects
#: of Hypothesis' record of each example)
REWALK_EVERY = 500
#: whether :func:`freeze_heap` froze the heap (and how many :func:`settle` calls since)
_HEAP = {"frozen": False, "settled": 0}


def freeze_heap() -> None:
    """The heap as it is now moves to the collector's permanent generation
    (``gc.freeze``); :func:`settle` keeps it so until :func:`unfreeze_heap`."""
    gc.collect()
    gc.freeze()
    _HEAP.update(frozen=True, settled=0)


def unfreeze_heap() -> None:
    _HEAP["frozen"] = False
    gc.unfreeze()


def settle() -> None:
    """Called just after :func:`fresh` at an example's start, when no object of an example
    lives (the shell made fresh, the garbage collected): what lives then (the shell, the
    modules the examples imported, Hypothesis' records) moves to the collector's permanent
    generation (``gc.freeze``), so that each later full collection (the checks', the shell's
    reset's, the purge's) walks what the example makes, not the process's whole heap (most
    of an example's time otherwise: 0.1 s a collection, ten of them an example). A frozen
    object is still freed when no reference holds it; one in a cycle (Hypothesis' record
    of the example running) is collected no more, so every :data:`REWALK_EVERY` calls the
    whole heap is walked again (unfreeze, full collection, freeze). Only between
    :func:`freeze_heap` and :func:`unfreeze_heap` (the package's ``frozen_heap`` fixture,
    conftest.py): elsewhere the collector is left as it is."""
    if not _HEAP["frozen"]:
        return
    _HEAP["settled"] += 1
    if _HEAP["settled"] % REWALK_EVERY == 0:
        gc.unfreeze()
        gc.collect()
    gc.freeze()


def user_keys(ip, model: Model) -> set:
    """The namespace's keys that are the user's (the model's names and any other
    binding that is neither hidden nor one IPython makes by itself)."""
    return {k for k in ip.user_ns if k in model.names or (
        k not in ip.user_ns_hidden and not (isinstance(k, str) and IPYTHON_NAME.fullmatch(k)))}


def bindings(ip, model: Model) -> dict:
    return {n: ip.user_ns.get(n) for n in model.names}


def alive() -> set:
    return {k for k, ref in traps.WEAK.items() if not ref.expired()}


def gpumem(ip, line: str):
    """``%gpumem LINE``; its value (or the UsageError it raised). No trap may fire."""
    traps.CALLS.clear()
    try:
        value = ip.run_line_magic("gpumem", line)
    except UsageError as err:
        value = err
    calls, traps.CALLS[:] = list(traps.CALLS), []
    assert calls == [], f"%gpumem {line} ran the user's code: {calls}"
    return value


def same(warm, full) -> None:
    """The two snapshots are the same report (the devices' readings aside)."""
    assert [d.attributed for d in warm.devices] == [d.attributed for d in full.devices]
    full.devices, full.unattributed = warm.devices, warm.unattributed
    full.processes = warm.processes
    full.time, full.scan_seconds = warm.time, warm.scan_seconds
    assert repr(warm) == repr(full), "the warm report is not the full one"
    assert warm._repr_html_() == full._repr_html_()
    assert warm.to_json() == full.to_json()


def unproven(ip):
    """``%gpumem --full`` with the small roots' proof off (``Reacher.reach_nothing``
    proves none): every name walked on its own, the reference the proof is held to."""
    from jupyter_gpumem.core.scan import reach

    real = reach.Reacher.reach_nothing
    reach.Reacher.reach_nothing = lambda self, objs, until, most=None: bytearray(len(objs))
    try:
        return gpumem(ip, "--device cpu --full -o")
    finally:
        reach.Reacher.reach_nothing = real


def comparable(snap) -> dict:
    """A snapshot's text (below the devices' line and its note) and JSON (readings and
    timings out), for comparing two processes' reports."""
    data = {k: v for k, v in snap.to_json().items() if k not in READINGS}
    data["attributed"] = [d.attributed for d in snap.devices]
    return {"text": repr(snap).split("\n", 2)[2], "json": data}


def blamed(snap, model: Model) -> None:
    """Every name is blamed for at least the bytes of the watched storages it reaches,
    those it keeps alive only from C code (Obj.unseen) where a walk reaches them too (one
    allocation, one key: core/scan/__init__.py)."""
    visible = model.visible()
    for name, obj in model.names.items():
        need = sum(model.sizes[k] for k in obj.reach(visible=True) | (obj.reach() & visible))
        if need:
            found = snap.holder(name)
            assert found is not None and found.total >= need, (
                f"{name} reaches {need} B, blamed for {found.total if found else None}")


def scan_point(ip, model: Model):
    """Every scan and dry run, checked; the warm report."""
    gc.collect()   # what an earlier traceback or cycle left goes first
    keys, binds, live = user_keys(ip, model), bindings(ip, model), alive()
    assert model.held_by(model.names) <= live, "the model lost track (a test bug)"
    warm = gpumem(ip, "--device cpu -o")
    full = gpumem(ip, "--device cpu --full -o")
    assert not isinstance(warm, UsageError) and not isinstance(full, UsageError)
    same(warm, full)
    walked = unproven(ip)
    assert not isinstance(walked, UsageError)
    same(warm, walked)
    blamed(warm, model)
    for name in sorted(model.names):
        gpumem(ip, f"{name} --device cpu")
        gpumem(ip, f"purge {name} --dry-run --device cpu -o")
    gpumem(ip, "purge --dry-run --device cpu -o")
    gc.collect()
    assert user_keys(ip, model) == keys, "a scan or dry run changed the namespace"
    assert all(ip.user_ns.get(n) is v for n, v in binds.items()), "a dry run rebound a name"
    assert alive() == live, "a scan or dry run freed a storage"
    return warm


def purge_point(ip, model: Model, target: str | None, shown_at: list[int] = ()) -> None:
    """The purge that ends a recipe (of ``target``: a name, ``--all``, or None: the hidden
    holders only), checked against the model. ``--all`` takes the names its own rule
    picks (core/purge/everything.py), never one that holds nothing and always a bare tensor.
    ``shown_at``: the ``Out`` key of each of ``model.shown``.

    A named purge clears the hidden holders that go with its targets (core/purge/targets.py
    hidden_to_clear); the others stay and keep what they hold. Which went is read from the
    shell after the purge, and held to the rule both ways: each that went is a target's
    object or holds something of a target's; each that is a target's object (an output;
    a traceback is none: it holds its frames' objects), or holds (where a walk sees it) a
    storage no name that stays reaches, went."""
    holding = {n for n, o in model.names.items() if o.reach()}
    removed = {target} & holding if target not in (None, "--all") else set()
    candidates = holding if target == "--all" else removed
    keys = user_keys(ip, model)
    out_before = set(ip.user_ns.get("Out", {}))
    # the objects of the names that stay, to see them the same after; of the others, no
    # reference is kept (only their ids)
    binds = {n: v for n, v in bindings(ip, model).items() if n not in candidates}
    ids = {n: id(ip.user_ns.get(n)) for n in candidates}
    result = gpumem(ip, f"purge {target or ''} --device cpu -o")
    what = f"purge {target or '(hidden)'}"
    if target == "--all":
        removed = set(getattr(result, "removed", ())) & set(model.names)
        assert removed <= holding, \
            f"--all removed names that hold nothing: {sorted(removed - holding)}"
        bare = {n for n in holding if model.names[n].kind in ("tensor", "graph")}
        assert bare <= removed, f"--all kept tensors: {sorted(bare - removed)}"
    elif target is not None and not removed:
        assert isinstance(result, UsageError), f"{target} holds nothing, yet was purged"
    if removed or target is None:
        assert not isinstance(result, UsageError), f"{what} refused: {result}"
    staying = [n for n in model.names if n not in removed]
    survivors = model.held_by(staying, purged=removed)
    own = set().union(*(model.names[n].reach() for n in removed)) - survivors
    if target is None:
        own |= model.hidden_atoms() - survivors
    else:
        kept, error_kept = hidden_kept(ip, model, shown_at, out_before)
        gone = [o for o in hidden_now(model, shown_at, out_before)
                if not any(o is k for k in kept) and not (o is model.last_error and error_kept)]
        targets = [model.names[n] for n in removed]
        reach = set().union(*(t.reach() for t in targets))
        sole = set().union(*(t.reach(visible=True) for t in targets)) - survivors
        for obj in gone:
            assert any(obj is t for t in targets) or obj.reach() & reach, (
                f"{what} cleared a hidden holder that holds nothing of its targets")
        for obj in kept:
            assert not any(obj is t for t in targets), f"{what} kept a hidden holder of its target"
        if error_kept:   # (a traceback holds its frames' objects: it is none of them)
            kept.append(model.last_error)
        for obj in kept:
            assert not obj.reach(visible=True) & sole, (
                f"{what} kept a hidden holder of {sorted(obj.reach(visible=True) & sole)}, "
                f"which only its targets held")
            survivors |= obj.reach()
        own = set().union(*(o.reach() for o in targets + gone)) - survivors
    gc.collect()
    assert user_keys(ip, model) == keys - removed, (
        f"{what} removed {sorted(keys - user_keys(ip, model))}")
    moved = sorted(n for n, v in binds.items() if ip.user_ns.get(n) is not v)
    moved += sorted(n for n, i in ids.items() if n not in removed and id(ip.user_ns.get(n)) != i)
    assert moved == [], f"{what} touched the user's {moved}"
    live = alive()
    assert survivors <= live, \
        f"{what} freed storages a surviving name holds: {sorted(survivors - live)}"
    assert not own & live, f"{what} left storages only its targets held: {sorted(own & live)}"


def hidden_now(model: Model, shown_at, out_before) -> list:
    """The hidden holders of the model that hold something before a purge: the shown
    values still in ``Out``, the last error."""
    found = [o for o, key in zip(model.shown, shown_at) if key in out_before]
    return found + ([model.last_error] if model.last_error is not None else [])


def hidden_kept(ip, model: Model, shown_at, out_before) -> tuple[list, bool]:
    """Of :func:`hidden_now`, those the shell still keeps after a purge: the shown values,
    and whether the last error is kept."""
    out = ip.user_ns.get("Out", {})
    kept = [o for o, key in zip(model.shown, shown_at) if key in out_before and key in out]
    return kept, (model.last_error is not None
                  and getattr(sys, "last_traceback", None) is not None)


def run_recipe(ip, recipe, *, report_before_purge: bool = False):
    """Run ``recipe`` in ``ip`` (made fresh first), checking as it goes; the last warm
    report before the purge (where asked), as :func:`comparable`."""
    fresh(ip)
    settle()
    model, last, shown_at = Model(), None, []
    try:
        for step in recipe:
            if step[0] == "scan":
                last = scan_point(ip, model)
            elif step[0] == "purge":
                if report_before_purge:
                    last = comparable(last)
                purge_point(ip, model, step[1] if len(step) > 1 else None, shown_at)
            else:
                cell = cell_of(step)
                result = ip.run_cell(cell, store_history=True)
                if result.success == (step[0] == "raise"):
                    how = "did not fail" if result.success else "failed"
                    raise AssertionError(f"the cell {cell!r} {how}: {result.error_in_exec!r}\n"
                                         f"{program(recipe)}")
                model.apply(step)
                if step[0] == "show":
                    shown_at.append(result.execution_count)
    finally:
        fresh(ip)
    return last


COLD_CHILD = """
import ast, json, sys, collections
sys.setrecursionlimit(10000)
from IPython.core.interactiveshell import InteractiveShell
from tests.generated import traps
from tests.generated.recipe import cell_of
from tests.generated.checks import comparable
recipe = ast.literal_eval(sys.argv[1])
ip = InteractiveShell.instance()
ip.run_cell('%load_ext jupyter_gpumem', store_history=False)
for name, value in (('gen', traps), ('collections', collections), ('torch', traps.torch)):
    ip.user_ns[name] = ip.user_ns_hidden[name] = value
for step in recipe:
    cell = cell_of(step)
    if cell is not None:
        ip.run_cell(cell, store_history=True)
snap = ip.run_line_magic('gpumem', '--device cpu -o')
print('RESULT ' + json.dumps(comparable(snap)), flush=True)
traps.forget_modules()
"""


def cold_report(recipe) -> dict:
    """The report (as :func:`comparable`) of a fresh process that runs the recipe's cells
    up to its purge and scans once."""
    cells = [s for s in recipe if s[0] not in ("scan", "purge")]
    assert ast.literal_eval(repr(cells)) == cells
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", COLD_CHILD, repr(cells)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])
