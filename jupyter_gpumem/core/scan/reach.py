"""The first pass of a scan: which storages each root reaches, in C-level passes.

A breadth-first walk, a level a chunk at a time through ``gc.get_referents`` (no user
code runs); objects that need care (tensors, models, modules, frames ...) are taken out by
exact type and read through C-level slots. Where the C core is built (:data:`NATIVE`,
``core/_reach_parts/walk.c``) it walks the plain objects at C speed instead; both walks
find the same storages (tests/core/scan/test_native.py). No path is kept here
(:mod:`jupyter_gpumem.core.scan.search`). The story:
docs/ARCHITECTURE.md#the-walk-and-the-path-search.
"""
from __future__ import annotations

import gc
import sys
import time
from collections import OrderedDict, defaultdict, deque
from itertools import compress, islice
from operator import itemgetter, not_
from typing import Any

from ...backends import Backend
from ...backends.base import dict_descriptor
from . import native
from .kinds import BIG, HANDLERS
from .proof import SmallRoots
from .steps import run_to_end
from .tensors import TensorTaking, no_nodes
from .types import (ATOMIC, BUILTIN, CELL, CONTAINER, DICT, EXCEPTION, HAVE_GC, INSTANCE, LRU,
                    METHOD, NDARRAY, PARTIAL, SEQ, SET, SKIP, TENSOR, TRACEBACK, TYPE_FLAGS,
                    OutOfTime, Refusals, classify, keyable, split_keyable, untracked_holds_nothing)
from ...backends.base import is_a, with_room

_native = native.CORE   # the C core (built with the package where a compiler was found)

CHUNK = 4096            # objects whose referents are read in one call
SLICE = 1 << 16         # items per slice of a long container
_PLAIN = frozenset({dict, list, tuple, set, frozenset})
#: exact types whose C length and items the walk reads (a long one in slices)
_BASE_OF = {dict: dict, list: list, tuple: tuple, set: set, frozenset: frozenset,
            OrderedDict: dict, defaultdict: dict, deque: deque}
_SIZED = frozenset(_BASE_OF)
#: kinds read by ``gc.get_referents``: what the gc sees is what the walk follows
_BY_REFERENTS = frozenset({DICT, SEQ, SET, METHOD, BUILTIN, PARTIAL, LRU, CELL, TRACEBACK,
                           EXCEPTION, INSTANCE})
_SECOND = itemgetter(1)

is_tracked = gc.is_tracked
get_referents = gc.get_referents
getrefcount = sys.getrefcount


class _Hit(Exception):
    """In :meth:`Reacher.leads_to`: a storage looked for is reached."""


def _refcount_base() -> int | None:
    """What ``sys.getrefcount`` says, in :meth:`Reacher._admit_tracked`, of an object
    that only its parent holds (None where counts are not exact: free threading)."""
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return None
    counts = _probe([[[]]])
    return counts[0] if counts else None


def _probe(objs: list) -> list:
    tracked = list(filter(is_tracked, get_referents(*objs)))
    return list(map(getrefcount, tracked))


_BASE = _refcount_base()

#: the C walker's type, or None: the walk is then all Python (the same objects, the same
#: answers). It needs exact reference counts; JUPYTER_GPUMEM_PURE_SCAN=1 turns it off
#: (and every other use of the C core: see :mod:`.native`).
NATIVE = _native.Walker if _native is not None and _BASE is not None else None
NATIVE_SLICE = 0.004   # seconds of one C run: the walk can yield (or stop) between two
#: the C core's loop over many plain tensors (see Backend.batch_spec), or None: the
#: backend's take_many and the C-level passes of :meth:`Reacher._take_batch`
TAKE_BATCH = getattr(_native, "take_batch", None) if NATIVE is not None else None


class Reacher(TensorTaking, SmallRoots):
    """Walks roots, one at a time, to the storages they reach (see the module docstring).

    One instance per scan: it remembers the kind of every type it met, and each
    tensor's storages and edges (``memo``), which the path search reads later.
    """

    def __init__(self, backends: list[Backend], devices: set[str] | None, stop_ids: set[int],
                 extra_stop: set[int] | None, max_depth: int, describe: bool) -> None:
        self.backends = backends
        self.devices = devices
        self.stop = set(stop_ids) | set(extra_stop or ())
        # objects only one other holds are not remembered, so a stopped one among them
        # is looked for by id, but only where the caller stops objects of its own
        self.check_singles = bool(extra_stop)
        self.max_depth = max_depth
        self.describe = describe
        self.deadline = float("inf")
        self.partial = False
        self.out_of_time = False
        self.reasons: list[str] = []
        self.refusals = Refusals()
        self.current_root: str | None = None
        # exact type -> kind, and the backend of tensor and container types
        self.kinds: dict[type, str] = dict.fromkeys(ATOMIC, "atom")
        self.backend_of: dict[type, Backend] = {}
        self.tensor_backend: dict[type, Backend] = {}
        self._by_referents: set[type] = set(_PLAIN)   # read through gc.get_referents
        self._learned: set[type] = set(ATOMIC)
        self.untracked_is_empty = untracked_holds_nothing(backends)
        # types the collector does not track whose instances still matter: numpy arrays
        # (an object array holds tensors), tensors of a framework whose types are not
        # collectable (and then dicts and tuples the collector leaves untracked)
        self._watch: set[type] = set()
        numpy = sys.modules.get("numpy")
        if is_a(getattr(numpy, "ndarray", None), type):
            self._watch |= _subclasses(numpy.ndarray)
        for backend in backends:   # a framework's own object the collector does not
            try:                   # track (torch's saved tensors, held by checkpoint)
                self._watch.update(t for t in backend.container_types()
                                   if not TYPE_FLAGS(t) & HAVE_GC)
            except Exception:
                pass
        if not self.untracked_is_empty:
            self._watch |= {dict, tuple}
            for backend in backends:
                try:
                    self._watch.update(t for t in backend.tensor_types()
                                       if not TYPE_FLAGS(t) & HAVE_GC)
                except Exception:
                    pass
        self._watching = bool(self._watch)
        # id(tensor) -> [tensor, storages, edges the same for every root (a tuple) or None]
        self.memo: dict[int, list] = {}
        #: id -> (storages, held label, held) of the tensors taken in batches (no graph),
        #: alive while the roots are: a tensor met again (a model's parameters, then its
        #: optimizer's) is not asked again within one scan
        self._batched: dict[int, tuple] = {}
        self._probe: tuple | None = None    # (storages looked for, graph) in leads_to
        self._batch_types: dict[int, frozenset] = {}
        self._batch_specs: dict[int, tuple | None] = {}   # id(backend) -> its batch_spec()
        self._seen: dict[int, Any] = {}
        self._next: list = []
        self._found: dict = {}
        self._node: Any = no_nodes
        self._graph_seen: dict = {}
        self.graph_edges: dict[int, list] = {}   # of the root being walked: id(tensor) -> edges
        self.children_of: dict[int, tuple] = {}  # id(model or optimizer) -> (it, its children)
        # the C walker: the plain objects of a level go through it (None: all in Python)
        self.native = None if NATIVE is None else NATIVE(
            self._by_referents, self._watch, self.stop, self.check_singles, max_depth,
            time.perf_counter)
        # the C core's loop over many plain tensors, with the C walker (or neither)
        self._c_batch = TAKE_BATCH if self.native is not None else None
        if self.native is not None:
            for tp in self._learned:
                self.native.learn(tp, tp in self._by_referents, tp in self._watch)
        self._depth = 0   # of the level being expanded
        self.learn(set(_SIZED))

    # -- bookkeeping -----------------------------------------------------------------
    @property
    def taken(self) -> dict:
        """id -> (storages, held label, held) of the tensors taken in batches by this
        scan so far (the warm scan's fingerprint reads them instead of each tensor)."""
        return self._batched

    @property
    def errors(self) -> int:
        """How many objects refused introspection (see :meth:`refuse`)."""
        return self.refusals.count

    def refuse(self, obj: Any, tp: type | None = None) -> None:
        """``obj`` (or objects of type ``tp``) could not be read: skipped and counted,
        with where it was met."""
        self.refusals.add(type(obj) if tp is None else tp, self.current_root)

    def stop_walk(self, reason: str) -> None:
        """The result is partial, for ``reason``."""
        self.partial = True
        text = f"{reason} in {self.current_root}" if self.current_root else reason
        if text not in self.reasons:
            self.reasons.append(text)

    def _check_time(self) -> None:
        if time.perf_counter() > self.deadline:
            self.out_of_time = True
            raise OutOfTime

    def _learn_one(self, tp: type) -> None:
        try:
            kind, backend = classify(tp, self.backends)
        except RecursionError:
            # a deep stack (a low limit of the user's) says nothing of the type: it is
            # asked again with room, not skipped for the whole scan
            got = with_room(classify, tp, self.backends)
            kind, backend = got if got is not None else (SKIP, None)
            if got is None:
                self.refuse(None, tp)
        except Exception:
            kind, backend = SKIP, None
            self.refuse(None, tp)
        self.kinds[tp] = kind
        self._learned.add(tp)
        if backend is not None:
            self.backend_of[tp] = backend
            if kind == TENSOR:
                self.tensor_backend[tp] = backend
        if kind in _BY_REFERENTS or tp in _SIZED or \
                (kind == CONTAINER and backend.gc_sees_all(tp)):
            self._by_referents.add(tp)
        try:
            collectable = TYPE_FLAGS(tp) & HAVE_GC
        except Exception:
            collectable = True
        if not collectable and kind in (TENSOR, NDARRAY):
            self._watch.add(tp)
            self._watching = True
        if self.native is not None:
            self.native.learn(tp, tp in self._by_referents, tp in self._watch)

    def learn(self, kinds: set) -> None:
        """Classify the types in ``kinds`` not met before."""
        for tp in kinds - self._learned:
            self._learn_one(tp)

    # -- one root ------------------------------------------------------------------------
    def walk(self, obj: Any, node: Any = None) -> tuple[dict, int]:
        """The storages ``obj`` reaches (key -> (info, path node, description)) and how
        many objects the walk expanded. Stops at the deadline (``out_of_time``).

        ``node(keys)``: the path nodes of those storages (by default ``None`` each)."""
        return run_to_end(self.walk_steps(obj, node))

    def walk_steps(self, obj: Any, node: Any = None, due: Any = None):
        """:meth:`walk` as a generator that yields between two chunks once ``due()``
        says so, and returns what :meth:`walk` returns."""
        found: dict = {}
        self._found = found
        self._node = node if node is not None else no_nodes
        if self.untracked_is_empty and (type(obj) is dict or type(obj) is tuple) and not is_tracked(obj):
            return found, 1   # atoms only (see untracked_holds_nothing)
        self._seen = {id(obj): obj}
        self._graph_seen = {}
        self.graph_edges = {}
        level = [obj]
        count = 0
        depth = 0
        native = self.native
        try:
            tp = type(obj)
            if keyable(obj) and tp in self.tensor_backend:   # a tensor: taken at once
                self._next = []
                self._take_tensors(level, [tp])
                level, count, depth = self._next, 1, 1
            while level:
                if depth > self.max_depth:
                    self.stop_walk(f"structure deeper than {self.max_depth} levels cut")
                    break
                self._next = []
                self._depth = depth
                n = len(level)
                for start in range(0, n, CHUNK):
                    self._check_time()
                    if due is not None and due():
                        yield   # between two chunks: what the walk holds stays as it is
                    self._expand(level[start:start + CHUNK] if n > CHUNK else level)
                    while native is not None and native.pending:
                        self._check_time()
                        if due is not None and due():
                            yield   # between two C runs
                        got, _ = native.run(min(self.deadline, time.perf_counter() + NATIVE_SLICE))
                        if got:   # what is not plain: classified, then taken as Python does
                            self.learn(set(map(type, got)))
                            self._admit(got)
                count += n
                level = self._next
                depth += 1
            if native is not None and native.deep:
                self.stop_walk(f"structure deeper than {self.max_depth} levels cut")
        except OutOfTime:
            pass
        finally:
            if native is not None:
                count += native.count
                native.clear()
            self._next = []
            self._seen = {}
            self._graph_seen = {}
            self._found = {}
            self._node = no_nodes   # it refers to the path finder, which refers back here
        return found, count

    def leads_to(self, objs: list, wanted: set, graph: dict, deadline: float) -> bool | None:
        """Whether ``objs`` reach one of the storages ``wanted`` (None: the deadline came
        first; True where the depth limit cut the walk: what lies past it is not known).
        A walk like :meth:`walk` that takes no tensor: it looks each one up in what this
        scan knows (``graph``: the root's autograd edges), so no backend runs and no graph
        node is read again. ``wanted`` None: whether they reach any tensor or framework
        container (a model, a graph node) at all."""
        saved = (self.deadline, self.out_of_time, self.partial, list(self.reasons))
        self._probe = (wanted, graph)
        self.deadline = deadline
        self.out_of_time = self.partial = False
        try:
            for obj in objs:
                self.walk(obj)
                if self.out_of_time or self.partial:
                    return None if self.out_of_time else True
            return False
        except _Hit:
            return True
        finally:
            self._probe = None
            self.deadline, self.out_of_time, self.partial, self.reasons[:] = saved

    def _look_up(self, tensors: list) -> None:
        """In :meth:`leads_to`: tensors met are looked up, not taken (any is a hit where
        anything is looked for: ``wanted`` None)."""
        wanted, graph = self._probe
        if wanted is None and tensors:
            raise _Hit
        children: list = []
        for t in tensors:
            rec = self.tensor_record(t)
            if rec is None:
                continue
            for info in rec[1]:
                if info[0] in wanted:
                    raise _Hit
            children += map(_SECOND, rec[2] or ())
            children += map(_SECOND, graph.get(id(t), ()))
        if children:
            self._admit(children)

    # -- a chunk of one level ------------------------------------------------------------
    def _expand(self, part: list) -> None:
        part, odd = split_keyable(part)
        if odd:
            self._keyless(odd)
            if not part:
                return
        kset = set(map(type, part))
        if not kset <= self._learned:
            self.learn(kset)
        if kset <= self._by_referents:
            if self.native is not None:
                self.native.push(part if type(part) is list else list(part), self._depth)
            else:
                self._by_gc(part, None, kset)
            return
        kinds_ = list(map(type, part))
        mask = list(map(self._by_referents.__contains__, kinds_))
        if any(mask):
            gen = list(compress(part, mask))
            if self.native is not None:
                self.native.push(gen, self._depth)
            else:
                gen_kinds = list(compress(kinds_, mask))
                self._by_gc(gen, gen_kinds, set(gen_kinds))
        rest = list(compress(part, map(not_, mask)))
        rest_kinds = list(compress(kinds_, map(not_, mask)))
        self._one_by_one(rest, rest_kinds)

    def _keyless(self, objs: list) -> None:
        """Objects whose class cannot be a key (its metaclass defines ``__eq__`` or
        ``__hash__``: see :func:`~.types.keyable_meta`): never classified, read
        through their type's traverse (the C core walks them itself, as plain)."""
        objs = [o for o in objs if is_tracked(o) and id(o) not in self.stop]
        if not objs:
            return
        if self.native is not None:
            self.native.push(objs, self._depth)
        else:
            self._admit(get_referents(*objs))

    def _by_gc(self, objs: list, kinds_: list | None, kset: set) -> None:
        """What the garbage collector sees in ``objs``; a long dict, list, tuple or set
        is read in slices (the time limit is looked at between them)."""
        if not kset.isdisjoint(_SIZED):
            if kset <= _SIZED:
                plain = objs
            else:
                if kinds_ is None:
                    kinds_ = list(map(type, objs))
                plain = list(compress(objs, map(_SIZED.__contains__, kinds_)))
            if max(map(len, plain)) > BIG:   # exact builtin types: their C length
                lens = list(map(len, plain))
                big = set(map(id, compress(plain, map(BIG.__lt__, lens))))
                for o in plain:
                    if id(o) in big:
                        self.in_slices(o, _BASE_OF[type(o)])
                objs = [o for o in objs if id(o) not in big]
                if not objs:
                    return
        self._admit_referents(objs)

    def _admit_referents(self, objs: list) -> None:
        refs, odd = split_keyable(get_referents(*objs))
        if odd:
            self._admit(odd)
        if self._watching and not self._watch.isdisjoint(map(type, refs)):
            self._admit_watched(refs)
        tracked = list(filter(is_tracked, refs))
        del refs   # the counts below must see only the parent's reference and ours
        self._admit_tracked(tracked)

    def _admit_watched(self, refs: list) -> None:
        watch = self._watch
        self._admit([r for r in refs if type(r) in watch and not is_tracked(r)])

    def _admit_tracked(self, tracked: list) -> None:
        """Objects the collector tracks, read from their parents: those only their parent
        holds go on at once; the others once, by id."""
        if not tracked:
            return
        base = _BASE
        if base is not None:
            counts = list(map(getrefcount, tracked))
            if counts.count(base) == len(counts):
                self._singles(tracked)
                return
            single = list(map(base.__eq__, counts))
            self._singles(list(compress(tracked, single)))
            tracked = list(compress(tracked, map(not_, single)))
        self._admit(tracked)

    def _singles(self, objs: list) -> None:
        if self.check_singles and objs:
            stop = self.stop
            if not stop.isdisjoint(map(id, objs)):
                tensor_types = self.tensor_backend
                objs = [o for o in objs if id(o) not in stop or type(o) in tensor_types]
        self._next += objs

    def _admit(self, objs: list) -> None:
        """Objects met for the first time in this root's walk go on, by id: what the
        collector tracks (no atoms; no dict or tuple of atoms only) and the untracked
        objects that still matter (numpy arrays). A stopped one goes on only if it is a
        tensor (a tensor is counted wherever it is met)."""
        if not objs:
            return
        objs, odd = split_keyable(objs)
        if odd:
            fresh_odd = {id(o): o for o in odd if id(o) not in self._seen}
            self._seen.update(fresh_odd)
            self._keyless(list(fresh_odd.values()))
            if not objs:
                return
        if self._watching:
            kinds_ = set(map(type, objs))
            if not kinds_ <= self._learned:
                self.learn(kinds_)
            if not kinds_.isdisjoint(self._watch):
                watch = self._watch
                objs = [o for o in objs if is_tracked(o) or type(o) in watch]
            else:
                objs = list(filter(is_tracked, objs))
        else:
            objs = list(filter(is_tracked, objs))
        fresh = dict(zip(map(id, objs), objs))
        seen = self._seen
        for k in fresh.keys() & seen.keys():
            del fresh[k]
        stopped = fresh.keys() & self.stop
        for k in stopped:
            if self.kinds.get(type(fresh[k])) != TENSOR:
                del fresh[k]
        seen.update(fresh)
        self._next += fresh.values()

    # -- a long container, in slices -------------------------------------------------------
    def in_slices(self, obj: Any, tp: type) -> None:
        try:
            if tp is list:
                n = list.__len__(obj)
                for start in range(0, n, SLICE):
                    self._check_time()
                    self._admit_slice(list.__getitem__(obj, slice(start, start + SLICE)))
            elif tp is dict:
                keys = dict.keys(obj)
                atoms, odd = split_keyable(list(keys))
                if odd or not ATOMIC.issuperset(map(type, atoms)):
                    self.admit_iter(iter(keys))
                self.admit_iter(iter(dict.values(obj)))
            else:
                self.admit_iter(tp.__iter__(obj))
            if type(obj) is not tp:   # a subclass: what its instance holds besides
                self._admit(self._own(obj))
        except OutOfTime:
            raise
        except Exception:
            self.refuse(obj)   # changed while read, by another thread

    @staticmethod
    def _own(obj: Any) -> list:
        tp = type(obj)
        d = dict_descriptor(tp)
        own = d.__get__(obj) if d is not None else None
        return [tp] + ([own] if own is not None else [])

    def admit_iter(self, it: Any) -> None:
        """What ``it`` gives, admitted a slice at a time (the time limit looked at between two)."""
        while True:
            self._check_time()
            chunk = list(islice(it, SLICE))
            n = len(chunk)
            if n:
                self._admit_slice(chunk)
            if n < SLICE:
                return

    def _admit_slice(self, refs: list) -> None:
        kept, odd = split_keyable(refs)
        if odd:
            refs.clear()    # the split made new lists: the slice's references must not count
            refs = kept
            self._admit(odd)
        if ATOMIC.issuperset(map(type, refs)):
            return   # a slice of atoms (a list of strings): one C-level pass
        if self._watching and not self._watch.isdisjoint(map(type, refs)):
            self._admit_watched(refs)
        tracked = list(filter(is_tracked, refs))
        refs.clear()   # the slice's own references must not count
        self._admit_tracked(tracked)

    # -- objects read one by one -------------------------------------------------------------
    def _one_by_one(self, objs: list, kinds_: list) -> None:
        is_tensor = list(map(self.tensor_backend.__contains__, kinds_))
        if any(is_tensor):
            tensors = list(compress(objs, is_tensor))
            if len(tensors) == len(objs):
                self._take_tensors(tensors, kinds_)
                return
            self._take_tensors(tensors, list(compress(kinds_, is_tensor)))
            objs = list(compress(objs, map(not_, is_tensor)))
            kinds_ = list(compress(kinds_, map(not_, is_tensor)))
        children: list = []
        kind_of = self.kinds
        if self._probe is not None and self._probe[0] is None and \
                CONTAINER in map(kind_of.__getitem__, kinds_):
            raise _Hit   # (a probe for anything: a model, a graph node is something)
        for obj, tp in zip(objs, kinds_):
            handler = HANDLERS.get(kind_of[tp])
            if handler is None:
                continue
            try:
                got = handler(self, obj)
            except OutOfTime:
                raise
            except Exception:
                self.refuse(obj)   # an object that refuses introspection
                continue
            if got:
                children += got
        if children:
            self._admit(children)


def _subclasses(tp: type) -> set:
    """``tp`` and every subclass of it that exists now."""
    out, todo = set(), [tp]
    while todo:
        t = todo.pop()
        if t not in out:
            out.add(t)
            todo += type.__subclasses__(t)
    return out
