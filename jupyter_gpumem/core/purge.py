"""Purge: delete chosen names and every hidden reference to their memory.

The plan is made first and checked whole (every name must exist and hold
memory on the chosen devices), so bad input deletes nothing. Execution
removes the bindings by identity, clears the hidden holders that reach the
same storages (output history, ``_``, the last result, the last traceback),
collects garbage, releases each framework's caches and measures again.
"""
from __future__ import annotations

import gc
import sys
import time
import types
import weakref
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from . import devices as _devices
from . import paths as _paths
from . import hidden as _hidden
from . import purge_all as _purge_all
from . import scan as _scan
from .. import backends as _backends
from ..backends import active_backends
from .hidden import BY_PURGE_ARG
from .render import fmt_bytes, purge_html, purge_text
from .roots import Root
from .scan_types import ATOMIC_IDS
from .snapshot import released_by_purge
from ..units import JsonFields, Report, json_field, round6

PURGE_SCHEMA = "jupyter_gpumem.purge/1"
_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
_TYPE_DICT = type.__dict__["__dict__"].__get__
_EXC_LINKS = ("__traceback__", "__context__", "__cause__")
_FIRST = itemgetter(0)
UNNAMED = "something outside the notebook's names"


class PurgeError(ValueError):
    """Bad input to purge: nothing was deleted."""

    @classmethod
    def check(cls, errors: list[str]) -> None:
        """Raise one error for all of ``errors`` (found before anything is deleted)."""
        if errors:
            raise cls("; ".join(errors) + " (nothing was deleted)")


@dataclass
class Change(JsonFields):
    """One device before and after a purge (bytes, read with ``measure``)."""

    JSON_AFTER = {"freed": "after"}

    device: str
    measure: str
    before: int | None
    after: int | None

    @property
    def freed(self) -> int | None:
        if self.before is None or self.after is None:
            return None
        return self.before - self.after


@dataclass
class DeviceChange(Change):
    """Memory of one device before and after a purge (and its allocator's figures)."""

    allocated_before: int | None = None
    allocated_after: int | None = None
    reserved_before: int | None = None
    reserved_after: int | None = None


@dataclass
class StillHeld(JsonFields):
    """Memory a purge meant to free that another holder still keeps alive."""

    by: str
    path: str | None
    nbytes: int = json_field(key="bytes")
    #: name (of the notebook) | library (a module's global) | unnamed; not in its JSON
    kind: str = json_field("name", leave_out=True)


@dataclass(repr=False)   # the repr is the text report (Report)
class PurgeResult(JsonFields, Report):
    """What a purge removed and what it freed, per device; its JSON: the PurgeResult
    object of docs/PROTOCOL.md."""

    schema = PURGE_SCHEMA
    JSON_AFTER = {"schema": None, "dry_run": "schema", "before": "predicted",
                  "after": "before", "freed": "after"}

    names: list[str]
    removed: list[str]
    predicted: dict[str, int]
    changes: list[DeviceChange] = field(default_factory=list)
    still_held: list[StillHeld] = field(default_factory=list)
    dry_run: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = json_field(0.0, convert=round6)

    @property
    def before(self) -> dict[str, int | None]:
        return {c.device: c.before for c in self.changes}

    @property
    def after(self) -> dict[str, int | None]:
        return {c.device: c.after for c in self.changes}

    @property
    def freed(self) -> dict[str, int | None]:
        return {c.device: c.freed for c in self.changes}

    _text = purge_text
    _html = purge_html


@dataclass
class _Target:
    """One name a purge was asked for (here and in a cluster purge): its binding, its root
    and what it holds (storage key -> path node; on a cluster, dask key -> path)."""

    text: str
    binding: _paths.Binding | None      # None for hidden holders named directly
    root: Root | None             # the root this name is, if it is one
    keys: dict = field(default_factory=dict)


# -- planning ------------------------------------------------------------------
def _targets(names, roots, by_name, scan1, ids, shell, namespace, budget, device,
             backends, all_names: bool) -> tuple[list[_Target], list[str]]:
    """The targets of ``names``, checked whole; and, with ``--all``, the names that went
    or were rebound on their own since the roots were collected (skipped)."""
    errors: list[str] = []
    skipped: list[str] = []
    targets: list[_Target] = []
    reach_of = {id(r): reach for r, reach in zip(roots, scan1.reach)}
    for text in names:
        if text == "Out" and shell is not None and \
                dict.get(shell.user_ns, "Out") is _hidden.output_history(shell):
            # the output history itself: the entries of it that hold memory
            found = [_Target(r.name, None, r, _paths_of(reach_of[id(r)])) for r in roots
                     if r.kind == "output" and r.name.startswith("Out[")
                     and reach_of[id(r)].storages]
            if not found:
                errors.append(f"no entry of Out holds {_devices.memory_on(ids)}"
                              + _cut_short(scan1))
            targets += found
            continue
        if text in BY_PURGE_ARG:
            root = next((r for r in roots if r.kind == BY_PURGE_ARG[text]), None)
            if root is None:
                errors.append(f"nothing is held by the {text}")
                continue
            targets.append(_Target(text, None, root, _paths_of(reach_of[id(root)])))
            continue
        try:
            binding = _paths.resolve(text, shell=shell, namespace=namespace)
            _paths.check_deletable(binding)
        except _paths.PathError as exc:
            if all_names:   # a name purge itself listed: it went since (another thread?)
                skipped.append(text)
            else:
                errors.append(str(exc))
            continue
        root = by_name.get(text)
        if root is None and binding.is_name:   # ``globals()["x"]`` for ``x``
            root = by_name.get(binding.root_name)
        if all_names and (root is None or root.obj is not binding.obj):
            skipped.append(text)   # rebound since it was listed: not what --all found
            continue
        if root is not None and root.obj is binding.obj:
            keys = _paths_of(reach_of[id(root)])
        else:
            root = None
            extra = _scan.scan([Root(text, binding.obj)], devices=ids, shell=shell,
                               namespace=namespace, time_limit=budget.limit(), backends=backends)
            keys = _paths_of(extra.reach[0])
            if not keys:
                errors.append(_devices.holds_nothing(text, ids) + _cut_short(extra))
                continue
        if not keys:
            errors.append(_devices.holds_nothing(text, ids) + _cut_short(scan1))
            continue
        targets.append(_Target(text, binding, root, keys))
    PurgeError.check(errors)
    return targets, skipped


def _cut_short(scan_result) -> str:
    """What to add to "holds no memory" when the scan that found nothing was cut."""
    if not scan_result.partial:
        return ""
    return (" that the scan found before it was cut short (" + ", ".join(scan_result.reasons)
            + "): it may hold more; a larger scan_time_limit looks further")


def _paths_of(reach) -> dict:
    return {k: v[1] for k, v in reach.storages.items()}


def _through_graph(node) -> bool:
    """True when a path goes through an autograd graph (``x.grad_fn→...``)."""
    while node is not None:
        node, label = node
        if label[0] == "graph":
            return True
    return False


class _Reportable:
    """The target storages whose path runs through no autograd graph, decided only for
    the keys asked about (a path is found when first read: deciding it for every one of
    a long graph's storages would cost a path search each)."""

    def __init__(self, paths: dict) -> None:
        self._paths = paths
        self._memo: dict = {}

    def __contains__(self, key) -> bool:
        found = self._memo.get(key)
        if found is None:
            node = self._paths.get(key, _MISSING)
            found = self._memo[key] = node is not _MISSING and not _through_graph(node)
        return found

    def __and__(self, keys) -> set:
        return {k for k in keys if k in self}

    __rand__ = __and__


_MISSING = object()


def _still_held(remaining, scan_result, target_keys, by_of: dict | None = None) -> list[StillHeld]:
    """Who among ``remaining`` still reaches ``target_keys``; roots that stand for the
    same name (``by_of``: root id -> name) are counted as one."""
    groups: dict[str, dict] = {}
    for root, reach in zip(remaining, scan_result.reach):
        common = target_keys & reach.storages.keys()
        if not common:
            continue
        by = by_of.get(id(root), root.name) if by_of else root.name
        group = groups.setdefault(by, {})
        for k in common:
            group.setdefault(k, reach.storages[k])
    out = []
    for by, found in groups.items():
        largest = max(found, key=lambda k: found[k][0].nbytes)
        out.append(StillHeld(by, _scan.format_path(found[largest][1]),
                             sum(v[0].nbytes for v in found.values())))
    out.sort(key=lambda s: -s.nbytes)
    return out


def _predicted(scan_result, own: set, ids) -> tuple[dict[str, int], set]:
    """Bytes each device gets back, and every storage key the scan reached. The
    frameworks estimate what freeing these storages and releasing their caches returns
    (torch: the segments left wholly free, with the workspaces and the cache; CuPy: its
    pool; JAX and TensorFlow keep theirs); a storage no framework accounts for counts
    its size (see backends.purge_estimate)."""
    infos: dict = {}
    reached: set = set()
    for reach in scan_result.reach:
        found = reach.storages
        reached.update(found.keys())
        for k in own & found.keys():
            infos.setdefault(k, found[k][0])
    return _backends.purge_estimate(sorted(ids), infos, reached), reached


def _tracked(scan_result) -> dict[str, int]:
    seen = {}
    for reach in scan_result.reach:
        for k, (i, _, _) in reach.storages.items():
            seen[k] = i
    out: dict[str, int] = {}
    for i in seen.values():
        out[i.device] = out.get(i.device, 0) + i.nbytes
    return out


# -- what stays: the plan's view of the namespace without the purged references -------
class _StandIn:
    """What an object still holds once a purge has taken some of its references away:
    its other attributes, slots and links, for the plan's scan of what stays. Made and
    dropped inside the plan; the user's object is never changed to find this out."""


def _stand_in(owner: Any, bindings: list[_paths.Binding]) -> Any:
    """A shallow copy of ``owner`` without the references ``bindings`` remove (``None``
    at a list position). Read through the base types' own methods only."""
    tp = type(owner)
    drop = {(id(b.container), b.key) for b in bindings}
    if issubclass(tp, (dict, list, tuple)) and any(b.container is owner for b in bindings):
        if issubclass(tp, dict):
            # a new dict hashes its keys: only keys of built-in atomic types go into one
            # (no __hash__ of the user's runs); otherwise the pairs go in a list
            pairs = [(k, v) for k, v in dict.items(owner)
                     if not ((type(k) is str or type(k) is int) and (id(owner), k) in drop)]
            # by id: no class of the user's is hashed
            copy: Any = dict(pairs) if all(id(type(k)) in ATOMIC_IDS for k, _ in pairs) else pairs
        else:
            copy = list(list.__iter__(owner) if issubclass(tp, list) else tuple.__iter__(owner))
            for b in bindings:
                if b.container is owner:
                    copy[b.key] = None
        own = _paths.instance_dict(owner)
        return [copy, own, tp] if own else copy
    out = _StandIn()
    d = out.__dict__
    is_module = issubclass(tp, types.ModuleType)
    if not is_module:
        d["__class__"] = tp
    own = _paths.instance_dict(owner)
    containers = {id(b.container) for b in bindings}
    for k, v in dict.items(own or {}):
        if type(k) is not str or (id(own), k) in drop or \
                (is_module and k.startswith("__") and k.endswith("__")):
            continue
        if id(v) in containers and issubclass(type(v), dict):   # nn.Module's _modules and the like
            v = {gk: gv for gk, gv in dict.items(v) if type(gk) is str and (id(v), gk) not in drop}
        d[k] = v
    for name, value in _paths.slot_items(owner):
        if (id(owner), name) not in drop:
            d.setdefault(name, value)
    if issubclass(tp, BaseException):
        for name in _EXC_LINKS + ("args",):
            value = _TYPE_DICT(BaseException)[name].__get__(owner, tp)
            if value is not None and (id(owner), name) not in drop:
                d.setdefault(name, value)
    if tp is types.FunctionType:
        d.setdefault("__closure__", owner.__closure__)
        d.setdefault("__defaults__", owner.__defaults__)
        d.setdefault("__kwdefaults__", owner.__kwdefaults__)
    return out


def _what_stays(targets: list[_Target], user_remaining: list[Root]):
    """Roots for the scan of what stays, the objects it must not enter, and the name
    each stand-in root speaks for.

    A purged name's object is cut out. A path's reference is taken out where it lives:
    its owner (the list, dict or object holding it) is cut and a stand-in without that
    reference takes its place, so the owner's other entries (``L[0]`` when ``L[2]`` is
    the same tensor) still count as staying."""
    held = {id(r.obj) for r in user_remaining}   # another name of the same object keeps it
    cut = {id(t.binding.obj) for t in targets if t.binding is not None and t.binding.is_name
           and id(t.binding.obj) not in held}
    removed = {id(t.binding.obj) for t in targets if t.binding is not None}
    by_owner: dict[int, list[_paths.Binding]] = {}
    for t in targets:
        b = t.binding
        if b is not None and not b.is_name and b.owner is not None:
            by_owner.setdefault(id(b.owner), []).append(b)
    roots = list(user_remaining)
    by_of: dict[int, str] = {}
    for bindings in by_owner.values():
        owner = bindings[0].owner
        cut.add(id(owner))
        if id(owner) in removed:
            continue   # the owner goes too: nothing of it stays
        root = Root(bindings[0].owner_text, _stand_in(owner, bindings))
        roots.append(root)
        by_of[id(root)] = bindings[0].root_name
    return roots, cut, by_of


# -- weak handles on the memory a purge frees ---------------------------------------
class _Recorder:
    """A backend as the scan sees it, noting for each storage key the first tensor seen
    using it. Those are strong references: the plan turns the ones it needs into weak
    handles (:func:`_handles`) and drops them all before anything is deleted. (A weak
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


def _handles(refs: dict, infos: dict) -> dict:
    """``key -> (backend, weak handle)`` for the storages a purge means to free (``infos``:
    key -> StorageInfo; ``refs``: key -> a tensor using it, from :class:`_Recorder`).

    A framework that can watch a storage itself gives the handle (PyTorch: a weak
    reference to the storage, which outlives a view's tensor object); for the rest it
    is a weak reference to the tensor object (backend None). Release with :func:`_release`."""
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


def _release(handles: dict) -> None:
    """Give back the handles :func:`_handles` took (a framework's own, each to it)."""
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
        if type(modname) is not str or not issubclass(type(mod), types.ModuleType):
            continue
        d = _MODULE_DICT(mod)
        if d is user_ns or type(d) is not dict or id(d) in seen:
            continue
        seen.add(id(d))
        for k, v in list(dict.items(d)):
            tp = type(v)
            if type(k) is not str or (k.startswith("__") and k.endswith("__")) \
                    or id(tp) in ATOMIC_IDS or issubclass(tp, types.ModuleType):
                continue
            entries[f"{modname}.{k}"] = v
            if issubclass(tp, type):
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


def _held_elsewhere(handles: dict, infos: dict, scan3, shell, namespace, ids, time_limit):
    """What of the memory a purge meant to free is still alive though no notebook name
    reaches it: StillHeld entries (a module's global, or unnamed), bytes per device
    to count as not freed, and notes."""
    alive = _alive(handles, infos)
    for reach in scan3.reach:
        for k in alive.keys() & reach.storages.keys():
            del alive[k]
    if not alive:
        return [], {}, []
    kept: dict[str, int] = {}
    for info in alive.values():
        kept[info.device] = kept.get(info.device, 0) + info.nbytes
    found, notes = _library_holders(set(alive), ids, shell, namespace, time_limit)
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


# -- execution ---------------------------------------------------------------------
def _delete_target(t: _Target, shell: Any, namespace: dict | None) -> list[str]:
    """Remove one target's binding; :class:`paths.Changed` when it is not the planned one."""
    removed: list[str] = []
    if t.binding is None:
        return removed
    obj = t.binding.obj
    _paths.delete(t.binding)
    removed.append(t.text)
    if t.binding.is_name and shell is not None:
        hidden = getattr(shell, "user_ns_hidden", {})
        key = t.binding.key
        if type(key) is str and dict.get(hidden, key) is obj:
            dict.pop(hidden, key, None)
    for name, mod in list(dict.items(sys.modules)):
        if mod is obj and dict.get(sys.modules, name) is obj:
            dict.pop(sys.modules, name, None)
            removed.append(f"sys.modules[{name!r}]")
    return removed


def _execute(targets: list[_Target], hidden_clear: list[Root], shell: Any,
             namespace: dict | None) -> tuple[list[str], list[str]]:
    """Remove the bindings and hidden holders; leave no reference to them behind.
    Returns what went and the targets skipped because they changed on their own."""
    removed: list[str] = []
    skipped: list[str] = []
    for t in targets:
        try:
            removed += _delete_target(t, shell, namespace)
        except _paths.Changed:
            skipped.append(t.text)
    for r in hidden_clear:
        try:
            removed += [n for n in _hidden.clear(r, shell) if n not in removed]
        except Exception:  # noqa: BLE001 - the rest is purged, and the result says what was not
            skipped.append(r.name)
    targets.clear()
    hidden_clear.clear()
    return removed, skipped


def release_caches() -> list[str]:
    """Collect garbage and give every active framework's cached memory back."""
    notes: list[str] = []
    gc.collect()
    for backend in active_backends():
        try:
            notes += backend.release()
        except Exception as exc:
            notes.append(f"{backend.name}: could not release its cache ({exc})")
    return notes


def _read(device: str) -> dict[str, _devices.DeviceUsage]:
    return {d.id: d for d in _devices.read_devices(device)}


def _changes(before, after, tracked_before, tracked_after) -> list[DeviceChange]:
    out = []
    for dev, b in before.items():
        a = after.get(dev)
        if dev == "cpu" or a is None:
            out.append(DeviceChange(dev, "tracked tensors", tracked_before.get(dev, 0),
                                    tracked_after.get(dev, 0)))
            continue
        if b.used_process is not None and a.used_process is not None:
            measure, vb, va = "process (NVML)", b.used_process, a.used_process
        elif b.reserved is not None and a.reserved is not None:
            measure, vb, va = "reserved", b.reserved, a.reserved
        else:
            measure, vb, va = "tracked tensors", tracked_before.get(dev, 0), tracked_after.get(dev, 0)
        out.append(DeviceChange(dev, measure, vb, va, b.allocated, a.allocated, b.reserved, a.reserved))
    return out


@dataclass
class _Plan:
    """What a purge will do; the only holder of references to the objects it removes."""

    result: PurgeResult
    targets: list[_Target]
    hidden_clear: list[Root]
    reportable: set | _Reportable
    tracked_before: dict[str, int]
    handles: dict            # storage key -> weak handle, of the memory it means to free
    infos: dict              # storage key -> StorageInfo, of the same
    skipped: list[str]
    in_list: list[str]


class _Budget:
    """One deadline for all the scans of a purge: each scan gets the scan limit, or what
    is left of the whole command's time, whichever is less (at least a sliver, so that a
    late scan still answers, partial). The command then answers within its bound
    whatever the heap, however many scans it needed."""

    RESERVE = 0.05   # of the whole: the work after the last scan

    def __init__(self, time_limit: float, scans: int):
        self.time_limit = time_limit
        self.deadline = time.perf_counter() + scans * time_limit * (1 - self.RESERVE)

    def limit(self) -> float:
        left = self.deadline - time.perf_counter()
        return min(self.time_limit, max(left, 0.05 * self.time_limit))

    def extend(self, seconds: float) -> None:
        """Time spent on work that is not a scan (a garbage collection) is not the scans'."""
        self.deadline += seconds


def _plan(names: list[str], shell: Any, namespace: dict | None, all_names: bool, dry_run: bool,
          device: str, ids: set[str], budget: _Budget) -> _Plan:
    """Check every name and work out what goes, what is freed and what still holds it."""
    refs: dict = {}   # storage key -> a tensor using it (not for a dry run)
    try:
        return _plan_with(refs, names, shell, namespace, all_names, dry_run, device, ids,
                          budget)
    finally:
        refs.clear()   # the tensors noted: no reference to them may outlive the plan


def _plan_with(refs: dict, names: list[str], shell: Any, namespace: dict | None,
               all_names: bool, dry_run: bool, device: str, ids: set[str],
               budget: _Budget) -> _Plan:
    backends = None if dry_run else [_Recorder(b, refs) for b in active_backends()]
    roots = _scan.collect_roots(namespace, shell)
    scan1 = _scan.scan(roots, devices=ids, shell=shell, namespace=namespace,
                       time_limit=budget.limit(), backends=backends)
    reach_of = {id(r): reach for r, reach in zip(roots, scan1.reach)}
    kept: list = []
    if all_names:   # what --all takes and what it keeps: see purge_all
        names, kept = _purge_all.split(roots, reach_of, active_backends())
    names = list(dict.fromkeys(names))   # a name given twice is purged once
    by_name = {r.name: r for r in roots if not r.hidden}
    for hidden_root in (r for r in roots if r.hidden):
        for n in [hidden_root.name] + hidden_root.aliases:
            by_name.setdefault(n, hidden_root)
    targets, skipped = _targets(names, roots, by_name, scan1, ids, shell, namespace, budget,
                                device, backends, all_names)
    if names:
        target_paths = {k: node for t in targets for k, node in t.keys.items()}
    else:  # no names: the targets are the hidden holders that hold memory
        target_paths = {k: v[1] for r in roots if r.hidden for k, v in reach_of[id(r)].storages.items()}
    # what the user names that stay will still hold, with the purged references taken out
    named_roots = {id(t.root) for t in targets if t.root is not None}
    user_remaining = [r for r in roots if not r.hidden and id(r) not in named_roots]
    stay_roots, cut, by_of = _what_stays(targets, user_remaining)
    scan2 = _scan.scan(stay_roots, devices=ids, shell=shell, namespace=namespace,
                       time_limit=budget.limit(), extra_stop=cut)
    user_held = set().union(*(reach.storages.keys() for reach in scan2.reach)) if scan2.reach else set()
    own = target_paths.keys() - user_held
    named_objs = {id(t.binding.obj) for t in targets if t.binding is not None} | \
        {id(t.root.obj) for t in targets if t.root is not None}
    hidden_clear = [r for r in roots if r.hidden and reach_of[id(r)].storages and (
        not names or id(r.obj) in named_objs or own & reach_of[id(r)].storages.keys())]
    # an entry of Out under a key of the user's own type: finding it again to remove it
    # would hash the key (their code); it stays, and the result says so
    left = [r for r in hidden_clear if _hidden.purge_arg(r.kind, r.purge) is None]
    hidden_clear = [r for r in hidden_clear if _hidden.purge_arg(r.kind, r.purge) is not None]
    # parameters an autograd graph points to belong to their model, not to the loss
    # a dry run decides it only for what it reports (its plan goes when it returns); a
    # purge decides it now, for every target: the paths refer to what it deletes
    reportable = _Reportable(target_paths) if dry_run else \
        {k for k, node in target_paths.items() if not _through_graph(node)}
    predicted, reached = _predicted(scan1, own, ids)
    removed = list(dict.fromkeys([t.text for t in targets] + [
        n for r in hidden_clear for n in [r.name] + r.aliases if n not in names]))
    result = PurgeResult(names, removed, predicted, dry_run=dry_run,
                         still_held=_still_held(stay_roots, scan2, reportable, by_of))
    if kept:
        result.messages.append(_purge_all.kept_message(kept, fmt_bytes, dry_run))
    if left:
        size = fmt_bytes(sum(i.nbytes for r in left for i, _, _ in reach_of[id(r)].storages.values()))
        result.messages.append(
            f"{len(left)} entr{'y' if len(left) == 1 else 'ies'} of Out under a key that is "
            f"not a number or a string (Out[...]) keep{'s' if len(left) == 1 else ''} {size}: "
            f"left in place, as finding the key again would run its own code; "
            f"`del Out[key]` frees it")
    if scan1.partial or scan2.partial:
        result.messages.append("partial scan: " + ", ".join(scan1.reasons + scan2.reasons))
    if dry_run:
        result.messages += released_by_purge(sorted(ids), reached)
    handles, infos = {}, {}
    if not dry_run:
        for reach in scan1.reach:
            for k in own & reach.storages.keys():
                infos.setdefault(k, reach.storages[k][0])
        handles = _handles(refs, infos)
    in_list = [t.text for t in targets if t.binding is not None and t.binding.in_list]
    return _Plan(result, targets, hidden_clear, reportable, _tracked(scan1), handles, infos,
                 skipped, in_list)


#: purges begun in this process (not dry runs): what says a reading taken before is stale
PURGES = [0]


def purge(names=(), *, shell: Any = None, namespace: dict | None = None, all: bool = False,
          dry_run: bool = False, device: str = "auto", time_limit: float = 3.0) -> PurgeResult:
    """Delete ``names`` (or, with none, only the hidden holders) and free their memory.

    ``all`` purges every user name that holds memory on the chosen devices.
    ``dry_run`` only reports what would go. Raises :class:`PurgeError`, having
    deleted nothing, when a name is missing, malformed or holds nothing.

    A path into a list leaves ``None`` at that position (the list keeps its
    length). A name that goes or is rebound on its own while the purge runs (by
    another thread) is skipped and said so. Memory still alive afterwards is
    not counted as freed, and what holds it is named: a notebook name, a
    module's global (libraries included), or, failing both, that it is unnamed.
    """
    start = time.perf_counter()
    try:
        device = _devices.parse_device(device)
    except ValueError as exc:
        raise PurgeError(str(exc)) from None
    if names and all:
        raise PurgeError("give names or --all, not both (nothing was deleted)")
    ids = set(_devices.selected_ids(device))
    # a dry run scans twice (what is held, what stays); a purge once more afterwards
    budget = _Budget(time_limit, 2 if dry_run else 3)
    plan = _plan(list(names or ()), shell, namespace, all, dry_run, device, ids, budget)
    result = plan.result
    if dry_run:
        if plan.in_list:
            result.messages.append(_list_message(plan.in_list, dry_run))
        result.messages += _skipped_messages(plan.skipped, dry_run)
        result.messages += _still_messages(result.still_held)
        result.seconds = time.perf_counter() - start
        return result
    PURGES[0] += 1
    try:
        before = _read(device)
        # _execute empties the plan: after it, nothing here refers to the purged objects.
        # The collection release_caches makes next does the collector's work once: one
        # started by the deletions themselves would walk the whole heap for nothing
        with _scan.paused_gc():
            result.removed, skipped = _execute(plan.targets, plan.hidden_clear, shell, namespace)
        in_list = [text for text in plan.in_list if text not in skipped]
        if in_list:
            result.messages.append(_list_message(in_list, dry_run))
        result.messages += _skipped_messages(plan.skipped + skipped, dry_run)
        collected = time.perf_counter()
        result.messages += release_caches()
        budget.extend(time.perf_counter() - collected)
        after = _read(device)
        roots = _scan.collect_roots(namespace, shell)
        scan3 = _scan.scan(roots, devices=ids, shell=shell, namespace=namespace,
                           time_limit=budget.limit())
        result.still_held = _still_held(roots, scan3, plan.reportable)
        # only when memory the purge meant to free is still alive: the search of modules'
        # globals that names its holder gets a scan limit of its own, beyond the budget
        elsewhere, kept, notes = _held_elsewhere(plan.handles, plan.infos, scan3, shell,
                                                 namespace, ids, time_limit)
    finally:
        _release(plan.handles)
    result.still_held += elsewhere
    tracked_after = _tracked(scan3)
    for dev, n in kept.items():   # alive, though no name reaches it: not freed
        tracked_after[dev] = tracked_after.get(dev, 0) + n
    result.changes = _changes(before, after, plan.tracked_before, tracked_after)
    result.messages += _still_messages(result.still_held) + notes
    result.seconds = time.perf_counter() - start
    return result


def _list_message(texts: list[str], dry_run: bool) -> str:
    verb = "would hold" if dry_run else "now holds" if len(texts) == 1 else "now hold"
    return (f"{', '.join(texts)} {verb} None: a list keeps its length, so its other "
            f"positions stay as they were")


def _skipped_messages(skipped: list[str], dry_run: bool) -> list[str]:
    if not skipped:
        return []
    one = len(skipped) == 1
    rest = "would be" if dry_run else "was"
    return [f"skipped {', '.join(skipped)}: {'it' if one else 'they'} went or changed on "
            f"{'its' if one else 'their'} own while the purge ran (another thread?); "
            f"the rest {rest} purged"]


#: more names than this holding the same bytes read as one line
GROUP_AT = 3


def _still_messages(still: list[StillHeld]) -> list[str]:
    out = []
    same: dict[int, list[str]] = {}
    for s in still:
        if s.kind == "name":
            same.setdefault(s.nbytes, []).append(s.by)
    for s in still:
        size = fmt_bytes(s.nbytes)
        group = same.get(s.nbytes, ()) if s.kind == "name" else ()
        if len(group) > GROUP_AT:
            if s.by == group[0]:
                shown = ", ".join(group[:GROUP_AT])
                out.append(f"{shown} and {len(group) - GROUP_AT} other name(s) still hold "
                           f"{size} of it each: purge them too (`%gpumem` lists them)")
            continue
        if s.kind == "library":
            out.append(f"{s.path} (a module's global) still holds {size} of it, so that was "
                       f"not freed: clear it there to free it")
        elif s.kind == "unnamed":
            out.append(f"{size} of it is still alive, held by {UNNAMED} and modules' globals: "
                       f"not freed")
        else:
            out.append(f"{s.by} still holds {size} of it ({s.path}): purge {s.by} too")
    return out
