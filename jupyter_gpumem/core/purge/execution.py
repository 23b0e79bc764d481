"""Carrying out a purge: remove the targets' bindings and the hidden holders that go
with them (by identity), collect garbage, release the frameworks' caches, and read
the devices before and after. The notebook's purge and a cluster's use the same
:func:`execute`.
"""
from __future__ import annotations

import gc
import sys
from typing import Any

from .. import devices as _devices
from ..scan import hidden as _hidden
from ..scan import paths as _paths
from ...backends import active_backends
from .result import DeviceChange
from .targets import Target
from ..scan import Root


def delete_target(t: Target, shell: Any, namespace: dict | None) -> list[str]:
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


def execute(targets: list[Target], hidden_clear: list[Root], shell: Any,
            namespace: dict | None) -> tuple[list[str], list[str]]:
    """Remove the bindings and hidden holders; leave no reference to them behind.
    Returns what went and the targets skipped because they changed on their own."""
    removed: list[str] = []
    skipped: list[str] = []
    # which hidden names are IPython's own is settled before anything is deleted
    owned = [(r, _hidden.owned(r, shell)) for r in hidden_clear]
    for t in targets:
        try:
            removed += delete_target(t, shell, namespace)
        except _paths.Changed:
            skipped.append(t.text)
    for r, names in owned:
        try:
            removed += [n for n in _hidden.clear(r, shell, names) if n not in removed]
        except Exception:  # noqa: BLE001 - the rest is purged, and the result says what was not
            skipped.append(r.name)
    targets.clear()
    hidden_clear.clear()
    owned.clear()
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


def read_usage(selection: _devices.DeviceSelection) -> dict[str, _devices.DeviceUsage]:
    """Each selected device's reading, by id."""
    return {d.id: d for d in _devices.read_devices(selection)}


def changes(before, after, tracked_before, tracked_after) -> list[DeviceChange]:
    """Each device before and after, in the best measure both readings have."""
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

