"""Snapshot, Holder and the attribution of bytes to holders.

A :class:`Snapshot` holds no reference to user objects: only names, bytes
and text, so keeping one (``-o``, the panel, ``Out``) pins no memory.
"""
from __future__ import annotations

import time
import types
from dataclasses import dataclass, field, replace
from itertools import islice
from operator import itemgetter
from typing import Any

from . import devices as _devices
from .scan import hidden as _hidden
from . import processes as _processes
from . import scan as _scan
from . import trace as _trace
from .. import backends as _backends
from ..backends import Internal, active_backends
from ..backends import cuda_context as _cuda_context
from .render import fmt_bytes, snapshot_html, snapshot_text
from .scan.paths import resolve
from .scan import Root, is_a, odd_keys, run_to_end, type_name_of
from ..units import JsonFields, Report, json_field, round6

SNAPSHOT_SCHEMA = "jupyter_gpumem.snapshot/1"


@dataclass
class TensorRow(JsonFields):
    """One storage inside a named holder (``%gpumem NAME``; its JSON: a ``rows`` entry)."""

    path: str
    nbytes: int = json_field(key="bytes")
    device: str
    framework: str
    what: str | None = None
    shared_with: list[str] = field(default_factory=list)
    key: tuple | None = json_field(None, leave_out=True)
    #: where it was allocated (``cell [12] line 3: out = model(x)``) while trace is on
    allocated_at: str | None = None


@dataclass
class Holder(JsonFields):
    """A name (or hidden holder) and the memory it keeps alive."""

    JSON_AFTER = {"hidden": "label", "aliases": "hidden", "total": "shared"}

    name: str
    label: str
    type: str
    unique: int
    shared: int
    devices: dict[str, int]
    tensors: int
    largest_path: str | None
    largest_bytes: int
    hidden: bool = False
    aliases: list[str] = field(default_factory=list)
    shared_with: list[str] = field(default_factory=list)
    hint: str | None = None
    purge: str | None = None
    rows: list[TensorRow] = json_field(default_factory=list, leave_out=True)

    @property
    def total(self) -> int:
        return self.unique + self.shared

    def to_json(self, with_rows: bool = False) -> dict:
        """The ``Holder`` object of docs/PROTOCOL.md (``rows`` only for ``details``)."""
        out = super().to_json()
        if with_rows:
            out["rows"] = [r.to_json() for r in self.rows]
        return out


def _with_rows(holders: list[Holder]) -> list[dict]:
    return [h.to_json(with_rows=True) for h in holders]


@dataclass(repr=False)   # the repr is the text report (Report)
class Snapshot(JsonFields, Report):
    """Devices and holders at one moment; renders as text, HTML and JSON (the snapshot
    schema of docs/PROTOCOL.md)."""

    schema = SNAPSHOT_SCHEMA
    JSON_AFTER = {"schema": None, "time": "schema", "accelerator": "device",
                  "partial": "accelerator", "scan_seconds": "partial",
                  "messages": "scan_seconds", "details": "unattributed_sites"}

    device: str
    devices: list[_devices.DeviceUsage]
    holders: list[Holder]
    unattributed: dict[str, int | None]
    accelerator: bool
    partial: bool = False
    messages: list[str] = field(default_factory=list)
    scan_seconds: float = json_field(0.0, convert=round6)
    time: float = field(default_factory=time.time)
    details: list[Holder] = json_field(default_factory=list, convert=_with_rows, if_any=True)
    internals: list[Internal] = field(default_factory=list)
    #: while trace is on: device -> what no name reaches, by allocation site, largest first
    #: (``{"text", "bytes", "count", ...}`` of :class:`jupyter_gpumem.trace.SiteGroup`)
    unattributed_sites: dict[str, list[dict]] = json_field(default_factory=dict, if_any=True)
    #: the other processes on each accelerator (NVML's lists, named): only where NVML
    #: lists any
    processes: list[_processes.DeviceProcesses] = json_field(default_factory=list,
                                                             if_any=True)
    #: the first objects the scan refused, ``(type name, where)``; the note counts all
    refused: list = json_field(default_factory=list, leave_out=True)

    def list_every_refusal(self) -> None:
        """The refusals' note names every refused object kept, not only the first few
        (``%gpumem -v``)."""
        self.messages = [refused_note(self.refused_count, self.refused, every=True)
                         if is_refused_note(m) else m for m in self.messages]

    @property
    def refused_count(self) -> int:
        for m in self.messages:
            if is_refused_note(m):
                return int(m.partition(" ")[0])
        return 0

    def internals_of(self, device: str, kinds: tuple = ("allocated", "cached")) -> list[Internal]:
        """The internals on ``device`` of these kinds (``"outside"``: the rest's parts)."""
        return [i for i in self.internals if i.device == device and i.kind in kinds]

    def holder(self, name: str) -> Holder | None:
        """The holder called ``name``, else one with that alias, if any: a name the user
        bound (their own ``_``) is theirs, before an IPython record that has it as an
        alias (the display hook's ``_``, kept under the user's binding)."""
        every = self.holders + self.details
        return next((h for h in every if h.name == name), None) or \
            next((h for h in every if name in h.aliases), None)

    _text = snapshot_text
    _html = snapshot_html


# -- building ---------------------------------------------------------------
def type_name(obj: Any) -> str:
    """What an object is, in a user's words."""
    tp = type(obj)
    name = type_name_of(tp)
    for backend in active_backends():
        words = backend.type_name(name)
        if words:
            return words
    if tp is types.FunctionType:
        return "closure" if obj.__closure__ else "function"
    if name == "_lru_cache_wrapper":
        return "lru_cache"
    return name


_INFO = itemgetter(0)        # (storage info, path node, description) -> info
_NBYTES = itemgetter(1)      # StorageInfo -> bytes
_PLACE = itemgetter(2, 3)    # StorageInfo -> (device, framework)
_DEVICE, _FRAMEWORK = itemgetter(2), itemgetter(3)
_PAIRWISE = 16               # up to this many sharing roots, compare them pairwise


class Sharing:
    """Which storages more than one root reaches, and the distinct bytes reached.

    Built with set operations over the roots' storage keys, so its cost grows
    with the number of roots and shared storages, not with each storage."""

    def __init__(self, result: _scan.ScanResult, memo: dict | None = None) -> None:
        self.result = result
        #: id(storages) -> (storages, stats): a root's stats of an earlier attribution,
        #: for the same storages (a warm scan's kept walk gives the same dict again; only
        #: those are noted: a walk's own storages carry path nodes, which hold objects)
        self._memo_in = memo or {}
        self.memo: dict[int, tuple] = {}   # the same, for this attribution's roots
        keys: set = set()
        self.keys = keys   # every storage key some root reaches
        multi: set = set()
        #: the indices of the roots that reach a storage (the others play no part)
        self.holding = holding = result.holding()
        for i in holding:
            found = result.reach[i].storages
            if keys:
                multi |= keys.intersection(found)
            keys.update(found)
        # root index -> the keys of its storages other roots reach too
        self.shared_keys: dict[int, set] = {}
        if multi:
            for i in holding:
                common = result.reach[i].storages.keys() & multi
                if common:
                    self.shared_keys[i] = common
        self._owners: dict | None = None
        self._reached: dict | None = None
        self._stats: dict[int, tuple] = {}
        self._pairs: dict[tuple, int] = {}

    def stats(self, i: int) -> tuple[list, list, int, set]:
        """Root ``i``'s storages: their infos, their sizes, the total, the places
        ``(device, framework)`` they are on."""
        out = self._stats.get(i)
        if out is None:
            storages = self.result.reach[i].storages
            last = self._memo_in.get(id(storages))
            if last is not None and last[0] is storages:
                out = self._stats[i] = last[1]
                self.memo[id(storages)] = last
                return out
            infos = list(map(_INFO, storages.values()))
            sizes = list(map(_NBYTES, infos))
            devices, frameworks = set(map(_DEVICE, infos)), set(map(_FRAMEWORK, infos))
            # one device and framework (the common case) without a pair per storage
            places = {(devices.pop(), frameworks.pop())} if len(devices) == len(frameworks) == 1 \
                else set(map(_PLACE, infos))
            out = self._stats[i] = (infos, sizes, sum(sizes), places)
            kept = self.result.kept
            if i < len(kept) and kept[i]:   # a kept walk's storages hold no path to read
                self.memo[id(storages)] = (storages, out)
        return out

    @property
    def reached(self) -> dict[str, dict[str, int]]:
        """The distinct bytes reached from all roots, device -> framework -> bytes."""
        if self._reached is None:
            out: dict[str, dict[str, int]] = {}
            counted: set = set()   # shared keys already counted (under an earlier root)
            for i in self.holding:
                found = self.result.reach[i].storages
                infos, _, total, places = self.stats(i)
                common = self.shared_keys.get(i)
                again = common & counted if common else ()
                if common:
                    counted |= common
                if len(places) == 1:
                    dev, fw = next(iter(places))
                    per = out.setdefault(dev, {})
                    per[fw] = per.get(fw, 0) + total - (self._sum(i, again) if again else 0)
                    continue
                for key, (info, _, _) in found.items():
                    if key not in again:
                        per = out.setdefault(info.device, {})
                        per[info.framework] = per.get(info.framework, 0) + info.nbytes
            self._reached = out
        return self._reached

    def shared_bytes(self, i: int, j: int | None = None) -> int:
        """Bytes root ``i`` shares with other roots (with root ``j`` only, if given)."""
        key = (i, -1) if j is None else (min(i, j), max(i, j))
        out = self._pairs.get(key)
        if out is None:
            mine = self.shared_keys.get(i, set())
            common = mine if j is None else mine & self.shared_keys.get(j, set())
            out = self._pairs[key] = self._sum(i, common)
        return out

    def _sum(self, i: int, keys: set) -> int:
        """Bytes of root ``i``'s storages ``keys``; all it shares (a model and its
        optimizer share every parameter) is summed once."""
        mine = self.shared_keys.get(i)
        if mine is not None and keys is not mine and len(keys) == len(mine) \
                and keys <= mine:
            return self.shared_bytes(i)
        return _bytes_of(self.result.reach[i].storages, keys)

    def owners(self, key: tuple) -> list[int]:
        """Indices of the roots that reach a shared storage."""
        if self._owners is None:
            self._owners = {}
            for i, keys in self.shared_keys.items():
                for k in keys:
                    self._owners.setdefault(k, []).append(i)
        return self._owners.get(key, [])

    def sharers(self, i: int) -> dict[int, int]:
        """Root index -> bytes that root shares with root ``i``."""
        mine = self.shared_keys.get(i)
        if not mine:
            return {}
        found = self.result.reach[i].storages
        out: dict[int, int] = {}
        if len(self.shared_keys) <= _PAIRWISE:
            for j, theirs in self.shared_keys.items():
                if j != i and not mine.isdisjoint(theirs):
                    out[j] = self.shared_bytes(i, j)
            return out
        for k in mine:
            nbytes = found[k][0].nbytes
            for j in self.owners(k):
                if j != i:
                    out[j] = out.get(j, 0) + nbytes
        return out


def _bytes_of(found: dict, keys) -> int:
    return sum(map(_NBYTES, map(_INFO, map(found.__getitem__, keys))))


def fold_own_aliases(result: _scan.ScanResult) -> _scan.ScanResult:
    """A hidden holder that holds the very object a name of the user's holds (``big``
    shown as a cell's value: ``Out[5]`` is ``big``) is that name's alias, not a holder
    of its own: its row goes, the name lists it (``big 64.0 MiB, also Out[5]``) and
    owns the bytes alone. A purge of the name clears it too (see purge)."""
    named: dict[int, int] = {}   # id(object) -> index of the first user name holding it
    holding, roots = result.holding(), result.roots
    for i in holding:
        if not roots[i].hidden:
            named.setdefault(id(roots[i].obj), i)
    folded: dict[int, list[str]] = {}
    for i in holding:
        root = roots[i]
        j = named.get(id(root.obj)) if root.hidden else None
        if j is not None:
            folded.setdefault(j, []).extend([root.name] + list(root.aliases))
            folded.setdefault(i, [])
    if not folded:
        return result
    roots, reach = list(result.roots), list(result.reach)
    for i, names in folded.items():
        if roots[i].hidden:   # its storages are the name's: counted there
            reach[i] = _scan.Reach({}, reach[i].objects)
        else:
            roots[i] = replace(roots[i], aliases=(*roots[i].aliases, *names))
    return replace(result, roots=roots, reach=reach)


def attribute(result: _scan.ScanResult, *, rows_for: set[str] = frozenset(), backends=None,
              sharing: Sharing | None = None) -> list[Holder]:
    """Turn what each root reaches into holders: unique and shared bytes.

    ``rows_for``: names whose every storage is listed (``%gpumem NAME``).
    """
    sharing = Sharing(result) if sharing is None else sharing
    backends = active_backends() if backends is None else backends
    roots = result.roots
    holders = []
    for i in sharing.holding:
        root, found = result.roots[i], result.reach[i].storages
        infos, sizes, total, places = sharing.stats(i)
        largest_bytes = max(sizes)
        largest_entry = next(islice(found.values(), sizes.index(largest_bytes), None))
        if not _scan.readable(largest_entry[1]):
            # one allocation, one key made a storage the warm scan kept no path for the
            # largest (it took its allocation's bytes): the largest with a path stands
            largest_entry = max((e for e in found.values() if _scan.readable(e[1])),
                                key=lambda e: e[0].nbytes, default=largest_entry)
        devices = {place[0] for place in places}
        if len(devices) == 1:
            per_device = {devices.pop(): total}
        else:
            per_device = {}
            for info in infos:
                per_device[info.device] = per_device.get(info.device, 0) + info.nbytes
        common = sharing.shared_keys.get(i)
        shared = sharing.shared_bytes(i) if common else 0
        sharers = sharing.sharers(i) if common else {}
        rows = []
        if root.name in rows_for:
            for key, (info, node, what) in found.items():
                rows.append(TensorRow(
                    _scan.format_path(node), info.nbytes, info.device, info.framework, what,
                    [roots[j].name for j in sharing.owners(key) if j != i] if common and key in common
                    else [], key=key))
        path = _scan.format_path(largest_entry[1])
        holders.append(Holder(
            name=root.name, label=_hidden.label(root, path),
            type=_hidden.what(root) or type_name(root.obj),
            unique=total - shared, shared=shared, devices=per_device, tensors=len(found),
            largest_path=path, largest_bytes=largest_bytes, hidden=root.hidden,
            aliases=list(root.aliases),
            shared_with=[roots[j].name for j, _ in sorted(sharers.items(), key=lambda kv: -kv[1])],
            hint=_hint(root, backends, total), purge=root.purge,
            rows=sorted(rows, key=lambda r: -r.nbytes),
        ))
    holders.sort(key=lambda h: (-h.unique, -h.total, h.name))
    return holders


def _hint(root: Root, backends, nbytes: int) -> str | None:
    if root.hidden:
        return _hidden.hint(root)
    if is_a(root.obj, BaseException):
        return (f"exception `{root.name}` keeps its traceback's frames alive: "
                f"keep `str({root.name})` instead")
    for backend in backends:
        try:
            text = backend.hint(root.name, root.obj, nbytes)
        except Exception:
            text = None
        if text:
            return text
    return None


def build(*, shell: Any = None, namespace: dict | None = None,
          device: _devices.DeviceSelection, names: list[str] | None = None,
          time_limit: float = 3.0, warm: Any = None, full: bool = False) -> Snapshot:
    """Scan names and hidden holders and read the devices of ``device`` (a
    :class:`~jupyter_gpumem.core.devices.DeviceSelection`): one Snapshot."""
    # the scan's many short-lived objects are all gone when _build returns, so the
    # collector, paused meanwhile, finds nothing to do when it resumes
    with _scan.paused_gc():
        return run_to_end(build_steps(shell=shell, namespace=namespace, device=device,
                                      names=names, time_limit=time_limit, warm=warm,
                                      full=full, interleaved=False))


def build_steps(*, shell: Any = None, namespace: dict | None = None,
                device: _devices.DeviceSelection, names: list[str] | None = None,
                time_limit: float = 3.0, warm: Any = None, full: bool = False,
                interleaved: bool = True):
    """:func:`build` in steps (see :func:`jupyter_gpumem.core.scan.iter_scan`): a generator
    that yields while it scans and returns the Snapshot."""
    device = _devices.DeviceSelection.of(device)
    built = yield from build_many_steps(shell=shell, namespace=namespace, devices=[device],
                                        names=names, time_limit=time_limit, warm=warm,
                                        full=full, interleaved=interleaved)
    return built[device.text]


def build_many_steps(*, shell: Any = None, namespace: dict | None = None,
                     devices: list[_devices.DeviceSelection], names: list[str] | None = None,
                     time_limit: float = 3.0, errors: dict | None = None, warm: Any = None,
                     full: bool = False, interleaved: bool = True):
    """:func:`build_steps` for several device selections (the views of one shell): a
    generator that returns each selection's text -> Snapshot, in the order given.
    Selections that cover the same devices (``auto`` and ``cpu`` where no accelerator is
    seen, ``cuda`` and ``auto`` on a machine of GPUs) share one reading and one scan;
    each still gets its own snapshot, under its own text. With ``errors`` (a dict), a
    selection whose snapshot fails gets its exception there (by its text) and the
    others go on; without, it raises.

    ``warm``: the shell's :class:`~jupyter_gpumem.core.scan.warm.WarmScan` (roots proved
    unchanged are not walked again; not with ``names``, whose rows read every path);
    ``full``: walk every root all the same (and keep what it reached for the next);
    ``interleaved``: the caller may run other code between steps (see iter_scan)."""
    groups: dict[tuple[str, ...], list[_devices.DeviceSelection]] = {}
    for selection in dict.fromkeys(map(_devices.DeviceSelection.of, devices)):
        groups.setdefault(selection.ids, []).append(selection)
    out: dict[str, Snapshot] = {}
    for ids, selections in groups.items():
        try:
            started = time.perf_counter()   # the limit is the group's, reading included
            usages = _devices.read_devices(selections[0], detail=True)
            # (without names, the user's names are taken by the scan itself, and one that
            # is proven to reach nothing gets no root)
            roots = _scan.collect_roots(namespace, shell) if names else \
                _scan.hidden_roots(shell)
            extra: list[Root] = []
            if names:
                by_name = {r.name: r for r in roots}
                for text in names:
                    target = resolve(text, shell=shell, namespace=namespace)
                    if text in by_name and by_name[text].obj is target.obj:
                        continue
                    extra.append(Root(text, target.obj, purge=text, kind="path"))
            result = yield from _scan.iter_scan(roots + extra, devices=set(ids), shell=shell,
                                                namespace=namespace, time_limit=time_limit,
                                                describe=bool(names),
                                                warm=None if names else warm, reuse=not full,
                                                interleaved=interleaved, started=started,
                                                user=None if names else _scan.user_names(namespace, shell))
            result = fold_own_aliases(result)
            for selection in selections:
                out[selection.text] = _assemble(
                    selection.device, list(ids), list(selection.accelerators), usages, result,
                    names, extra, shell, namespace, warm)
        except Exception as exc:  # noqa: BLE001 - that group's failure alone
            if errors is None:
                raise
            for selection in selections:
                errors[selection.text] = exc
    return {s.text: out[s.text] for s in dict.fromkeys(devices) if s.text in out}


def _hints_again(holders: list[Holder], result: _scan.ScanResult) -> None:
    """The hints of reused holders that read more than the walk proved unchanged: a
    name's own tensor (a view's shape); a hidden holder's hint is its kind's."""
    backends = active_backends()
    by_name = {r.name: r for r in map(result.roots.__getitem__, result.holding())
               if not r.hidden}
    for h in holders:
        root = by_name.get(h.name)
        if root is not None:
            h.hint = _hint(root, backends, h.total)


def _assemble(device: str, ids: list[str], accs, usages, result, names, extra,
              shell: Any, namespace: dict | None, warm: Any = None) -> Snapshot:
    """One selection's Snapshot (``device``, parsed) from a scan of its devices (shared
    by selections alike); with ``warm``, the holders of the last scan where it says
    nothing they come from changed."""
    detail_names = set(names or ())

    def compute() -> tuple:
        sharing = Sharing(result, warm.stats if warm is not None else None)
        holders = attribute(result, rows_for=detail_names, sharing=sharing)
        if warm is not None:
            warm.stats = sharing.memo
        return holders, sharing.keys, sharing.reached

    if warm is not None and not names and not _trace.is_on():
        all_holders, reached_keys, reached, reused = warm.attributed(result, compute)
        if reused:   # a hint reads the object (a view's shape): asked again
            _hints_again(all_holders, result)
    else:
        all_holders, reached_keys, reached = compute()
    details = [h for h in all_holders if h.name in detail_names]
    _allocation_sites(details)
    extra_names = {r.name for r in extra}
    holders = [h for h in all_holders if h.name not in extra_names]
    messages = list(_messages(result, usages, accs, device))
    odd = odd_keys(namespace, shell)
    if odd:
        messages.append(f"skipped {len(odd)} namespace key(s) that are not names: {', '.join(odd[:5])}")
    internals, errors = _backends.internals(ids, reached_keys)
    messages += errors
    internals = sorted(internals, key=_internal_order) + _rest_remainders(usages, internals)
    unattributed = _unattributed(usages, reached, internals)
    for du in usages:
        du.attributed = sum(reached.get(du.id, {}).values())
    sites = _sites_of_unattributed(unattributed, result, internals) if _trace.is_on() else {}
    others = [dp for dp in _processes.read(usages) if dp.processes or dp.hidden]
    return Snapshot(device, usages, holders, unattributed, bool(accs), result.partial,
                    messages, result.seconds, details=details, internals=internals,
                    unattributed_sites=sites, processes=others,
                    refused=list(result.refused))


_KIND_ORDER = {"allocated": 0, "cached": 1, "outside": 2}


def released_by_purge(device_ids, reached_keys) -> list[str]:
    """For a dry run: one line per device naming the internals that every purge gives
    back (workspaces, caches, pools), which its prediction includes."""
    found, _ = _backends.internals(device_ids, reached_keys)
    per: dict[str, list[Internal]] = {}
    for i in found:
        if i.freed_by_purge and i.nbytes and i.device != "cpu":
            per.setdefault(i.device, []).append(i)
    return [f"{dev}: the purge also gives back " + ", ".join(
                f"{i.label} {fmt_bytes(i.nbytes)}" for i in sorted(items, key=_internal_order))
            + " (included above)" for dev, items in per.items()]


def _internal_order(i: Internal):
    return (_KIND_ORDER.get(i.kind, 3), i.device, -(i.nbytes or 0), i.label)


def _allocation_sites(details: list[Holder]) -> None:
    """While ``%gpumem trace`` is on, each row of ``%gpumem NAME`` says where its
    storage was allocated."""
    if not details or not _trace.is_on():
        return
    rows = [r for h in details for r in h.rows]
    sites = _trace.sites_of([r.key for r in rows])
    for r in rows:
        site = sites.get(r.key)
        if site is not None:
            r.allocated_at = site.text


SITE_GROUPS = 5   # allocation sites shown for what no name reaches, per device


def _sites_of_unattributed(unattributed: dict, result, internals: list[Internal]
                           ) -> dict[str, list[dict]]:
    """While trace is on: what no name reaches on each device, by allocation site."""
    sizes = {k: _NBYTES(_INFO(v)) for reach in result.reach for k, v in reach.storages.items()}
    return sites_of_unattributed(unattributed, sizes, internals)


def sites_of_unattributed(unattributed: dict, sizes: dict, internals: list[Internal] = ()
                          ) -> dict[str, list[dict]]:
    """What no name reaches on each device with unattributed bytes, by allocation site
    (``sizes``: the reached storages' keys -> bytes): the blocks the internals name (the
    workspaces, a graph's pool) are left out, as they are of the unattributed figure,
    and the allocator's rounding past the named storages is a group of its own, so the
    groups add up to the figure; past the first few, one row sums the others."""
    if not _trace.is_on():
        return {}
    out = {}
    for dev, nbytes in unattributed.items():
        if nbytes:
            shown = {addr: i.label for i in internals
                     if i.device == dev and i.kind == "allocated" for addr, _ in i.blocks}
            groups = _trace.unattributed_sites(sizes, dev, shown)
            rows = [dict(g.to_json(), text=g.text) for g in groups[:SITE_GROUPS]]
            rest = groups[SITE_GROUPS:]
            if rest:
                size, count = sum(g.nbytes for g in rest), sum(g.count for g in rest)
                rows.append({"site": None, "bytes": size, "count": count, "device": dev,
                             "text": f"{fmt_bytes(size)} in {count} block(s) · "
                                     f"{len(rest)} other site(s)"})
            if rows:
                out[dev] = rows
    return out


def _unattributed(usages, reached: dict[str, dict[str, int]],
                  internals: list[Internal] = ()) -> dict[str, int | None]:
    """Allocated bytes no name reaches, per device, summed over the frameworks that count;
    the internals inside a framework's allocated bytes (workspaces, ...) are not counted."""
    inside: dict[tuple, int] = {}
    for i in internals:
        if i.kind == "allocated" and i.nbytes:
            inside[(i.device, i.framework)] = inside.get((i.device, i.framework), 0) + i.nbytes
    out: dict[str, int | None] = {}
    for du in usages:
        mine = reached.get(du.id, {})
        rest = [max(fw.allocated - mine.get(fw.name, 0) - inside.get((du.id, fw.name), 0), 0)
                for fw in du.frameworks if fw.allocated is not None]
        out[du.id] = sum(rest) if rest else None
    return out


def _rest_remainders(usages, internals: list[Internal]) -> list[Internal]:
    """For each device whose rest (this process's memory outside the frameworks' pools)
    has known parts, the part left unexplained: kernel images, handles, the driver."""
    out = []
    for du in usages:
        rest = du.non_framework
        parts = [i for i in internals if i.device == du.id and i.kind == "outside"]
        if rest is None or not parts:
            continue
        known = sum(i.nbytes for i in parts if i.nbytes)
        # a pool that reports no reserved figure (TensorFlow) sits in the rest too
        no_reserved = {fw.name for fw in du.frameworks if fw.reserved is None}
        known += sum(i.nbytes for i in internals if i.device == du.id and i.kind == "cached"
                     and i.framework in no_reserved and i.nbytes)
        limits = None
        if du.id.startswith("cuda:") and du.id[5:].isdigit():
            try:
                limits = _cuda_context.context_limits(int(du.id[5:]))
            except Exception:
                limits = None
        out.append(_cuda_context.rest_remainder(du.id, rest - known, limits))
    return out


_REFUSED = " object(s) refused introspection and were skipped"
_REFUSED_NAMED = 3   # kinds of refused object the note names


def is_refused_note(message: str) -> bool:
    """True for the note :func:`refused_note` writes."""
    head, sep, _ = message.partition(_REFUSED)
    return bool(sep) and head.isdigit()


def refused_note(count: int, refused: list, every: bool = False) -> str:
    """``N object(s) refused introspection and were skipped: Foo in x, 2 Bar in last
    traceback, …``: the first few kinds (type and where) of ``refused``, or all of them
    with ``every``."""
    kinds: dict[tuple[str, str], int] = {}
    for entry in refused:
        kinds[tuple(entry)] = kinds.get(tuple(entry), 0) + 1
    named = list(kinds.items()) if every else list(kinds.items())[:_REFUSED_NAMED]
    text = f"{count}{_REFUSED}"
    if not named:
        return text
    parts = [f"{n} {tp}" if n > 1 else tp for (tp, _), n in named]
    text += ": " + ", ".join(f"{p} in {where}" for p, ((_, where), _) in zip(parts, named))
    if sum(kinds.values()) < count and every:
        text += f", and {count - sum(kinds.values())} more"
    elif len(named) < len(kinds) or sum(kinds.values()) < count:
        text += ", … (%gpumem -v lists all)"
    return text


def _messages(result, usages, accs, device):
    if not accs:
        yield _devices.NO_ACCELERATOR
    if result.partial:
        hint = " (raise GpuMemMagics.scan_time_limit)" if any("time limit" in r for r in result.reasons) else ""
        yield "partial result: " + ", ".join(result.reasons) + hint
    if result.errors:
        yield refused_note(result.errors, result.refused)
    yield from result.notes
    for du in usages:
        for note in du.notes:
            yield f"{du.id}: {note}"
        for fw in du.frameworks:
            if fw.note:
                yield f"{du.id}: {fw.note}"
