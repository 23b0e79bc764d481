"""What of the memory a purge frees is still alive afterwards, and who holds it.

The plan notes a weak handle on each storage it means to free (:class:`Recorder`,
:func:`weak_handles`); after the deletions, :func:`held_elsewhere` names what keeps
a live one: a module's global (libraries included, which the scan of names does not
enter) or, failing that, something unnamed.
"""
from __future__ import annotations

import sys
import types
import weakref
from operator import itemgetter
from typing import Any

from .. import scan as _scan
from ...backends import active_backends
from .result import UNNAMED, StillHeld
from ..scan import ATOMIC_IDS, Root
from ...backends.base import is_subtype

_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
_TYPE_DICT = type.__dict__["__dict__"].__get__
_FIRST = itemgetter(0)


class Recorder:
    """A backend as the scan sees it, noting for each storage key the first tensor seen
    using it. Those are strong references: the plan turns the ones it needs into weak
    handles (:func:`weak_handles`) and drops them all before anything is deleted. (A weak
    reference to each of 30,000 tensors costs ~0.2 s; a dict entry next to nothing.)"""

    def __init__(self, inner: Any, refs: dict) -> None:
        self._inner = inner
        self._refs = refs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def take(self, obj: Any, seen: dict) -> tuple:
        out = self._inner.take(obj, seen)
        self._note(obj, out[0])
        return out

    def batch_spec(self) -> None:
        return None   # every batch through take_many below, which notes its tensors

    def take_many(self, values: list) -> Any:
        out = self._inner.take_many(values)
        if out is not None:
            infos = out[0]
            if set(map(len, infos)) == {1}:   # one storage each: C-level passes
                self._refs.update(zip(map(_FIRST, map(_FIRST, infos)), values))
            else:
                for value, its in zip(values, infos):
                    self._note(value, its)
        return out

    def storages(self, obj: Any) -> list:
        infos = self._inner.storages(obj)
        self._note(obj, infos)
        return infos

    def _note(self, obj: Any, infos: Any) -> None:
        refs = self._refs
        for info in infos:
            if info[0] not in refs:
                refs[info[0]] = obj


def weak_handles(refs: dict, infos: dict) -> dict:
    """``key -> (backend, weak handle)`` for the storages a purge means to free (``infos``:
    key -> StorageInfo; ``refs``: key -> a tensor using it, from :class:`Recorder`).

    A framework that can watch a storage itself gives the handle (PyTorch: a weak
    reference to the storage, which outlives a view's tensor object); for the rest it
    is a weak reference to the tensor object (backend None). Release with :func:`release_handles`."""
    out: dict = {}
    with _scan.paused_gc():
        for backend in active_backends():
            try:
                found = backend.weak_handles(refs, infos)
            except Exception:  # noqa: BLE001 - the plain weak references below stand
                found = {}
            out.update((key, (backend, h)) for key, h in found.items() if key not in out)
        for key in infos:
            obj = refs.get(key)
            if key in out or obj is None:
                continue
            try:
                out[key] = (None, weakref.ref(obj))
            except TypeError:
                pass
            del obj
    return out


def _alive(handles: dict, infos: dict) -> dict:
    """``key -> StorageInfo`` of the handles whose memory is still in use."""
    return {key: infos[key] for key, (backend, handle) in handles.items()
            if (backend.handle_alive(handle) if backend is not None else handle() is not None)}


def release_handles(handles: dict) -> None:
    """Give back the handles :func:`weak_handles` took (a framework's own, each to it)."""
    by_backend: dict = {}
    for backend, handle in handles.values():
        if backend is not None:
            by_backend.setdefault(id(backend), (backend, []))[1].append(handle)
    for backend, its in by_backend.values():
        try:
            backend.release_handles(its)
        except Exception:  # noqa: BLE001
            pass
    handles.clear()


def _library_holders(keys: set, ids, shell, namespace, time_limit: float):
    """Where modules' globals (libraries included, which the scan of names does not
    enter) still hold ``keys``: ``key -> (global, path)``, and the scan's notes.

    Reads module dicts and class dicts through ``dict.items``; a class's own
    attributes are looked at where the class is defined."""
    user_ns = shell.user_ns if shell is not None else namespace
    entries: dict[str, Any] = {}
    seen: set[int] = set()
    for modname, mod in list(dict.items(sys.modules)):
        if type(modname) is not str or not is_subtype(type(mod), types.ModuleType):
            continue
        d = _MODULE_DICT(mod)
        if d is user_ns or type(d) is not dict or id(d) in seen:
            continue
        seen.add(id(d))
        for k, v in list(dict.items(d)):
            tp = type(v)
            if type(k) is not str or (k.startswith("__") and k.endswith("__")) \
                    or id(tp) in ATOMIC_IDS or is_subtype(tp, types.ModuleType):
                continue
            entries[f"{modname}.{k}"] = v
            if is_subtype(tp, type):
                cd = _TYPE_DICT(v)
                home = cd.get("__module__")
                if type(home) is str and home == modname:
                    for ck, cv in list(cd.items()):
                        if type(ck) is str and not (ck.startswith("__") and ck.endswith("__")) \
                                and id(type(cv)) not in ATOMIC_IDS:
                            entries[f"{modname}.{k}.{ck}"] = cv
    result = _scan.scan([Root("", entries)], devices=ids, shell=shell, namespace=namespace,
                        time_limit=time_limit)
    del entries
    found = {}
    for key in keys & result.reach[0].storages.keys():
        node = result.reach[0].storages[key][1]
        labels = []
        while node is not None:
            node, label = node
            labels.append(label)
        labels.reverse()   # ("root", ""), ("item", "json._stash"), ...
        if len(labels) < 2 or labels[1][0] != "item" or type(labels[1][1]) is not str:
            continue
        by = labels[1][1]
        found[key] = (by, by + "".join(_scan.format_label(lb) for lb in labels[2:]))
    notes = ["partial search of modules' globals: " + ", ".join(result.reasons)] \
        if result.partial else []
    return found, notes


def held_elsewhere(handles: dict, infos: dict, scan3, context: Any):
    """What of the memory a purge meant to free is still alive though no notebook name
    reaches it: StillHeld entries (a module's global, or unnamed), bytes per device
    to count as not freed, and notes. ``context``: the purge's
    :class:`~.plan.PurgeContext` (its search of modules' globals gets what is left of
    the budget)."""
    alive = _alive(handles, infos)
    for reach in scan3.reach:
        for k in alive.keys() & reach.storages.keys():
            del alive[k]
    if not alive:
        return [], {}, []
    kept: dict[str, int] = {}
    for info in alive.values():
        kept[info.device] = kept.get(info.device, 0) + info.nbytes
    found, notes = _library_holders(set(alive), context.ids, context.shell,
                                    context.namespace, context.budget.limit())
    groups: dict[str, list] = {}
    for key, (by, path) in found.items():
        groups.setdefault(by, []).append((alive.pop(key), path))
    out = []
    for by, items in groups.items():
        largest = max(items, key=lambda x: x[0].nbytes)
        out.append(StillHeld(by, largest[1], sum(i.nbytes for i, _ in items), kind="library"))
    if alive:
        out.append(StillHeld(UNNAMED, None, sum(i.nbytes for i in alive.values()), kind="unnamed"))
    out.sort(key=lambda s: -s.nbytes)
    return out, kept, notes

