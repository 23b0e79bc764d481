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
from ..units import JsonFields, Report, json_field, round6

CLUSTER_SCHEMA = "jupyter_gpumem.cluster/1"
CLUSTER_PURGE_SCHEMA = "jupyter_gpumem.cluster_purge/1"


def _keys_as_text(by_key: dict) -> dict:
    return {key_text(k): v for k, v in by_key.items()}


@dataclass
class WorkerKey(JsonFields):
    """One key a worker stores, and its bytes there."""

    JSON_AFTER = {"bytes": ("devices", "nbytes")}

    key: Any = json_field(convert=key_text)
    devices: dict[str, int]
    sizeof: int
    type: str
    frameworks: list[str] = field(default_factory=list)
    #: ids of the storages other keys share (not in its JSON)
    shared: list[int] = json_field(default_factory=list, leave_out=True)

    @property
    def nbytes(self) -> int:
        return sum(self.devices.values())


@dataclass
class WorkerReport(JsonFields):
    """One worker: where it runs, its devices and the keys it stores."""

    address: str
    name: str | None = None
    host: str | None = None
    pid: int | None = None
    devices: list = field(default_factory=list)         # jupyter_gpumem.devices.DeviceUsage
    keys: dict = json_field(default_factory=dict, convert=len)   # dask key -> WorkerKey
    #: storage id -> (bytes, device)
    storages: dict = json_field(default_factory=dict, leave_out=True)
    tracked: dict[str, int] = field(default_factory=dict)
    #: dask key -> bytes on disk
    spilled: dict = json_field(default_factory=dict, convert=_keys_as_text)
    visible_devices: str | None = None
    partial: bool = False
    reasons: list[str] = field(default_factory=list)
    seconds: float = json_field(0.0, convert=round6)

    def device(self, device_id: str):
        """This worker's figures for one device id (``cuda:0``, ``cpu``), or None."""
        return next((d for d in self.devices if d.id == device_id), None)


@dataclass
class ClusterHolder(JsonFields):
    """A notebook name that keeps cluster keys alive, and their bytes per worker."""

    JSON_AFTER = {"devices": "workers", "total": "shared", "summary": "largest_path"}

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


@dataclass
class UnclaimedKey(JsonFields):
    """A key in worker memory that no name of this notebook keeps, and who does."""

    JSON_AFTER = {"bytes": ("devices", "nbytes")}

    key: Any = json_field(convert=key_text)
    worker: str
    devices: dict[str, int]
    sizeof: int
    held_by: list[str]
    state: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(self.devices.values())


@dataclass(repr=False)   # the repr is the text report (Report)
class ClusterSnapshot(JsonFields, Report):
    """A Dask cluster's workers, the notebook names holding their keys, and the keys
    no name holds; partial when the scheduler or a worker did not answer in time. Its
    JSON: the cluster snapshot schema (docs/PROTOCOL.md), its fields in their order."""

    schema = CLUSTER_SCHEMA
    JSON_AFTER = {"schema": None, "time": "schema", "held_bytes": "held"}

    scheduler: str | None
    client_id: str = json_field(key="client")
    device: str
    partial: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = json_field(0.0, convert=round6)
    workers: list[WorkerReport] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)   # worker -> why it gave no answer
    held: dict[str, dict[str, int]] = field(default_factory=dict)   # by all names, distinct
    holders: list[ClusterHolder] = field(default_factory=list)
    unclaimed: list[UnclaimedKey] = field(default_factory=list)
    time: float = field(default_factory=time.time)
    #: the scheduler's records, by key (not in the JSON)
    records: dict = json_field(default_factory=dict, repr=False, leave_out=True)

    @property
    def held_bytes(self) -> int:
        """Bytes the notebook's names hold on the cluster, each storage counted once."""
        return sum(n for per in self.held.values() for n in per.values())

    def holder(self, name: str) -> ClusterHolder | None:
        """The holder called ``name`` (or with that alias), if any."""
        return next((h for h in self.holders if h.name == name or name in h.aliases), None)

    def worker(self, address: str) -> WorkerReport | None:
        return next((w for w in self.workers if w.address == address), None)

    _text = snapshot_text
    _html = snapshot_html


@dataclass
class WorkerChange(Change):
    """One device of one worker before and after a purge (bytes)."""

    JSON_AFTER = {"worker": None}

    worker: str = ""
    tracked_before: int | None = None
    tracked_after: int | None = None


@dataclass
class KeyStillHeld(JsonFields):
    """Memory a purge meant to free that something else still keeps on the cluster."""

    by: str
    key: str
    nbytes: int = json_field(key="bytes")
    worker: str | None = None


@dataclass(repr=False)   # the repr is the text report (Report)
class ClusterPurgeResult(JsonFields, Report):
    """What a cluster purge released and what it freed, per worker and device."""

    schema = CLUSTER_PURGE_SCHEMA
    JSON_AFTER = {"schema": None, "dry_run": "schema", "freed": "predicted"}

    names: list[str]
    removed: list[str]
    keys: int
    predicted: dict[str, dict[str, int]]        # worker -> device -> bytes
    changes: list[WorkerChange] = field(default_factory=list)
    still_held: list[KeyStillHeld] = field(default_factory=list)
    dropped: bool = True
    waited: float = json_field(0.0, convert=round6)
    missing: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    messages: list[str] = field(default_factory=list)
    seconds: float = json_field(0.0, convert=round6)

    @property
    def freed(self) -> dict[str, dict[str, int | None]]:
        """Worker -> device -> bytes freed."""
        out: dict[str, dict[str, int | None]] = {}
        for c in self.changes:
            out.setdefault(c.worker, {})[c.device] = c.freed
        return out

    def change(self, worker: str, device: str) -> WorkerChange | None:
        return next((c for c in self.changes if c.worker == worker and c.device == device), None)

    _text = purge_text
    _html = purge_html
