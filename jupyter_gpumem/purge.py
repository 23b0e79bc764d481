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
from dataclasses import dataclass, field
from typing import Any

from . import devices as _devices
from . import paths as _paths
from . import scan as _scan
from .backends import active_backends

PURGE_SCHEMA = "jupyter_gpumem.purge/1"
_SPECIAL = {"last traceback": "traceback", "last result": "result"}


class PurgeError(ValueError):
    """Bad input to purge: nothing was deleted."""


@dataclass
class DeviceChange:
    """Memory of one device before and after a purge."""

    device: str
    measure: str
    before: int | None
    after: int | None
    allocated_before: int | None = None
    allocated_after: int | None = None
    reserved_before: int | None = None
    reserved_after: int | None = None

    @property
    def freed(self) -> int | None:
        if self.before is None or self.after is None:
            return None
        return self.before - self.after

    def to_json(self) -> dict:
        return {"device": self.device, "measure": self.measure, "before": self.before,
                "after": self.after, "freed": self.freed,
                "allocated_before": self.allocated_before, "allocated_after": self.allocated_after,
                "reserved_before": self.reserved_before, "reserved_after": self.reserved_after}


@dataclass
class StillHeld:
    """Memory a purge meant to free that another holder still keeps alive."""

    by: str
    path: str
    nbytes: int

    def to_json(self) -> dict:
        return {"by": self.by, "path": self.path, "bytes": self.nbytes}


@dataclass
class PurgeResult:
    """What a purge removed and what it freed, per device."""

    names: list[str]
    removed: list[str]
    predicted: dict[str, int]
    changes: list[DeviceChange] = field(default_factory=list)
    still_held: list[StillHeld] = field(default_factory=list)
    dry_run: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def freed(self) -> dict[str, int | None]:
        return {c.device: c.freed for c in self.changes}

    def to_json(self) -> dict:
        """The PurgeResult object of docs/PROTOCOL.md."""
        return {
            "schema": PURGE_SCHEMA, "dry_run": self.dry_run, "names": list(self.names),
            "removed": list(self.removed), "predicted": dict(self.predicted),
            "before": {c.device: c.before for c in self.changes},
            "after": {c.device: c.after for c in self.changes},
            "freed": self.freed, "changes": [c.to_json() for c in self.changes],
            "still_held": [s.to_json() for s in self.still_held],
            "messages": list(self.messages), "seconds": round(self.seconds, 6),
        }

    def __repr__(self) -> str:
        from .render import purge_text

        return purge_text(self)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        from .render import purge_html

        return purge_html(self)


@dataclass
class _Target:
    text: str
    binding: _paths.Binding | None      # None for hidden holders named directly
    root: _scan.Root | None             # the root this name is, if it is one
    keys: dict = field(default_factory=dict)   # storage key -> path node


# -- planning ------------------------------------------------------------------
def _device_words(device: str) -> str:
    return "host memory" if device == "cpu" else f"memory on {device}" if ":" in device \
        else "accelerator memory"


def _targets(names, roots, by_name, scan1, ids, shell, namespace, time_limit, device):
    errors: list[str] = []
    targets: list[_Target] = []
    reach_of = {id(r): reach for r, reach in zip(roots, scan1.reach)}
    for text in names:
        if text in _SPECIAL:
            root = next((r for r in roots if r.kind == _SPECIAL[text]), None)
            if root is None:
                errors.append(f"nothing is held by the {text}")
                continue
            targets.append(_Target(text, None, root, _paths_of(reach_of[id(root)])))
            continue
        try:
            binding = _paths.resolve(text, shell=shell, namespace=namespace)
            _paths.check_deletable(binding)
        except _paths.PathError as exc:
            errors.append(str(exc))
            continue
        root = by_name.get(text)
        if root is not None and root.obj is binding.obj:
            keys = _paths_of(reach_of[id(root)])
        else:
            root = None
            extra = _scan.scan([_scan.Root(text, binding.obj)], devices=ids, shell=shell,
                               namespace=namespace, time_limit=time_limit)
            keys = _paths_of(extra.reach[0])
        if not keys:
            errors.append(f"{text!r} holds no {_device_words(device)}")
            continue
        targets.append(_Target(text, binding, root, keys))
    if errors:
        raise PurgeError("; ".join(errors) + " (nothing was deleted)")
    return targets


def _paths_of(reach) -> dict:
    return {k: v[1] for k, v in reach.storages.items()}


def _through_graph(node) -> bool:
    """True when a path goes through an autograd graph (``x.grad_fn→...``)."""
    while node is not None:
        node, label = node
        if label[0] == "graph":
            return True
    return False


def _still_held(remaining, scan_result, target_keys) -> list[StillHeld]:
    out = []
    for root, reach in zip(remaining, scan_result.reach):
        common = target_keys & reach.storages.keys()
        if not common:
            continue
        nbytes = sum(reach.storages[k][0].nbytes for k in common)
        largest = max(common, key=lambda k: reach.storages[k][0].nbytes)
        out.append(StillHeld(root.name, _scan.format_path(reach.storages[largest][1]), nbytes))
    out.sort(key=lambda s: -s.nbytes)
    return out


def _bytes_by_device(scan_result, keys) -> dict[str, int]:
    info = {}
    for reach in scan_result.reach:
        for k in keys & reach.storages.keys():
            info[k] = reach.storages[k][0]
    out: dict[str, int] = {}
    for i in info.values():
        out[i.device] = out.get(i.device, 0) + i.nbytes
    return out


def _tracked(scan_result) -> dict[str, int]:
    seen = {}
    for reach in scan_result.reach:
        for k, (i, _, _) in reach.storages.items():
            seen[k] = i
    out: dict[str, int] = {}
    for i in seen.values():
        out[i.device] = out.get(i.device, 0) + i.nbytes
    return out


# -- execution ---------------------------------------------------------------------
def clear_hidden(root: _scan.Root, shell: Any) -> list[str]:
    """Drop IPython's hidden references for one hidden root; return what went."""
    removed: list[str] = []
    obj = root.obj
    if shell is not None:
        ns, hidden = shell.user_ns, getattr(shell, "user_ns_hidden", {})
        hook = getattr(shell, "displayhook", None)
        out_hist = getattr(getattr(shell, "history_manager", None), "output_hist", None)
        for name in [root.name] + list(root.aliases):
            if name.startswith("Out[") and out_hist is not None:
                n = int(name[4:-1])
                if out_hist.get(n) is obj:
                    del out_hist[n]
                    removed.append(name)
            elif name in ("_", "__", "___"):
                for d in (ns, hidden):
                    if d.get(name) is obj:
                        d[name] = ""
                if hook is not None and getattr(hook, name, None) is obj:
                    setattr(hook, name, "")
                removed.append(name)
            elif name == "last result":
                result = getattr(shell, "last_execution_result", None)
                if result is not None and result.result is obj:
                    result.result = None
                removed.append(name)
            elif name.startswith("_") and name[1:].isdigit():
                for d in (ns, hidden):
                    if d.get(name) is obj:
                        del d[name]
                if name not in removed:
                    removed.append(name)
    if root.kind == "traceback":
        for name in ("last_exc", "last_value", "last_traceback", "last_type"):
            if hasattr(sys, name):
                try:
                    delattr(sys, name)
                except AttributeError:
                    pass
        if shell is not None:
            tb = getattr(shell, "InteractiveTB", None)
            if tb is not None:
                tb.tb = None
                if getattr(tb, "pdb", None) is not None:
                    tb.pdb = None
            result = getattr(shell, "last_execution_result", None)
            if result is not None and result.error_in_exec is not None:
                result.error_in_exec = None
        removed.append(root.name)
    return removed


def _delete_target(t: _Target, shell: Any, namespace: dict | None) -> list[str]:
    removed: list[str] = []
    if t.binding is None:
        return removed
    obj = t.binding.obj
    _paths.delete(t.binding)
    removed.append(t.text)
    if t.binding.is_name and shell is not None:
        hidden = getattr(shell, "user_ns_hidden", {})
        if hidden.get(t.text) is obj:
            del hidden[t.text]
    for name, mod in list(sys.modules.items()):
        if mod is obj:
            del sys.modules[name]
            removed.append(f"sys.modules[{name!r}]")
    return removed


def _execute(targets: list[_Target], hidden_clear: list[_scan.Root], shell: Any,
             namespace: dict | None) -> list[str]:
    """Remove the bindings and hidden holders; leave no reference to them behind."""
    removed: list[str] = []
    for t in targets:
        removed += _delete_target(t, shell, namespace)
    for r in hidden_clear:
        removed += [n for n in clear_hidden(r, shell) if n not in removed]
    targets.clear()
    hidden_clear.clear()
    return removed


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
    hidden_clear: list[_scan.Root]
    reportable: set
    tracked_before: dict[str, int]


def _plan(names: list[str], shell: Any, namespace: dict | None, all_names: bool, dry_run: bool,
          device: str, ids: set[str], time_limit: float) -> _Plan:
    """Check every name and work out what goes, what is freed and what still holds it."""
    roots = _scan.collect_roots(namespace, shell)
    scan1 = _scan.scan(roots, devices=ids, shell=shell, namespace=namespace, time_limit=time_limit)
    reach_of = {id(r): reach for r, reach in zip(roots, scan1.reach)}
    if all_names:
        names = [r.name for r in roots if not r.hidden and reach_of[id(r)].storages]
    by_name = {r.name: r for r in roots if not r.hidden}
    for hidden_root in (r for r in roots if r.hidden):
        for n in [hidden_root.name] + hidden_root.aliases:
            by_name.setdefault(n, hidden_root)
    targets = _targets(names, roots, by_name, scan1, ids, shell, namespace, time_limit, device)
    if names:
        target_paths = {k: node for t in targets for k, node in t.keys.items()}
    else:  # no names: the targets are the hidden holders that hold memory
        target_paths = {k: v[1] for r in roots if r.hidden for k, v in reach_of[id(r)].storages.items()}
    # what the user names that stay will still hold, with the purged objects cut out
    named_roots = {id(t.root) for t in targets if t.root is not None}
    user_remaining = [r for r in roots if not r.hidden and id(r) not in named_roots]
    cut = {id(t.binding.obj) for t in targets if t.binding is not None}
    scan2 = _scan.scan(user_remaining, devices=ids, shell=shell, namespace=namespace,
                       time_limit=time_limit, extra_stop=cut)
    user_held = set().union(*(reach.storages.keys() for reach in scan2.reach)) if scan2.reach else set()
    own = target_paths.keys() - user_held
    named_objs = {id(t.binding.obj) for t in targets if t.binding is not None} | \
        {id(t.root.obj) for t in targets if t.root is not None}
    hidden_clear = [r for r in roots if r.hidden and reach_of[id(r)].storages and (
        not names or id(r.obj) in named_objs or own & reach_of[id(r)].storages.keys())]
    # parameters an autograd graph points to belong to their model, not to the loss
    reportable = {k for k, node in target_paths.items() if not _through_graph(node)}
    predicted = _bytes_by_device(scan1, own)
    for dev in ids:
        predicted.setdefault(dev, 0)
    removed = [t.text for t in targets] + [n for r in hidden_clear for n in [r.name] + r.aliases
                                           if n not in names]
    result = PurgeResult(names, removed, predicted, still_held=_still_held(user_remaining, scan2, reportable),
                         dry_run=dry_run)
    if scan1.partial or scan2.partial:
        result.messages.append("partial scan: " + ", ".join(scan1.reasons + scan2.reasons))
    return _Plan(result, targets, hidden_clear, reportable, _tracked(scan1))


def purge(names=(), *, shell: Any = None, namespace: dict | None = None, all: bool = False,
          dry_run: bool = False, device: str = "auto", time_limit: float = 3.0) -> PurgeResult:
    """Delete ``names`` (or, with none, only the hidden holders) and free their memory.

    ``all`` purges every user name that holds memory on the chosen devices.
    ``dry_run`` only reports what would go. Raises :class:`PurgeError`, having
    deleted nothing, when a name is missing, malformed or holds nothing.
    """
    start = time.perf_counter()
    try:
        device = _devices.parse_device(device)
    except ValueError as exc:
        raise PurgeError(str(exc)) from None
    if names and all:
        raise PurgeError("give names or --all, not both (nothing was deleted)")
    ids = set(_devices.selected_ids(device))
    plan = _plan(list(names or ()), shell, namespace, all, dry_run, device, ids, time_limit)
    result = plan.result
    if dry_run:
        result.messages += _still_messages(result.still_held)
        result.seconds = time.perf_counter() - start
        return result
    before = _read(device)
    # _execute empties the plan: after it, nothing here refers to the purged objects
    result.removed = _execute(plan.targets, plan.hidden_clear, shell, namespace)
    result.messages += release_caches()
    after = _read(device)
    roots = _scan.collect_roots(namespace, shell)
    scan3 = _scan.scan(roots, devices=ids, shell=shell, namespace=namespace, time_limit=time_limit)
    result.still_held = _still_held(roots, scan3, plan.reportable)
    result.changes = _changes(before, after, plan.tracked_before, _tracked(scan3))
    result.messages += _still_messages(result.still_held)
    result.seconds = time.perf_counter() - start
    return result


def _still_messages(still: list[StillHeld]) -> list[str]:
    from .render import fmt_bytes

    return [f"{s.by} still holds {fmt_bytes(s.nbytes)} of it ({s.path}): purge {s.by} too"
            for s in still]



from ._callable import make_module_callable  # noqa: E402

make_module_callable(__name__, purge)
