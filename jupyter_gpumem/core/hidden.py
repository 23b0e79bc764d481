"""IPython's hidden holders, as one table.

Each :class:`HiddenKind` says, for one kind of reference IPython keeps behind
the user's back, how it is found (``find``), which names are its own and how
each is cleared (``owns``, ``clear``), what ``%gpumem purge`` accepts for it
(``purge_arg``), how it reads (``label``, ``what``) and the hint the report
gives. The scan's roots, the purge, the snapshot and the watch's holders all
read :data:`KINDS`; a new kind is one more entry here.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable

from . import chains as _chains
from .roots import Root, format_key
from .scan_types import ATOMIC_IDS as _ATOMIC_IDS, is_a

_FIRST = itemgetter(0)


def _may_hold(obj: Any) -> bool:
    """Whether a hidden holder's value can be a root: not None, not atomic (the type is
    looked up by id: no class is hashed)."""
    return obj is not None and id(type(obj)) not in _ATOMIC_IDS

#: ``add(name, obj, purge)``: what a kind's ``find`` calls for each reference it finds
Add = Callable[[str, Any, "str | None"], None]


@dataclass(frozen=True)
class HiddenKind:
    """One kind of hidden holder (see the module docstring)."""

    kind: str
    hint: str
    find: Callable[[Any, Add], None]              # (shell, add)
    owns: Callable[[str], bool]                   # is this name (or alias) one of ours?
    clear: Callable[[str, Any, Any], bool]        # (name, obj, shell) -> report it as removed
    purge_arg: str | None = None                  # what purge accepts where no name is typed
    what: str | None = None                       # what it is, instead of the object's type
    rebuilt: bool = False                         # a new root object at every scan

    def label(self, root: Root, path: str) -> str:
        """How the holder reads in a report (``last traceback (f(): t)``)."""
        if self.rebuilt and "→" in path:
            return f"{root.name} ({path.rsplit('→', 1)[1]})"
        return root.name


# -- output history: Out[N] and _N -----------------------------------------------------------
def output_history(shell: Any) -> dict:
    """IPython's output history (``Out``): cell number -> the value it showed."""
    out_hist = getattr(getattr(shell, "history_manager", None), "output_hist", None)
    if out_hist is None:
        out = shell.user_ns.get("Out")
        out_hist = out if is_a(out, dict) else {}
    return out_hist


def output_name(key: Any) -> str:
    """``Out[12]``, ``Out['x']`` (a key the user put there), or ``Out[...]`` for a key of
    another type (its repr, its order, its format would be the user's code)."""
    return f"Out[{key}]" if type(key) is int else "Out" + format_key(key)


def _find_output(shell: Any, add: Add) -> None:
    ns = shell.user_ns
    # the values a root can be (most outputs are numbers and text), in the cells' order;
    # only the cells' numbers are ordered (``int``'s own order: no key's __lt__ runs)
    numbered, other = [], []
    for n, value in dict.items(output_history(shell)):
        if _may_hold(value):
            (numbered if type(n) is int else other).append((n, value))
    numbered.sort(key=_FIRST)
    for n, value in numbered:
        add(f"Out[{n}]", value, f"Out[{n}]")
    for n, value in other:
        name = output_name(n)
        add(name, value, name if type(n) is str else None)   # Out[...]: nothing to type
    for n, _ in numbered:
        alias = f"_{n}"
        if alias in ns:
            add(alias, ns[alias], alias)    # only an alias of an Out[N] found above


def _owns_output(name: str) -> bool:
    return (name.startswith("Out[") and name.endswith("]")) or \
        (name.startswith("_") and name[1:].isdigit())


def _clear_output(name: str, obj: Any, shell: Any) -> bool:
    if name.startswith("Out["):
        out_hist = getattr(getattr(shell, "history_manager", None), "output_hist", None)
        if not is_a(out_hist, dict):
            return False
        for key, value in list(dict.items(out_hist)):
            # an int's or a str's own hash: a key of another type is never looked up
            if value is obj and type(key) in (int, str) and output_name(key) == name:
                dict.__delitem__(out_hist, key)
                return True
        return False
    for d in (shell.user_ns, getattr(shell, "user_ns_hidden", {})):
        if d.get(name) is obj:
            del d[name]
    return True


# -- _, __, ___ -----------------------------------------------------------------------------
_UNDERSCORES = ("_", "__", "___")


def _find_underscore(shell: Any, add: Add) -> None:
    ns, hidden_ns = shell.user_ns, getattr(shell, "user_ns_hidden", {})
    hook = getattr(shell, "displayhook", None)
    for name in _UNDERSCORES:
        first = ns.get(name)
        add(name, first, name)
        for value in (hidden_ns.get(name), getattr(hook, name, None)):
            if value is not first:      # most often the same object: added once is enough
                add(name, value, name)


def _clear_underscore(name: str, obj: Any, shell: Any) -> bool:
    for d in (shell.user_ns, getattr(shell, "user_ns_hidden", {})):
        if d.get(name) is obj:
            d[name] = ""
    hook = getattr(shell, "displayhook", None)
    if hook is not None and getattr(hook, name, None) is obj:
        setattr(hook, name, "")
    return True


# -- the last execution result ------------------------------------------------------------------
def _find_result(shell: Any, add: Add) -> None:
    result = getattr(shell, "last_execution_result", None)
    add("last result", getattr(result, "result", None), None)


def _clear_result(name: str, obj: Any, shell: Any) -> bool:
    result = getattr(shell, "last_execution_result", None)
    if result is not None and result.result is obj:
        result.result = None
    return True


# -- the last traceback (sys.last_*, IPython's traceback and debugger, the failed result) -------
_SYS_LAST = ("last_exc", "last_value", "last_traceback", "last_type")


def traceback_objects(shell: Any = None) -> list[Any]:
    """Objects that keep the last error's frames alive (distinct, in order)."""
    found = [getattr(sys, name, None) for name in _SYS_LAST[:3]]
    if shell is not None:
        tb = getattr(shell, "InteractiveTB", None)
        found += (getattr(tb, "tb", None),
                  getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None),
                  getattr(getattr(tb, "pdb", None), "curframe", None))
    found = [obj for obj in found if obj is not None]
    if len(found) < 2:
        return found        # no error since the session began, most often
    out: list[Any] = []
    ids: set[int] = set()
    for obj in found:
        if id(obj) not in ids:
            ids.add(id(obj))
            out.append(obj)
    return out


def traceback_root(objs) -> Root:
    """The one root that stands for every object keeping the last error's frames."""
    return Root("last traceback", tuple(objs), hidden=True, kind="traceback")


def _clear_traceback(name: str, obj: Any, shell: Any) -> bool:
    for attr in _SYS_LAST:
        if hasattr(sys, attr):
            try:
                delattr(sys, attr)
            except AttributeError:
                pass
    if shell is not None:
        tb = getattr(shell, "InteractiveTB", None)
        if tb is not None:
            tb.tb = None
            if getattr(tb, "pdb", None) is not None:
                tb.pdb = None
        result = getattr(shell, "last_execution_result", None)
        if result is not None and result.error_in_exec is not None:
            result.error_in_exec = None
    return True


OUTPUT = HiddenKind(
    "output", "a value shown as a cell's result stays in Out: end the line with `;`",
    _find_output, _owns_output, _clear_output)
UNDERSCORE = HiddenKind(
    "underscore", "`_` keeps the last shown result: `%gpumem purge` clears it",
    _find_underscore, _UNDERSCORES.__contains__, _clear_underscore)
RESULT = HiddenKind(
    "result", "the last cell's result is kept by IPython: `%gpumem purge` clears it",
    _find_result, "last result".__eq__, _clear_result, purge_arg="last result")
TRACEBACK = HiddenKind(
    "traceback", "the last error keeps its frames' locals alive: `%gpumem purge` clears it",
    lambda shell, add: None,   # one root for all its objects: see hidden_roots
    "last traceback".__eq__, _clear_traceback, purge_arg="last traceback", what="traceback",
    rebuilt=True)
CHAIN = HiddenKind(
    "chain", "the last error keeps the exceptions chained to it, and their frames' locals: "
    "`%gpumem purge` clears them", _chains.find, _chains.owns, _chains.clear,
    purge_arg="chained errors", what="exception")

#: every kind, in the order the report lists them
KINDS: tuple[HiddenKind, ...] = (OUTPUT, UNDERSCORE, RESULT, CHAIN, TRACEBACK)
_BY_KIND = {k.kind: k for k in KINDS}
#: ``%gpumem purge ARG`` -> the kind it names, for the kinds that have no typed name
BY_PURGE_ARG = {k.purge_arg: k.kind for k in KINDS if k.purge_arg}


def kind_of(root: Root) -> HiddenKind | None:
    """The table's entry for a root (None for the user's names)."""
    return _BY_KIND.get(root.kind) if root.hidden else None


def hint(root: Root) -> str | None:
    entry = kind_of(root)
    return entry.hint if entry is not None else None


def purge_arg(kind: str, purge: str | None) -> str | None:
    """What ``%gpumem purge`` accepts for a root of ``kind`` whose own name is ``purge``."""
    if purge:
        return purge
    entry = _BY_KIND.get(kind)
    return entry.purge_arg if entry is not None else None


def label(root: Root, path: str) -> str:
    entry = kind_of(root)
    return entry.label(root, path) if entry is not None else root.name


def what(root: Root) -> str | None:
    """What the holder is where the kind says it (a traceback), else None: its type."""
    entry = kind_of(root)
    return entry.what if entry is not None else None


class _Found:
    """What :func:`hidden_roots` gathers: one root per object, its other names aliases."""

    __slots__ = ("roots", "by_id", "kind")

    def __init__(self) -> None:
        self.roots: list[Root] = []
        self.by_id: dict[int, Root] = {}
        self.kind = ""

    def add(self, name: str, obj: Any, purge: str | None) -> None:
        if not _may_hold(obj):
            return
        existing = self.by_id.get(id(obj))
        if existing is not None:
            if name != existing.name and name not in existing.aliases:
                existing.aliases.append(name)
            return
        if self.kind == "output" and not name.startswith("Out["):
            return   # _N only names an Out[N] already found
        root = Root(name, obj, hidden=True, purge=purge, kind=self.kind)
        self.roots.append(root)
        self.by_id[id(obj)] = root


def hidden_roots(shell: Any = None) -> list[Root]:
    """IPython's hidden holders, under names a user can type: one root per object (its
    other names are aliases), then the last traceback."""
    found = _Found()
    if shell is not None:
        add = found.add
        for entry in KINDS:
            found.kind = entry.kind
            entry.find(shell, add)
    roots = found.roots
    objs = traceback_objects(shell)
    if objs:
        roots.append(traceback_root(objs))
    return roots


def clear(root: Root, shell: Any) -> list[str]:
    """Drop IPython's hidden references for one hidden root; return what went."""
    removed: list[str] = []
    for name in [root.name] + list(root.aliases):
        entry = next((k for k in KINDS if k.owns(name)), None)
        if entry is None or (shell is None and entry is not TRACEBACK):
            continue
        if entry.clear(name, root.obj, shell) and name not in removed:
            removed.append(name)
    return removed
