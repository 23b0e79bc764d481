"""Run a recipe (tests/generated/recipe.py) in a real IPython shell and hold the product
to rule 9's invariants at every scan point and at the purge that ends it:

- no trap (tests/generated/traps.py) fires during ``%gpumem``, ``%gpumem NAME``,
  ``--full`` or a dry run, and a dry run changes nothing;
- the warm report equals ``--full`` byte for byte (text, HTML, JSON; the devices' own
  readings, taken anew by each call, aside), and every name is blamed for at least the
  bytes of the storages it reaches;
- ``purge NAME`` removes exactly NAME (and hidden holders), frees every watched storage
  only it held and keeps every one a surviving name holds; ``purge`` with no name keeps
  every user binding, the user's own ``_`` included, and frees what only hidden holders
  kept;
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


def user_keys(ip, model: Model) -> set:
    """The namespace's keys that are the user's (the model's names and any other
    binding that is neither hidden nor one IPython makes by itself)."""
    return {k for k in ip.user_ns if k in model.names or (
        k not in ip.user_ns_hidden and not (isinstance(k, str) and IPYTHON_NAME.fullmatch(k)))}


def bindings(ip, model: Model, leave_out: str | None = None) -> dict:
    return {n: ip.user_ns.get(n) for n in model.names if n != leave_out}


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
    full.devices, full.unattributed, full.processes = warm.devices, warm.unattributed, warm.processes
    full.time, full.scan_seconds = warm.time, warm.scan_seconds
    assert repr(warm) == repr(full), "the warm report is not the full one"
    assert warm._repr_html_() == full._repr_html_()
    assert warm.to_json() == full.to_json()


def comparable(snap) -> dict:
    """A snapshot's text (below the devices' line and its note) and JSON (readings and
    timings out), for comparing two processes' reports."""
    data = {k: v for k, v in snap.to_json().items() if k not in READINGS}
    data["attributed"] = [d.attributed for d in snap.devices]
    return {"text": repr(snap).split("\n", 2)[2], "json": data}


def blamed(snap, model: Model) -> None:
    """Every name is blamed for at least the bytes of the watched storages it reaches."""
    for name, obj in model.names.items():
        need = sum(model.sizes[k] for k in obj.reach())
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


def purge_point(ip, model: Model, target: str | None) -> None:
    """The purge that ends a recipe, checked against the model."""
    keys, binds = user_keys(ip, model), bindings(ip, model, leave_out=target)
    others = [n for n in model.names if n != target]
    survivors = model.held_by(others)
    if target is None:
        own = model.hidden_atoms() - survivors
        result = gpumem(ip, "purge --device cpu -o")
    else:
        own = model.names[target].reach() - survivors
        result = gpumem(ip, f"purge {target} --device cpu -o")
    if target is not None and not model.names[target].reach():
        assert isinstance(result, UsageError), f"{target} holds nothing, yet was purged"
        target = None   # and nothing may change
    else:
        assert not isinstance(result, UsageError), f"purge refused: {result}"
    gc.collect()
    assert user_keys(ip, model) == keys - {target}, (
        f"purge {target or '(hidden)'} removed {sorted(keys - user_keys(ip, model))}")
    moved = sorted(n for n, v in binds.items() if ip.user_ns.get(n) is not v)
    assert moved == [], f"purge {target or '(hidden)'} touched the user's {moved}"
    live = alive()
    assert survivors <= live, f"purge freed storages a surviving name holds: {sorted(survivors - live)}"
    assert not own & live, f"purge left storages only its targets held: {sorted(own & live)}"


def run_recipe(ip, recipe, *, report_before_purge: bool = False):
    """Run ``recipe`` in ``ip`` (made fresh first), checking as it goes; the last warm
    report before the purge (where asked), as :func:`comparable`."""
    fresh(ip)
    model, last = Model(), None
    try:
        for step in recipe:
            if step[0] == "scan":
                last = scan_point(ip, model)
            elif step[0] == "purge":
                if report_before_purge:
                    last = comparable(last)
                purge_point(ip, model, step[1] if len(step) > 1 else None)
            else:
                cell = cell_of(step)
                result = ip.run_cell(cell, store_history=True)
                if result.success == (step[0] == "raise"):
                    raise AssertionError(f"the cell {cell!r} {'did not fail' if result.success else 'failed'}:"
                                         f" {result.error_in_exec!r}\n{program(recipe)}")
                model.apply(step)
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
