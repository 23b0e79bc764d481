"""Walk from the user's names and IPython's hidden holders to tensor storages.

The walk starts at named roots, never at ``gc.get_objects()``, so its cost
follows what the user holds, not the size of the heap. It reads objects only
through C-level slots: no property, ``__getattr__`` or other user code runs.
It is bounded in time and depth, and a partial result says why.

A scan has two passes:

1. :mod:`jupyter_gpumem.scan_reach`: which storages each root reaches, breadth
   first, a chunk of objects at a time in C-level passes (``gc.get_referents``
   over the chunk, exact types filtered in ``map``/``filter``/``compress``);
   tensors, models and optimizers are taken in batches by their backend.
2. :mod:`jupyter_gpumem.scan_paths`: the path a user would type, found only
   inside the roots that reach storages and only for what is shown (each
   holder's largest storage now, the others when their path is read).
"""
from __future__ import annotations

import builtins
import gc
import re
import sys
import time
import types
import weakref
from dataclasses import dataclass, field
from itertools import islice, repeat
from operator import itemgetter
from typing import Any

from ..backends import Backend, active_backends
from .scan_paths import LazyNode, PathFinder
from .scan_reach import Reacher
from .scan_types import (  # noqa: F401 - the scan's public helpers live on here
    ATOMIC, MODULE_DICT as _MODULE_DICT, is_a, is_library_module_name, type_module,
    type_name_of,
)

_DEFAULT_MAX_DEPTH = 4000   # levels of the walk (an attribute is one or two)
_PATH_SHARE = 0.1           # of the time limit: what the paths get at least, after the walk
_FIRST, _NBYTES = itemgetter(0), itemgetter(1)
_STEP = 0.005               # seconds of work between two steps of iter_scan

# -- hidden names IPython keeps in user_ns --------------------------------
_HIDDEN_NAME = re.compile(r"^(_|__|___|_\d+|_i|_ii|_iii|_i\d+|_ih|_oh|_dh|In|Out|_exit_code)$")
_SHELL_NAMES = {"exit", "quit", "get_ipython", "__builtin__", "__builtins__", "__name__",
                "__doc__", "__package__", "__loader__", "__spec__"}


@dataclass
class Root:
    """A starting point of the walk: something the user can name."""

    name: str
    obj: Any
    hidden: bool = False
    aliases: list[str] = field(default_factory=list)
    purge: str | None = None
    kind: str = "user"      # user | output | underscore | result | traceback | path


@dataclass
class Reach:
    """What one root reaches: storage key -> (storage, path node, description).

    A path node reads as ``parent, label = node`` (:func:`format_path`); it is found
    when it is first read (see :mod:`jupyter_gpumem.scan_paths`)."""

    storages: dict = field(default_factory=dict)
    objects: int = 0


@dataclass
class ScanResult:
    """Roots and what each reaches, plus how the walk went."""

    roots: list[Root]
    reach: list[Reach]
    partial: bool = False
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    errors: int = 0


# -- paths -------------------------------------------------------------------------
def _format_key(key: Any) -> str:
    if key is ... or type(key) not in ATOMIC:
        return "[...]"   # the repr of an object of the user's would run its code
    text = repr(key)
    return f"[{text}]" if len(text) <= 40 else "[...]"


def format_label(label: tuple) -> str:
    """Text of one step of a path."""
    kind = label[0]
    if kind == "root":
        return label[1]
    if kind == "attr":
        return "." + label[1] if type(label[1]) is str else ".__dict__[...]"
    if kind == "flat":
        return f".flat[{label[1]}]"
    if kind == "item":
        return _format_key(label[1])
    if kind == "index":
        return f"[{label[1]}]"
    if kind == "key":
        return ".keys()[...]"
    if kind == "elem":
        return "{...}"
    if kind == "attr_index":
        return f".{label[1]}[{label[2]}]"
    if kind == "attr_item":
        return f".{label[1]}{_format_key(label[2])}"
    if kind == "closure":
        return f"→closure:{label[1]}"
    if kind == "default":
        return f"→default:{label[1]}"
    if kind == "local":
        return f"→{label[1]}(): {label[2]}"
    if kind == "graph":
        return f".grad_fn→{label[1]}.{label[2]}"
    if kind == "ref":
        return "→ref"
    if kind == "unknown":
        return "→…"
    if kind == "lru":
        return "→lru_cache"
    if kind == "opt_param":
        return f".param_groups[{label[1]}]['params'][{label[2]}]"
    if kind == "opt_group":
        return f".param_groups[{label[1]}]{_format_key(label[2])}"
    if kind == "opt_state":
        return f".state[...]{_format_key(label[1])}"
    if kind == "opt_state_key":
        return ".state.keys()[...]"
    return "→" + str(kind)


def format_path(node: tuple | None) -> str:
    """The text of a path node, from its root to the storage."""
    parts = []
    while node is not None:
        node, label = node
        parts.append(format_label(label))
    parts.reverse()
    return "".join(parts)


# -- roots -----------------------------------------------------------------------
def user_roots(namespace: dict, hidden_ns: dict | None = None) -> list[Root]:
    """The user's own names in a namespace (IPython's bookkeeping left out)."""
    hidden_ns = hidden_ns or {}
    out = []
    for name, value in list(dict.items(namespace)):
        if type(name) is not str:
            continue   # ``globals()[42] = ...``: no name to type (see odd_keys)
        if type(value) in ATOMIC or name in _SHELL_NAMES or _HIDDEN_NAME.match(name):
            continue
        if name.startswith("__") and name.endswith("__"):
            continue
        if name in hidden_ns and hidden_ns[name] is value:
            continue
        if is_a(value, types.ModuleType) and is_library_module_name(_MODULE_DICT(value).get("__name__")):
            continue
        out.append(Root(name, value, purge=name))
    return out


def odd_keys(namespace: dict | None = None, shell: Any = None) -> list[str]:
    """Keys of the namespace that are not names (``globals()[42] = ...``): the scan
    skips them, and the report says so."""
    ns = shell.user_ns if shell is not None else namespace or {}
    return [_format_key(k)[1:-1] for k in list(dict.keys(ns)) if type(k) is not str]


def _add_hidden(roots: list[Root], by_id: dict[int, Root], name: str, obj: Any,
                kind: str, purge: str | None) -> None:
    if obj is None or type(obj) in ATOMIC:
        return
    existing = by_id.get(id(obj))
    if existing is not None:
        if name != existing.name and name not in existing.aliases:
            existing.aliases.append(name)
        return
    root = Root(name, obj, hidden=True, purge=purge, kind=kind)
    roots.append(root)
    by_id[id(obj)] = root


def traceback_objects(shell: Any = None) -> list[Any]:
    """Objects that keep the last error's frames alive (distinct, in order)."""
    out: list[Any] = []
    ids: set[int] = set()

    def add(obj):
        if obj is not None and id(obj) not in ids:
            ids.add(id(obj))
            out.append(obj)

    for name in ("last_exc", "last_value", "last_traceback"):
        add(getattr(sys, name, None))
    if shell is not None:
        add(getattr(getattr(shell, "InteractiveTB", None), "tb", None))
        result = getattr(shell, "last_execution_result", None)
        add(getattr(result, "error_in_exec", None))
        pdb = getattr(getattr(shell, "InteractiveTB", None), "pdb", None)
        add(getattr(pdb, "curframe", None))
    return out


def hidden_roots(shell: Any = None) -> list[Root]:
    """IPython's hidden holders, under names a user can type."""
    roots: list[Root] = []
    by_id: dict[int, Root] = {}
    if shell is not None:
        ns = shell.user_ns
        out_hist = getattr(getattr(shell, "history_manager", None), "output_hist", None)
        if out_hist is None:
            out_hist = ns.get("Out", {}) if is_a(ns.get("Out"), dict) else {}
        for n, value in sorted(dict.items(out_hist), key=lambda kv: kv[0]):
            _add_hidden(roots, by_id, f"Out[{n}]", value, "output", f"Out[{n}]")
        for n in list(out_hist):
            alias = f"_{n}"
            if alias in ns and id(ns[alias]) in by_id:
                _add_hidden(roots, by_id, alias, ns[alias], "output", alias)
        hook = getattr(shell, "displayhook", None)
        hidden_ns = getattr(shell, "user_ns_hidden", {})
        for name in ("_", "__", "___"):
            for value in (ns.get(name), hidden_ns.get(name), getattr(hook, name, None)):
                _add_hidden(roots, by_id, name, value, "underscore", name)
        result = getattr(shell, "last_execution_result", None)
        _add_hidden(roots, by_id, "last result", getattr(result, "result", None), "result", None)
    tb_objs = traceback_objects(shell)
    if tb_objs:
        root = Root("last traceback", tuple(tb_objs), hidden=True, kind="traceback")
        roots.append(root)
    return roots


def collect_roots(namespace: dict | None = None, shell: Any = None,
                  include_hidden: bool = True) -> list[Root]:
    """User roots, then hidden roots, for a shell or a plain namespace."""
    if shell is not None:
        namespace = shell.user_ns
        hidden_ns = getattr(shell, "user_ns_hidden", {})
    else:
        hidden_ns = {}
    roots = user_roots(namespace or {}, hidden_ns)
    if include_hidden:
        roots += hidden_roots(shell)
    return roots


def stop_ids_for(shell: Any = None, namespace: dict | None = None) -> set[int]:
    """Objects the walk never enters: namespaces, the shell, module tables."""
    objs: list[Any] = [sys.modules, builtins.__dict__, builtins, sys]
    if namespace is not None:
        objs.append(namespace)
    if shell is not None:
        objs += [shell, shell.user_ns, getattr(shell, "user_ns_hidden", None),
                 getattr(shell, "user_global_ns", None), getattr(shell, "history_manager", None),
                 getattr(shell, "displayhook", None), getattr(shell, "display_pub", None)]
        hm = getattr(shell, "history_manager", None)
        if hm is not None:
            objs += [hm.output_hist, hm.input_hist_parsed, hm.input_hist_raw]
        objs += [shell.user_ns.get("In"), shell.user_ns.get("Out")]
    return {id(o) for o in objs if o is not None}


class paused_gc:
    """No garbage collection inside (``with paused_gc():``): a scan makes many
    short-lived objects, and a collection they trigger costs time in proportion to
    the whole heap, which the scan's cost must not depend on. (A class, not a
    generator: it is entered once per root.)"""

    __slots__ = ("_was_enabled",)

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc) -> None:
        if self._was_enabled:
            gc.enable()


def scan(roots: list[Root], *, devices: set[str] | None, shell: Any = None,
         namespace: dict | None = None, time_limit: float = 3.0,
         extra_stop: set[int] | None = None, describe: bool = False,
         backends: list[Backend] | None = None) -> ScanResult:
    """Walk every root; see the module docstring."""
    steps = iter_scan(roots, devices=devices, shell=shell, namespace=namespace,
                      time_limit=time_limit, extra_stop=extra_stop, describe=describe,
                      backends=backends)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def iter_scan(roots: list[Root], *, devices: set[str] | None, shell: Any = None,
              namespace: dict | None = None, time_limit: float = 3.0,
              extra_stop: set[int] | None = None, describe: bool = False,
              backends: list[Backend] | None = None):
    """:func:`scan` in steps: a generator that yields every few milliseconds, between
    roots or between two C-level batches of one root (the garbage collector runs
    again meanwhile), and returns the :class:`ScanResult`. A caller on an event loop
    lets other work run at each step; it must not let the user's code run and then go
    on (the namespace may have changed): it starts a new scan."""
    start = time.perf_counter()
    stop = stop_ids_for(shell, namespace)
    backends = active_backends() if backends is None else backends
    deadline = start + time_limit
    reacher = Reacher(backends, devices, stop, extra_stop, _DEFAULT_MAX_DEPTH, describe)
    for backend in backends:
        backend.start_scan(deadline)

    finder = PathFinder(reacher, _PATH_SHARE * time_limit, _DEFAULT_MAX_DEPTH)

    def walk(i: int, until: float) -> tuple:
        root = roots[i]
        reacher.current_root = root.name
        reacher.deadline = until
        reacher.out_of_time = False
        for backend in backends:
            backend.set_deadline(until)

        def nodes(keys, i=i):   # each storage's path, found when it is read
            return map(LazyNode, zip(repeat(finder), repeat(i), keys))

        walking = reacher.walk_steps(root.obj, nodes, steps.due)
        while True:
            try:
                next(walking)
            except StopIteration as done:
                found, count = done.value
                break
            yield from steps.step()   # a long root: a step between two C-level batches
        graph = reacher.graph_edges
        reacher.graph_edges = {}
        for backend in backends:
            for reason in backend.partial_reasons():
                reacher.stop_walk(reason)
        return found, count, graph

    # Each root first gets a fair share of the time left, so one huge root (a list of
    # ten million records) cannot starve the names after it; the roots cut short then
    # share what the others left, in order.
    walked: list = []
    cut: list[int] = []
    steps = _Steps()
    try:
        for i, root in enumerate(roots):
            if id(root.obj) in reacher.stop:
                walked.append(({}, 0, {}))
                continue
            now = time.perf_counter()
            walked.append((yield from walk(i, now + max(deadline - now, 0.0) / (len(roots) - i))))
            if reacher.out_of_time:
                cut.append(i)
            if steps.due():
                yield from steps.step()
        for i in cut:
            if time.perf_counter() < deadline:
                walked[i] = yield from walk(i, deadline)
                yield from steps.step()
                if not reacher.out_of_time:
                    continue
            reacher.current_root = roots[i].name
            reacher.stop_walk("time limit reached")

        # the paths: each holder's largest storage now (the first in canonical order
        # among the largest), the rest when they are read
        finder.budget = max(deadline - time.perf_counter(), _PATH_SHARE * time_limit)
        reach: list[Reach] = []
        for i, (root, (found, count, graph)) in enumerate(zip(roots, walked)):
            if found:
                finder.add_root(i, root.name, root.obj, found, graph)
                found = _storages(finder, i, found, root)
                if steps.due():
                    yield from steps.step()
            reach.append(Reach(found, count))
    finally:
        steps.end()
    result = ScanResult(roots, reach, reacher.partial, reacher.reasons,
                        time.perf_counter() - start, reacher.errors)
    finder.result = weakref.ref(result)
    return result


class _Steps:
    """The collector paused while the scan works (see :class:`paused_gc`), and a step
    (a yield of :func:`iter_scan`, the collector running again) now and then: every
    few milliseconds, not after each root."""

    __slots__ = ("_was_enabled", "_paused", "_until")

    def __init__(self) -> None:
        self._paused = False
        self._start()

    def _start(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._paused = True
        self._until = time.perf_counter() + _STEP

    def due(self) -> bool:
        return time.perf_counter() > self._until

    def step(self):
        """Yield once, with the collector as the caller had it."""
        self.end()
        yield
        self._start()

    def end(self) -> None:
        if self._paused:
            self._paused = False
            if self._was_enabled:
                gc.enable()


def _storages(finder: PathFinder, i: int, found: dict, root: Root) -> dict:
    """``key -> (storage, path node, description)`` of root ``i``, its largest storage
    first among those of its size (the one whose path comes first)."""
    finder.root_is_met(i, root.obj)
    sizes = list(map(_NBYTES, map(_FIRST, found.values())))
    largest = max(sizes)
    first = None
    if sizes.count(largest) > 1:
        first = finder.first_of(i, lambda key: found[key][0][1] == largest)
    if first is None:
        first = next(islice(found, sizes.index(largest), None))
    if next(iter(found)) != first:
        found = {first: found[first], **found}
    return found
