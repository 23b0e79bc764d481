"""What an object of each kind holds, labelled with the step a user would type to it
(``("attr", "weight")``, ``("index", 3)``, ``("closure", "f")``): the path search's
reading of objects (:mod:`.search`).

:data:`LABELLED` maps a kind (:mod:`.types`) to its reader, called with the path
finder and the object; a reader returns ``(label, child)`` pairs. A long container of
an exact type is read by :func:`long_pairs` (see :data:`LONG`, :func:`size_of`).
"""
from __future__ import annotations

import functools
import gc
import sys
import types
from collections import deque
from itertools import chain, compress, islice, repeat
from operator import not_
from typing import Any

from ...backends.base import dict_descriptor, is_subtype
from .kinds import (CLASS_SKIP_KEYS, function_parts, frame_locals, generator_frame, ndarray_base,
                    ndarray_holds_objects, ndarray_items, ndarray_size)
from .types import (BUILTIN, CELL, CLASS, CONTAINER, DICT, DICT_SUB, EXCEPTION, FRAME, FUNCTION,
                    GENERATOR, INSTANCE, LRU, MEMORYVIEW, METHOD, MODULE, MODULE_DICT, NDARRAY,
                    PANDAS, PARTIAL, PROXY, SEQ, SEQ_SUB, SET, SET_SUB, TRACEBACK, TYPE_DICT,
                    has_native_base, is_a, is_library_module_name, keyable_meta, slots_of, viewed)
from .types import ATOMIC_IDS as _ATOMIC_IDS

_SLICE = 1 << 15   # children of a long container labelled in one C-level pass
_ELEM, _KEY, _ODD_KEY = ("elem",), ("key",), ("item", ...)
_BASES = {DICT: (dict,), SEQ: (list, tuple), SET: (set, frozenset), DICT_SUB: (dict,),
          SEQ_SUB: (list, tuple), SET_SUB: (set, frozenset)}
_EXC_LINKS = ("__traceback__", "__context__", "__cause__")
is_tracked = gc.is_tracked


class LongPairs:
    """The labelled children of a long dict, list, tuple, set or object array (exact
    types), a block of the search whose ``(label, child)`` pairs are made only when
    read: ``pairs[j]`` is ``((kind, position), value)`` (``(("elem",), value)`` for kind
    None). A million records cost two C-level lists, not two million tuples."""

    __slots__ = ("kind", "positions", "values")

    def __init__(self, kind: str | None, positions: list | None, values: list) -> None:
        self.kind = kind
        self.positions = positions   # None: each value's position is its index
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, j: int) -> tuple:
        if self.kind is None:
            return _ELEM, self.values[j]
        return (self.kind, j if self.positions is None else self.positions[j]), self.values[j]


def _not_atoms(values: list) -> list:
    """Which of ``values`` are not atoms, in C-level passes. Types are compared by id
    here and below: a class whose metaclass defines ``__hash__`` or ``__eq__`` is never
    hashed (see types.keyable_meta)."""
    return list(map(not_, map(_ATOMIC_IDS.__contains__, map(id, map(type, values)))))


def _labelled(f: Any, it: Any, kind: str | None) -> list:
    """``((kind, i), v)`` (``(("elem",), v)`` for kind None) of each value ``it`` gives
    that is not an atom, ``i`` its place: read in slices, in C-level passes, the search's
    clock looked at between two (a list of a million records is not read in one go)."""
    out: list = []
    at = 0
    while True:
        f.check_time()
        chunk = list(islice(it, _SLICE))
        n = len(chunk)
        labels = repeat(_ELEM, n) if kind is None else zip(repeat(kind), range(at, at + n))
        out += compress(zip(labels, chunk), _not_atoms(chunk))
        at += n
        if n < _SLICE:
            return out


#: the kinds whose long instances are read into a :class:`LongPairs`
LONG = frozenset({DICT, SEQ, SET, NDARRAY})


def size_of(obj: Any, kind: str) -> int:
    """How many items a container has (0 for other kinds), by its base type's C length."""
    if kind == NDARRAY:   # the elements of an object array (another holds none)
        return ndarray_size(obj) if ndarray_holds_objects(obj) else 0
    base = _BASES.get(kind)
    if base is None:
        return 0
    if kind in (DICT, SEQ, SET):
        return len(obj)   # an exact builtin type: its C length
    base = next((b for b in base if is_a(obj, b)), None)
    return base.__len__(obj) if base is not None else 0


def long_pairs(f: Any, obj: Any, kind: str) -> Any:
    """The children of a long container of an exact type (see :data:`LONG`), as a
    :class:`LongPairs`, read in slices as :func:`_labelled` reads (a dict with keys that
    are not atoms: the pairs of :func:`_dict_items`)."""
    tp = type(obj)
    if kind == DICT:
        keys_of, values_of = iter(dict.keys(obj)), iter(dict.values(obj))
        label = "item"
    else:
        keys_of = None
        values_of = ndarray_items(obj) if kind == NDARRAY else tp.__iter__(obj)
        label = "index" if kind == SEQ else "flat" if kind == NDARRAY else None
    values: list = []
    positions: list | None = None
    at = 0
    while True:
        f.check_time()
        chunk = list(islice(values_of, _SLICE))
        n = len(chunk)
        if keys_of is not None:
            keys = list(islice(keys_of, _SLICE))
            if not _ATOMIC_IDS.issuperset(map(id, map(type, keys))):
                return _dict_items(f, obj)
            if positions is None:
                positions = []
        mask = _not_atoms(chunk)
        if positions is None and label is not None and mask.count(True) != n:
            positions = list(range(len(values)))   # until now, each one's index
        values += compress(chunk, mask)
        if positions is not None:
            positions += compress(keys if keys_of is not None else range(at, at + n), mask)
        at += n
        if n < _SLICE:
            return LongPairs(label, positions, values)


def _dict_items(f: Any, obj: Any) -> list:
    """``(("item", key), value)`` of a dict's values that are not atoms (the key shown
    only where it is an atom), then ``(("key",), key)`` of its keys that are not: in
    slices, as :func:`_labelled`."""
    out: list = []
    odd: list = []
    keys_of, values_of = iter(dict.keys(obj)), iter(dict.values(obj))
    while True:
        f.check_time()
        keys = list(islice(keys_of, _SLICE))
        values = list(islice(values_of, _SLICE))
        n = len(keys)
        atom_keys = list(map(_ATOMIC_IDS.__contains__, map(id, map(type, keys))))
        if atom_keys.count(True) == n:
            labels: Any = zip(repeat("item"), keys)
        else:
            labels = [("item", k) if atom else _ODD_KEY for k, atom in zip(keys, atom_keys)]
            odd += compress(keys, map(not_, atom_keys))
        out += compress(zip(labels, values), _not_atoms(values))
        if n < _SLICE:
            out += zip(repeat(_KEY), odd)
            return out


def _l_dict(f: Any, obj: Any):
    if f.untracked_is_empty and not is_tracked(obj):
        return ()   # only atoms inside
    return _dict_items(f, obj)


def _l_seq(f: Any, obj: Any):
    if f.untracked_is_empty and not is_tracked(obj):
        return ()
    return _labelled(f, (list if type(obj) is list else tuple).__iter__(obj), "index")


def _l_set(f: Any, obj: Any):
    return _labelled(f, (set if is_a(obj, set) else frozenset).__iter__(obj), None)


def _l_dict_sub(f: Any, obj: Any):
    return chain(_dict_items(f, obj), _l_instance(f, obj, covered=True))


def _l_seq_sub(f: Any, obj: Any):
    return chain(_labelled(f, (list if is_a(obj, list) else tuple).__iter__(obj), "index"),
                 _l_instance(f, obj, covered=True))


def _l_set_sub(f: Any, obj: Any):
    return chain(_labelled(f, (set if is_a(obj, set) else frozenset).__iter__(obj), None),
                 _l_instance(f, obj, covered=True))


def _l_container(f: Any, obj: Any):
    known = f.reacher.children_of.get(id(obj))
    if known is not None and known[0] is obj:
        return known[1]
    return f.reacher.backend_of[type(obj)].children(obj)


def _l_module(f: Any, obj: Any):
    d = MODULE_DICT(obj)
    main = sys.modules.get("__main__")
    if is_library_module_name(d.get("__name__")) or (main is not None and main is obj):
        return ()
    return ((("attr", k), v) for k, v in dict.items(d)
            if type(k) is str and not (k.startswith("__") and k.endswith("__")))


def _l_class(f: Any, obj: Any):
    d = TYPE_DICT(obj)
    if is_library_module_name(d.get("__module__")):
        return ()
    return ((("attr", k), v) for k, v in d.items() if k not in CLASS_SKIP_KEYS)


def _l_function(f: Any, obj: Any):
    closure, defaults, kwdefaults, attrs = function_parts(obj)
    out = [(("closure", name), v) for name, v in closure]
    out += [(("default", i), v) for i, v in enumerate(defaults)]
    out += [(("default", k), v) for k, v in dict.items(kwdefaults)]
    out += [(("attr", k), v) for k, v in dict.items(attrs)]
    return out


def _l_method(f: Any, obj: Any):
    return [(("attr", "__self__"), obj.__self__), (("attr", "__func__"), obj.__func__)]


def _l_builtin(f: Any, obj: Any):
    owner = obj.__self__
    if owner is None or is_a(owner, type(gc)):
        return ()
    return [(("attr", "__self__"), owner)]


def _l_partial(f: Any, obj: Any):
    def get(name):
        return functools.partial.__dict__[name].__get__(obj)

    out = [(("attr", "func"), get("func"))]
    out += [(("attr_index", "args", i), v) for i, v in enumerate(get("args"))]
    out += [(("attr_item", "keywords", k), v) for k, v in dict.items(get("keywords") or {})]
    return chain(out, _l_instance(f, obj, covered=True))


def _own_dict(obj: Any) -> Any:
    descr = dict_descriptor(type(obj))
    return descr.__get__(obj) if descr is not None else None


def _l_lru(f: Any, obj: Any):
    own = _own_dict(obj)
    refs = [(("lru",), v) for v in gc.get_referents(obj)
            if v is not own and type(v) is not types.FunctionType]
    return chain(refs, _l_instance(f, obj, covered=True))


def _l_cell(f: Any, obj: Any):
    try:
        return [(None, obj.cell_contents)]
    except ValueError:
        return ()


def _l_generator(f: Any, obj: Any):
    frame = generator_frame(obj)
    return [(None, frame)] if frame is not None else ()


def _l_frame(f: Any, obj: Any):
    func = obj.f_code.co_name
    return [(("local", func, k), v) for k, v in dict.items(frame_locals(obj)) if v is not obj]


def _l_traceback(f: Any, obj: Any):
    out = [(None, obj.tb_frame)]
    if obj.tb_next is not None:
        out.append((None, obj.tb_next))
    return out


def _l_exception(f: Any, obj: Any):
    base = BaseException.__dict__
    out = []
    for name in _EXC_LINKS:
        v = base[name].__get__(obj)
        if v is not None:
            out.append((("attr", name), v))
    out += [(("attr_index", "args", i), v) for i, v in enumerate(base["args"].__get__(obj))]
    return chain(out, _l_instance(f, obj, covered=True))


def _l_ndarray(f: Any, obj: Any):
    base = ndarray_base(obj)
    return _labelled(f, ndarray_items(obj), "flat") + (
        [(("attr", "base"), base)] if base is not None else [])


def _l_memoryview(f: Any, obj: Any):
    got = viewed(obj)
    return [(("attr", "obj"), got)] if got is not None else ()


def _l_proxy(f: Any, obj: Any):
    got = viewed(obj)
    if got is None:
        return ()
    return _dict_items(f, got) if is_a(got, dict) else [(("ref",), got)]


def _layout(f: Any, tp: type) -> tuple:
    """``(dict descriptor, slots, a class of the user's, a native base)`` of a type, kept
    per type (read anew for a class that cannot be a key: see keyable_meta)."""
    if not keyable_meta(type(tp)):
        return _read_layout(tp)
    layout = f.layouts.get(tp)
    if layout is None:
        layout = f.layouts[tp] = _read_layout(tp)
    return layout


def _read_layout(tp: type) -> tuple:
    return (dict_descriptor(tp), slots_of(tp),
            not is_library_module_name(TYPE_DICT(tp).get("__module__")), has_native_base(tp))


def _l_instance(f: Any, obj: Any, covered: bool = False):
    """An instance's attributes (its dict, its slots), its class where it is the
    user's, and what only the collector sees of a native base (unless ``covered``:
    the caller lists that base's references itself)."""
    tp = type(obj)
    dict_descr, slots, user_class, native = _layout(f, tp)
    out: list = []
    own = None
    if dict_descr is not None:
        own = dict_descr.__get__(obj)
        if is_a(own, dict) and dict.__len__(own):   # a dict subclass through dict's own
            out += [(("attr", k), v) for k, v in dict.items(own)]
    for name, descr in slots:
        try:
            out.append((("attr", name), descr.__get__(obj)))
        except AttributeError:
            continue
    if not covered and is_subtype(tp, deque):
        out += _labelled(f, deque.__iter__(obj), "index")
        covered = True
    if not covered and ((dict_descr is None and not slots) or native):
        # what only the garbage collector sees (a native base's references)
        listed = {id(v) for _, v in out}
        out += [(("ref",), v) for v in gc.get_referents(obj)
                if v is not tp and v is not own and id(v) not in listed]
    if user_class:
        out.append((("attr", "__class__"), tp))
    return out


def _l_pandas(f: Any, obj: Any):
    tp = type(obj)
    out = _l_instance(f, obj, covered=True)
    listed = {id(v) for _, v in out}
    own = _own_dict(obj)
    out += [(("ref",), v) for v in gc.get_referents(obj)
            if v is not tp and v is not own and id(v) not in listed]
    return out


#: kind -> its labelled reader
LABELLED = {
    DICT: _l_dict, SEQ: _l_seq, SET: _l_set, DICT_SUB: _l_dict_sub, SEQ_SUB: _l_seq_sub,
    SET_SUB: _l_set_sub, CONTAINER: _l_container, MODULE: _l_module, CLASS: _l_class,
    FUNCTION: _l_function, METHOD: _l_method, BUILTIN: _l_builtin, PARTIAL: _l_partial,
    LRU: _l_lru, CELL: _l_cell, GENERATOR: _l_generator, FRAME: _l_frame,
    TRACEBACK: _l_traceback, EXCEPTION: _l_exception, NDARRAY: _l_ndarray,
    INSTANCE: _l_instance, PANDAS: _l_pandas, MEMORYVIEW: _l_memoryview, PROXY: _l_proxy,
}
