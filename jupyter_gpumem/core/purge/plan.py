"""A purge's plan, made and checked whole before anything is deleted: the targets
(:mod:`.targets`), the hidden holders that go with them, the bytes each device
gets back, and, from a scan of what stays (the user's other names, with the purged
references taken out), what still holds the memory.
"""
from __future__ import annotations

import time
import types
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from .. import devices as _devices
from ..scan import paths as _paths
from ..scan import hidden as _hidden
from . import everything as _everything
from .. import scan as _scan
from ... import backends as _backends
from ...backends import active_backends
from ..scan.hidden import BY_PURGE_ARG
from .holders import Recorder, weak_handles
from .messages import cut_plan_message, cut_short, out_key_message, partial_message
from .result import PurgeError, PurgeResult, StillHeld
from .targets import Holdings, Target, hidden_to_clear, removed_names, resolve_targets
from ..render import fmt_bytes
from ..scan import ATOMIC_IDS, Root
from ..snapshot import released_by_purge
from ...backends.base import is_subtype

_TYPE_DICT = type.__dict__["__dict__"].__get__
_EXC_LINKS = ("__traceback__", "__context__", "__cause__")


class _Holdings(Holdings):
    """What the notebook's roots hold: the storages the plan's first scan found (storage
    key -> path node), and for another object a scan of its own."""

    def __init__(self, roots: list[Root], scan1, context: PurgeContext, backends,
                 reach_of: dict) -> None:
        self.roots, self.scan1, self.context, self.ids = roots, scan1, context, context.ids
        self.shell, self.backends = context.shell, backends
        self.reach_of = reach_of   # id(root) -> what the first scan found it reaches
        self._paths: dict[int, dict] = {}

    def of(self, root: Root) -> dict:
        found = self._paths.get(id(root))
        if found is None:
            found = self._paths[id(root)] = _paths_of(self.reach_of[id(root)])
        return found

    def of_object(self, text: str, obj: Any) -> tuple[dict, str]:
        extra = self.context.scan([Root(text, obj)], backends=self.backends)
        return _paths_of(extra.reach[0]), _devices.holds_nothing(text, self.ids) + cut_short(extra)

    def nothing(self, text: str) -> str:
        return _devices.holds_nothing(text, self.ids) + cut_short(self.scan1)

    def direct(self, text: str) -> list[Target] | str | None:
        shell = self.shell
        if text == "Out" and shell is not None and \
                dict.get(shell.user_ns, "Out") is _hidden.output_history(shell):
            # the output history itself: the entries of it that hold memory
            found = [Target(r.name, None, r, self.of(r)) for r in self.roots
                     if r.kind == "output" and r.name.startswith("Out[")
                     and self.reach_of[id(r)].storages]
            return found or (f"no entry of Out holds {_devices.memory_on(self.ids)}"
                             + cut_short(self.scan1))
        if text in BY_PURGE_ARG:
            root = next((r for r in self.roots if r.kind == BY_PURGE_ARG[text]), None)
            if root is None:
                return f"nothing is held by the {text}"
            return [Target(text, None, root, self.of(root))]
        if text.startswith(_hidden.THEIRS):
            # IPython's own record under a name the user bound to another object
            # ("IPython's _"): never a path, which would name the user's
            root = next((r for r in self.roots if r.hidden and r.purge == text), None)
            if root is None:
                return f"nothing is held by {text}"
            return [Target(text, None, root, self.of(root))]
        return None


def _paths_of(reach) -> dict:
    return {k: v[1] for k, v in reach.storages.items()}


def through_graph(node) -> bool:
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
            found = self._memo[key] = node is not _MISSING and not through_graph(node)
        return found

    def __and__(self, keys) -> set:
        return {k for k in keys if k in self}

    __rand__ = __and__


_MISSING = object()


def still_held(remaining, scan_result, target_keys, by_of: dict | None = None) -> list[StillHeld]:
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
    for i in scan_result.holding():
        found = scan_result.reach[i].storages
        reached.update(found.keys())
        for k in own & found.keys():
            infos.setdefault(k, found[k][0])
    return _backends.purge_estimate(sorted(ids), infos, reached), reached


def tracked(scan_result) -> dict[str, int]:
    seen = {}
    for j in scan_result.holding():
        for k, (i, _, _) in scan_result.reach[j].storages.items():
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
    if is_subtype(tp, (dict, list, tuple)) and any(b.container is owner for b in bindings):
        if is_subtype(tp, dict):
            # a new dict hashes its keys: only keys of built-in atomic types go into one
            # (no __hash__ of the user's runs); otherwise the pairs go in a list
            pairs = [(k, v) for k, v in dict.items(owner)
                     if not ((type(k) is str or type(k) is int) and (id(owner), k) in drop)]
            # by id: no class of the user's is hashed
            copy: Any = dict(pairs) if all(id(type(k)) in ATOMIC_IDS for k, _ in pairs) else pairs
        else:
            copy = list(list.__iter__(owner) if is_subtype(tp, list) else tuple.__iter__(owner))
            for b in bindings:
                if b.container is owner:
                    copy[b.key] = None
        own = _paths.instance_dict(owner)
        return [copy, own, tp] if own else copy
    out = _StandIn()
    d = out.__dict__
    is_module = is_subtype(tp, types.ModuleType)
    if not is_module:
        d["__class__"] = tp
    own = _paths.instance_dict(owner)
    containers = {id(b.container) for b in bindings}
    for k, v in dict.items(own or {}):
        if type(k) is not str or (id(own), k) in drop or \
                (is_module and k.startswith("__") and k.endswith("__")):
            continue
        if id(v) in containers and is_subtype(type(v), dict):   # nn.Module's _modules and the like
            v = {gk: gv for gk, gv in dict.items(v) if type(gk) is str and (id(v), gk) not in drop}
        d[k] = v
    for name, value in _paths.slot_items(owner):
        if (id(owner), name) not in drop:
            d.setdefault(name, value)
    if is_subtype(tp, BaseException):
        for name in _EXC_LINKS + ("args",):
            value = _TYPE_DICT(BaseException)[name].__get__(owner, tp)
            if value is not None and (id(owner), name) not in drop:
                d.setdefault(name, value)
    if tp is types.FunctionType:
        d.setdefault("__closure__", owner.__closure__)
        d.setdefault("__defaults__", owner.__defaults__)
        d.setdefault("__kwdefaults__", owner.__kwdefaults__)
    return out


_OBJ = attrgetter("obj")


def _what_stays(targets: list[Target], user_remaining: list[Root]):
    """Roots for the scan of what stays, the objects it must not enter, and the name
    each stand-in root speaks for.

    A purged name's object is cut out. A path's reference is taken out where it lives:
    its owner (the list, dict or object holding it) is cut and a stand-in without that
    reference takes its place, so the owner's other entries (``L[0]`` when ``L[2]`` is
    the same tensor) still count as staying."""
    named = {id(t.binding.obj) for t in targets if t.binding is not None and t.binding.is_name}
    # another name of the same object keeps it (a small set met by every name's object)
    held = named.intersection(map(id, map(_OBJ, user_remaining)))
    cut = named - held
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



@dataclass
class Plan:
    """What a purge will do; the only holder of references to the objects it removes."""

    result: PurgeResult
    targets: list[Target]
    hidden_clear: list[Root]
    reportable: set | _Reportable
    tracked_before: dict[str, int]
    handles: dict            # storage key -> weak handle, of the memory it means to free
    infos: dict              # storage key -> StorageInfo, of the same
    skipped: list[str]
    in_list: list[str]
    #: user name -> (its object, its first walk), for the names that stay and reached none
    #: of the targets' storages: the scan after the deletions reuses their walk
    unchanged: dict = field(default_factory=dict)

    def scan_after(self, context: PurgeContext) -> "_scan.ScanResult":
        """The scan of the notebook once the targets are gone: a root still bound to the
        object the plan walked, that reached none of the targets' storages then, reaches
        what it did (the purge only took references away, and ran no code of the
        user's); only the others are walked again."""
        roots = _scan.collect_roots(context.namespace, context.shell)
        reach: list = [None] * len(roots)
        again: list[int] = []
        for i, root in enumerate(roots):
            known = None if root.hidden else self.unchanged.get(root.name)
            if known is not None and known[0] is root.obj:
                reach[i] = known[1]
            else:
                again.append(i)
        self.unchanged = {}
        walked = context.scan([roots[i] for i in again])
        for i, got in zip(again, walked.reach):
            reach[i] = got
        walked.roots, walked.reach = roots, reach
        walked.kept, walked.cut = [], [again[i] for i in walked.cut]
        return walked


class Budget:
    """One deadline for all the scans of a purge, within the scan limit: each scan gets
    what is left of ``share`` of the limit from the command's start (at least a sliver,
    so that a late scan still answers, partial). The command then answers within its
    limit whatever the heap, however many scans it needed (a real purge's collection of
    garbage and release of caches are not the scans': see :meth:`extend`)."""

    RESERVE = 0.05   # of the whole: the work after the last scan
    SLIVER = 0.05    # of the limit: what a scan gets at least

    def __init__(self, time_limit: float, share: float = 1.0, started: float | None = None):
        self.time_limit = time_limit
        self.share = share
        self.started = time.perf_counter() if started is None else started
        self.excluded = 0.0

    @property
    def deadline(self) -> float:
        return self.started + self.excluded + self.share * self.time_limit * (1 - self.RESERVE)

    def limit(self) -> float:
        left = self.deadline - time.perf_counter()
        return min(self.time_limit, max(left, self.SLIVER * self.time_limit))

    def later(self, share: float) -> None:
        """The next scans may use up to ``share`` of the limit from the start."""
        self.share = max(self.share, share)

    def extend(self, seconds: float) -> None:
        """Time spent on work that is not a scan (a garbage collection) is not the scans'."""
        self.excluded += seconds


@dataclass(frozen=True)
class PurgeContext:
    """What every scan and step of one purge needs: where the names live (``shell``,
    ``namespace``), which devices count (``selection``, made where the command entered)
    and the time the scans share (``budget``)."""

    shell: Any
    namespace: dict | None
    selection: _devices.DeviceSelection
    budget: Budget

    def __post_init__(self) -> None:
        _devices.DeviceSelection.of(self.selection)

    @property
    def ids(self) -> set[str]:
        """The ids of the devices that count."""
        return set(self.selection.ids)

    def scan(self, roots: list[Root], **options: Any) -> "_scan.ScanResult":
        """A scan of ``roots`` on these devices, within what is left of the budget."""
        return _scan.scan(roots, devices=self.ids, shell=self.shell,
                          namespace=self.namespace, time_limit=self.budget.limit(), **options)


def make_plan(names: list[str], context: PurgeContext, all_names: bool,
              dry_run: bool) -> Plan:
    """Check every name and work out what goes, what is freed and what still holds it."""
    refs: dict = {}   # storage key -> a tensor using it (not for a dry run)
    try:
        return _plan_with(refs, names, context, all_names, dry_run)
    finally:
        refs.clear()   # the tensors noted: no reference to them may outlive the plan


def _plan_with(refs: dict, names: list[str], context: PurgeContext, all_names: bool,
               dry_run: bool) -> Plan:
    shell, namespace, ids = context.shell, context.namespace, context.ids
    backends = None if dry_run else [Recorder(b, refs) for b in active_backends()]
    # the user's names are taken by the scan itself: one proven to reach nothing (most of
    # a long notebook's) gets no root, and a purge of it finds it through its binding
    scan1 = context.scan(_scan.hidden_roots(shell), backends=backends,
                         user=_scan.user_names(namespace, shell))
    roots = scan1.roots
    reach_of = {id(r): reach for r, reach in zip(roots, scan1.reach)}
    kept: list = []
    if all_names:   # what --all takes and what it keeps: see everything.py
        names, kept = _everything.split([roots[i] for i in scan1.holding()], reach_of,
                                        active_backends())
    names = list(dict.fromkeys(names))   # a name given twice is purged once
    holdings = _Holdings(roots, scan1, context, backends, reach_of)
    targets, skipped, errors = resolve_targets(names, roots, holdings, shell=shell,
                                               namespace=namespace, all_names=all_names)
    PurgeError.check(errors)
    hidden_only = not names and not all_names
    if not hidden_only:   # (--all that took no name has no target)
        target_paths = {k: node for t in targets for k, node in t.keys.items()}
    else:  # no names: the targets are the hidden holders that hold memory
        target_paths = {k: v[1] for r in roots if r.hidden for k, v in reach_of[id(r)].storages.items()}
    # what the user names that stay will still hold, with the purged references taken out.
    # Taking references out only takes reach away: a root whose first walk reached none of
    # the targets' storages reaches none now, and is not walked again (the first walk is
    # reused); the others, and the stand-ins, are
    named_roots = {id(t.root) for t in targets if t.root is not None}
    user_remaining = [r for r in roots if not r.hidden and id(r) not in named_roots]
    stay_roots, cut, by_of = _what_stays(targets, user_remaining)
    target_keys = target_paths.keys()
    # (a root the first scan's time limit cut is not walked again either: that plan is
    # cut, and proves only what it found: see below)
    first_cut = {id(roots[i]) for i in scan1.cut}
    # (the names that stay, then the stand-ins, which the first scan never met: a name
    # whose first walk reached no storage reaches none of the targets', so only the roots
    # that hold a storage are looked at, in order)
    stand_ins = stay_roots[len(user_remaining):]
    stay_roots = [r for r in map(roots.__getitem__, scan1.holding())
                  if not r.hidden and id(r) not in named_roots
                  and not target_keys.isdisjoint(reach_of[id(r)].storages)] + stand_ins
    scan2 = context.scan(stay_roots, extra_stop=cut)
    # (a storage that borrows a purged one's bytes is keyed by that allocation, as in scan1)
    scan2 = replace(scan2, reach=_scan.one_allocation(scan2.reach, also=scan1.reach))
    user_held = set().union(*(scan2.reach[i].storages.keys() for i in scan2.holding()))
    own = target_paths.keys() - user_held
    # a plan the time limit cut proves only what it found: the targets, and the hidden
    # holders that are their objects; a hidden holder that only shares their memory may
    # share it with a name the scans did not finish, and stays
    timed_out = scan1.timed_out or scan2.timed_out
    hidden_clear = hidden_to_clear(roots, holdings, targets, hidden_only,
                                   set() if timed_out and names else own)
    # an entry of Out under a key of the user's own type: finding it again to remove it
    # would hash the key (their code); it stays, and the result says so
    left = [r for r in hidden_clear if _hidden.purge_arg(r.kind, r.purge) is None]
    hidden_clear = [r for r in hidden_clear if _hidden.purge_arg(r.kind, r.purge) is not None]
    # parameters an autograd graph points to belong to their model, not to the loss
    # a dry run decides it only for what it reports (its plan goes when it returns); a
    # purge decides it now, for every target: the paths refer to what it deletes
    reportable = _Reportable(target_paths) if dry_run else \
        {k for k, node in target_paths.items() if not through_graph(node)}
    predicted, reached = _predicted(scan1, own, ids)
    removed = removed_names(targets, hidden_clear, names)
    result = PurgeResult(names, removed, predicted, dry_run=dry_run,
                         partial=scan1.partial or scan2.partial,
                         still_held=still_held(stay_roots, scan2, reportable, by_of))
    if kept:
        result.messages.append(_everything.kept_message(kept, fmt_bytes, dry_run))
    if all_names:
        going = {id(r) for r in hidden_clear}
        stay = [(r.name, reach_of[id(r)].nbytes)
                for r in roots if r.hidden and id(r) not in going and holdings.of(r)]
        if stay:
            result.messages.append(_everything.hidden_left_message(stay, fmt_bytes, dry_run))
    if left:
        result.messages.append(out_key_message(
            len(left), sum(reach_of[id(r)].nbytes for r in left)))
    if result.partial:
        result.messages.append(partial_message(scan1.reasons + scan2.reasons))
    if timed_out and names:
        result.messages.append(cut_plan_message(dry_run))
    if dry_run:
        result.messages += released_by_purge(sorted(ids), reached)
    handles, infos = {}, {}
    if not dry_run:
        for i in scan1.holding():
            found = scan1.reach[i].storages
            for k in own & found.keys():
                infos.setdefault(k, found[k][0])
        handles = weak_handles(refs, infos)
    in_list = [t.text for t in targets if t.binding is not None and t.binding.in_list]
    # (each reach without its paths: a path node is found when read, through the scan's
    # path search, which holds what the scan walked, the purged tensors too)
    unchanged = {} if dry_run else {
        r.name: (r.obj, _scan.Reach({k: (v[0], None, None) for k, v in found.items()},
                                    reach_of[id(r)].objects))
        for r in user_remaining if id(r) not in first_cut
        for found in (reach_of[id(r)].storages,) if target_keys.isdisjoint(found)}
    return Plan(result, targets, hidden_clear, reportable, tracked(scan1), handles, infos,
                skipped, in_list, unchanged)
