"""Walk from the user's names and IPython's hidden holders to tensor storages.

The walk starts at named roots, never at ``gc.get_objects()``, so its cost
follows what the user holds, not the size of the heap. It reads objects
only through C-level slots and descriptors: no property, ``__getattr__`` or
other user code runs. It is iterative, bounded in time and depth, and a
partial result says it is partial.

Its hot path is tensors: a model's parameters and an optimizer's state wait
in a batch and are taken together in C-level passes (``Walker._take_batch``),
with each tensor's storages remembered by its backend between scans.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import gc
import os
import re
import sys
import sysconfig
import time
import types
import weakref
from dataclasses import dataclass, field
from itertools import compress, filterfalse, islice, repeat
from operator import is_not, itemgetter, not_
from typing import Any, Callable

from .backends import Backend, StorageInfo, active_backends
from .backends.base import dict_descriptor

ATOMIC = frozenset({
    int, float, complex, bool, str, bytes, bytearray, type(None), range, slice,
    type(Ellipsis), type(NotImplemented), memoryview,
})
_SKIP_TYPES = frozenset({
    weakref.ref, weakref.ProxyType, weakref.CallableProxyType, types.CodeType,
    types.GetSetDescriptorType, types.MemberDescriptorType, types.WrapperDescriptorType,
    types.MethodWrapperType, types.MethodDescriptorType, types.ClassMethodDescriptorType,
    types.MappingProxyType,
})
_LRU_WRAPPER = type(functools.lru_cache(lambda: None))
_BIG = 4096            # containers longer than this get a C-speed "all atomic?" check first
_DEFAULT_MAX_DEPTH = 2000
_BATCH = 8             # this many tensors waiting are taken together; fewer, one by one
_FLUSH = 4096          # tensors waiting to be taken together at most
_CHUNK = 1024          # children of one container pushed at a time
_FIRST, _SECOND, _THIRD, _FOURTH = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
_NEXT = (1).__add__

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
    """What one root reaches: storage key -> (storage, path node, description)."""

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


# -- what counts as library code ------------------------------------------
def _library_dirs() -> tuple[str, ...]:
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(os.path.realpath(sysconfig.get_paths()[key]))
        except (KeyError, OSError):
            pass
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p):
            dirs.add(os.path.realpath(p))
    return tuple(d + os.sep for d in dirs if d)


_LIB_DIRS = _library_dirs()
_module_is_library: dict[str, bool] = {}


def is_library_module_name(name: str | None) -> bool:
    """True for modules that belong to Python or an installed package."""
    if type(name) is not str or not name:
        return False
    cached = _module_is_library.get(name)
    if cached is not None:
        return cached
    top = name.partition(".")[0]
    if name == "__main__":
        result = False
    elif top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        result = True
    else:
        mod = sys.modules.get(name)
        path = _MODULE_DICT(mod).get("__file__") if is_a(mod, types.ModuleType) else None
        if type(path) is not str:
            # a module made at run time (types.ModuleType) is the user's;
            # an unknown module name with no file is taken as a library's
            result = mod is None and top in sys.modules and top != name
        else:
            result = os.path.realpath(path).startswith(_LIB_DIRS)
    _module_is_library[name] = result
    return result


_TYPE_DICT = type.__dict__["__dict__"].__get__
_TYPE_MRO = type.__dict__["__mro__"].__get__
_TYPE_NAME = type.__dict__["__name__"].__get__
_TYPE_MODULE = type.__dict__["__module__"].__get__
_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__


def type_module(tp: type) -> str | None:
    """``tp.__module__`` read without the metaclass's ``__getattribute__``."""
    try:
        name = _TYPE_MODULE(tp)
    except Exception:
        return None
    return name if type(name) is str else None


def type_name_of(tp: type) -> str:
    """``tp.__name__`` read without the metaclass's ``__getattribute__``."""
    return _TYPE_NAME(tp)


def is_a(obj: Any, cls: "type | tuple[type, ...]") -> bool:
    """``isinstance`` by the object's real type: never asks ``obj.__class__`` (a
    property of the user's, a mock's spec, a dead weak proxy)."""
    return issubclass(type(obj), cls)


_dict_of = dict_descriptor


def _slots_of(tp: type) -> tuple:
    out = []
    for klass in _TYPE_MRO(tp):
        d = type.__dict__["__dict__"].__get__(klass)
        slots = d.get("__slots__", ())
        if type(slots) is str:
            slots = (slots,)
        elif type(slots) not in (tuple, list):
            slots = ()   # what Python made the slots from is gone; their descriptors stay
        for name in slots:
            if type(name) is not str:
                continue
            descr = d.get(name)
            if type(descr) is types.MemberDescriptorType:
                out.append((name, descr))
    return tuple(out)


_HAVE_GC = 1 << 14   # Py_TPFLAGS_HAVE_GC


def _untracked_holds_nothing(backends: list[Backend]) -> bool:
    """Whether a dict or tuple the garbage collector does not track holds nothing the
    walk could follow: true when every tensor type of these backends is collectable.

    CPython tracks a dict from the moment a collectable object goes into it (and a
    tuple unless all it holds is untracked), so an untracked one holds atoms only:
    a 50,000-entry ``{str: int}`` dict is skipped in O(1). Everything else the walk
    enters (containers, instances, functions, frames, modules, optimizers) is
    collectable; objects of types that are not hold no reference the walk can see.
    """
    try:
        return all(t.__flags__ & _HAVE_GC for b in backends for t in b.tensor_types())
    except Exception:
        return False


class Walker:
    """Walks object graphs; one instance per scan (it caches per type)."""

    def __init__(self, backends: list[Backend], devices: set[str] | None,
                 deadline: float, stop_ids: set[int], max_depth: int = _DEFAULT_MAX_DEPTH,
                 describe: bool = False) -> None:
        self.backends = backends
        self.devices = devices
        self.deadline = deadline
        self.stop_ids = stop_ids
        self.max_depth = max_depth
        self.describe = describe
        self.partial = False
        self.reasons: list[str] = []
        self.errors = 0
        self._handlers: dict[type, Callable] = {}
        # id -> [tensor, storages, edges or None, the ``found`` of the last root that saw it]
        self._storage_cache: dict[int, list] = {}
        self._instance_layout: dict[type, tuple] = {}
        self._tensor_backend: dict[type, Backend] = {}
        self._untracked_is_empty = _untracked_holds_nothing(backends)
        self._instance_handler = self._instance
        self._batch_types: dict[Backend, frozenset] = {}
        self._pending: dict[Backend, list] = {}   # (parent, label, tensor, depth) to take
        self._waiting = 0                          # how many, over all backends
        self.current_root: str | None = None
        self.out_of_time = False

    # -- driving -----------------------------------------------------------
    def stop(self, reason: str) -> None:
        self.partial = True
        text = f"{reason} in {self.current_root}" if self.current_root else reason
        if text not in self.reasons:
            self.reasons.append(text)

    def walk(self, obj: Any, label: tuple) -> Reach:
        """Every storage reachable from ``obj`` (stops at ``stop_ids``)."""
        reach = Reach()
        found = reach.storages
        # id -> object: holding each visited object keeps its id from being reused
        # by a temporary (saved tensors, frame locals) made later in the walk
        seen: dict[int, Any] = dict.fromkeys(self.stop_ids)
        stack: list = [(obj, (None, label), 0)]
        push = stack.append
        pop = stack.pop
        self._seen, self._found, self._push, self._graph_seen = seen, found, push, {}
        self._stack = stack
        count = 0
        atomic = ATOMIC
        handlers = self._handlers
        tensor_backend = self._tensor_backend
        take = self._take
        max_depth = self.max_depth
        instance = self._instance_handler
        untracked_is_empty = self._untracked_is_empty
        is_tracked = gc.is_tracked
        while stack or self._waiting:
            if not stack:   # tensors wait to be taken together; what they hold comes next
                try:
                    self._flush()
                except _OutOfTime:
                    break
                except Exception:
                    self.errors += 1
                continue
            item, node, depth = pop()
            tp = type(item)
            if tp in atomic:
                continue
            if tp is _Rest:   # the rest of a long container, after what it gave so far
                try:
                    take(item.pairs, node, depth)
                except _OutOfTime:
                    break
                except Exception:
                    self.errors += 1
                continue
            handler = handlers.get(tp)
            try:
                if handler is None:
                    handler = handlers[tp] = self._classify(tp)
                if tp in tensor_backend:   # _take keeps its own account of what it saw
                    take(((node[1], item),), node[0], depth)
                    continue
            except _OutOfTime:
                break
            except Exception:
                self.errors += 1
                continue
            if handler is instance and untracked_is_empty and not is_tracked(item):
                continue   # an object() or the like: it holds nothing the walk follows
            oid = id(item)
            if oid in seen:
                continue
            count += 1
            if not count & 511 and time.perf_counter() > self.deadline:
                self.out_of_time = True   # the scan says so, if no second try finishes
                break
            if depth > max_depth:
                self.stop(f"structure deeper than {self.max_depth} levels cut")
                continue
            size, waiting = len(stack), self._waiting
            try:
                handler(item, node, depth + 1, push, found)
            except _OutOfTime:
                break
            except Exception:
                self.errors += 1  # an object that refuses introspection
            if len(stack) != size or self._waiting != waiting:
                # only what leads on is remembered: a leaf (a record's list of ints) met
                # again is read again, cheaply, so the memo stays small against the heap
                seen[oid] = item
        for pending in self._pending.values():   # a walk cut short leaves some
            pending.clear()
        self._waiting = 0
        reach.objects = count
        return reach

    def close(self) -> None:
        """Let go of every object the walk kept: its memo holds tensors, and its handlers
        refer back to it, so without this the tensors would live until a collection."""
        self._storage_cache.clear()
        self._handlers.clear()
        self._pending.clear()
        self._seen = self._found = self._push = self._graph_seen = self._stack = None
        self._instance_handler = None

    def _take(self, pairs: Any, parent: tuple | None, depth: int) -> None:
        """Take ``(label, child)`` pairs found under the path node ``parent``: a tensor at
        once, anything else onto the stack.

        The hot path of a scan, one loop over a container's children (a model's
        parameters, an optimizer's state). A tensor's storages are asked once per
        scan; another root that reaches it (a parameter seen from its model, then
        from its optimizer) finds them in the memo.
        """
        backend_of = self._tensor_backend.get
        cache = self._storage_cache
        memo_of = cache.get
        found = self._found
        push = self._push
        graph_seen = self._graph_seen
        devices = self.devices
        atomic = ATOMIC
        pairs = iter(pairs)
        stack = self._stack
        bottom = len(stack)
        for n, (label, value) in enumerate(pairs, 1):
            if not n & 4095:
                self._check_time()
            tp = type(value)
            backend = backend_of(tp)
            if backend is None:
                if tp in atomic:
                    continue
                if tp not in self._handlers:
                    self._handlers[tp] = self._classify(tp)   # a tensor type seen here first
                    backend = backend_of(tp)
                if backend is None:
                    push((value, (parent, label), depth))
                    if len(stack) - bottom >= _CHUNK:
                        # a long container: the rest waits under what it gave so far,
                        # so the stack stays short and the time limit is looked at
                        stack.insert(bottom, (_Rest(pairs), parent, depth))
                        return
                    continue
            if self._waiting:
                self._flush()
            memo = memo_of(id(value))
            if memo is None:
                infos, edges = backend.take(value, graph_seen)
                if devices is not None and infos and (len(infos) > 1 or infos[0][2] not in devices):
                    infos = [i for i in infos if i[2] in devices]
                # the entry keeps the tensor alive (so its id stays its own) and says which
                # root's walk saw it last (by that walk's ``found``); edges given as a tuple
                # are the same for every root, a list (an autograd graph) depends on what
                # the root has seen and is asked again
                cache[id(value)] = [value, infos, edges if type(edges) is tuple else None, found]
            elif memo[3] is found:
                continue   # seen already from this root
            else:
                memo[3] = found
                infos, edges = memo[1], memo[2]
                if edges is None:
                    edges = backend.tensor_edges(value, graph_seen)
            node = (parent, label)
            for info in infos:
                if info[0] not in found:
                    found[info[0]] = (info, node, self._describe(value) if self.describe else None)
            if edges:
                if type(edges) is tuple:   # a gradient and the like: taken at once
                    self._take(edges, node, depth + 1)
                else:                      # an autograd graph: through the stack, however deep
                    for child_label, child in edges:
                        push((child, (node, child_label), depth + 1))

    def _check_time(self) -> None:
        if time.perf_counter() > self.deadline:
            self.out_of_time = True
            raise _OutOfTime

    def _all_atomic(self, values: Any) -> bool:
        """Whether every value is an atom, in C-level passes of a million values
        with the time limit looked at between them."""
        values = iter(values)
        while True:
            chunk = list(islice(values, 1 << 20))
            if not ATOMIC.issuperset(map(type, chunk)):
                return False
            if len(chunk) < 1 << 20:
                return True
            self._check_time()

    def _classify(self, tp: type) -> Callable:
        if tp in _SKIP_TYPES or issubclass(tp, weakref.ref):
            return _skip
        if type(tp) is not type and not is_library_module_name(type_module(type(tp))):
            # a metaclass of the user's may run code on any look at the class (an
            # abstract base's subclass check asks for ``__mro__``): only the C-level
            # layout is read
            return self._by_layout(tp)
        for backend in self.backends:
            types_ = backend.tensor_types()
            if types_ and issubclass(tp, types_):
                self._tensor_backend[tp] = backend
                return _skip  # never called: walk() takes tensors on its hot path
            containers = backend.container_types()
            if containers and issubclass(tp, containers):
                return functools.partial(self._backend_container, backend)
        if tp is types.ModuleType or issubclass(tp, types.ModuleType):
            return self._module
        if issubclass(tp, type):
            return self._class
        if issubclass(tp, dict):
            return self._dict if tp is dict else self._with_instance(self._dict)
        if issubclass(tp, (list, tuple)):
            return self._sequence if tp in (list, tuple) else self._with_instance(self._sequence)
        if issubclass(tp, (set, frozenset)):
            return self._set if tp in (set, frozenset) else self._with_instance(self._set)
        if tp is types.FunctionType:
            return self._function
        if tp is types.MethodType:
            return self._method
        if tp is types.BuiltinFunctionType:
            return self._builtin_method
        if issubclass(tp, functools.partial):
            return self._partial
        if tp is _LRU_WRAPPER:
            return self._lru
        if tp is types.CellType:
            return self._cell
        if tp in (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType):
            return self._generator
        if tp is types.FrameType:
            return self._frame
        if tp is types.TracebackType:
            return self._traceback
        if issubclass(tp, BaseException):
            return self._exception
        return self._by_layout(tp)

    def _by_layout(self, tp: type) -> Callable:
        """Handler of a type found by its C-level layout alone."""
        for base, handler in ((dict, self._dict), ((list, tuple), self._sequence),
                              ((set, frozenset), self._set), (BaseException, self._exception)):
            if issubclass(tp, base):
                return self._with_instance(handler) if handler != self._exception else handler
        top = (type_module(tp) or "").partition(".")[0]
        if top == "numpy" and not _dict_of(tp):
            numpy = sys.modules.get("numpy")
            if numpy is not None and issubclass(tp, numpy.ndarray):
                return self._ndarray
            return _skip   # scalars, dtypes: no references inside
        if top == "pandas":
            # block managers and blocks keep their arrays in Cython slots: what the gc sees
            return self._instance_and_referents
        return self._instance_handler

    def _instance_and_referents(self, obj, node, depth, push, found) -> None:
        self._instance(obj, node, depth, push, found)
        own = self._instance_layout_dict(obj)
        tp = type(obj)
        for v in gc.get_referents(obj):
            if v is not own and v is not tp and type(v) not in ATOMIC:
                push((v, (node, ("ref",)), depth))

    def _ndarray(self, obj, node, depth, push, found) -> None:
        """An object array's elements (a tensor in a numpy object array or in a pandas
        object column); other arrays hold no Python objects."""
        numpy = sys.modules["numpy"]
        base = numpy.ndarray.__dict__
        if not base["dtype"].__get__(obj).hasobject:
            return
        flat = base["flat"].__get__(obj)
        self._take(((("flat", i), v) for i, v in enumerate(flat)), node, depth)

    def _with_instance(self, container: Callable) -> Callable:
        def both(obj, node, depth, push, found):
            container(obj, node, depth, push, found)
            self._instance(obj, node, depth, push, found)
        return both

    # -- handlers ----------------------------------------------------------------
    def _describe(self, obj) -> str | None:
        name = type_name_of(type(obj))
        backend = self._tensor_backend.get(type(obj))
        try:
            text = backend.describe(obj) if backend is not None else None
        except Exception:
            text = None
        return f"{name} {text}" if text else name

    def _backend_container(self, backend: Backend, obj, node, depth, push, found) -> None:
        """A model, a module, an optimizer: their tensors of the backend's batch types
        wait in ``_pending`` and are taken together (a model's 1,000 modules give one
        batch of their parameters); the rest goes through :meth:`_take`."""
        pairs = backend.children(obj)
        if self.describe:
            self._take(pairs, node, depth)
            return
        pairs = list(pairs)
        kinds = self._batch_types.get(backend)
        if kinds is None:
            kinds = self._batch_types[backend] = backend.batch_types()
        chosen = list(map(kinds.__contains__, map(type, map(_SECOND, pairs))))
        if any(chosen):
            batch = list(compress(pairs, chosen))
            pending = self._pending.setdefault(backend, [])
            pending += zip(repeat(node), map(_FIRST, batch), map(_SECOND, batch), repeat(depth))
            self._waiting += len(batch)
            if self._waiting >= _FLUSH:
                self._flush()
            if all(chosen):
                return
            pairs = list(compress(pairs, map(not_, chosen)))
        self._take(pairs, node, depth)

    def _flush(self) -> None:
        """Take the tensors waiting in ``_pending``: before any other tensor is taken
        (the first path to a storage names it) and at the end of a root's walk."""
        self._waiting = 0
        for backend, pending in self._pending.items():
            if not pending:
                continue
            items = pending[:]
            pending.clear()
            if len(items) < _BATCH:
                for node, label, value, depth in items:
                    self._take(((label, value),), node, depth)
            else:
                self._take_batch(backend, list(map(_FIRST, items)), list(map(_SECOND, items)),
                                 list(map(_THIRD, items)), list(map(_FOURTH, items)))

    def _take_batch(self, backend: Backend, parents: Any, labels: Any, values: list,
                    depths: Any) -> None:
        """Many tensors at once (an optimizer's state, a model's parameters): what
        :meth:`_take` does for each, in C-level passes over lists. Each tensor's path
        node is ``(parent, label)``, one of ``parents`` and ``labels`` each."""
        taken = backend.take_many(values)
        if taken is None:   # some need the long way (an autograd graph): find them by halves
            n = len(values)
            parents, labels, depths = (list(islice(x, n)) for x in (parents, labels, depths))
            if n >= 2 * _BATCH:
                half = n // 2
                for part in (slice(0, half), slice(half, n)):
                    self._take_batch(backend, parents[part], labels[part], values[part],
                                     depths[part])
                return
            for parent, label, value, depth in zip(parents, labels, values, depths):
                self._take(((label, value),), parent, depth)
            return
        infos, held_label, held = taken
        nodes = list(zip(parents, labels))
        found = self._found
        devices = self.devices
        if set(map(len, infos)) == {1}:   # one storage each: the common case
            single = list(map(_FIRST, infos))
            if devices is not None and not devices.issuperset(map(_THIRD, single)):
                keep = list(map(devices.__contains__, map(_THIRD, single)))
                single, nodes_kept = list(compress(single, keep)), list(compress(nodes, keep))
            else:
                nodes_kept = nodes
            keys = list(map(_FIRST, single))
            new = list(filterfalse(found.__contains__, dict.fromkeys(keys)))
            if new:   # the first path to each storage wins, as in _take
                entries = dict(zip(reversed(keys), zip(reversed(single), reversed(nodes_kept),
                                                       repeat(None))))
                found.update(zip(new, map(entries.__getitem__, new)))
        else:
            for node, its in zip(nodes, infos):
                for info in its:
                    if (devices is None or info[2] in devices) and info[0] not in found:
                        found[info[0]] = (info, node, None)
        if any(map(is_not, held, repeat(None))):
            has = list(map(is_not, held, repeat(None)))
            self._take_batch(backend, list(compress(nodes, has)), repeat(held_label),
                             list(compress(held, has)), map(_NEXT, compress(depths, has)))

    def _dict(self, obj, node, depth, push, found) -> None:
        if self._untracked_is_empty and not gc.is_tracked(obj):
            return   # only atoms inside: see _untracked_holds_nothing
        if dict.__len__(obj) > _BIG and self._all_atomic(dict.values(obj)) \
                and self._all_atomic(dict.keys(obj)):
            return
        atomic = ATOMIC
        self._take(((("item", k) if type(k) in atomic else ("item", ...), v)
                    for k, v in dict.items(obj) if type(v) not in atomic), node, depth)
        if not ATOMIC.issuperset(map(type, dict.keys(obj))):
            self._take(((("key",), k) for k in dict.keys(obj)), node, depth)

    def _sequence(self, obj, node, depth, push, found) -> None:
        if self._untracked_is_empty and not gc.is_tracked(obj):
            return   # a tuple of atoms
        base = list if is_a(obj, list) else tuple
        if base.__len__(obj) > _BIG and self._all_atomic(base.__iter__(obj)):
            return
        self._take(((("index", i), v) for i, v in enumerate(base.__iter__(obj))), node, depth)

    def _set(self, obj, node, depth, push, found) -> None:
        for v in (set.__iter__(obj) if is_a(obj, set) else frozenset.__iter__(obj)):
            if type(v) not in ATOMIC:
                push((v, (node, ("elem",)), depth))

    def _module(self, obj, node, depth, push, found) -> None:
        d = _MODULE_DICT(obj)
        if is_library_module_name(d.get("__name__")) or d is sys.modules.get("__main__", obj).__dict__:
            return
        for k, v in dict.items(d):
            if type(k) is str and not (k.startswith("__") and k.endswith("__")) \
                    and type(v) not in ATOMIC:
                push((v, (node, ("attr", k)), depth))

    def _class(self, obj, node, depth, push, found) -> None:
        d = type.__dict__["__dict__"].__get__(obj)
        if is_library_module_name(d.get("__module__")):
            return
        for k, v in d.items():
            if k in ("__dict__", "__weakref__", "__module__", "__doc__", "__slots__"):
                continue
            if type(v) not in ATOMIC and type(v) not in _SKIP_TYPES:
                push((v, (node, ("attr", k)), depth))

    def _function(self, obj, node, depth, push, found) -> None:
        if is_library_module_name(obj.__module__):
            return
        closure = obj.__closure__
        if closure:
            for name, cell in zip(obj.__code__.co_freevars, closure):
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                if type(value) not in ATOMIC:
                    push((value, (node, ("closure", name)), depth))
        for i, v in enumerate(obj.__defaults__ or ()):
            if type(v) not in ATOMIC:
                push((v, (node, ("default", i)), depth))
        for k, v in (obj.__kwdefaults__ or {}).items():
            if type(v) not in ATOMIC:
                push((v, (node, ("default", k)), depth))
        for k, v in dict.items(obj.__dict__):
            if type(v) not in ATOMIC:
                push((v, (node, ("attr", k)), depth))

    def _method(self, obj, node, depth, push, found) -> None:
        push((obj.__self__, (node, ("attr", "__self__")), depth))
        push((obj.__func__, (node, ("attr", "__func__")), depth))

    def _builtin_method(self, obj, node, depth, push, found) -> None:
        owner = obj.__self__
        if owner is not None and not is_a(owner, types.ModuleType):
            push((owner, (node, ("attr", "__self__")), depth))

    def _partial(self, obj, node, depth, push, found) -> None:
        get = lambda name: functools.partial.__dict__[name].__get__(obj)  # noqa: E731
        push((get("func"), (node, ("attr", "func")), depth))
        for i, v in enumerate(get("args")):
            push((v, (node, ("attr_index", "args", i)), depth))
        for k, v in (get("keywords") or {}).items():
            push((v, (node, ("attr_item", "keywords", k)), depth))
        self._instance(obj, node, depth, push, found)

    def _lru(self, obj, node, depth, push, found) -> None:
        # cached keys and results are reachable only through the C-level links
        own = self._instance_layout_dict(obj)
        for v in gc.get_referents(obj):
            if v is not own and type(v) not in ATOMIC and type(v) is not types.FunctionType:
                push((v, (node, ("lru",)), depth))
        self._instance(obj, node, depth, push, found)

    def _instance_layout_dict(self, obj):
        descr = _dict_of(type(obj))
        return descr.__get__(obj) if descr is not None else None

    def _cell(self, obj, node, depth, push, found) -> None:
        try:
            push((obj.cell_contents, node, depth))
        except ValueError:
            pass

    def _generator(self, obj, node, depth, push, found) -> None:
        frame = getattr(obj, "gi_frame", None) or getattr(obj, "cr_frame", None) \
            or getattr(obj, "ag_frame", None)
        if frame is not None:
            push((frame, node, depth))

    def _frame(self, obj, node, depth, push, found) -> None:
        func = obj.f_code.co_name
        local_vars = obj.f_locals
        if local_vars is obj.f_globals:
            return  # a module-level frame: its locals are the namespace itself
        for k, v in dict(local_vars).items():
            if type(v) not in ATOMIC and v is not obj:
                push((v, (node, ("local", func, k)), depth))

    def _traceback(self, obj, node, depth, push, found) -> None:
        if obj.tb_next is not None:
            push((obj.tb_next, node, depth))
        push((obj.tb_frame, node, depth))

    def _exception(self, obj, node, depth, push, found) -> None:
        base = BaseException.__dict__
        for name in ("__traceback__", "__context__", "__cause__"):
            v = base[name].__get__(obj)
            if v is not None:
                push((v, (node, ("attr", name)), depth))
        for i, v in enumerate(base["args"].__get__(obj)):
            if type(v) not in ATOMIC:
                push((v, (node, ("attr_index", "args", i)), depth))
        self._instance(obj, node, depth, push, found)

    def _instance(self, obj, node, depth, push, found) -> None:
        tp = type(obj)
        layout = self._instance_layout.get(tp)
        if layout is None:
            layout = self._instance_layout[tp] = (
                _dict_of(tp), _slots_of(tp),
                not is_library_module_name(type.__dict__["__dict__"].__get__(tp).get("__module__")))
        dict_descr, slots, user_class = layout
        if user_class:
            push((tp, (node, ("attr", "__class__")), depth))
        if dict_descr is None and not slots:
            self._referents(obj, node, depth, push)
            return
        # tensors held directly as attributes are taken at once, so a tensor stored both
        # as an attribute and in a list of the same object is named by its attribute
        if dict_descr is not None:
            d = dict_descr.__get__(obj)
            if dict.__len__(d):
                self._take(((("attr", k), v) for k, v in dict.items(d)), node, depth)
        if slots:
            self._take(self._slot_values(obj, slots), node, depth)

    @staticmethod
    def _slot_values(obj, slots) -> Any:
        for name, descr in slots:
            try:
                yield ("attr", name), descr.__get__(obj)
            except AttributeError:
                continue

    def _referents(self, obj, node, depth, push) -> None:
        tp = type(obj)
        for v in gc.get_referents(obj):
            if v is tp or type(v) in ATOMIC:
                continue
            push((v, (node, ("ref",)), depth))


def _skip(obj, node, depth, push, found) -> None:
    return None


class _Rest:
    """On the walk's stack: the children of a container still to be taken."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: Any) -> None:
        self.pairs = pairs


class _OutOfTime(Exception):
    """The scan's time limit passed inside one container or graph."""


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


@contextlib.contextmanager
def paused_gc():
    """No garbage collection inside: a scan makes many short-lived objects, and a
    collection they trigger costs time in proportion to the whole heap, which the
    scan's cost must not depend on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
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
    """:func:`scan` in steps: a generator that yields between roots (the garbage
    collector runs again meanwhile) and returns the :class:`ScanResult`. A caller on
    an event loop lets other work run at each step; it must not let the user's code
    run and then go on (the namespace may have changed): it starts a new scan."""
    start = time.perf_counter()
    stop = stop_ids_for(shell, namespace)
    if extra_stop:
        stop |= extra_stop
    backends = active_backends() if backends is None else backends
    deadline = start + time_limit
    walker = Walker(backends, devices, deadline, stop, describe=describe)
    for backend in backends:
        backend.start_scan(deadline)

    def walk(root: Root, until: float) -> Reach:
        walker.current_root = root.name
        walker.deadline = until
        walker.out_of_time = False
        for backend in backends:
            backend.set_deadline(until)
        with paused_gc():
            found = walker.walk(root.obj, ("root", root.name))
        for backend in backends:
            for reason in backend.partial_reasons():
                walker.stop(reason)
        return found

    # Each root first gets a fair share of the time left, so one huge root (a list of
    # ten million records) cannot starve the names after it; the roots cut short then
    # share what the others left, in order.
    reach: list[Reach] = []
    cut: list[int] = []
    try:
        for i, root in enumerate(roots):
            if id(root.obj) in stop:
                reach.append(Reach())
                continue
            now = time.perf_counter()
            reach.append(walk(root, now + max(deadline - now, 0.0) / (len(roots) - i)))
            if walker.out_of_time:
                cut.append(i)
            yield
        for i in cut:
            if time.perf_counter() < deadline:
                reach[i] = walk(roots[i], deadline)
                yield
                if not walker.out_of_time:
                    continue
            walker.current_root = roots[i].name
            walker.stop("time limit reached")
    finally:
        walker.close()
    return ScanResult(roots, reach, walker.partial, walker.reasons,
                      time.perf_counter() - start, walker.errors)
