"""Walk from the user's names and IPython's hidden holders to tensor storages.

The walk starts at named roots, never at ``gc.get_objects()``, so its cost follows what
the user holds (rule 6: :func:`iter_scan` reads each name once at most, within the time
limit, and a partial result says why). It reads objects only through C-level slots: no
property, ``__getattr__`` or other user code runs. Two passes:
:mod:`jupyter_gpumem.core.scan.reach` (which storages each root reaches, reused by
:mod:`.warm` while proven unchanged) and :mod:`jupyter_gpumem.core.scan.search` (the path
a user would type, only for what is shown). This module is the scan's face. The flow:
docs/ARCHITECTURE.md#the-scan-in-core.
"""
from __future__ import annotations

import gc
import time
import weakref
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from operator import attrgetter, is_, itemgetter
from types import MappingProxyType
from typing import Any

from ...backends import Backend, active_backends
from .search import Nodes, PathFinder
from .hidden import hidden_roots
from .paths import ELIDED, attr_text
from .roots import Root, format_key, odd_keys, stop_ids_for, user_roots
from .allocations import by_allocation, one_allocation
from .proof import NOT_PROVEN
from .reach import Reacher
from .warm import Kept, Unread, WarmScan
from .steps import run_to_end
from .types import (ATOMIC_IDS, CLASS, CONTAINER, DICT, DICT_SUB, LIB_DIRS, SEQ, SEQ_SUB, SET,
                    SET_SUB, TENSOR, classify, is_a, type_name_of)

# The face: a module outside core/scan imports what it needs of the scan from here (the
# names above and below: Root, WarmScan, run_to_end, the kinds of objects, ...); the
# scan's modules that are nouns of their own, hidden (IPython's hidden holders), paths
# (the paths a user types) and native (the C core's loader), it may import whole.

_DEFAULT_MAX_DEPTH = 4000   # levels of the walk (an attribute is one or two)
_PATH_SHARE = 0.1           # of the time limit: what the paths get at least, after the walk
_FIRST, _NBYTES = itemgetter(0), itemgetter(1)
_SECOND = _NBYTES
_STEP = 0.005               # seconds of work between two steps of iter_scan


@dataclass(slots=True)
class Reach:
    """What one root reaches: storage key -> (storage, path node, description).

    A path node reads as ``parent, label = node`` (:func:`format_path`); it is found
    when it is first read (see :mod:`jupyter_gpumem.core.scan.search`). Never changed
    in place: a pass that changes what a root reaches sets a new one (see
    :data:`NOTHING`)."""

    storages: dict = field(default_factory=dict)
    objects: int = 0

    @property
    def nbytes(self) -> int:
        """The bytes of the storages it reaches."""
        return sum(info.nbytes for info, _, _ in self.storages.values())


_STORAGES = attrgetter("storages")
_OBJ = attrgetter("obj")

#: what each root proven to reach nothing has (most of a long notebook's names): one
#: object for them all, read-only, so that a scan of 100,000 names makes no object for
#: each of them (allocated afresh at every scan, they outgrew the caches)
NOTHING = Reach(MappingProxyType({}), 1)
_NOTHING_WALKED = (NOTHING.storages, 1, NOTHING.storages)


@dataclass
class ScanResult:
    """Roots and what each reaches, plus how the walk went."""

    roots: list[Root]
    reach: list[Reach]
    partial: bool = False
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    errors: int = 0
    #: the first objects refused, as ``(type name, root name)`` (``errors`` counts all)
    refused: list = field(default_factory=list)
    #: per root, whether a warm scan reused its last walk (see :mod:`.warm`)
    kept: list = field(default_factory=list)
    #: the indices of the roots the time limit cut short or never reached
    cut: list = field(default_factory=list)
    #: what the backends said of the walk, the result not partial for it (Backend.notes)
    notes: list = field(default_factory=list)

    #: (the reach list, :meth:`holding` of it): asked by several passes of one scan
    _holding: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def holding(self) -> list[int]:
        """The indices of the roots that reach a storage, in order: a long notebook's
        names are mostly plain data, and the passes after the scan (aliases, sharing,
        attribution, the warm signature, the purge plan) look at these alone. Found once
        per reach list (a result's list is never changed in place: a new one is set)."""
        cached = self._holding
        if cached is None or cached[0] is not self.reach:
            cached = self._holding = (self.reach, list(
                compress(range(len(self.reach)), map(_STORAGES, self.reach))))
        return cached[1]

    @property
    def timed_out(self) -> bool:
        """Whether the time limit cut the scan (one of its reasons; a scan partial for
        another reason, a graph behind hooks, read everything it could)."""
        return any("time limit" in reason for reason in self.reasons)


# -- paths -------------------------------------------------------------------------


#: how each kind of path step reads (``label[0]`` is the kind)
_LABELS = {
    "root": lambda label: label[1],
    "attr": lambda label: attr_text(label[1]),
    "flat": lambda label: f".flat[{label[1]}]",
    "item": lambda label: format_key(label[1]),
    "index": lambda label: f"[{label[1]}]",
    "key": lambda label: ".keys()[...]",
    "elem": lambda label: "{...}",
    "attr_index": lambda label: f"{attr_text(label[1])}[{label[2]}]",
    "attr_item": lambda label: f"{attr_text(label[1])}{format_key(label[2])}",
    "closure": lambda label: f"→closure:{label[1]}",
    "default": lambda label: f"→default:{label[1]}",
    "local": lambda label: f"→{label[1]}(): {label[2]}",
    "graph": lambda label: graph_text(label),
    "ref": lambda label: "→ref",
    "unknown": lambda label: "→…",
    "lru": lambda label: "→lru_cache",
    "opt_param": lambda label: f".param_groups[{label[1]}]['params'][{label[2]}]",
    "opt_group": lambda label: f".param_groups[{label[1]}]{format_key(label[2])}",
    "opt_state": lambda label: f".state[...]{format_key(label[1])}",
    "opt_state_key": lambda label: ".state.keys()[...]",
    "part": lambda label: f".{label[1]}()",   # a part of a sparse tensor: ``._values()``
}


#: a graph path's nodes shown in full at most; a longer one shows this many at each end
GRAPH_STEPS_SHOWN, GRAPH_ENDS = 24, 8


def graph_text(label: tuple) -> str:
    """Text of a step into an autograd graph, ``("graph", route, tail)`` (its form:
    backends/torch_graph.py): ``.grad_fn.next_functions[0][0]._saved_mat1``. A route of
    more than :data:`GRAPH_STEPS_SHOWN` nodes (a recurrent net's, thousands deep) shows
    its first and last :data:`GRAPH_ENDS` around ``…(N steps)…``: a row's text stays
    short, and such a path is read, not typed back (:func:`.paths.resolve` says so)."""
    _, route, tail = label
    at: list = []
    while type(route) is tuple:   # (parent route, i), from the node back to the head
        route, i = route
        at.append(i)
    head = "" if route is None else attr_text(route)
    steps = [f".next_functions[{i}][0]" for i in reversed(at)]
    if len(steps) > GRAPH_STEPS_SHOWN:
        left_out = len(steps) - 2 * GRAPH_ENDS
        steps[GRAPH_ENDS:-GRAPH_ENDS] = [f"{ELIDED}({left_out:,} steps){ELIDED}"]
    return head + "".join(steps) + "".join(map(format_label, tail))


def format_label(label: tuple) -> str:
    """Text of one step of a path."""
    text = _LABELS.get(label[0])
    return text(label) if text is not None else "→" + str(label[0])


def format_path(node: tuple | None) -> str:
    """The text of a path node, from its root to the storage."""
    parts = []
    while node is not None:
        node, label = node
        parts.append(format_label(label))
    parts.reverse()
    return "".join(parts)


# -- roots -----------------------------------------------------------------------


def user_names(namespace: dict | None = None, shell: Any = None) -> tuple[dict, dict]:
    """Where the user's names are, ``(namespace, hidden_ns)``: a shell's (with IPython's
    hidden names), or a plain namespace's."""
    if shell is not None:
        return shell.user_ns, getattr(shell, "user_ns_hidden", {})
    return namespace or {}, {}


def collect_roots(namespace: dict | None = None, shell: Any = None,
                  include_hidden: bool = True) -> list[Root]:
    """User roots, then hidden roots, for a shell or a plain namespace."""
    roots = user_roots(*user_names(namespace, shell))
    if include_hidden:
        roots += hidden_roots(shell)
    return roots


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
         backends: list[Backend] | None = None, warm: WarmScan | None = None,
         reuse: bool = True, started: float | None = None,
         user: tuple | None = None) -> ScanResult:
    """Walk every root; see the module docstring (and :func:`iter_scan` for ``user``)."""
    return run_to_end(iter_scan(roots, devices=devices, shell=shell, namespace=namespace,
                                time_limit=time_limit, extra_stop=extra_stop, describe=describe,
                                backends=backends, warm=warm, reuse=reuse, interleaved=False,
                                started=started, user=user))


def iter_scan(roots: list[Root], *, devices: set[str] | None, shell: Any = None,
              namespace: dict | None = None, time_limit: float = 3.0,
              extra_stop: set[int] | None = None, describe: bool = False,
              backends: list[Backend] | None = None, warm: WarmScan | None = None,
              reuse: bool = True, interleaved: bool = True, started: float | None = None,
              user: tuple | None = None):
    """:func:`scan` in steps: a generator that yields every few milliseconds, between
    roots or between two C-level batches of one root (the garbage collector runs
    again meanwhile), and returns the :class:`ScanResult`. A caller on an event loop
    lets other work run at each step; it must not let the user's code run and then go
    on (the namespace may have changed): it starts a new scan.

    With ``warm`` (the shell's :class:`~jupyter_gpumem.core.scan.warm.WarmScan`), a root whose
    fingerprint proves it unchanged since its last walk is not walked: its storages
    are the last walk's, and only its largest storage's path is kept (any other path
    node raises when read: a caller that reads them passes no ``warm``). With
    ``reuse=False`` every root is walked, and kept for the next scan. ``interleaved``:
    the caller may run other code at a step (an event loop); where it does not (it
    drives the steps to the end at once), a root is fingerprinted right after its walk
    even if steps came during it. ``started``: when the caller's command began (the
    limit is the command's: what it did before the scan counts), else now. ``user``:
    ``(namespace, hidden_ns)``, whose user names are roots too, before ``roots``
    (:func:`collect_roots`' user roots), but a name proven to reach nothing (most of a
    long notebook's: plain data) gets no Root and is in no list of the result.

    Its cost is linear in what the roots hold, and it honours its limit: past the
    deadline no further root is looked at, and the result says which roots were cut."""
    start = time.perf_counter()
    stop = stop_ids_for(shell, namespace)
    backends = active_backends() if backends is None else backends
    deadline = (start if started is None else min(started, start)) + time_limit
    reacher = Reacher(backends, devices, stop, extra_stop, _DEFAULT_MAX_DEPTH, describe)
    for backend in backends:
        backend.start_scan(deadline)

    finder = PathFinder(reacher, _PATH_SHARE * time_limit, _DEFAULT_MAX_DEPTH)
    warm_pass = None if warm is None or extra_stop or describe else \
        warm.start(backends, reacher.stop, devices, reuse)
    if warm_pass is not None:   # what the walk takes, read by the fingerprint too
        warm_pass.fingerprint.use_taken(reacher.taken)
    clean: set[int] = set()   # roots walked whole (no refusal, not cut short)

    def whole(i: int, before: tuple) -> None:
        """Root ``i`` was walked to its end; ``before``: the refusals, reasons, steps and
        time when its walk began. Clean if it refused nothing and said nothing, and then
        told the warm scan (with what the walk cost) before any other code can run."""
        if before[:2] == (reacher.errors, len(reacher.reasons)):
            clean.add(i)
            if warm_pass is not None:
                warm_pass.walked(i, roots[i], walked[i][0],
                                 interleaved and before[2] != steps.taken, walked[i][1],
                                 time.perf_counter() - before[3], before[2])

    def walk(i: int, until: float) -> tuple:
        root = roots[i]
        reacher.current_root = root.name
        reacher.deadline = until
        reacher.out_of_time = False
        for backend in backends:
            backend.set_deadline(until)

        # each storage's path, found when it is read
        walking = reacher.walk_steps(root.obj, Nodes(finder, i), steps.due)
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
            notes.extend(n for n in backend.notes() if n not in notes)
        return found, count, graph

    # Each root first gets a fair share of the time left, so one huge root (a list of
    # ten million records) cannot starve the names after it; the roots cut short then
    # share what the others left, in order.
    cut: list[int] = []
    notes: list[str] = []
    steps = _Steps()
    try:
        had = 0   # the user's names the proof had already: walked below, not tried again
        if user is not None:
            mine = user_roots(user[0], user[1], None if describe else
                              lambda objs: _proven_empty(reacher, objs, deadline))
            had = 0 if describe else len(mine)   # (user_roots proves them where asked to)
            roots = mine + roots
        walked: list = [_NOTHING_WALKED] * len(roots)   # (each root not proven so is set below)
        # the small roots that reach nothing (most of a long notebook's names), proven in
        # a few runs of the C walker rather than walked one by one; nothing of them is kept
        # for the warm scan: the proof costs less than a fingerprint's. (C-level passes
        # over the roots: a long notebook's names are tens of thousands.)
        empty = None if describe else \
            _proven_empty(reacher, list(map(_OBJ, roots[had:])), deadline)   # (a mark each)
        rest = list(range(len(roots))) if empty is None else list(range(had)) + \
            list(compress(range(had, len(roots)), empty.translate(NOT_PROVEN)))
        for at, i in enumerate(rest):
            root = roots[i]
            if time.perf_counter() >= deadline:   # the rest is not looked at: said below
                for j in rest[at:]:
                    walked[j] = ({}, 0, {})
                    cut.append(j)
                break
            if id(root.obj) in reacher.stop:
                walked[i] = ({}, 0, {})
                continue
            if warm_pass is not None:
                if interleaved and steps.taken != warm_pass.steps:   # other code ran
                    warm_pass.forget(steps.taken)
                kept = warm_pass.look(i, root)
                if kept is not None:
                    walked[i] = kept
                    continue
            now = time.perf_counter()
            before = (reacher.errors, len(reacher.reasons), steps.taken, now)
            try:
                walked[i] = yield from walk(i, now + max(deadline - now, 0.0) / (len(roots) - i))
            except Exception:  # noqa: BLE001 - one name that cannot be read: the rest stands
                walked[i] = ({}, 0, {})
                reacher.refuse(root.obj)
                continue
            if reacher.out_of_time:
                cut.append(i)
            else:
                whole(i, before)
            if steps.due():
                yield from steps.step()
        out_of_time: list[int] = []   # the roots the time limit cut short, in order
        for i in cut:
            if time.perf_counter() < deadline:
                before = (reacher.errors, len(reacher.reasons), steps.taken, time.perf_counter())
                try:
                    walked[i] = yield from walk(i, deadline)
                except Exception:  # noqa: BLE001 - as above: what it found before stands
                    reacher.current_root = roots[i].name
                    reacher.refuse(roots[i].obj)
                    continue
                if not reacher.out_of_time:
                    whole(i, before)   # walked whole on its second turn
                yield from steps.step()
                if not reacher.out_of_time:
                    continue
            out_of_time.append(i)
        if out_of_time:
            reacher.current_root = None
            reacher.stop_walk(time_reason([roots[i].name for i in out_of_time[:_NAMED_CUT]],
                                          len(out_of_time)))

        if warm_pass is not None:
            warm_pass.settle(steps.taken if interleaved else None)
        # the paths: each holder's largest storage now (the first in canonical order
        # among the largest), the rest when they are read
        finder.budget = max(deadline - time.perf_counter(), _PATH_SHARE * time_limit)
        reach: list[Reach] = [NOTHING] * len(roots)   # (each root in rest is set below)
        kept = list(map(is_, map(type, walked), repeat(Kept)))
        for i in rest:
            root, got = roots[i], walked[i]
            if kept[i]:
                reach[i] = Reach(got.storages, got.objects)
                continue
            found, count, graph = got
            if found:
                finder.add_root(i, root.name, root.obj, found, graph)
                try:
                    found = _storages(finder, i, found, root)
                except Exception:  # noqa: BLE001 - its storages stand, their paths unknown
                    reacher.current_root = root.name
                    reacher.refuse(root.obj)
                    clean.discard(i)
                if warm_pass is not None and i in clean:
                    _keep(warm_pass, finder, i, root, found, count)
                if steps.due():
                    yield from steps.step()
            elif warm_pass is not None and i in clean:
                warm_pass.keep(i, root, found, count, None)
            reach[i] = Reach(found, count)
        if warm_pass is not None and not out_of_time:
            warm_pass.end()   # (a scan cut short forgets none of the roots it did not meet)
    finally:
        steps.end()
        if warm_pass is not None:
            warm_pass.close()
    # one allocation, one key, among the roots that reach a storage (a long notebook's
    # names mostly reach none): each one's reused record (a Kept), or None
    holding = list(compress(range(len(roots)), map(_STORAGES, reach)))
    held = list(map(reach.__getitem__, holding))
    keyed = by_allocation(held, [walked[i] if kept[i] else None for i in holding], warm)
    if keyed is not held:
        for i, r in zip(holding, keyed):
            reach[i] = r
    result = ScanResult(roots, reach, reacher.partial, reacher.reasons,
                        time.perf_counter() - start, reacher.errors,
                        reacher.refusals.kept, kept, out_of_time, notes)
    result._holding = (reach, holding)   # (one allocation, one key empties no root's)
    finder.result = weakref.ref(result)
    if finder.exhausted:   # a path read for what is kept took the last of the time
        finder.say_partial()
    return result


def _proven_empty(reacher: Reacher, objs: list, deadline: float) -> list:
    """For each of ``objs``, whether it is proven to reach nothing (see
    :meth:`Reacher.reach_nothing`); none where the proof failed."""
    try:
        return reacher.reach_nothing(objs, deadline, SMALL_ROOT)
    except Exception:  # noqa: BLE001 - nothing proven: each root is walked as usual
        return bytearray(len(objs))


def readable(node: Any) -> bool:
    """Whether a storage's path node can be read: a warm scan keeps only each holder's
    largest path (the others are :class:`~.warm.Unread`)."""
    return type(node) is not Unread


#: a root whose object is a dict, list, tuple or set of at most this many items, or of
#: another type (an instance), is first tried with the others in Reacher.reach_nothing
SMALL_ROOT = 256


#: the roots a partial result names (the rest are counted)
_NAMED_CUT = 5


def time_reason(names: list[str], count: int) -> str:
    """Why a scan is partial when its time limit cut ``count`` roots short (or never
    reached them), the first of them ``names``: one reason, whatever their number."""
    more = count - len(names)
    return f"time limit reached in {', '.join(names)}" + (f" and {more:,} more names" if more > 0 else "")


def _keep(warm_pass: Any, finder: PathFinder, i: int, root: Root, found: dict,
          count: int) -> None:
    """Root ``i``'s walk, kept for the next scan with its largest storage's path read
    now (as the report reads it); nothing kept where the paths' time ran out."""
    errors = finder.errors
    path = format_path(found[next(iter(found))][1])
    if finder.exhausted or finder.errors != errors:
        warm_pass.drop(root)
    else:
        warm_pass.keep(i, root, found, count, (None, ("root", path)))


class _Steps:
    """The collector paused while the scan works (see :class:`paused_gc`), and a step
    (a yield of :func:`iter_scan`, the collector running again) now and then: every
    few milliseconds, not after each root. ``taken`` counts the steps."""

    __slots__ = ("_was_enabled", "_paused", "_until", "taken")

    def __init__(self) -> None:
        self._paused = False
        self.taken = 0
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
        self.taken += 1
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
