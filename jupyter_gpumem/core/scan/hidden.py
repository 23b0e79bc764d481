"""IPython's hidden holders, as one table.

Each :class:`HiddenKind` says, for one kind of reference IPython keeps behind
the user's back, how it is found (``find``), which names are its own and how
each is cleared (``owns``, ``clear``), what ``%gpumem purge`` accepts for it
(``purge_arg``), how it reads (``label``, ``what``) and the hint the report
gives. The scan's roots, the purge, the snapshot and the watch's holders all
read :data:`KINDS`; a new kind is one more entry here.
"""
from __future__ import annotations

import ast
import re
import sys
import weakref
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable

from . import chains as _chains
from .roots import Root, format_key
from .types import ATOMIC_IDS as _ATOMIC_IDS, is_a

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
    #: (name, shell) -> the objects IPython's own record holds under a name the user can
    #: also bind (``_``, ``_5``); None where no user binding can have the name
    records: Callable[[str, Any], tuple] | None = None
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
    for n, value in numbered:
        alias = f"_{n}"
        if dict.get(ns, alias) is value:
            add(alias, value, alias)    # IPython's own alias of Out[N] (identity: rule 2)


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
        if dict.get(d, name) is obj:
            dict.__delitem__(d, name)
    return True


def _records_output(name: str, shell: Any) -> tuple:
    """What IPython's own output history holds under ``Out[N]`` or its alias ``_N``."""
    out_hist = output_history(shell)
    if name.startswith("Out["):
        return tuple(v for k, v in list(dict.items(out_hist))
                     if type(k) in (int, str) and output_name(k) == name)
    return (dict.get(out_hist, int(name[1:])),)


# -- _, __, ___ -----------------------------------------------------------------------------
_UNDERSCORES = ("_", "__", "___")
#: how the display hook's own record reads where the user's name is another object
THEIRS = "IPython's "


def _bare(name: str) -> str:
    """``_`` of ``_`` and of ``IPython's _``."""
    return name[len(THEIRS):] if name.startswith(THEIRS) else name


def _owns_underscore(name: str) -> bool:
    return _bare(name) in _UNDERSCORES


def _ipythons_records(name: str, shell: Any) -> tuple:
    """What IPython itself keeps under ``_``, ``__`` or ``___``: the display hook's own
    record of the results it showed, and its copy in ``user_ns_hidden``."""
    hook = getattr(shell, "displayhook", None)
    return (getattr(hook, name, None), dict.get(getattr(shell, "user_ns_hidden", {}), name))


#: per shell (weakly, the shell's own record): the underscores the user bound, name -> id
#: of the object bound. IPython keeps no record of who bound ``_``: once it shows the
#: user's own ``_`` (a cell ending in ``_``) its display hook holds that very object, and
#: identity alone would call the name IPython's (see observe_underscores)
_USER_BOUND: "weakref.WeakKeyDictionary[Any, dict[str, int]]" = weakref.WeakKeyDictionary()


def _bound_of(shell: Any) -> dict[str, int] | None:
    try:
        return _USER_BOUND.get(shell) if type(shell).__hash__ is object.__hash__ else None
    except TypeError:
        return None


def user_bound(shell: Any, name: str) -> bool:
    """Whether the user bound ``name`` (``_``, ``__`` or ``___``) to what it holds now."""
    bound = _bound_of(shell)
    ns = getattr(shell, "user_ns", None)
    return bound is not None and type(ns) is dict and name in ns \
        and bound.get(name) == id(dict.get(ns, name))


#: ``_``, ``__`` or ``___`` as a name of their own (not inside ``x_1`` or ``obj._``)
_UNDERSCORE_TOKEN = re.compile(r"(?<![\w.])_{1,3}(?!\w)")
#: the nodes whose names are their own scope's, not the cell's
_OWN_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp,
               ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _binds(source: str, names) -> set[str]:
    """Which of ``names`` a cell's source binds (an assignment, a loop, a ``with``, an
    import, ``del``), read by its syntax tree; none where it does not parse."""
    if _UNDERSCORE_TOKEN.search(source) is None:   # (most cells: no parse, a few µs)
        return set()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    out = set()
    todo = [tree]
    while todo:   # the cell's own scope: not the bodies of its functions, classes, lambdas
        node = todo.pop()   # and comprehensions, whose names are their own
        if type(node) is ast.Name and type(node.ctx) is not ast.Load and node.id in names:
            out.add(node.id)
        elif type(node) is ast.alias and (node.asname or node.name) in names:
            out.add(node.asname or node.name)
        if type(node) in _OWN_SCOPES:
            if type(node) in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef) \
                    and node.name in names:
                out.add(node.name)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def observe_underscores(shell: Any, source: str | None = None) -> None:
    """Note which of ``_``, ``__``, ``___`` the user bound, after a cell (``source``: its
    code, as typed) and before each scan. A name is the user's where it is none of
    IPython's records, or where the cell's code binds it; it stays the user's while it
    holds the object the user bound (IPython's display hook then records that object
    too when the cell shows it, and leaves the name alone); it is IPython's again once it
    holds another object that IPython's records hold (IPython wrote it)."""
    ns = getattr(shell, "user_ns", None)
    if type(ns) is not dict or type(shell).__hash__ is not object.__hash__:
        return
    try:
        bound = _USER_BOUND.setdefault(shell, {})
    except TypeError:
        return
    binds = _binds(source, _UNDERSCORES) if type(source) is str else set()
    for name in _UNDERSCORES:
        if name not in ns:
            bound.pop(name, None)
            continue
        now = dict.get(ns, name)
        if name in binds or not any(r is now for r in _ipythons_records(name, shell)):
            bound[name] = id(now)
        elif bound.get(name) != id(now):
            bound.pop(name, None)


def _records_underscore(name: str, shell: Any) -> tuple:
    """IPython's records (:func:`_ipythons_records`) under ``IPython's _``, and under the
    plain name unless the user bound it (:func:`user_bound`). The name in ``user_ns`` is
    IPython's only while it is one of these."""
    bare = _bare(name)
    if bare == name and user_bound(shell, bare):
        return ()
    return _ipythons_records(bare, shell)


def _find_underscore(shell: Any, add: Add) -> None:
    # the plain name only where the user's ``_`` is that very object, and the user did not
    # bind it: else it is the user's own binding (or none), and IPython's record reads
    # "IPython's _"
    ns = shell.user_ns
    for name in _UNDERSCORES:
        mine = user_bound(shell, name)
        for value in _ipythons_records(name, shell):
            shown = name if dict.get(ns, name) is value and not mine else THEIRS + name
            add(shown, value, shown)    # the same object twice is added once


def _clear_underscore(name: str, obj: Any, shell: Any) -> bool:
    # called only where ``obj`` is one of IPython's records (see :func:`clear`); the
    # name is said removed unless the user's own binding of it stays
    name = _bare(name)
    ns, hidden_ns = shell.user_ns, getattr(shell, "user_ns_hidden", {})
    mine = user_bound(shell, name)   # the user's own binding of that very object stays
    said = name not in ns or (dict.get(ns, name) is obj and not mine)
    for d in ((hidden_ns,) if mine else (ns, hidden_ns)):
        if dict.get(d, name) is obj:
            dict.__setitem__(d, name, "")
    hook = getattr(shell, "displayhook", None)
    if hook is not None and getattr(hook, name, None) is obj:
        setattr(hook, name, "")
    return said


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
    _find_output, _owns_output, _clear_output, records=_records_output)
UNDERSCORE = HiddenKind(
    "underscore", "`_` keeps the last shown result: `%gpumem purge` clears it",
    _find_underscore, _owns_underscore, _clear_underscore,
    records=_records_underscore)
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
                existing.aliases += (name,)
            return
        if self.kind == "output" and not name.startswith("Out["):
            return   # _N only names an Out[N] already found
        root = Root(name, obj, hidden=True, purge=purge, kind=self.kind)
        self.roots.append(root)
        self.by_id[id(obj)] = root


def is_ipythons(entry: HiddenKind, name: str, obj: Any, shell: Any) -> bool:
    """Rule 2, the one place it is decided: a hidden holder is IPython's, and may be
    cleared, only where the object under the name is the one IPython's own record holds
    (the display hook's ``_``, ``__``, ``___``; the output history's ``Out[N]`` for
    ``_N``), by identity. A user's binding that happens to have the name is the user's."""
    if entry.records is None:
        return True
    return any(value is obj for value in entry.records(name, shell))


def user_bindings(shell: Any) -> list[Root]:
    """The user's own bindings of IPython's names (``_ = t`` after ``Out[4] = 2``, or
    ``_5 = t`` where Out[5] is something else): the user's names, listed as such, and
    never cleared with the hidden holders."""
    ns = shell.user_ns
    names = list(_UNDERSCORES)
    names += [f"_{n}" for n in dict.keys(output_history(shell)) if type(n) is int]
    out = []
    for name in names:
        value = dict.get(ns, name)
        if not _may_hold(value):
            continue
        entry = UNDERSCORE if name in _UNDERSCORES else OUTPUT
        if not is_ipythons(entry, name, value, shell):
            out.append(Root(name, value, purge=name))
    return out


def hidden_roots(shell: Any = None) -> list[Root]:
    """IPython's hidden holders, under names a user can type: one root per object (its
    other names are aliases), then the last traceback; then the user's own bindings of
    IPython's names (:func:`user_bindings`), which are not hidden."""
    found = _Found()
    if shell is not None:
        observe_underscores(shell)
        add = found.add
        for entry in KINDS:
            found.kind = entry.kind
            entry.find(shell, add)
    roots = found.roots
    objs = traceback_objects(shell)
    if objs:
        roots.append(traceback_root(objs))
    if shell is not None:
        roots += user_bindings(shell)
    return roots


def owned(root: Root, shell: Any) -> list[tuple[str, HiddenKind]]:
    """The names of a hidden root that are IPython's own (:func:`is_ipythons`), with
    their kinds. A purge settles them for every root before it deletes anything
    (deleting ``Out[5]`` first would make its ``_5`` look like the user's)."""
    out: list[tuple[str, HiddenKind]] = []
    for name in [root.name] + list(root.aliases):
        entry = next((k for k in KINDS if k.owns(name)), None)
        if entry is None or (shell is None and entry is not TRACEBACK):
            continue
        if is_ipythons(entry, name, root.obj, shell):
            out.append((name, entry))
    return out


def clear(root: Root, shell: Any, names: list | None = None) -> list[str]:
    """Drop IPython's hidden references for one hidden root, under ``names`` (what
    :func:`owned` said of it, by default now); return what went."""
    removed: list[str] = []
    for name, entry in (owned(root, shell) if names is None else names):
        if entry.clear(name, root.obj, shell) and name not in removed:
            removed.append(name)
    return removed
