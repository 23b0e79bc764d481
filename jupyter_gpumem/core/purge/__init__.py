"""Purge: delete chosen names and every hidden reference to their memory.

The plan is made first and checked whole (every name must exist and hold
memory on the chosen devices), so bad input deletes nothing. Execution
removes the bindings by identity, clears the hidden holders that reach the
same storages (output history, ``_``, the last result, the last traceback),
collects garbage, releases each framework's caches and measures again.

The parts: :mod:`.result` (what a purge answers), :mod:`.targets`
(names to targets, shared with a cluster's purge), :mod:`.plan`,
:mod:`.execution`, :mod:`.holders` (who still holds what was meant to
go) and :mod:`.messages`.
"""
from __future__ import annotations

import time
from typing import Any

from .. import devices as _devices
from .. import scan as _scan
from .execution import changes, execute, read_usage, release_caches
from .holders import held_elsewhere, release_handles
from .messages import list_message, partial_message, skipped_messages, still_messages
from .plan import Budget, PurgeContext, make_plan, still_held, tracked
from .result import PURGE_SCHEMA, UNNAMED, Change, DeviceChange, PurgeError, PurgeResult, StillHeld
from .targets import Holdings, Target, hidden_to_clear, names_of, removed_names, resolve_targets

#: the package's face: what a module outside ``core/purge`` may import (the cluster's purge
#: shares the targets and the execution)
__all__ = ["PURGE_SCHEMA", "UNNAMED", "Change", "DeviceChange", "PurgeError",
           "PurgeResult", "StillHeld", "purge", "release_caches", "Budget", "PurgeContext",
           "Holdings", "Target", "execute", "hidden_to_clear", "names_of", "removed_names",
           "resolve_targets"]

#: of the limit: what a real purge's plan may take (the scan after the deletions: the rest)
_PLAN_SHARE = 0.75


def purge(names=(), *, shell: Any = None, namespace: dict | None = None, all: bool = False,
          dry_run: bool = False, device: _devices.DeviceSelection,
          time_limit: float = 3.0) -> PurgeResult:
    """Delete ``names`` (or, with none, only the hidden holders) and free their memory on
    the devices of ``device`` (a :class:`~jupyter_gpumem.core.devices.DeviceSelection`).

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
    selection = _devices.DeviceSelection.of(device)
    if names and all:
        raise PurgeError("give names or --all, not both (nothing was deleted)")
    # the whole command within the limit: a dry run's plan may take all of it; a real
    # purge's plan three quarters, the scan after the deletions the rest (the collection
    # of garbage and the release of caches are not the scans' time)
    budget = Budget(time_limit, 1.0 if dry_run else _PLAN_SHARE, started=start)
    context = PurgeContext(shell, namespace, selection, budget)
    # no collection while the plan makes its many short-lived objects: one they trigger
    # costs time in proportion to the whole heap, which the plan's cost must not follow
    with _scan.paused_gc():
        plan = make_plan(list(names or ()), context, all, dry_run)
    result = plan.result
    if dry_run:
        if plan.in_list:
            result.messages.append(list_message(plan.in_list, dry_run))
        result.messages += skipped_messages(plan.skipped, dry_run)
        result.messages += still_messages(result.still_held)
        result.seconds = time.perf_counter() - start
        return result
    try:
        before = read_usage(selection)
        # execute empties the plan: after it, nothing here refers to the purged objects.
        # The collection release_caches makes next does the collector's work once: one
        # started by the deletions themselves would walk the whole heap for nothing
        with _scan.paused_gc():
            result.removed, skipped = execute(plan.targets, plan.hidden_clear, shell, namespace)
        in_list = [text for text in plan.in_list if text not in skipped]
        if in_list:
            result.messages.append(list_message(in_list, dry_run))
        result.messages += skipped_messages(plan.skipped + skipped, dry_run)
        collected = time.perf_counter()
        result.messages += release_caches()
        budget.extend(time.perf_counter() - collected)
        after = read_usage(selection)
        budget.later(1.0)
        with _scan.paused_gc():   # (after the one collection above: as for the plan)
            scan3 = plan.scan_after(context)
            result.still_held = still_held(scan3.roots, scan3, plan.reportable)
            if scan3.partial:
                result.partial = True
                result.messages.append(partial_message(scan3.reasons))
            # only when memory the purge meant to free is still alive: the search of
            # modules' globals that names its holder gets what is left of the limit
            elsewhere, kept, notes = held_elsewhere(plan.handles, plan.infos, scan3, context)
    finally:
        release_handles(plan.handles)
    result.still_held += elsewhere
    tracked_after = tracked(scan3)
    for dev, n in kept.items():   # alive, though no name reaches it: not freed
        tracked_after[dev] = tracked_after.get(dev, 0) + n
    result.changes = changes(before, after, plan.tracked_before, tracked_after)
    result.messages += still_messages(result.still_held) + notes
    result.seconds = time.perf_counter() - start
    return result
