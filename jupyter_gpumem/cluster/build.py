"""Ask the scheduler and every worker, within one time limit, and attribute the
workers' bytes to the notebook's names.

Every question goes through Dask's own API: ``Client.run_on_scheduler`` for the
scheduler's records, ``Client.run`` (one call per worker, side by side) for the
workers, each bounded by what is left of the time limit, so a worker that does
not answer costs the limit, never a hang, and is named in the answer.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import remote
from .names import NameKeys, NameScan, holders_of, scan_names
from .render import key_text
from .result import ClusterHolder, ClusterSnapshot, UnclaimedKey, WorkerKey, WorkerReport

#: the least a worker is given to answer, and the share of the time left it may scan
_MIN_WAIT = 0.05
_SCAN_SHARE = 0.6


class Deadline:
    """Seconds left of one time limit."""

    def __init__(self, seconds: float) -> None:
        self.limit = float(seconds)
        self.end = time.perf_counter() + self.limit

    def left(self) -> float:
        return max(self.end - time.perf_counter(), 0.0)


# -- asking -----------------------------------------------------------------------------
async def _fan_out(client: Any, function: Any, addresses: list[str], timeout: float,
                   kwargs: dict) -> dict:
    async def one(address: str):
        try:
            answers = await client.run(function, workers=[address], on_error="return",
                                       asynchronous=True, callback_timeout=timeout, **kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:   # noqa: BLE001 - a timeout or a lost connection
            return address, exc
        if address not in answers:
            return address, LookupError("the scheduler no longer knows this worker")
        return address, answers[address]

    pairs = await asyncio.gather(*(one(a) for a in addresses))
    return dict(pairs)


def _why(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return f"did not answer within {timeout:.2g} s"
    text = str(exc) or type(exc).__name__
    if "No module named 'jupyter_gpumem" in text:
        return "cannot run the product's worker side: jupyter_gpumem is not installed there"
    return f"did not answer ({type(exc).__name__}: {text})"[:200]


def run_on_workers(client: Any, function: Any, addresses: list[str], timeout: float,
                   **kwargs) -> tuple[dict, dict]:
    """``function`` (one of :mod:`.remote`) on each worker at once, each given
    ``timeout`` seconds: (address -> answer, address -> why it gave none)."""
    if not addresses:
        return {}, {}
    timeout = max(timeout, _MIN_WAIT)
    try:
        answers = client.sync(_fan_out, client, function, list(addresses), timeout, kwargs,
                              callback_timeout=timeout + 1.0)
    except Exception as exc:  # noqa: BLE001 - the client's loop itself did not answer
        return {}, {a: _why(exc, timeout) for a in addresses}
    good, bad = {}, {}
    for address, answer in answers.items():
        if isinstance(answer, BaseException):
            bad[address] = _why(answer, timeout)
        else:
            good[address] = answer
    return good, bad


def scheduler_records(client: Any, timeout: float) -> tuple[dict | None, str | None]:
    """The scheduler's records (:func:`.remote.scheduler_records`), or why there are none."""
    timeout = max(timeout, _MIN_WAIT)
    try:
        return client.run_on_scheduler(remote.scheduler_records, client_id=client.id,
                                       callback_timeout=timeout), None
    except Exception as exc:  # noqa: BLE001
        return None, "the scheduler " + _why(exc, timeout)


def worker_reports(client: Any, addresses: list[str], *, device: str, timeout: float
                   ) -> tuple[list[WorkerReport], dict[str, str]]:
    """Every worker's :func:`.remote.worker_report`, as :class:`WorkerReport` objects."""
    answers, missing = run_on_workers(client, remote.worker_report, addresses, timeout,
                                      device=device, time_limit=timeout * _SCAN_SHARE)
    reports = []
    for address in addresses:
        raw = answers.get(address)
        if raw is None:
            continue
        keys = {k: WorkerKey(k, dict(r["devices"]), int(r["sizeof"]), r["type"],
                             list(r["frameworks"]), list(r["shared"]))
                for k, r in raw["keys"].items()}
        reports.append(WorkerReport(
            address, raw.get("name"), raw.get("host"), raw.get("pid"), list(raw["devices"]),
            keys, dict(raw["storages"]), dict(raw["tracked"]), dict(raw["spilled"]),
            raw.get("visible_devices"), bool(raw["partial"]), list(raw["reasons"]),
            float(raw["seconds"])))
    return reports, missing


# -- who holds what -----------------------------------------------------------------------
def describe_wanters(record: dict | None, client_id: str, *, ours: str | None) -> list[str]:
    """Who keeps a key, in a user's words, from the scheduler's record of it; this
    notebook's client is called ``ours`` (left out when ``ours`` is None)."""
    if record is None:
        return ["unknown to the scheduler (being released?)"]
    out = []
    for cid in record["wants"]:
        if cid == client_id:
            if ours is not None:
                out.append(ours)
        elif cid.startswith("published-"):
            out.append(f"published dataset {cid[len('published-'):]!r}")
        elif cid == "fire-and-forget":
            out.append("fire_and_forget")
        else:
            out.append(f"another client {cid}")
    if record["waiters"]:
        first = ", ".join(f"{k} ({s})" for k, s in record["waiting"])
        more = record["waiters"] - len(record["waiting"])
        out.append(f"{record['waiters']} task(s) that need it: {first}"
                   + (f" and {more} more" if more > 0 else ""))
    if not out and (ours is not None or client_id not in record["wants"]):
        out.append("no one (being released)")
    return out


def bytes_on(report: WorkerReport, keys) -> dict[str, int]:
    """Bytes the given keys hold on one worker, each shared storage counted once."""
    per: dict[str, int] = {}
    repeats: Counter = Counter()
    for k in keys:
        wk = report.keys.get(k)
        if wk is None:
            continue
        for dev, n in wk.devices.items():
            per[dev] = per.get(dev, 0) + n
        repeats.update(wk.shared)
    for sid, count in repeats.items():
        if count > 1 and sid in report.storages:
            nbytes, dev = report.storages[sid]
            per[dev] = per.get(dev, 0) - (count - 1) * nbytes
    return per


def attribute(names: list[NameKeys], reports: list[WorkerReport], records: dict,
              missing: dict[str, str]) -> list[ClusterHolder]:
    """One :class:`ClusterHolder` per name, largest first."""
    owners: dict = {}
    for nk in names:
        for k in nk.keys:
            owners.setdefault(k, []).append(nk.name)
    spilled = {k for report in reports for k in report.spilled}
    located: dict = {}   # key -> the reports of the workers that store it
    for report in reports:
        for k in report.keys:
            located.setdefault(k, []).append(report)
    holders = []
    for nk in names:
        workers: dict[str, dict[str, int]] = {}
        shared_keys = [k for k in nk.keys if len(owners[k]) > 1]
        unique = shared = 0
        in_memory: set = set()
        largest, largest_bytes = None, -1
        on: dict[str, tuple[WorkerReport, list]] = {}
        for k in nk.keys:
            for report in located.get(k, ()):
                on.setdefault(report.address, (report, []))[1].append(k)
        for address, (report, held) in on.items():
            in_memory.update(held)
            per = bytes_on(report, held)
            workers[address] = {d: n for d, n in per.items() if n}
            only = [k for k in held if len(owners[k]) == 1]
            only_bytes = sum(bytes_on(report, only).values()) if only else 0
            unique += only_bytes
            shared += sum(per.values()) - only_bytes
            for k in held:
                n = report.keys[k].nbytes
                if n > largest_bytes:
                    largest, largest_bytes = k, n
        absent: Counter = Counter()
        for k in nk.keys:
            if k in in_memory:
                continue
            rec = records.get(k)
            if k in spilled:
                absent["spilled to disk"] += 1
            elif rec is None:
                absent["unknown"] += 1
            elif rec["state"] == "memory" and any(w in missing for w in rec["who_has"]):
                absent["on a worker that did not answer"] += 1
            else:
                absent[rec["state"]] += 1
        sharers = Counter(n for k in shared_keys for n in owners[k] if n != nk.name)
        holders.append(ClusterHolder(
            nk.name, nk.what, len(nk.keys), len(in_memory), workers, unique, shared,
            [n for n, _ in sharers.most_common()], dict(absent), nk.hidden, list(nk.aliases),
            nk.purge, key_text(largest) if largest is not None else None,
            nk.keys.get(largest) if largest is not None else None))
    holders.sort(key=lambda h: (-h.unique, -h.total, h.name))
    return holders


def held_by_names(names: list[NameKeys], reports: list[WorkerReport]) -> dict:
    """Worker -> device -> bytes that any name holds, each storage counted once."""
    claimed = {k for nk in names for k in nk.keys}
    out = {}
    for report in reports:
        per = bytes_on(report, [k for k in report.keys if k in claimed])
        per = {d: n for d, n in per.items() if n}
        if per:
            out[report.address] = per
    return out


def unclaimed(names: list[NameKeys], reports: list[WorkerReport], records: dict,
              client_id: str) -> list[UnclaimedKey]:
    """Keys in worker memory that no name of this notebook holds, with who does."""
    claimed = {k for nk in names for k in nk.keys}
    out = []
    for report in reports:
        for k, wk in report.keys.items():
            if k in claimed:
                continue
            rec = records.get(k)
            out.append(UnclaimedKey(
                k, report.address, dict(wk.devices), wk.sizeof,
                describe_wanters(rec, client_id, ours="this notebook's client "
                                 "(a Future no name reaches)"),
                rec["state"] if rec else None))
    out.sort(key=lambda u: (-u.nbytes, -u.sizeof, key_text(u.key)))
    return out


# -- one snapshot ----------------------------------------------------------------------------
def walk_messages(found: NameScan) -> list[str]:
    """What a walk of the names has to say (cut short, keys of another client)."""
    out = []
    if found.partial:
        out.append("partial walk of the names: " + ", ".join(found.reasons))
    if found.other_clients:
        out.append("names holding keys of another client, not counted: "
                   + ", ".join(sorted(found.other_clients)))
    return out


@dataclass
class HeldNames:
    """The names that hold keys of one client, from one walk of the namespace (names,
    keys and paths only: no reference to the objects)."""

    client_id: str
    names: list[NameKeys]
    messages: list[str] = field(default_factory=list)
    partial: bool = False


def held_names(client: Any, *, namespace: dict | None = None, shell: Any = None,
               time_limit: float = 1.0) -> HeldNames:
    """The names that hold keys of ``client``. Reads the namespace: call it on the
    kernel's main thread; :func:`build` given its result reads only the cluster."""
    found = scan_names(client_id=client.id, namespace=namespace, shell=shell,
                       time_limit=time_limit)
    try:
        return HeldNames(client.id, holders_of(found), walk_messages(found), found.partial)
    finally:
        found.release()


def build(client: Any, *, namespace: dict | None = None, shell: Any = None,
          device: str = "auto", time_limit: float = 3.0,
          names: HeldNames | None = None) -> ClusterSnapshot:
    """A :class:`ClusterSnapshot`; see :func:`jupyter_gpumem.cluster.snapshot`. Given
    ``names`` (from :func:`held_names`), the namespace is not read."""
    start = time.perf_counter()
    deadline = Deadline(time_limit)
    if names is None:
        names = held_names(client, namespace=namespace, shell=shell,
                           time_limit=time_limit * 0.3)
    elif names.client_id != client.id:
        raise ValueError("names were walked for another client")
    messages = list(names.messages)
    walk_partial = names.partial
    names = names.names
    snap = ClusterSnapshot(None, client.id, device, partial=walk_partial)
    records, error = scheduler_records(client, deadline.left())
    if records is None:
        snap.partial = True
        snap.messages = messages + [error or "the scheduler did not answer"]
        snap.holders = attribute(names, [], {}, {})
        snap.seconds = time.perf_counter() - start
        return snap
    snap.scheduler = records["address"]
    snap.records = records["tasks"]
    addresses = sorted(records["workers"])
    reports, missing = worker_reports(client, addresses, device=device,
                                      timeout=deadline.left())
    for report in reports:
        info = records["workers"].get(report.address, {})
        report.name = report.name or info.get("name")
        if report.partial:
            messages.append(f"worker {report.address}: partial scan: "
                            + ", ".join(report.reasons))
    snap.workers = reports
    snap.missing = missing
    snap.holders = attribute(names, reports, records["tasks"], missing)
    snap.unclaimed = unclaimed(names, reports, records["tasks"], client.id)
    snap.held = held_by_names(names, reports)
    if missing:
        snap.partial = True
        messages += [f"worker {w} {why}: its keys are not counted" for w, why in missing.items()]
    if not addresses:
        messages.append("the cluster has no worker")
    snap.partial = snap.partial or any(r.partial for r in reports)
    snap.messages = messages
    snap.seconds = time.perf_counter() - start
    return snap
