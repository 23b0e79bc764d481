"""What the walk reads of an object of each kind, one at a time (no labels: the path
search labels them itself, :mod:`.labels`), and the readers both passes share
(a function's parts, a frame's locals, a numpy array's elements).

:data:`HANDLERS` maps a kind (:mod:`.types`) to its reader, called with the
walker and the object; a reader returns what the object holds.
"""
from __future__ import annotations

import sys
import types
from gc import get_referents
from itertools import repeat
from operator import is_, itemgetter
from typing import Any

from .types import (CLASS, CONTAINER, DICT_SUB, FRAME, FUNCTION, GENERATOR, MEMORYVIEW, MODULE,
                    MODULE_DICT, NDARRAY, PANDAS, PROXY, SEQ_SUB, SET_SUB, TYPE_DICT,
                    is_library_module_name, viewed)
from ...backends.base import is_subtype

BIG = 1 << 15           # an exact dict, list, tuple or set longer than this is read in slices
#: a class's own entries that are not what it holds
CLASS_SKIP_KEYS = frozenset({"__dict__", "__weakref__", "__module__", "__doc__", "__slots__"})
_SECOND = itemgetter(1)


def _container(walker: Any, obj: Any) -> list:
    pairs = list(walker.backend_of[type(obj)].children(obj))
    walker.children_of[id(obj)] = (obj, pairs)   # the path search reads them again
    return list(map(_SECOND, pairs))


def _module(walker: Any, obj: Any) -> list:
    d = MODULE_DICT(obj)
    main = sys.modules.get("__main__")
    if is_library_module_name(d.get("__name__")) or (main is not None and main is obj):
        return []
    return [v for k, v in dict.items(d)
            if not (type(k) is str and k.startswith("__") and k.endswith("__"))]


def _class(walker: Any, obj: Any) -> list:
    d = TYPE_DICT(obj)
    if is_library_module_name(d.get("__module__")):
        return []
    return [v for k, v in d.items() if k not in CLASS_SKIP_KEYS]   # a mappingproxy


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


def _function(walker: Any, obj: Any) -> list:
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


def _generator(walker: Any, obj: Any) -> list:
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
    namespace = next((r for r in get_referents(obj) if not is_subtype(type(r), skip)
                      and not any(map(is_, repeat(r), other))), None)
    if namespace is None:
        return {}
    if is_subtype(type(namespace), dict):
        return dict(dict.items(namespace))
    return {"f_locals": namespace}


def _frame(walker: Any, obj: Any) -> list:
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


def _ndarray(walker: Any, obj: Any) -> list:
    # in slices, the clock looked at between two: a long array is never made a list
    walker.admit_iter(ndarray_items(obj))
    base = ndarray_base(obj)
    return [base] if base is not None else []


def _viewed(walker: Any, obj: Any) -> list:
    got = viewed(obj)
    return [got] if got is not None else []


def _pandas(walker: Any, obj: Any) -> list:
    # what the gc sees (block managers and blocks keep their arrays in Cython slots),
    # numpy arrays included, which the collector does not track
    tp = type(obj)
    return [v for v in get_referents(obj) if v is not tp]


def _subclass_container(walker: Any, obj: Any) -> list:
    """A subclass of dict, list, tuple or set: its items through the builtin base's C
    methods (a long one in slices), and what the instance holds besides."""
    tp = type(obj)
    base = next(b for b in (dict, list, tuple, set, frozenset) if is_subtype(tp, b))
    if base.__len__(obj) > BIG:
        walker.in_slices(obj, base)
        return []
    return get_referents(obj)


#: kind -> its reader
HANDLERS = {
    CONTAINER: _container, MODULE: _module, CLASS: _class, FUNCTION: _function,
    GENERATOR: _generator, FRAME: _frame, NDARRAY: _ndarray, PANDAS: _pandas,
    MEMORYVIEW: _viewed, PROXY: _viewed,
    DICT_SUB: _subclass_container, SEQ_SUB: _subclass_container, SET_SUB: _subclass_container,
}
