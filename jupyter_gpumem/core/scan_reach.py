"""The first pass of a scan: which storages each root reaches, in C-level passes.

The walk is breadth first and takes a level of objects a chunk at a time: one
``gc.get_referents(*chunk)`` call reads what the chunk's dicts, lists, tuples,
sets and plain instances hold (their C ``tp_traverse``, so no user code runs),
``filter(gc.is_tracked, ...)`` drops the atoms, and ``sys.getrefcount`` tells
which of the rest only their parent holds: those cannot be met again, so only
objects held more than once are remembered by id. Objects that need more care
(tensors, models, optimizers, modules, classes, functions, frames, numpy and
pandas objects) are taken out of the chunk by exact type and read one by one
through C-level slots, as before.

Where the package's C core is built (``core/_reach.c``, :data:`NATIVE`), the
plain objects of each chunk go to it instead of ``gc.get_referents``: it walks
everything plain they hold at C speed, in runs of a few milliseconds (the walk
can yield and the deadline holds between two), and hands back, once each, the
objects that need the care above. Both walks find the same storages
(tests/test_native_scan.py).

No path is kept here: paths are found afterwards, inside the roots that reach
storages (:mod:`jupyter_gpumem.scan_paths`).
"""
from __future__ import annotations

import gc
import sys
import time
import types
from collections import OrderedDict, defaultdict, deque
from itertools import compress, filterfalse, islice, repeat
from operator import is_, is_not, itemgetter, not_
from typing import Any

from ..backends import Backend
from ..backends.base import dict_descriptor
from . import native
from .scan_types import (
    ATOMIC, CELL, CLASS, CONTAINER, DICT, DICT_SUB, EXCEPTION, FRAME, FUNCTION, GENERATOR,
    INSTANCE, LRU, MEMORYVIEW, METHOD, BUILTIN, MODULE, MODULE_DICT, NDARRAY, PANDAS, PARTIAL,
    PROXY, SEQ, SEQ_SUB, SET, SET_SUB, SKIP, TENSOR, TRACEBACK, TYPE_DICT, TYPE_FLAGS, HAVE_GC, classify,
    is_library_module_name, untracked_holds_nothing, viewed,
)
from .scan_types import Refusals, keyable, split_keyable, type_name_of

_native = native.CORE   # the C core (built with the package where a compiler was found)

CHUNK = 4096            # objects whose referents are read in one call
BIG = 1 << 15           # an exact dict, list, tuple or set longer than this is read in slices
SLICE = 1 << 16         # items per slice of a long container
BATCH = 8               # this many tensors of one container are taken together; fewer, one by one
_PLAIN = frozenset({dict, list, tuple, set, frozenset})
#: exact types whose C length and items the walk reads (a long one in slices)
_BASE_OF = {dict: dict, list: list, tuple: tuple, set: set, frozenset: frozenset,
            OrderedDict: dict, defaultdict: dict, deque: deque}
_SIZED = frozenset(_BASE_OF)
#: kinds read by ``gc.get_referents``: what the gc sees is what the walk follows
_BY_REFERENTS = frozenset({DICT, SEQ, SET, METHOD, BUILTIN, PARTIAL, LRU, CELL, TRACEBACK,
                           EXCEPTION, INSTANCE})
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
_GRAD = ("attr", "grad")
_CLASS_SKIP_KEYS = frozenset({"__dict__", "__weakref__", "__module__", "__doc__", "__slots__"})

is_tracked = gc.is_tracked
get_referents = gc.get_referents
getrefcount = sys.getrefcount


class OutOfTime(Exception):
    """The scan's time limit passed inside one level, container or graph."""


class _Hit(Exception):
    """In :meth:`Reacher.leads_to`: a storage looked for is reached."""


def _refcount_base() -> int | None:
    """What ``sys.getrefcount`` says, in :meth:`Reacher._admit_tracked`, of an object
    that only its parent holds (None where counts are not exact: free threading)."""
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return None
    probe = [[]]
    counts = _probe([probe])
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
_UNASKED = object()   # a backend whose batch_spec() the scan has not asked yet


class Reacher:
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
        if isinstance(getattr(numpy, "ndarray", None), type):
            self._watch |= _subclasses(numpy.ndarray)
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
        self._node: Any = _no_nodes
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
        steps = self.walk_steps(obj, node)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def walk_steps(self, obj: Any, node: Any = None, due: Any = None):
        """:meth:`walk` as a generator that yields between two chunks once ``due()``
        says so, and returns what :meth:`walk` returns."""
        found: dict = {}
        self._found = found
        self._node = node if node is not None else _no_nodes
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
            self._node = _no_nodes   # it refers to the path finder, which refers back here
        return found, count

    def leads_to(self, objs: list, wanted: set, graph: dict, deadline: float) -> bool | None:
        """Whether ``objs`` reach one of the storages ``wanted`` (None: the deadline came
        first). A walk like :meth:`walk` that takes no tensor: it looks each one up in
        what this scan already knows (``graph``: the root's autograd edges), so no
        backend runs and no graph node is read again."""
        saved = (self.deadline, self.out_of_time, self.partial, list(self.reasons))
        self._probe = (wanted, graph)
        self.deadline = deadline
        self.out_of_time = False
        try:
            for obj in objs:
                self.walk(obj)
                if self.out_of_time:
                    return None
            return False
        except _Hit:
            return True
        finally:
            self._probe = None
            self.deadline, self.out_of_time, self.partial, self.reasons[:] = saved

    def _look_up(self, tensors: list) -> None:
        """In :meth:`leads_to`: tensors met are looked up, not taken."""
        wanted, graph = self._probe
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
        ``__hash__``: see :func:`~.scan_types.keyable_meta`): never classified, read
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
                        self._in_slices(o, _BASE_OF[type(o)])
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
    def _in_slices(self, obj: Any, tp: type) -> None:
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
        for obj, tp in zip(objs, kinds_):
            handler = _HANDLERS.get(kind_of[tp])
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

    # -- tensors -------------------------------------------------------------------------------
    def _take_tensors(self, tensors: list, kinds_: list) -> None:
        if self._probe is not None:
            self._look_up(tensors)
            return
        backend_of = self.backend_of
        backends = set(map(id, map(backend_of.__getitem__, set(kinds_))))
        if len(backends) == 1:
            groups = [(backend_of[kinds_[0]], tensors, kinds_)]
        else:
            by: dict[int, tuple] = {}
            for t, tp in zip(tensors, kinds_):
                backend = backend_of[tp]
                entry = by.get(id(backend))
                if entry is None:
                    entry = by[id(backend)] = (backend, [], [])
                entry[1].append(t)
                entry[2].append(tp)
            groups = list(by.values())
        for backend, values, types_ in groups:
            if len(values) >= BATCH and not self.describe:
                kinds = self._batch_types.get(id(backend))
                if kinds is None:
                    kinds = self._batch_types[id(backend)] = backend.batch_types()
                if kinds:
                    chosen = list(map(kinds.__contains__, types_))
                    if all(chosen):
                        self._take_batch(backend, values)
                        continue
                    batch = list(compress(values, chosen))
                    if len(batch) >= BATCH:
                        self._take_batch(backend, batch)
                        values = list(compress(values, map(not_, chosen)))
            for t in values:
                try:
                    self._take_one(backend, t)
                except OutOfTime:
                    raise
                except Exception:
                    self.refuse(t)

    def _record(self, tensor: Any, infos: list) -> None:
        found = self._found
        for info in infos:
            if info[0] not in found:
                node, = self._node((info[0],))
                found[info[0]] = (info, node, self._describe(tensor) if self.describe else None)

    def _filter_devices(self, infos: list) -> list:
        devices = self.devices
        if devices is not None and infos and (len(infos) > 1 or infos[0][2] not in devices):
            return [i for i in infos if i[2] in devices]
        return infos

    def _take_one(self, backend: Backend, value: Any) -> None:
        memo = self.memo.get(id(value))
        if memo is None:
            infos, edges = backend.take(value, self._graph_seen)
            infos = self._filter_devices(infos)
            # edges given as a tuple are the same for every root; a list (an autograd
            # graph) depends on what the root has seen and is asked again
            memo = self.memo[id(value)] = [value, infos, edges if type(edges) is tuple else None]
        else:
            infos, edges = memo[1], memo[2]
            if edges is None:
                edges = backend.tensor_edges(value, self._graph_seen)
        if type(edges) is not tuple:
            self.graph_edges[id(value)] = edges
        self._record(value, infos)
        if edges:
            self._admit(list(map(_SECOND, edges)))

    def _take_batch(self, backend: Backend, values: list) -> None:
        """Many tensors at once (an optimizer's state, a model's parameters): in one loop
        of the C core where the backend allows (:meth:`Backend.batch_spec`), else in
        C-level passes over lists; the tensors that need the long way (an autograd
        graph) are found by halves."""
        spec = self._batch_specs.get(id(backend), _UNASKED)
        if spec is _UNASKED:
            spec = self._batch_specs[id(backend)] = \
                backend.batch_spec() if self._c_batch is not None else None
        # how the C loop makes the path nodes: (node type, its head), (None, None) for
        # none; None where only the walk's node callable knows (then the passes below)
        node_args = (None, None) if self._node is _no_nodes else getattr(self._node, "args", None)
        if spec is not None and node_args is not None:
            held = self._c_batch(values, self._batched, *spec, self._found, self.devices,
                                 *node_args)
            if held is None:
                self._split_batch(backend, values)
            else:
                self._take_held(backend, held)
            return
        memo = self._batched
        seen = list(map(memo.get, map(id, values)))
        taken = self._take_fresh(backend, values, seen) if None in seen else (
            list(map(_FIRST, seen)), seen[0][1], list(map(_THIRD, seen)))
        if taken is None:
            self._split_batch(backend, values)
            return
        infos, held_label, held = taken
        devices = self.devices
        found = self._found
        if set(map(len, infos)) == {1}:   # one storage each: the common case
            single = list(map(_FIRST, infos))
            if devices is not None and not devices.issuperset(map(_THIRD, single)):
                keep = list(map(devices.__contains__, map(_THIRD, single)))
                single = list(compress(single, keep))
            keys = list(map(_FIRST, single))
            new = list(filterfalse(found.__contains__, dict.fromkeys(keys)))
            if len(new) == len(keys):   # each new, once: the common case
                found.update(zip(keys, zip(single, self._node(keys), repeat(None))))
            elif new:   # the first tensor met with each storage stands for it
                info_of = dict(zip(reversed(keys), reversed(single)))
                found.update(zip(new, zip(map(info_of.__getitem__, new), self._node(new),
                                          repeat(None))))
        else:
            if devices is not None:
                infos = [[i for i in its if i[2] in devices] for its in infos]
            for value, its in zip(values, infos):
                for info in its:
                    if info[0] not in found:
                        node, = self._node((info[0],))
                        found[info[0]] = (info, node, None)
        if any(map(is_not, held, repeat(None))):
            self._take_held(backend, [h for h in held if h is not None])

    def _split_batch(self, backend: Backend, values: list) -> None:
        """A batch where some tensor has an autograd graph: by halves, then one by one."""
        n = len(values)
        if n >= 2 * BATCH:
            self._take_batch(backend, values[:n // 2])
            self._take_batch(backend, values[n // 2:])
            return
        for value in values:
            self._take_one(backend, value)

    def _take_held(self, backend: Backend, held: list) -> None:
        """What a batch's tensors hold (gradients), taken at once in the same way. (No
        memo entry: the path search asks the backend again for the few it meets.)"""
        if len(held) >= BATCH and set(map(type, held)) <= self._batch_types[id(backend)]:
            self._take_batch(backend, held)
        elif held:
            self._admit(held)

    def _take_fresh(self, backend: Backend, values: list, seen: list) -> tuple | None:
        """:meth:`Backend.take_many` of the values not met before in this scan (``seen``
        None), merged in order with those met; None where one has a graph."""
        if not any(map(is_not, seen, repeat(None))):
            fresh = values
        else:
            fresh = list(compress(values, map(is_, seen, repeat(None))))
        taken = backend.take_many(fresh)
        if taken is None:
            return None
        infos, label, held = taken
        new = list(zip(infos, repeat(label), held))
        self._batched.update(zip(map(id, fresh), new))
        if fresh is not values:
            rest = iter(new)
            new = [s if s is not None else next(rest) for s in seen]
            infos, held = list(map(_FIRST, new)), list(map(_THIRD, new))
        return infos, label, held

    def tensor_record(self, obj: Any) -> list | None:
        """``[tensor, storages, edges]`` of a tensor: as the walk took it, or, for one it
        took in a batch (no autograd graph), asked again of its backend (which keeps
        each tensor's storages)."""
        memo = self.memo.get(id(obj))
        if memo is not None and memo[0] is obj:
            return memo
        backend = self.tensor_backend.get(type(obj))
        if backend is None or id(obj) not in self._batched:
            return None   # never taken: its graph (if any) is not read here
        try:
            fn, grad = backend.graph_and_grad(obj)
            if fn is not None:
                return None   # a graph the walk did not expand: not expanded here either
            infos = self._filter_devices(backend.storages(obj))
        except Exception:
            return None
        return [obj, infos, ((_GRAD, grad),) if grad is not None else ()]

    def _describe(self, obj: Any) -> str | None:
        name = type_name_of(type(obj))
        backend = self.backend_of.get(type(obj))
        try:
            text = backend.describe(obj) if backend is not None else None
        except Exception:
            text = None
        return f"{name} {text}" if text else name



def _subclasses(tp: type) -> set:
    """``tp`` and every subclass of it that exists now."""
    out, todo = set(), [tp]
    while todo:
        t = todo.pop()
        if t not in out:
            out.add(t)
            todo += type.__subclasses__(t)
    return out


def _no_nodes(keys: Any) -> Any:
    return repeat(None, len(keys))


# -- what objects read one by one hold (no labels: the path search has its own) ---------
def _container(walker: Reacher, obj: Any) -> list:
    pairs = list(walker.backend_of[type(obj)].children(obj))
    walker.children_of[id(obj)] = (obj, pairs)   # the path search reads them again
    return list(map(_SECOND, pairs))


def _module(walker: Reacher, obj: Any) -> list:
    d = MODULE_DICT(obj)
    main = sys.modules.get("__main__")
    if is_library_module_name(d.get("__name__")) or (main is not None and main is obj):
        return []
    return [v for k, v in dict.items(d)
            if not (type(k) is str and k.startswith("__") and k.endswith("__"))]


def _class(walker: Reacher, obj: Any) -> list:
    d = TYPE_DICT(obj)
    if is_library_module_name(d.get("__module__")):
        return []
    return [v for k, v in d.items() if k not in _CLASS_SKIP_KEYS]   # a mappingproxy


def function_parts(obj: Any) -> tuple:
    """A function of the user's: its closure's values, defaults and attributes (a
    library's function: nothing)."""
    if is_library_module_name(obj.__module__):
        return (), (), {}, {}
    closure = []
    for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
        try:
            closure.append((name, cell.cell_contents))
        except ValueError:
            continue
    # read through the base types: a subclass of tuple or dict set as the defaults
    # never runs its own __bool__, __len__ or __iter__
    defaults, kwdefaults = obj.__defaults__, obj.__kwdefaults__
    return (closure, () if defaults is None else list(tuple.__iter__(defaults)),
            {} if kwdefaults is None else kwdefaults, obj.__dict__)


def _function(walker: Reacher, obj: Any) -> list:
    closure, defaults, kwdefaults, attrs = function_parts(obj)
    return [v for _, v in closure] + list(defaults) + list(dict.values(kwdefaults)) \
        + list(dict.values(attrs))


def generator_frame(obj: Any) -> Any:
    """The frame of a generator, coroutine or async generator (None once it ended)."""
    tp = type(obj)
    if tp is types.GeneratorType:
        return obj.gi_frame
    if tp is types.CoroutineType:
        return obj.cr_frame
    return obj.ag_frame


def _generator(walker: Reacher, obj: Any) -> list:
    frame = generator_frame(obj)
    return _frame(walker, frame) if frame is not None else []


CO_OPTIMIZED = 1   # a function's frame (its locals in the frame's fast slots)


def frame_locals(obj: Any) -> dict:
    """A frame's local variables (none for a module's frame: they are its globals).

    A frame whose code is not a function's (a class body, exec'd code) keeps its
    namespace in a mapping that may be the user's (a metaclass's ``__prepare__``): it is
    not read through ``f_locals`` (which writes the frame's cells into it, through its
    ``__setitem__``), but found among the frame's referents; a dict (or a subclass) is
    read through dict's own methods, any other mapping is one local, ``f_locals``."""
    if obj.f_code.co_flags & CO_OPTIMIZED:
        return dict.copy(obj.f_locals)   # a dict the frame makes
    # its referents: the frame before, the trace function, the namespace, the function,
    # the code and the cells (a class body's ``__class__``)
    other = (obj.f_back, obj.f_trace, obj.f_globals)
    skip = (types.CodeType, types.FunctionType, types.CellType)
    namespace = next((r for r in get_referents(obj) if not issubclass(type(r), skip)
                      and not any(map(is_, repeat(r), other))), None)
    if namespace is None:
        return {}
    if issubclass(type(namespace), dict):
        return dict(dict.items(namespace))
    return {"f_locals": namespace}


def _frame(walker: Reacher, obj: Any) -> list:
    return [v for v in dict.values(frame_locals(obj)) if v is not obj]


def ndarray_holds_objects(obj: Any) -> bool:
    """Whether a numpy array's elements are Python objects (its dtype's ``hasobject``)."""
    return sys.modules["numpy"].ndarray.__dict__["dtype"].__get__(obj).hasobject


def ndarray_items(obj: Any) -> Any:
    """The elements of a numpy object array (nothing for other arrays), an iterator."""
    if not ndarray_holds_objects(obj):
        return iter(())
    return iter(sys.modules["numpy"].ndarray.__dict__["flat"].__get__(obj))


def ndarray_size(obj: Any) -> int:
    """How many elements a numpy array has (through the base type's descriptor)."""
    return sys.modules["numpy"].ndarray.__dict__["size"].__get__(obj)


def ndarray_base(obj: Any) -> Any:
    """What a numpy array views (another array, a tensor, a buffer), or None."""
    return sys.modules["numpy"].ndarray.__dict__["base"].__get__(obj)


def _ndarray(walker: Reacher, obj: Any) -> list:
    # in slices, the clock looked at between two: a long array is never made a list
    walker.admit_iter(ndarray_items(obj))
    base = ndarray_base(obj)
    return [base] if base is not None else []


def _viewed(walker: Reacher, obj: Any) -> list:
    got = viewed(obj)
    return [got] if got is not None else []


def _pandas(walker: Reacher, obj: Any) -> list:
    # what the gc sees (block managers and blocks keep their arrays in Cython slots),
    # numpy arrays included, which the collector does not track
    tp = type(obj)
    return [v for v in get_referents(obj) if v is not tp]


def _subclass_container(walker: Reacher, obj: Any) -> list:
    """A subclass of dict, list, tuple or set: its items through the builtin base's C
    methods (a long one in slices), and what the instance holds besides."""
    tp = type(obj)
    base = next(b for b in (dict, list, tuple, set, frozenset) if issubclass(tp, b))
    if base.__len__(obj) > BIG:
        walker._in_slices(obj, base)
        return []
    return get_referents(obj)


_HANDLERS = {
    CONTAINER: _container, MODULE: _module, CLASS: _class, FUNCTION: _function,
    GENERATOR: _generator, FRAME: _frame, NDARRAY: _ndarray, PANDAS: _pandas,
    MEMORYVIEW: _viewed, PROXY: _viewed,
    DICT_SUB: _subclass_container, SEQ_SUB: _subclass_container, SET_SUB: _subclass_container,
}
