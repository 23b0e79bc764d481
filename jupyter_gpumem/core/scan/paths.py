"""Names and paths a user can type (``model``, ``m.cache``, ``cfg['runs']``, ``Out[12]``).

A path is parsed, never evaluated: only a name followed by ``.attr`` and
``[literal]`` steps is accepted (``.0`` too, as the report shows a
``Sequential``'s children: ``seq.0.weight``). A namespace key that is not an
identifier (``globals()['x[0]'] = t``) is written ``globals()['x[0]']``, and an
attribute that is none ``.__dict__['my attr']``: the text a report shows for a
holder names that holder and nothing else. Each step is looked up in
instance dictionaries, ``__slots__`` fields and containers directly, through
the base types' own methods, so no property, ``__getattr__``, ``__class__``
or other code of the user's runs. An attribute found none of those ways is asked of
the backends (:meth:`~jupyter_gpumem.backends.Backend.path_attr`): the links only a
framework reads, as the scan prints them (``loss.grad_fn.next_functions[0][0]._saved_mat1``
steps through an autograd graph, read as the walk reads it, no saved tensor unpacked).
Such a path names an object but no binding a purge could delete (:func:`check_deletable`
says which name to purge instead).
"""
from __future__ import annotations

import ast
import re
import sys
import types
from dataclasses import dataclass
from typing import Any

from ...backends import active_backends
from ...backends.base import is_subtype

_MODULE_DICTS = ("_parameters", "_buffers", "_modules")  # nn.Module keeps these apart
_TYPE_DICT = type.__dict__["__dict__"].__get__      # a class's own namespace, C-level
_TYPE_MRO = type.__dict__["__mro__"].__get__
_TYPE_FLAGS = type.__dict__["__flags__"].__get__
_TYPE_NAME = type.__dict__["__name__"].__get__     # no metaclass of the user's asked
_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
_HEAPTYPE = 1 << 9      # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
_EXC_LINKS = ("__traceback__", "__context__", "__cause__")   # purged by setting None
_ATTR = re.compile(r"\s*(\d+|[^\W\d]\w*)\s*")
_NAME = re.compile(r"[^\W\d]\w*")
_DIGITS = re.compile(r"\d+")
_GLOBALS = "globals()"
_READ = object()   # the "slot" of a step a backend read (Backend.path_attr): no binding
#: where the report left steps out of a path too long to show (a deep autograd graph's):
#: ``…(1,234 steps)…``
ELIDED = "\u2026"
_ELISION = re.compile(ELIDED + r"\([\d,]+ steps\)" + ELIDED)


def is_plain_name(key: Any) -> bool:
    """Whether ``key`` reads back as itself when typed bare (``model``, not ``x[0]``)."""
    return type(key) is str and key.isidentifier() and _NAME.fullmatch(key) is not None


def name_text(key: str) -> str:
    """How a namespace key is typed: ``model``, or ``globals()['x[0]']`` for one that is
    no identifier (``x[0]`` would name the first item of ``x``)."""
    return key if is_plain_name(key) else f"{_GLOBALS}[{key!r}]"


def attr_text(name: Any) -> str:
    """How a stored attribute is typed after its owner: ``.cache``, or
    ``.__dict__['my attr']`` for a name that is no identifier; ``.__dict__[...]`` where
    the key is not a string."""
    if is_plain_name(name) or (type(name) is str and _DIGITS.fullmatch(name)):
        return "." + name   # ``seq.0``: a Sequential's children, as ``.0`` parses
    return f".__dict__[{name!r}]" if type(name) is str else ".__dict__[...]"


class PathError(ValueError):
    """A name or path that is malformed or does not exist."""


class Changed(LookupError):
    """What a binding describes is no longer there: it went or changed on its own."""


@dataclass
class Binding:
    """Where a path's object lives, so it can be deleted by identity."""

    text: str
    obj: Any
    container: Any          # dict or list holding the reference, or the object with the slot
    key: Any                # key in a dict, position (>= 0) in a list, slot name
    root_name: str          # how the name is typed (``x``, ``globals()['x[0]']``)
    slot: Any = None        # the descriptor of a ``__slots__`` field or an exception's link
    owner: Any = None       # the object whose step holds the reference (None: the namespace)
    owner_text: str = ""    # the path of ``owner``: ``m.layers[3]`` for ``m.layers[3].cache``
    steps: int = 0          # steps after the name: 0 for the name itself
    through: str = ""       # the first step a backend read (``loss.grad_fn``), if any
    holder: str = ""        # the path of the object that step left (``loss``)

    @property
    def is_name(self) -> bool:
        return self.steps == 0

    @property
    def in_list(self) -> bool:
        """Purging it leaves ``None`` at its position: the list keeps its length."""
        return self.slot is None and is_subtype(type(self.container), list)


# -- parsing -----------------------------------------------------------------------
def parse(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """``"m.layers[0]"`` -> ``("m", [("attr", "layers"), ("item", 0)])``."""
    if type(text) is not str or not text.strip():
        raise PathError(f"malformed path {text!r}: expected a name such as model or m.cache")
    s = text.strip()
    if s.startswith(_GLOBALS):
        pos = len(_GLOBALS)
        while pos < len(s) and s[pos].isspace():
            pos += 1
        if pos >= len(s) or s[pos] != "[":
            raise PathError(f"malformed path {text!r}: expected globals()['key']")
        name, pos = _bracket(s, pos, text)
        if type(name) is not str:
            raise PathError(f"malformed path {text!r}: a name is a string: globals()['key']")
        while pos < len(s) and s[pos].isspace():
            pos += 1
    else:
        m = _ATTR.match(s)
        if m is None or m.group(1)[0].isdigit():
            raise PathError(f"malformed path {text!r}: expected name, .attr and [key] steps")
        name, pos = m.group(1), m.end()
    steps: list[tuple[str, Any]] = []
    while pos < len(s):
        c = s[pos]
        if c == ".":
            m = _ATTR.match(s, pos + 1)
            if m is None:
                raise PathError(f"malformed path {text!r}: expected name, .attr and [key] steps")
            steps.append(("attr", m.group(1)))
            pos = m.end()
        elif c == "[":
            key, pos = _bracket(s, pos, text)
            steps.append(("item", key))
            while pos < len(s) and s[pos].isspace():
                pos += 1
        else:
            raise PathError(f"malformed path {text!r}: only name, .attr and [literal] steps")
    return name, steps


def _bracket(s: str, start: int, text: str) -> tuple[Any, int]:
    """The literal inside ``[...]`` at ``start`` and the position after it."""
    end = s.find("]", start + 1)
    while end != -1:   # a string key may hold "]": the first closing bracket that parses
        try:
            value = ast.literal_eval(s[start + 1:end].strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            end = s.find("]", end + 1)
            continue
        if type(value) not in (int, str):
            break
        return value, end + 1
    raise PathError(f"malformed path {text!r}: a [key] must be a number or a string")


# -- looking up, C-level only -------------------------------------------------------
def _instance_dict(obj: Any) -> dict | None:
    """``obj``'s own ``__dict__`` through the C descriptor, or ``None``."""
    tp = type(obj)
    if is_subtype(tp, types.ModuleType):
        return _MODULE_DICT(obj)
    if is_subtype(tp, type):
        return None
    for klass in _TYPE_MRO(tp):
        descr = _TYPE_DICT(klass).get("__dict__")
        if descr is not None:
            if type(descr) is not types.GetSetDescriptorType:
                return None   # something of the user's stands in for the dict
            d = descr.__get__(obj)
            return d if type(d) is dict else None
    return None


instance_dict = _instance_dict


def slot_items(obj: Any) -> list[tuple[str, Any]]:
    """``(name, value)`` of every ``__slots__`` field of ``obj`` that holds something."""
    out, names = [], set()
    for klass in _TYPE_MRO(type(obj)):
        for name, descr in _TYPE_DICT(klass).items():
            if type(descr) is types.MemberDescriptorType and type(name) is str \
                    and name not in names and _TYPE_FLAGS(descr.__objclass__) & _HEAPTYPE:
                names.add(name)
                try:
                    out.append((name, descr.__get__(obj, type(obj))))
                except (AttributeError, TypeError):
                    pass
    return out


def _slot(tp: type, name: str) -> Any:
    """The member descriptor of a ``__slots__`` field ``name`` of ``tp``, or ``None``.

    Looked for through the whole MRO, as the scan reads slots: a property of a
    subclass under the same name is never called, the field itself is found."""
    for klass in _TYPE_MRO(tp):
        descr = _TYPE_DICT(klass).get(name)
        if type(descr) is types.MemberDescriptorType:
            return descr
    return None


def _base_method(tp: type, base: type, name: str) -> Any:
    """``name`` of the nearest class in ``tp``'s MRO that is built in (not a class
    statement's) and a subclass of ``base``: ``OrderedDict.__delitem__`` for an
    ``OrderedDict`` (``dict``'s would break its order), ``dict``'s for a user's dict."""
    for klass in _TYPE_MRO(tp):
        if not _TYPE_FLAGS(klass) & _HEAPTYPE and is_subtype(klass, base):
            method = _TYPE_DICT(klass).get(name)
            if method is not None:
                return method
    return _TYPE_DICT(base)[name]


def _step(obj: Any, kind: str, key: Any, text: str) -> tuple[Any, Any, Any, Any]:
    """One step: returns (child, container, key in container, slot descriptor)."""
    tp = type(obj)
    if kind == "attr":
        d = _instance_dict(obj)
        if key == "__dict__" and d is not None and not dict.__contains__(d, key):
            return d, obj, key, None   # ``.__dict__['my attr']``: its stored attributes
        if d is not None:
            if dict.__contains__(d, key):
                return dict.__getitem__(d, key), d, key, None
            for group in _MODULE_DICTS:
                sub = dict.get(d, group)
                if is_subtype(type(sub), dict) and dict.__contains__(sub, key) \
                        and dict.__getitem__(sub, key) is not None:
                    return dict.__getitem__(sub, key), sub, key, None
        if not is_subtype(tp, type):
            descr = _slot(tp, key)
            if descr is not None:
                try:
                    return descr.__get__(obj, tp), obj, key, descr
                except AttributeError:
                    raise PathError(f"{text}: the slot {key!r} holds nothing") from None
                except TypeError:
                    pass
        else:
            if key in _TYPE_DICT(obj):
                raise PathError(f"{text}: class attributes are purged through the class; "
                                f"purge the class name instead")
        if key in _EXC_LINKS and is_subtype(tp, BaseException):
            descr = _TYPE_DICT(BaseException)[key]
            value = descr.__get__(obj, tp)
            if value is None:
                raise PathError(f"{text}: holds nothing")
            return value, obj, key, descr
        for backend in active_backends():
            try:
                return backend.path_attr(obj, key), obj, key, _READ
            except LookupError:
                continue
            except ValueError as exc:
                raise PathError(f"{text}: {exc}") from None
            except (AttributeError, TypeError, RuntimeError) as exc:   # not readable now
                raise PathError(f"{text}: .{key} not readable ({type(exc).__name__})") from None
        raise PathError(f"{text}: no attribute {key!r} (only stored attributes are looked up)")
    if is_subtype(tp, dict):
        if dict.__contains__(obj, key):
            return dict.__getitem__(obj, key), obj, key, None
        raise PathError(f"{text}: no key {key!r}")
    if is_subtype(tp, (list, tuple)) and type(key) is int:
        base = list if is_subtype(tp, list) else tuple
        n = base.__len__(obj)
        i = key + n if key < 0 else key
        if not 0 <= i < n:
            raise PathError(f"{text}: index {key} out of range")
        return base.__getitem__(obj, i), obj, i, None
    raise PathError(f"{text}: cannot look up [{key!r}] in a {_TYPE_NAME(tp)}")


def resolve(text: str, *, shell: Any = None, namespace: dict | None = None) -> Binding:
    """Find the object a path names, and the container that holds it."""
    ns = shell.user_ns if shell is not None else (namespace if namespace is not None else {})
    try:
        name, steps = parse(text)
    except PathError:
        if type(text) is str and dict.__contains__(ns, text):
            raise PathError(f"{text!r} is a key that is no name: write it "
                            f"{name_text(text)}") from None
        if type(text) is str and _ELISION.search(text):
            holder = _NAME.match(text.strip())
            raise PathError(f"{text}: the report left steps out of this path, too long to "
                            f"show: it names one object but cannot be typed back (%gpumem "
                            f"{holder.group() if holder else 'NAME'} lists it)") from None
        raise
    if not dict.__contains__(ns, name):
        raise PathError(f"name {name!r} is not defined")
    obj, container, key, slot = dict.__getitem__(ns, name), ns, name, None
    owner, owner_text = None, ""
    root_name = name_text(name)
    parts = [root_name] + [attr_text(k) if kind == "attr" else f"[{k!r}]" for kind, k in steps]
    through = holder = ""
    for i, (kind, k) in enumerate(steps):
        owner = obj
        obj, container, key, slot = _step(obj, kind, k, text)
        if slot is _READ and not through:
            holder = "".join(parts[:i + 1])
            through = holder + parts[i + 1]
    if steps:
        owner_text = "".join(parts[:-1])
    return Binding(text, obj, container, key, root_name, slot, owner, owner_text, len(steps),
                   through, holder)


# -- deleting -------------------------------------------------------------------------
def delete(binding: Binding) -> None:
    """Remove the reference a binding describes, by identity (no user code runs).

    A dict loses the key, a slot its value (an exception's ``__traceback__``,
    ``__context__`` and ``__cause__`` become ``None``); a list keeps its length and gets
    ``None`` at that position, so its other positions stay as they were.
    Raises :class:`Changed`, changing nothing, when the reference is no longer
    the one planned (gone or rebound meanwhile, by another thread say)."""
    c, key, obj = binding.container, binding.key, binding.obj
    tp = type(c)
    if binding.through:
        check_deletable(binding)   # raises: nothing to delete
    if binding.slot is not None:
        try:
            current = binding.slot.__get__(c, tp)
        except AttributeError:
            raise Changed(binding.text) from None
        if current is not obj:
            raise Changed(binding.text)
        if type(binding.slot) is types.MemberDescriptorType:
            binding.slot.__delete__(c)
        else:   # an exception's __traceback__, __context__ or __cause__
            binding.slot.__set__(c, None)
    elif is_subtype(tp, dict):
        if not (dict.__contains__(c, key) and dict.__getitem__(c, key) is obj):
            raise Changed(binding.text)
        try:
            _base_method(tp, dict, "__delitem__")(c, key)
        except KeyError:
            raise Changed(binding.text) from None
    elif is_subtype(tp, list):
        if not (key < list.__len__(c) and list.__getitem__(c, key) is obj):
            raise Changed(binding.text)
        _base_method(tp, list, "__setitem__")(c, key, None)
    else:
        raise PathError(f"{binding.text}: lives in a {_TYPE_NAME(tp)}, which cannot be changed; "
                        f"purge the name that holds it")


def check_deletable(binding: Binding) -> None:
    """Raise :class:`PathError` now if :func:`delete` would fail later."""
    if binding.through:
        raise PathError(f"{binding.text}: reached through {binding.through}, a link purge "
                        f"cannot cut (no name, attribute or item); purge {binding.holder} "
                        f"instead, which holds it")
    if type(binding.slot) is types.MemberDescriptorType:
        owner = binding.slot.__objclass__
        if not _TYPE_FLAGS(owner) & _HEAPTYPE:
            raise PathError(f"{binding.text}: a built-in field of {_TYPE_NAME(owner)}, which "
                            f"cannot be changed; purge the name that holds it")
    elif binding.slot is None and not is_subtype(type(binding.container), (dict, list)):
        raise PathError(f"{binding.text}: lives in a {_TYPE_NAME(type(binding.container))}, which "
                        f"cannot be changed; purge the name that holds it")
    if binding.root_name in ("__builtins__", "__builtin__"):
        raise PathError(f"refusing to delete {binding.text}")
    if binding.obj is sys.modules:
        raise PathError(f"refusing to delete {binding.text}")
