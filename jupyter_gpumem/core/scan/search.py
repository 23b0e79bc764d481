"""The second pass of a scan: the path a user would type to each storage shown.

Paths are looked for only inside the roots that reach storages, and only when asked for.
The path to a storage is the first met in this order: through attributes, items and
registered children before any hidden step (a closure, a frame, an autograd graph ...);
then the shortest; then the first in registration order. A best-first search over
labelled edges (:mod:`.labels`), keyed by ``(hidden steps, steps)``. The order's rules
and why: docs/ARCHITECTURE.md#the-walk-and-the-path-search.
"""
from __future__ import annotations

import gc
import heapq
import time
from itertools import chain, compress, groupby, islice, repeat
from operator import itemgetter
from typing import Any

from .labels import LABELLED, LONG, LongPairs, long_pairs, size_of
from .types import TENSOR, classify, keyable
from .types import ATOMIC_IDS as _ATOMIC_IDS

#: labels that go through what a user would not type first
HIDDEN = frozenset({"closure", "default", "local", "graph", "ref", "lru"})
#: how many accessors a label shows (``.param_groups[0]['params'][3]`` is four); others one
_STEPS = {"key": 2, "flat": 2, "attr_index": 2, "attr_item": 2, "opt_param": 4,
          "opt_group": 3, "opt_state": 3, "opt_state_key": 2, "graph": 2}
_ONE_STEP = frozenset({"root", "attr", "item", "index", "elem"})
UNKNOWN = ("unknown",)
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_PROBE = 1024      # a container this long is first asked whether it leads anywhere
_LOOK_SLICE = 512  # children looked at in one C-level pass, for the tensors among them
is_tracked = gc.is_tracked


class OutOfBudget(Exception):
    """The time given to the path search is spent."""


class LazyNode(tuple):
    """A path node found when it is first read (``parent, label = node``): made as
    ``LazyNode((finder, root index, storage key))``, in C-level passes."""

    __slots__ = ()

    def __iter__(self):
        finder, root, key = tuple.__iter__(self)
        return iter(finder.node(root, key))


class Nodes:
    """``nodes(keys)``: the :class:`LazyNode` of each storage key found in root ``root``
    of ``finder``. ``args`` (the node type and its head) lets the C core's batch loop
    make the same nodes itself."""

    __slots__ = ("args",)

    def __init__(self, finder: Any, root: int) -> None:
        self.args = (LazyNode, (finder, root))

    def __call__(self, keys: Any) -> Any:
        finder, root = self.args[1]
        return map(LazyNode, zip(repeat(finder), repeat(root), keys))


class _Search:
    """Where the search inside one root stands: it goes on from there when asked for
    a storage it has not met yet.

    A bucket holds, for one key, blocks ``(parent node, [(label, child), ...])``: the
    children of one expanded object, in its order (a child's node is ``(parent node,
    label)``, or the parent's where the label is None: a step the path does not show).
    """

    __slots__ = ("root_node", "want", "nodes", "buckets", "heap", "key", "blocks",
                 "checked", "look_from", "expanded_blocks", "child", "early", "expanded", "done",
                 "graph")

    def __init__(self, name: str, obj: Any, want: set, graph: dict) -> None:
        self.root_node = (None, ("root", name))
        self.want = want           # storage keys not met yet
        self.nodes: dict = {}      # storage key -> path node
        self.graph = graph         # id(tensor) -> its autograd edges, as the first pass saw them
        self.key = (0, 0)
        self.blocks: list = [(None, [(("root", name), obj)])]
        self.buckets = {self.key: self.blocks}
        self.heap: list = []
        self.checked = 0           # blocks of this key looked at for storages
        self.look_from = 0         # in the next block to look at, the child to go on from
        self.expanded_blocks = 0   # blocks of this key expanded, and in the next one
        self.child = 0             # the next child to expand
        self.early = False
        self.expanded: dict[int, Any] = {}   # id -> object: its path is final
        self.done = False


class PathFinder:
    """Canonical paths inside the roots of one scan (see the module docstring).

    It holds the roots and the first pass's record of each tensor (never a
    reference cycle: it goes when the scan's result goes)."""

    def __init__(self, reacher: Any, budget: float, max_depth: int) -> None:
        self.reacher = reacher
        self.kinds = reacher.kinds
        self.tensor_types = reacher.tensor_backend
        self.stop = reacher.stop
        self.untracked_is_empty = reacher.untracked_is_empty
        self.max_depth = max_depth
        self.budget = budget          # seconds of searching left, over every root
        self.exhausted = False
        self.result: Any = None       # a weak reference to the ScanResult, to say it is partial
        self._roots: dict[int, tuple] = {}
        self._searches: dict[int, _Search] = {}
        self._until = 0.0
        self._ticks = 0
        self.errors = 0
        self.layouts: dict[type, tuple] = {}
        self._tensor_ids: tuple | None = None   # (how many tensor types, their ids)

    def add_root(self, i: int, name: str, obj: Any, keys: Any, graph: dict) -> None:
        """Root ``i`` reaches the storages ``keys`` (``graph``: its autograd edges)."""
        self._roots[i] = (name, obj, set(keys), graph)

    def root_is_met(self, i: int, obj: Any) -> None:
        """A root that is a tensor: its own storages' path is the root's name."""
        if keyable(obj) and type(obj) in self.tensor_types:
            search = self._search(i)
            self._tensor_met(search, obj, search.root_node, None)
            if not search.want:
                self._finish(search)

    # -- asking ---------------------------------------------------------------------------
    def node(self, i: int, key: tuple) -> tuple:
        """The path node of storage ``key`` inside root ``i``."""
        search = self._search(i)
        got = search.nodes.get(key)
        if got is None and not search.done and key in search.want:
            self._run(search, lambda: key in search.nodes)
            got = search.nodes.get(key)
        return got if got is not None else (search.root_node, UNKNOWN)

    def first_of(self, i: int, wanted) -> tuple | None:
        """The first storage of root ``i`` in canonical order for which ``wanted(key)``
        is true (None when the search could not tell in its time)."""
        search = self._search(i)
        for key in search.nodes:
            if wanted(key):
                return key
        hit: list = []
        self._run(search, hit.__len__, lambda key: wanted(key) and hit.append(key))
        return hit[0] if hit else None

    def _search(self, i: int) -> _Search:
        search = self._searches.get(i)
        if search is None:
            name, obj, keys, graph = self._roots[i]
            search = self._searches[i] = _Search(name, obj, set(keys), graph)
        return search

    # -- searching -------------------------------------------------------------------------
    def _run(self, search: _Search, enough, on_found=None) -> None:
        if self.exhausted or search.done:
            return
        start = time.perf_counter()
        self._until = start + self.budget
        try:
            self._advance(search, enough, on_found)
        except OutOfBudget:
            self.exhausted = True
            self.say_partial()
        finally:
            self.budget = max(self.budget - (time.perf_counter() - start), 0.0)

    def say_partial(self) -> None:
        """The result this finder's paths belong to is partial (its time ran out)."""
        result = self.result() if self.result is not None else None
        if result is not None:
            result.partial = True
            text = "time limit reached while looking for paths (some shown as →…)"
            if text not in result.reasons:
                result.reasons.append(text)

    def check_time(self) -> None:
        """Raise :class:`OutOfBudget` once the search's time is spent."""
        if time.perf_counter() > self._until:
            raise OutOfBudget

    def _tick(self) -> None:
        self._ticks += 1
        if not self._ticks & 255 and time.perf_counter() > self._until:
            raise OutOfBudget

    def _advance(self, s: _Search, enough, on_found) -> None:
        """Go on until ``enough()`` or every storage is met (then the search is done)."""
        while True:
            key, blocks = s.key, s.blocks
            # every child at this key is looked at before any is expanded
            while s.checked < len(blocks):
                parent, pairs = blocks[s.checked]
                self._tick()
                stopped = self._look(s, parent, pairs, on_found, enough, s.look_from)
                if stopped is None:
                    s.checked += 1
                    s.look_from = 0
                    continue
                s.look_from = stopped
                if not s.want:
                    return self._finish(s)
                return
            if s.expanded_blocks == 0 and s.child == 0:
                # a storage met among the children of this key's objects comes first at
                # the next key if nothing was waiting there already: it is looked at at once
                s.early = (key[0], key[1] + 1) not in s.buckets
            while s.expanded_blocks < len(blocks):
                parent, pairs = blocks[s.expanded_blocks]
                n = len(pairs)
                while s.child < n:
                    label, child = pairs[s.child]
                    s.child += 1
                    if self._expand(s, parent, label, child, key,
                                    on_found if s.early else False, enough):
                        if not s.want:
                            return self._finish(s)
                        return
                s.expanded_blocks += 1
                s.child = 0
            del s.buckets[key]
            if not s.heap:
                return self._finish(s)
            s.key = heapq.heappop(s.heap)
            s.blocks = s.buckets[s.key]
            s.checked = s.look_from = s.expanded_blocks = s.child = 0

    def _finish(self, s: _Search) -> None:
        s.done = True
        s.buckets = {}
        s.heap = []
        s.blocks = []
        s.expanded = {}

    def _leads_on(self, s: _Search, obj: Any, n: int) -> bool:
        """Whether ``obj``, a container of ``n`` items (see :func:`.labels.size_of`), leads to a
        storage not met yet: asked at C speed of a long one (a list of a million records
        is not read at the speed of paths)."""
        if n < _PROBE:
            return True
        got = self.reacher.leads_to([obj], s.want, s.graph, self._until)
        if got is None:
            raise OutOfBudget
        return got

    def _look(self, s: _Search, parent: tuple | None, pairs: list, on_found, enough,
              start: int = 0) -> int | None:
        """Meet the tensors among ``pairs`` from ``start`` on: their storages' paths are
        final. Where one met makes ``enough()`` (or all are met), the index to go on
        from; None when every one was looked at."""
        ids = self._tensor_ids
        if ids is None or ids[0] != len(self.tensor_types):   # a tensor type learned since
            ids = self._tensor_ids = (len(self.tensor_types), frozenset(map(id, self.tensor_types)))
        is_tensor = ids[1].__contains__
        n = len(pairs)
        values = pairs.values if type(pairs) is LongPairs else None
        # in slices: the first storage looked for is often near the start of a long
        # block (an optimizer's ten thousand children), so most of it is never read
        for lo in range(start, n, _LOOK_SLICE):
            hi = min(lo + _LOOK_SLICE, n)
            self.check_time()
            # by the types' ids: a class whose metaclass defines __hash__ is never hashed
            part = values[lo:hi] if values is not None else map(_SECOND, pairs[lo:hi])
            mask = list(map(is_tensor, map(id, map(type, part))))
            if not any(mask):
                continue
            for j in compress(range(lo, hi), mask):
                label, child = pairs[j]
                if self._tensor_met(s, child, (parent, label) if label is not None else parent,
                                    on_found) and (not s.want or enough()):
                    return j + 1
        return None

    def _tensor_met(self, s: _Search, obj: Any, node: tuple, on_found) -> bool:
        memo = self.reacher.tensor_record(obj)
        if memo is None:
            return False
        hit = False
        # a tensor of several parts (sparse): each storage's path names its part
        parts = self.reacher.parts_of(obj) if len(memo[1]) > 1 else None
        for info in memo[1]:
            k = info[0]
            if k in s.want:
                s.want.discard(k)
                part = parts.get(k) if parts else None
                s.nodes[k] = node if part is None else (node, part[0])
                hit = True
                if on_found is not None:
                    on_found(k)
        return hit

    def _expand(self, s: _Search, parent: tuple | None, label: Any, obj: Any, key: tuple,
                early, enough) -> bool:
        """Put what ``obj`` holds in the buckets after ``key``; with ``early`` (not False:
        the ``on_found`` to call), look at once at the storages met at the next key.
        True when one met was ``enough()``."""
        self._tick()
        tp = type(obj)
        if id(tp) in _ATOMIC_IDS or (self.untracked_is_empty and (tp is dict or tp is tuple)
                                     and not is_tracked(obj)):
            return False
        if not keyable(obj):
            kind = classify(tp, ())[0]     # by its C-level layout; the class never hashed
        else:
            kind = self.kinds.get(tp)
            if kind is None:
                self.reacher.learn({tp})
                kind = self.kinds.get(tp)
        oid = id(obj)
        if oid in s.expanded or (oid in self.stop and kind != TENSOR):
            return False
        s.expanded[oid] = obj
        n = size_of(obj, kind)
        if key[1] >= self.max_depth or not self._leads_on(s, obj, n):
            return False
        node = (parent, label) if label is not None else parent
        try:
            if n >= _PROBE and kind in LONG:
                pairs = long_pairs(self, obj, kind)
            elif kind == TENSOR:
                memo = self.reacher.tensor_record(obj)
                pairs = list(chain(memo[2] or () if memo is not None else (),
                                   s.graph.get(oid, ())))
            else:
                handler = LABELLED.get(kind)
                if handler is None:
                    return False
                pairs = list(handler(self, obj))
        except OutOfBudget:
            raise
        except Exception:
            self.errors += 1
            return False
        if not pairs:
            return False
        if type(pairs) is LongPairs:
            groups = ((_cost(pairs.kind or "elem"), pairs),)   # one kind of step
        elif None not in (labels := list(map(_FIRST, pairs))) and \
                _ONE_STEP.issuperset(map(_FIRST, labels)):
            groups = (((0, 1), pairs),)   # the common case: plain steps of one accessor
        else:
            groups = _split(pairs)
        met = False
        for (hidden, steps), block in groups:
            self._add(s, (key[0] + hidden, key[1] + steps), (node, block))
            if early is not False and not hidden and steps == 1:
                met = self._look(s, node, block, early, enough) is not None
        return met

    @staticmethod
    def _add(s: _Search, key: tuple, block: tuple) -> None:
        bucket = s.buckets.get(key)
        if bucket is None:
            bucket = s.buckets[key] = []
            heapq.heappush(s.heap, key)
        bucket.append(block)


def _split(pairs: list) -> list:
    """``pairs`` in groups by the cost of their step: ``((hidden steps, steps), pairs)``,
    in the order of the first of each group. In C-level passes: an optimizer's children
    are ten thousand pairs of a few kinds, each kind in one run (then the groups are
    slices of the runs)."""
    labels = list(map(_FIRST, pairs))
    if None not in labels:
        kinds = list(map(_FIRST, labels))
        runs = [(kind, len(list(run))) for kind, run in islice(groupby(kinds), _RUNS + 1)]
        if len(runs) <= _RUNS and all(kind in _COST for kind, _ in runs):
            groups: dict = {}
            at = 0
            for kind, n in runs:
                groups.setdefault(_COST[kind], []).append(slice(at, at + n))
                at += n
            if len(groups) == 1:
                return [(next(iter(groups)), list(pairs))]
            return [(cost, list(chain.from_iterable(map(pairs.__getitem__, cuts))))
                    for cost, cuts in groups.items()]
        costs = list(map(_COST.get, kinds))
        if None in costs:
            costs = None
    else:
        costs = None
    if costs is None:   # a step the path does not show (a cell, a frame), or a new kind
        costs = [(0, 1) if label is None else _cost(label[0]) for label in labels]
    kinds = list(dict.fromkeys(costs))
    if len(kinds) == 1:
        return [(kinds[0], list(pairs))]
    return [(cost, list(compress(pairs, map(cost.__eq__, costs)))) for cost in kinds]


_RUNS = 16   # more runs of one kind than this: the pairs are grouped by compress


def _cost(kind: str) -> tuple:
    return (int(kind in HIDDEN), _STEPS.get(kind, 1))


#: label kind -> its step's cost, for every kind a handler labels with
_COST = {kind: _cost(kind) for kind in HIDDEN | _ONE_STEP | set(_STEPS) | {
    "key", "state_key", "attr_item", "opt_state", "cell", "frame", "closure"}}
