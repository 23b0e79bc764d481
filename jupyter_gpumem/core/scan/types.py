"""What the scan knows about types: atoms, library code, and what kind of object each
type's instances are (read through C-level slots only: no user code runs).

Shared by the reachability walk (:mod:`jupyter_gpumem.core.scan.reach`) and the search
for canonical paths (:mod:`jupyter_gpumem.core.scan.search`).
"""
from __future__ import annotations

import functools
import gc
import os
import sys
import sysconfig
import types
import weakref
from itertools import compress
from operator import not_
from typing import Any

from ...backends import Backend
from ...backends.base import (dict_descriptor, is_a, is_subtype,  # noqa: F401 - re-exported
                              keyable_meta)

ATOMIC = frozenset({
    int, float, complex, bool, str, bytes, bytearray, type(None), range, slice,
    type(Ellipsis), type(NotImplemented),
})
#: the atoms' types by id: a membership test that hashes no class of the user's (see
#: :func:`keyable_meta`)
ATOMIC_IDS = frozenset(map(id, ATOMIC))
SKIP_TYPES = frozenset({
    weakref.ref, weakref.ProxyType, weakref.CallableProxyType, types.CodeType,
    types.GetSetDescriptorType, types.MemberDescriptorType, types.WrapperDescriptorType,
    types.MethodWrapperType, types.MethodDescriptorType, types.ClassMethodDescriptorType,
})
LRU_WRAPPER = type(functools.lru_cache(lambda: None))
HAVE_GC = 1 << 14      # Py_TPFLAGS_HAVE_GC
HEAPTYPE = 1 << 9      # Py_TPFLAGS_HEAPTYPE

TYPE_DICT = type.__dict__["__dict__"].__get__
TYPE_MRO = type.__dict__["__mro__"].__get__
TYPE_NAME = type.__dict__["__name__"].__get__
TYPE_MODULE = type.__dict__["__module__"].__get__
TYPE_FLAGS = type.__dict__["__flags__"].__get__
MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__


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
    return tuple(sorted((d + os.sep for d in dirs if d), key=len, reverse=True))


#: where library code lives (stdlib, site-packages), longest first
LIB_DIRS = _library_dirs()
#: the product's own top-level package: its objects are library code, never the user's
OWN_PACKAGE = __name__.partition(".")[0]
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
    elif top == OWN_PACKAGE:
        result = True        # the product's own code, wherever it was installed from
    elif top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        result = True
    else:
        mod = sys.modules.get(name)
        path = MODULE_DICT(mod).get("__file__") if is_a(mod, types.ModuleType) else None
        if type(path) is not str:
            # a module made at run time (types.ModuleType) is the user's;
            # an unknown module name with no file is taken as a library's
            result = mod is None and top in sys.modules and top != name
        else:
            result = os.path.realpath(path).startswith(LIB_DIRS)
    _module_is_library[name] = result
    return result


def type_module(tp: type) -> str | None:
    """``tp.__module__`` read without the metaclass's ``__getattribute__``."""
    try:
        name = TYPE_MODULE(tp)
    except Exception:
        return None
    return name if type(name) is str else None


MEMORYVIEW_OBJ = memoryview.__dict__["obj"].__get__


def viewed(obj: Any) -> Any:
    """What a memoryview views (its exporter, None once released) or what a mappingproxy
    shows (None for a library class's namespace, which the walk does not enter)."""
    if type(obj) is memoryview:
        try:
            return MEMORYVIEW_OBJ(obj)
        except ValueError:   # released
            return None
    mapping = next(iter(gc.get_referents(obj)), None)
    if type(mapping) is dict and is_library_module_name(mapping.get("__module__")):
        return None
    return mapping


def type_name_of(tp: type) -> str:
    """``tp.__name__`` read without the metaclass's ``__getattribute__``."""
    return TYPE_NAME(tp)


def is_own_type(tp: type) -> bool:
    """True for the product's own types (their instances are never the user's)."""
    name = type_module(tp)
    return name is not None and name.partition(".")[0] == OWN_PACKAGE


#: refusals kept by name (each with where it was met); the count covers all
REFUSED_KEPT = 200


class OutOfTime(Exception):
    """The scan's time limit passed inside one level, container or graph."""


class Refusals:
    """The objects a scan could not read: how many, and the first few by type and where
    they were met (``(type name, root name)``)."""

    __slots__ = ("count", "kept")

    def __init__(self) -> None:
        self.count = 0
        self.kept: list[tuple[str, str]] = []

    def add(self, tp: type, where: str | None) -> None:
        """One object of type ``tp`` refused while walking ``where`` (the product's own
        objects are not counted: they are not the user's)."""
        if is_own_type(tp):
            return
        self.count += 1
        if len(self.kept) < REFUSED_KEPT:
            try:
                name = TYPE_NAME(tp)
            except Exception:
                name = "?"
            self.kept.append((name, where or "?"))


# -- classes that cannot be keys (keyable_meta: backends/base.py) ---------------------
def keyable(obj: Any) -> bool:
    """Whether ``type(obj)`` can be a key (see :func:`keyable_meta`)."""
    meta = type(type(obj))
    return meta is type or keyable_meta(meta)


def split_keyable(objs: list) -> tuple[list, list]:
    """``objs`` whose type can be a key, and the others (see :func:`keyable_meta`),
    each in order. In C-level passes; nothing is hashed but metaclasses."""
    metas = list(map(type, map(type, objs)))
    if metas.count(type) == len(metas) or all(map(keyable_meta, set(metas))):
        return objs, []     # (instances of abstract base classes: ABCMeta, asked once)
    ok = list(map(keyable_meta, metas))
    return list(compress(objs, ok)), list(compress(objs, map(not_, ok)))


def slots_of(tp: type) -> tuple:
    """``(name, member descriptor)`` of every ``__slots__`` entry along the MRO."""
    out = []
    for klass in TYPE_MRO(tp):
        d = TYPE_DICT(klass)
        slots = d.get("__slots__", ())
        if type(slots) is str:
            slots = (slots,)
        elif type(slots) is not tuple and type(slots) is not list:
            slots = ()   # what Python made the slots from is gone; their descriptors stay
        for name in slots:
            if type(name) is not str:
                continue
            descr = d.get(name)
            if type(descr) is types.MemberDescriptorType:
                out.append((name, descr))
    return tuple(out)


def has_native_base(tp: type) -> bool:
    """Whether a class made in Python derives from a native type (other than
    ``object``) whose references the instance dict and slots do not show."""
    for klass in TYPE_MRO(tp):
        if klass is object:
            return False
        if not TYPE_FLAGS(klass) & HEAPTYPE:
            return True
    return False


def untracked_holds_nothing(backends: list[Backend]) -> bool:
    """Whether a dict or tuple the garbage collector does not track holds nothing the
    walk could follow: true when every tensor type of these backends is collectable.

    CPython tracks a dict from the moment a collectable object goes into it (and a
    tuple unless all it holds is untracked), so an untracked one holds atoms (and
    objects of types that are not collectable: numpy arrays) only.
    """
    try:
        return all(TYPE_FLAGS(t) & HAVE_GC for b in backends for t in b.tensor_types())
    except Exception:
        return False


# -- kinds of objects ------------------------------------------------------------
SKIP, TENSOR, CONTAINER = "skip", "tensor", "container"
DICT, SEQ, SET = "dict", "seq", "set"                 # exact builtin containers
DICT_SUB, SEQ_SUB, SET_SUB = "dict+", "seq+", "set+"  # their subclasses (and the instance)
MODULE, CLASS, FUNCTION, METHOD, BUILTIN = "module", "class", "function", "method", "builtin"
PARTIAL, LRU, CELL, GENERATOR, FRAME = "partial", "lru", "cell", "generator", "frame"
TRACEBACK, EXCEPTION, NDARRAY = "traceback", "exception", "ndarray"
PANDAS, INSTANCE = "pandas", "instance"
MEMORYVIEW, PROXY = "memoryview", "proxy"   # what they view: the exporter, the mapping


def _by_layout(tp: type) -> str:
    """The kind of a type found by its C-level layout alone."""
    if is_subtype(tp, dict):
        return DICT_SUB
    if is_subtype(tp, (list, tuple)):
        return SEQ_SUB
    if is_subtype(tp, (set, frozenset)):
        return SET_SUB
    if is_subtype(tp, BaseException):
        return EXCEPTION
    top = (type_module(tp) or "").partition(".")[0]
    if top == "numpy" and not dict_descriptor(tp):
        numpy = sys.modules.get("numpy")
        if numpy is not None and is_subtype(tp, numpy.ndarray):
            return NDARRAY
        return SKIP   # scalars, dtypes: no references inside
    if top == "pandas":
        # block managers and blocks keep their arrays in Cython slots: what the gc sees
        return PANDAS
    return INSTANCE


def classify(tp: type, backends: list[Backend]) -> "tuple[str, Backend | None]":
    """The kind of ``tp``'s instances, and the backend for tensors and containers."""
    if not keyable_meta(type(tp)):
        return _by_layout(tp), None     # never hashed (see keyable_meta)
    if tp in SKIP_TYPES or is_subtype(tp, weakref.ref):
        return SKIP, None
    for backend in backends:   # a framework's own class, by identity (a pybind11 one's
        for known in backend.container_types():   # metaclass is no module's)
            if tp is known:
                return CONTAINER, backend
    if type(tp) is not type and not is_library_module_name(type_module(type(tp))):
        # a metaclass of the user's may run code on any look at the class (an
        # abstract base's subclass check asks for ``__mro__``): only the C-level
        # layout is read
        return _by_layout(tp), None
    for backend in backends:
        types_ = backend.tensor_types()
        if types_ and is_subtype(tp, types_):
            return TENSOR, backend
        containers = backend.container_types()
        if containers and is_subtype(tp, containers):
            return CONTAINER, backend
    if is_subtype(tp, types.ModuleType):
        return MODULE, None
    if is_subtype(tp, type):
        return CLASS, None
    if tp is dict:
        return DICT, None
    if tp is list or tp is tuple:
        return SEQ, None
    if tp is set or tp is frozenset:
        return SET, None
    if tp is types.FunctionType:
        return FUNCTION, None
    if tp is types.MethodType:
        return METHOD, None
    if tp is types.BuiltinFunctionType:
        return BUILTIN, None
    if is_subtype(tp, functools.partial):
        return PARTIAL, None
    if tp is LRU_WRAPPER:
        return LRU, None
    if tp is types.CellType:
        return CELL, None
    if tp in (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType):
        return GENERATOR, None
    if tp is types.FrameType:
        return FRAME, None
    if tp is types.TracebackType:
        return TRACEBACK, None
    if tp is memoryview:
        return MEMORYVIEW, None
    if tp is types.MappingProxyType:
        return PROXY, None
    return _by_layout(tp), None
