"""Names and paths a user can type (``model``, ``m.cache``, ``cfg['runs']``, ``Out[12]``).

A path is parsed, never evaluated: only a name followed by ``.attr`` and
``[literal]`` steps is accepted, and each step is looked up in instance
dictionaries and containers directly, so no property or ``__getattr__`` runs.
"""
from __future__ import annotations

import ast
import sys
import types
from dataclasses import dataclass
from typing import Any

_MODULE_DICTS = ("_parameters", "_buffers", "_modules")  # nn.Module keeps these apart


class PathError(ValueError):
    """A name or path that is malformed or does not exist."""


@dataclass
class Binding:
    """Where a path's object lives, so it can be deleted by identity."""

    text: str
    obj: Any
    container: Any          # dict or list holding the reference
    key: Any                # key or index in ``container``
    root_name: str

    @property
    def is_name(self) -> bool:
        return self.text == self.root_name


def parse(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """``"m.layers[0]"`` -> ``("m", [("attr", "layers"), ("item", 0)])``."""
    if not isinstance(text, str) or not text.strip():
        raise PathError(f"malformed path {text!r}: expected a name such as model or m.cache")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise PathError(f"malformed path {text!r}: expected name, .attr and [key] steps") from None
    steps: list[tuple[str, Any]] = []
    while True:
        if isinstance(tree, ast.Name):
            steps.reverse()
            return tree.id, steps
        if isinstance(tree, ast.Attribute):
            steps.append(("attr", tree.attr))
            tree = tree.value
        elif isinstance(tree, ast.Subscript):
            steps.append(("item", _literal(tree.slice, text)))
            tree = tree.value
        else:
            raise PathError(f"malformed path {text!r}: only name, .attr and [literal] steps")


def _literal(node: ast.AST, text: str) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        raise PathError(f"malformed path {text!r}: a [key] must be a number or a string") from None
    if type(value) not in (int, str):
        raise PathError(f"malformed path {text!r}: a [key] must be a number or a string")
    return value


def _instance_dict(obj: Any) -> dict | None:
    if isinstance(obj, types.ModuleType):
        return obj.__dict__
    if isinstance(obj, type):
        return None
    from .scan import _dict_of

    descr = _dict_of(type(obj))
    return descr.__get__(obj) if descr is not None else None


def _step(obj: Any, kind: str, key: Any, text: str) -> tuple[Any, Any, Any]:
    """One step: returns (child, container, key in container)."""
    if kind == "attr":
        d = _instance_dict(obj)
        if d is not None:
            if key in d:
                return d[key], d, key
            for group in _MODULE_DICTS:
                sub = d.get(group)
                if isinstance(sub, dict) and key in sub and sub[key] is not None:
                    return sub[key], sub, key
        elif isinstance(obj, type):
            d = type.__dict__["__dict__"].__get__(obj)
            if key in d:
                raise PathError(f"{text}: class attributes are purged through the class; "
                                f"purge the class name instead")
        raise PathError(f"{text}: no attribute {key!r} (only stored attributes are looked up)")
    if isinstance(obj, dict):
        if dict.__contains__(obj, key):
            return dict.__getitem__(obj, key), obj, key
        raise PathError(f"{text}: no key {key!r}")
    if isinstance(obj, (list, tuple)) and isinstance(key, int):
        seq = list.__getitem__ if isinstance(obj, list) else tuple.__getitem__
        try:
            return seq(obj, key), obj, key
        except IndexError:
            raise PathError(f"{text}: index {key} out of range") from None
    raise PathError(f"{text}: cannot look up [{key!r}] in a {type(obj).__name__}")


def resolve(text: str, *, shell: Any = None, namespace: dict | None = None) -> Binding:
    """Find the object a path names, and the container that holds it."""
    name, steps = parse(text)
    ns = shell.user_ns if shell is not None else (namespace if namespace is not None else {})
    if name not in ns:
        raise PathError(f"name {name!r} is not defined")
    obj, container, key = ns[name], ns, name
    for kind, k in steps:
        obj, container, key = _step(obj, kind, k, text)
    return Binding(text, obj, container, key, name)


def delete(binding: Binding) -> None:
    """Remove the reference a binding describes (no user code runs)."""
    c = binding.container
    if isinstance(c, dict):
        if dict.__contains__(c, binding.key) and dict.__getitem__(c, binding.key) is binding.obj:
            dict.__delitem__(c, binding.key)
    elif isinstance(c, list):
        for i, v in enumerate(c):
            if v is binding.obj:
                list.__delitem__(c, i)
                break
    else:
        raise PathError(f"{binding.text}: lives in a {type(c).__name__}, which cannot be changed; "
                        f"purge the name that holds it")


def check_deletable(binding: Binding) -> None:
    """Raise :class:`PathError` now if :func:`delete` would fail later."""
    if not isinstance(binding.container, (dict, list)):
        delete(binding)  # raises without changing anything
    if binding.root_name in ("__builtins__", "__builtin__"):
        raise PathError(f"refusing to delete {binding.text}")
    if binding.obj is sys.modules:
        raise PathError(f"refusing to delete {binding.text}")
