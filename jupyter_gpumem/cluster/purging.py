"""Purge on a cluster: release the keys that chosen names hold, wait until the
workers dropped them, then collect garbage and release the frameworks' caches on
every worker, and report before / after / freed per worker and device.

The semantics are the notebook's (:mod:`jupyter_gpumem.purge`): every name is
checked before any is removed; the names go from the namespace by identity, with
IPython's hidden holders of the same objects (``Out[N]``, ``_``, the last
traceback); no names means the hidden holders only; ``all`` means every name that
holds a key; a dry run changes nothing. A name's Futures are released the way Dask
releases them, by dropping the last reference: a Future another name still holds
stays, and so does a key another client or a published dataset wants.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

from ..core import scan as _scan
from ..core.purge import (Holdings, PurgeError, Target, execute, hidden_to_clear, names_of,
                          removed_names, resolve_targets)
from ..core.render import fmt_bytes
from ..core.scan import Root
from . import remote
from .build import (Deadline, HeldNames, bytes_on, build, describe_wanters, run_on_workers,
                    walk_messages)
from .names import NameScan, holders_of, scan_roots
from .render import key_text
from .result import ClusterPurgeResult, ClusterSnapshot, KeyStillHeld, WorkerChange

_POLL = 0.05
_GRACE = 0.3   # seconds for this client to send the release of the Futures that went
_IN_PROCESS = "a Future in this process that no name reaches"


class ClusterPurgeError(PurgeError):
    """Bad input to a cluster purge: nothing was deleted."""


@dataclass
class _Plan:
    """What a purge will do; the only holder of references to the objects it removes."""

    names: list[str]
    targets: list[Target]
    hidden_clear: list[Root]
    found: NameScan
    target_keys: set
    own: set                               # keys no remaining name of the notebook holds
    named: dict = field(default_factory=dict)   # key -> [(remaining name, path)]
    remaining_names: set = field(default_factory=set)
    messages: list[str] = field(default_factory=list)

    def release(self) -> None:
        self.targets.clear()
        self.hidden_clear.clear()
        self.found.release()
        self.found.futures.clear()


class _Holdings(Holdings):
    """What the notebook's roots hold on the cluster: the Dask keys of their Futures
    (key -> path), and for another object a walk of its own (its Futures join the
    plan's)."""

    def __init__(self, client: Any, roots: list[Root], found: NameScan, shell: Any,
                 namespace: dict | None, time_limit: float) -> None:
        self.client, self.found = client, found
        self.shell, self.namespace, self.time_limit = shell, namespace, time_limit
        self.keys_of = {id(r): k for r, k in zip(roots, found.keys)}
        self.by_name = names_of(roots)

    def of(self, root: Root) -> dict:
        return self.keys_of[id(root)]

    def of_object(self, text: str, obj: Any) -> tuple[dict, str]:
        extra = scan_roots([Root(text, obj)], client_id=self.client.id, shell=self.shell,
                           namespace=self.namespace, time_limit=self.time_limit, remember=True)
        keys = extra.keys[0]
        for k, refs in extra.futures.items():
            self.found.futures.setdefault(k, []).extend(refs)
        extra.release()
        return keys, self.nothing(text)

    def nothing(self, text: str) -> str:
        return f"{text!r} holds no key on the cluster"

    def direct(self, text: str) -> list[Target] | str | None:
        root = self.by_name.get(text)
        if root is None or not root.hidden:
            return None
        keys = self.keys_of[id(root)]
        return [Target(text, None, root, keys)] if keys else self.nothing(text)


def _plan(client: Any, names: list[str], all_names: bool, shell: Any, namespace: dict | None,
          time_limit: float) -> _Plan:
    roots = _scan.collect_roots(namespace, shell)
    found = scan_roots(roots, client_id=client.id, shell=shell, namespace=namespace,
                       time_limit=time_limit, remember=True)
    holdings = _Holdings(client, roots, found, shell, namespace, time_limit)
    keys_of = holdings.keys_of
    if all_names:
        names = [r.name for r in roots if not r.hidden and keys_of[id(r)]]
    targets, _, errors = resolve_targets(names, roots, holdings, shell=shell,
                                         namespace=namespace)
    ClusterPurgeError.check(errors)
    if not names and not all_names:   # no names: the hidden holders that hold keys
        targets = [Target(r.name, None, r, keys_of[id(r)]) for r in roots
                   if r.hidden and keys_of[id(r)]]
    target_keys = {k for t in targets for k in t.keys}
    target_roots = {id(t.root) for t in targets if t.root is not None}
    remaining = [r for r in roots if not r.hidden and id(r) not in target_roots]
    # a path's object is cut from the walk of the names that stay (``m`` no longer reaches
    # what ``m.cache`` held); a name's object is not: another name bound to it keeps it
    cut = {id(t.binding.obj) for t in targets if t.binding is not None and not t.binding.is_name}
    cut -= {id(r.obj) for r in remaining}
    rest = scan_roots(remaining, client_id=client.id, shell=shell, namespace=namespace,
                      time_limit=time_limit, extra_stop=cut)
    named: dict = {}
    for r, keys in zip(remaining, rest.keys):
        for k in target_keys & keys.keys():
            named.setdefault(k, []).append((r.name, keys[k]))
    user_held = set(named)
    remaining_names = {r.name for r, keys in zip(remaining, rest.keys) if keys}
    rest.release()
    own = target_keys - user_held
    hidden_clear = hidden_to_clear(roots, holdings, targets, not names and not all_names, own)
    plan = _Plan(list(names), targets, hidden_clear, found, target_keys, own, named,
                 remaining_names)
    if all_names and not targets:
        plan.messages.append("no name of this notebook holds a key on the cluster")
    return plan


def _execute(plan: _Plan, shell: Any, namespace: dict | None) -> tuple[list[str], list[str]]:
    """Remove the bindings and hidden holders (as the notebook's purge does), and every
    reference this module kept. Returns what went, and the names skipped because they
    changed meanwhile."""
    removed, skipped = execute(plan.targets, plan.hidden_clear, shell, namespace)
    refs = [ref for k in plan.own for ref in plan.found.futures.get(k, ())]
    plan.release()
    if any(ref() is not None for ref in refs):
        gc.collect()   # a Future in a reference cycle is released by its __del__ only now
    return removed, skipped


def _kept_by_others(keys, records: dict, client_id: str) -> set:
    out = set()
    for k in keys:
        rec = records.get(k)
        if rec is not None and (any(c != client_id for c in rec["wants"]) or rec["waiters"]):
            out.add(k)
    return out


def _predicted(snap: ClusterSnapshot, keys) -> dict[str, dict[str, int]]:
    out = {}
    for report in snap.workers:
        per = bytes_on(report, [k for k in keys if k in report.keys])
        per = {d: n for d, n in per.items() if n}
        if per:
            out[report.address] = per
    return out


def _wait_dropped(client: Any, keys: set, where: list[str],
                  limit: float) -> tuple[bool, float, set]:
    """Poll the workers that held ``keys`` until none stores them any more (or the time
    limit): (every released key dropped, seconds waited, keys this process still has
    Futures of).

    A key this client still wants a moment after the names went (a Future the walk did
    not find) will not go: it is not waited for."""
    start = time.perf_counter()
    deadline = Deadline(limit)
    waiting = list(keys)
    local: set = set()
    while True:
        if time.perf_counter() - start > _GRACE:
            local = {k for k in keys if k in client.futures}
            waiting = [k for k in keys if k not in local]
        answers, missing = run_on_workers(client, remote.worker_keys_present, where,
                                          max(min(deadline.left(), 1.0), 0.05), keys=waiting)
        present = {k for got in answers.values() for k in got}
        if not present and not missing:
            return True, time.perf_counter() - start, local
        if deadline.left() <= _POLL:
            return False, time.perf_counter() - start, local
        time.sleep(_POLL)


def _changes(before: ClusterSnapshot, after: ClusterSnapshot) -> list[WorkerChange]:
    out = []
    for wb in before.workers:
        wa = after.worker(wb.address)
        for db in wb.devices:
            da = wa.device(db.id) if wa is not None else None
            if db.kind == "cpu":
                measure, vb, va = "process RSS", db.used_process, getattr(da, "used_process", None)
            elif db.used_process is not None and getattr(da, "used_process", None) is not None:
                measure, vb, va = "process (NVML)", db.used_process, da.used_process
            elif db.reserved is not None and getattr(da, "reserved", None) is not None:
                measure, vb, va = "reserved", db.reserved, da.reserved
            else:
                measure, vb, va = "tracked", db.attributed, getattr(da, "attributed", None)
            out.append(WorkerChange(db.id, measure, vb, va, worker=wb.address,
                                    tracked_before=db.attributed,
                                    tracked_after=getattr(da, "attributed", None)))
    return out


def _still_held(snap: ClusterSnapshot, keys: set, client_id: str, named: dict,
                after: bool) -> list[KeyStillHeld]:
    """Who keeps ``keys`` that are in worker memory: the notebook's other names first,
    then the scheduler's wanters other than this client (and, after the purge, this
    client where no name explains it: a Future left in the process)."""
    out = []
    for report in snap.workers:
        for k in keys & report.keys.keys():
            nbytes = report.keys[k].nbytes
            for name, path in named.get(k, ()):
                out.append(KeyStillHeld(name, path, nbytes, report.address))
            ours = _IN_PROCESS if after and not named.get(k) else None
            for by in describe_wanters(snap.records.get(k), client_id, ours=ours):
                out.append(KeyStillHeld(by, key_text(k), nbytes, report.address))
    out.sort(key=lambda s: (-s.nbytes, s.by, s.key))
    return out


def _still_messages(still: list[KeyStillHeld], names: set) -> list[str]:
    """One line per holder: a name to purge too, or who else keeps the keys."""
    groups: dict[str, list[KeyStillHeld]] = {}
    for s in still:
        groups.setdefault(s.by, []).append(s)
    out = []
    for by, items in groups.items():
        nbytes = sum(s.nbytes for s in items)
        where = sorted({s.worker for s in items if s.worker})
        on = f" on {where[0]}" if len(where) == 1 else f" on {len(where)} workers" if where else ""
        if by in names:
            out.append(f"{by} still holds {fmt_bytes(nbytes)} of the memory this purge meant "
                       f"to free ({items[0].key}){on}: "
                       f"purge {by} too")
        else:
            what = items[0].key if len(items) == 1 else f"{len(items)} keys"
            out.append(f"{by} keeps {what} ({fmt_bytes(nbytes)}{on}): not freed")
    return out


def purge(client: Any, names=(), *, namespace: dict | None = None, shell: Any = None,
          all: bool = False, dry_run: bool = False, device: str = "auto",
          time_limit: float = 3.0) -> ClusterPurgeResult:
    """See :func:`jupyter_gpumem.cluster.purge`."""
    start = time.perf_counter()
    names = list(names or ())
    if names and all:
        raise ClusterPurgeError("give names or --all, not both (nothing was deleted)")
    plan = _plan(client, names, all, shell, namespace, time_limit * 0.3)
    before = build(client, device=device, time_limit=time_limit, names=HeldNames(
        client.id, holders_of(plan.found), walk_messages(plan.found), plan.found.partial))
    others = _kept_by_others(plan.own, before.records, client.id)
    going = plan.own - others
    target_keys, named = set(plan.target_keys), dict(plan.named)
    result = ClusterPurgeResult(list(names), removed_names(plan.targets, plan.hidden_clear, names),
                                len(target_keys),
                                _predicted(before, going), dry_run=dry_run,
                                missing=dict(before.missing), messages=list(plan.messages))
    if before.partial:
        result.messages += before.messages
    if dry_run:
        plan.release()
        result.still_held = _still_held(before, target_keys, client.id, named, after=False)
        result.messages += _still_messages(result.still_held, plan.remaining_names)
        result.seconds = time.perf_counter() - start
        return result
    remaining_names = set(plan.remaining_names)
    where = [w.address for w in before.workers
             if any(k in w.keys or k in w.spilled for k in going)]
    result.removed, skipped = _execute(plan, shell, namespace)
    plan = None
    if skipped:
        result.messages.append("changed since the plan, left as they are: " + ", ".join(skipped))
    if going:
        result.dropped, result.waited, _ = _wait_dropped(client, going, where, time_limit)
    answers, missing = run_on_workers(client, remote.worker_release,
                                      [w.address for w in before.workers], time_limit)
    for address, answer in answers.items():
        result.messages += [f"worker {address}: {n}" for n in answer.get("notes", [])]
    after = build(client, namespace=namespace, shell=shell, device=device, time_limit=time_limit)
    result.changes = _changes(before, after)
    result.missing.update(missing)
    result.missing.update(after.missing)
    result.still_held = _still_held(after, target_keys, client.id, named, after=True)
    if not result.dropped:
        result.messages.append(f"the workers still stored some of the keys after "
                               f"{result.waited:.1f} s (the time limit)")
    result.messages += _still_messages(result.still_held, remaining_names)
    result.seconds = time.perf_counter() - start
    return result
