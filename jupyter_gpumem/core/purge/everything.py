"""What ``%gpumem purge --all`` takes: every name whose memory is the point.

Taken: tensors, models and optimizers (what a framework's backend knows as a tensor or
a container of tensors), and plain lists, tuples, dicts and sets whose tensors are
most of what they hold (their bytes exceed the size of everything else in them).
Kept, unless named: modules, classes, functions, methods, ``functools.partial``
objects and every other object (a DataLoader, a dataset, a config dict with a small
mask in it, an exception), each listed with the bytes it holds. Only the base types'
own methods read the containers: no code of the user's runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..scan import (ATOMIC_IDS, CLASS, CONTAINER, DICT, DICT_SUB, SEQ, SEQ_SUB, SET, SET_SUB,
                    TENSOR, Root, classify, type_name_of)
from ...backends.base import is_subtype

#: the kinds a name is taken for as it is; the plain containers are weighed
TAKEN = frozenset({TENSOR, CONTAINER})
_WEIGHED = frozenset({DICT, SEQ, SET, DICT_SUB, SEQ_SUB, SET_SUB})
#: objects a container's weighing reads at most (beyond, what it read stands)
WEIGH_LIMIT = 10_000
#: what an object of another kind inside a container counts for (its size is its own
#: code to ask)
OTHER_OBJECT_BYTES = 64


@dataclass
class Kept:
    """A name ``--all`` leaves: what it is and the bytes it holds."""

    name: str
    what: str
    nbytes: int


def split(roots: list[Root], reach_of: dict, backends: list) -> tuple[list[str], list[Kept]]:
    """The user names ``--all`` purges, and those it keeps (largest first), among the
    roots that hold memory (``reach_of``: id(root) -> its Reach)."""
    taken: list[str] = []
    kept: list[Kept] = []
    for root in roots:
        reach = reach_of[id(root)]
        if root.hidden or not reach.storages:
            continue
        held = reach.nbytes
        kind, _ = classify(type(root.obj), backends)
        if kind in TAKEN or (kind in _WEIGHED and held > _other_bytes(root.obj, backends)):
            taken.append(root.name)
        else:
            kept.append(Kept(root.name, _what(root.obj, kind), held))
    kept.sort(key=lambda k: -k.nbytes)
    return taken, kept


def _what(obj: Any, kind: str) -> str:
    if kind == CLASS:
        return "class"
    try:
        return type_name_of(type(obj))
    except Exception:  # noqa: BLE001
        return kind


def _other_bytes(obj: Any, backends: list) -> int:
    """The size of what a plain container holds besides tensors, models and optimizers:
    the containers and atoms themselves, and a small fixed size for any other object."""
    total = 0
    stack = [obj]
    seen: set[int] = set()
    while stack and len(seen) < WEIGH_LIMIT:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        tp = type(o)
        if id(tp) in ATOMIC_IDS:
            total += tp.__sizeof__(o)     # a built-in atom's own size
            continue
        kind, _ = classify(tp, backends)
        if kind in TAKEN:
            continue
        if kind in (DICT, DICT_SUB):
            total += dict.__sizeof__(o)
            stack += dict.keys(o)
            stack += dict.values(o)
        elif kind in (SEQ, SEQ_SUB):
            base = list if is_subtype(tp, list) else tuple
            total += base.__sizeof__(o)
            stack += base.__iter__(o)
        elif kind in (SET, SET_SUB):
            base = set if is_subtype(tp, set) else frozenset
            total += base.__sizeof__(o)
            stack += base.__iter__(o)
        else:
            total += OTHER_OBJECT_BYTES
    return total


def kept_message(kept: list[Kept], fmt_bytes, dry_run: bool) -> str:
    """One line naming what ``--all`` leaves, with the bytes each holds."""
    shown = _listed([f"{k.name} {fmt_bytes(k.nbytes)} ({k.what})" for k in kept])
    verb = "would keep" if dry_run else "kept"
    return (f"--all {verb} {shown}: not tensors, models, optimizers or containers "
            f"mostly of them; name them to purge them")


def hidden_left_message(left: list[tuple[str, int]], fmt_bytes, dry_run: bool) -> str:
    """One line naming the hidden holders ``--all`` leaves (it takes names, and the hidden
    holders that go with them): ``(name, bytes)`` each."""
    shown = _listed([f"{name} {fmt_bytes(nbytes)}" for name, nbytes in left])
    verb = "would leave" if dry_run else "left"
    return (f"--all {verb} the hidden holders {shown} (it takes names, and only the "
            f"hidden holders that go with them): `%gpumem purge` with no names clears them")


def _listed(texts: list[str], most: int = 8) -> str:
    """The first ``most`` of ``texts``, and how many more."""
    more = f" and {len(texts) - most} more" if len(texts) > most else ""
    return ", ".join(texts[:most]) + more
