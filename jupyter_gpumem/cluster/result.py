"""Result objects of the cluster view: a snapshot of the workers and the names that
hold their keys, and a purge's before / after. Like the notebook's own results they
hold no reference to user objects (names, keys as text, bytes) and render as text,
HTML and JSON."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from ..core.render import fmt_bytes
from .render import key_text, purge_html, purge_text, snapshot_html, snapshot_text
from ..core.purge import Change
from ..units import Report

CLUSTER_SCHEMA = "jupyter_gpumem.cluster/1"
CLUSTER_PURGE_SCHEMA = "jupyter_gpumem.cluster_purge/1"


@dataclass
class WorkerKey:
    """One key a worker stores, and its bytes there."""

    key: Any
    devices: dict[str, int]
    sizeof: int
    type: str
    frameworks: list[str] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)   # ids of storages other keys share

    @property
    def nbytes(self) -> int:
        return sum(self.devices.values())

    def to_json(self) -> dict:
        return {"key": key_text(self.key), "devices": dict(self.devices), "bytes": self.nbytes,
                "sizeof": self.sizeof, "type": self.type, "frameworks": list(self.frameworks)}


@dataclass
class WorkerReport:
    """One worker: where it runs, its devices and the keys it stores."""

    address: str
    name: str | None = None
    host: str | None = None
    pid: int | None = None
    devices: list = field(default_factory=list)         # jupyter_gpumem.devices.DeviceUsage
    keys: dict = field(default_factory=dict)            # dask key -> WorkerKey
    storages: dict = field(default_factory=dict)        # storage id -> (bytes, device)
    tracked: dict[str, int] = field(default_factory=dict)
    spilled: dict = field(default_factory=dict)         # dask key -> bytes on disk
    visible_devices: str | None = None
    partial: bool = False
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def device(self, device_id: str):
        """This worker's figures for one device id (``cuda:0``, ``cpu``), or None."""
        return next((d for d in self.devices if d.id == device_id), None)

    def to_json(self) -> dict:
        return {"address": self.address, "name": self.name, "host": self.host, "pid": self.pid,
                "devices": [d.to_json() for d in self.devices],
                "keys": len(self.keys), "tracked": dict(self.tracked),
                "spilled": {key_text(k): v for k, v in self.spilled.items()},
                "visible_devices": self.visible_devices, "partial": self.partial,
                "reasons": list(self.reasons), "seconds": round(self.seconds, 6)}


@dataclass
class ClusterHolder:
    """A notebook name that keeps cluster keys alive, and their bytes per worker."""

    name: str
    what: str
    keys: int
    in_memory: int
    workers: dict[str, dict[str, int]]                  # worker -> device -> bytes
    unique: int = 0
    shared: int = 0
    shared_with: list[str] = field(default_factory=list)
    not_in_memory: dict[str, int] = field(default_factory=dict)   # state -> how many keys
    hidden: bool = False
    aliases: list[str] = field(default_factory=list)
    purge: str | None = None
    largest_key: str | None = None
    largest_path: str | None = None

    @property
    def total(self) -> int:
        return self.unique + self.shared

    @property
    def devices(self) -> dict[str, int]:
        """Device id -> bytes, over every worker."""
        out: dict[str, int] = {}
        for per in self.workers.values():
            for dev, n in per.items():
                out[dev] = out.get(dev, 0) + n
        return out

    def where(self) -> str:
        """``worker tcp://10.0.0.5:40123 cuda:1`` or ``4 workers``."""
        held = [w for w, per in self.workers.items() if any(per.values())]
        if len(held) == 1:
            devs = ",".join(sorted(d for d, n in self.workers[held[0]].items() if n))
            return f"worker {held[0]} {devs}".rstrip()
        if not held:
            return "no worker"
        return f"{len(held)} workers"

    def summary(self) -> str:
        """``x (Future) 1.0 GiB on worker tcp://...:40123 cuda:1``."""
        return f"{self.name} ({self.what}) {fmt_bytes(self.total)} on {self.where()}"

    def to_json(self) -> dict:
        return {"name": self.name, "what": self.what, "keys": self.keys,
                "in_memory": self.in_memory,
                "workers": {w: dict(per) for w, per in self.workers.items()},
                "devices": self.devices, "unique": self.unique, "shared": self.shared,
                "total": self.total, "shared_with": list(self.shared_with),
                "not_in_memory": dict(self.not_in_memory), "hidden": self.hidden,
                "aliases": list(self.aliases), "purge": self.purge,
                "largest_key": self.largest_key, "largest_path": self.largest_path,
                "summary": self.summary()}


@dataclass
class UnclaimedKey:
    """A key in worker memory that no name of this notebook keeps, and who does."""

    key: Any
    worker: str
    devices: dict[str, int]
    sizeof: int
    held_by: list[str]
    state: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(self.devices.values())

    def to_json(self) -> dict:
        return {"key": key_text(self.key), "worker": self.worker, "devices": dict(self.devices),
                "bytes": self.nbytes, "sizeof": self.sizeof, "held_by": list(self.held_by),
                "state": self.state}


@dataclass(repr=False)   # the repr is the text report (Report)
class ClusterSnapshot(Report):
    """A Dask cluster's workers, the notebook names holding their keys, and the keys
    no name holds; partial when the scheduler or a worker did not answer in time."""

    scheduler: str | None
    client_id: str
    device: str
    workers: list[WorkerReport] = field(default_factory=list)
    holders: list[ClusterHolder] = field(default_factory=list)
    unclaimed: list[UnclaimedKey] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)   # worker -> why it gave no answer
    held: dict[str, dict[str, int]] = field(default_factory=dict)   # by all names, distinct
    partial: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0
    time: float = field(default_factory=time.time)
    records: dict = field(default_factory=dict, repr=False)  # the scheduler's, by key

    @property
    def held_bytes(self) -> int:
        """Bytes the notebook's names hold on the cluster, each storage counted once."""
        return sum(n for per in self.held.values() for n in per.values())

    def holder(self, name: str) -> ClusterHolder | None:
        """The holder called ``name`` (or with that alias), if any."""
        return next((h for h in self.holders if h.name == name or name in h.aliases), None)

    def worker(self, address: str) -> WorkerReport | None:
        return next((w for w in self.workers if w.address == address), None)

    def to_json(self) -> dict:
        """The cluster snapshot schema (JSON-able)."""
        return {"schema": CLUSTER_SCHEMA, "time": self.time, "scheduler": self.scheduler,
                "client": self.client_id, "device": self.device, "partial": self.partial,
                "messages": list(self.messages), "seconds": round(self.seconds, 6),
                "workers": [w.to_json() for w in self.workers],
                "missing": dict(self.missing),
                "held": {w: dict(per) for w, per in self.held.items()},
                "held_bytes": self.held_bytes,
                "holders": [h.to_json() for h in self.holders],
                "unclaimed": [u.to_json() for u in self.unclaimed]}

    _text = snapshot_text
    _html = snapshot_html


@dataclass
class WorkerChange(Change):
    """One device of one worker before and after a purge (bytes)."""

    worker: str = ""
    tracked_before: int | None = None
    tracked_after: int | None = None

    def to_json(self) -> dict:
        return {"worker": self.worker, "device": self.device, "measure": self.measure,
                "before": self.before, "after": self.after, "freed": self.freed,
                "tracked_before": self.tracked_before, "tracked_after": self.tracked_after}


@dataclass
class KeyStillHeld:
    """Memory a purge meant to free that something else still keeps on the cluster."""

    by: str
    key: str
    nbytes: int
    worker: str | None = None

    def to_json(self) -> dict:
        return {"by": self.by, "key": self.key, "bytes": self.nbytes, "worker": self.worker}


@dataclass(repr=False)   # the repr is the text report (Report)
class ClusterPurgeResult(Report):
    """What a cluster purge released and what it freed, per worker and device."""

    names: list[str]
    removed: list[str]
    keys: int
    predicted: dict[str, dict[str, int]]        # worker -> device -> bytes
    changes: list[WorkerChange] = field(default_factory=list)
    still_held: list[KeyStillHeld] = field(default_factory=list)
    dropped: bool = True
    waited: float = 0.0
    missing: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def freed(self) -> dict[str, dict[str, int | None]]:
        """Worker -> device -> bytes freed."""
        out: dict[str, dict[str, int | None]] = {}
        for c in self.changes:
            out.setdefault(c.worker, {})[c.device] = c.freed
        return out

    def change(self, worker: str, device: str) -> WorkerChange | None:
        return next((c for c in self.changes if c.worker == worker and c.device == device), None)

    def to_json(self) -> dict:
        return {"schema": CLUSTER_PURGE_SCHEMA, "dry_run": self.dry_run,
                "names": list(self.names), "removed": list(self.removed), "keys": self.keys,
                "predicted": {w: dict(p) for w, p in self.predicted.items()},
                "freed": self.freed, "changes": [c.to_json() for c in self.changes],
                "still_held": [s.to_json() for s in self.still_held],
                "dropped": self.dropped, "waited": round(self.waited, 6),
                "missing": dict(self.missing), "messages": list(self.messages),
                "seconds": round(self.seconds, 6)}

    _text = purge_text
    _html = purge_html
