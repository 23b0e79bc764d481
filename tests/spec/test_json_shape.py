"""The JSON of the result objects has the keys docs/PROTOCOL.md lists, in its order.

The key lists are read from the protocol's ``jsonc`` examples (and, for a watch
record, from its key list there); the objects are made by
the real code paths on a real shell with CPU torch tensors, except the cluster's and the
framework counters' (a Dask cluster or a GPU is not needed to check their JSON), which
are made from their classes. Also: :class:`jupyter_gpumem.units.JsonFields`, the helper
every result's ``to_json`` is written with.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from conftest import run
from jupyter_gpumem.units import JsonFields, json_field

from protocol_keys import DOCUMENTED, PROTOCOL, UNLISTED, check  # noqa: E402


def test_the_protocol_lists_every_object_it_shows():
    assert sorted(DOCUMENTED) == ["ClusterHolder", "ClusterSnapshot", "DeviceUsage", "Holder",
                                  "Internal", "OrphanPurge", "ProcessReport", "PurgeResult",
                                  "ServerKernels", "Snapshot", "TensorRow"]
    snapshot, optional = DOCUMENTED["Snapshot"]
    assert snapshot[()][:3] == ["schema", "time", "device"]
    assert {k for _, k in optional} == {"unattributed_sites", "details", "processes", "cluster",
                                        "cell", "cell_running"}
    assert DOCUMENTED["DeviceUsage"][0][("frameworks", "[]")] == [
        "name", "allocated", "reserved", "peak", "pool", "note"]
    assert DOCUMENTED["TensorRow"][0][()] == ["path", "bytes", "device", "framework", "what",
                                              "shared_with", "allocated_at"]


# -- real objects --------------------------------------------------------------------------------
@pytest.fixture
def tensors(ip):
    pytest.importorskip("torch")
    run(ip, "import torch\nmodel = torch.nn.Linear(64, 64)\nx = torch.ones(10_000)\ny = x\n"
            "xs = [torch.ones(100), x[:10]]")
    run(ip, "x * 2")
    return ip


def test_snapshot_its_devices_holders_and_details(tensors):
    import jupyter_gpumem

    snap = jupyter_gpumem.snapshot(shell=tensors, device="cpu", names=["model", "xs"])
    data = snap.to_json()
    check("Snapshot", data)
    assert data["devices"] and data["holders"] and data["details"]
    for d in data["devices"]:
        check("DeviceUsage", d)
    for h in data["holders"]:
        check("Holder", h)
    for h in data["details"]:
        assert list(h)[-1] == "rows" and h["rows"]
        check("Holder", {k: v for k, v in h.items() if k != "rows"})
        for row in h["rows"]:
            check("TensorRow", row)
    plain = jupyter_gpumem.snapshot(shell=tensors, device="cpu").to_json()
    assert "details" not in plain and "unattributed_sites" not in plain
    check("Snapshot", plain)


def test_purge_result_dry_and_real(tensors):
    for code in ("%gpumem purge x --dry-run --device cpu -o", "%gpumem purge xs --device cpu -o"):
        data = run(tensors, code).result.to_json()
        check("PurgeResult", data)
        assert bool(data["changes"]) != data["dry_run"]       # a dry run measures nothing
        for path in (("changes", "[]"), ("still_held", "[]")):
            for item in data[path[0]]:
                check("PurgeResult", item, path)
    # xs[1] is a view of x: a name not purged still holds part of it
    assert data["still_held"] and data["removed"] == ["xs"]


def test_device_readings_of_the_sidebar(tensors):
    from jupyter_gpumem.backends import FrameworkUsage
    from jupyter_gpumem.core.devices import read_devices_now

    (cpu,) = read_devices_now("cpu")
    cpu.frameworks = [FrameworkUsage("torch", 1, 2, 3, None, None, 4, 5)]
    data = cpu.to_json()
    check("DeviceUsage", data)
    check("DeviceUsage", data["frameworks"][0], ("frameworks", "[]"))
    check("DeviceUsage", data["fragmentation"], ("fragmentation",))


def test_internal():
    from jupyter_gpumem.backends import Internal

    check("Internal", Internal("cuBLAS workspaces", "cuda:0", 1 << 20, "torch", 2, True).to_json())


def _watch_keys() -> set[str]:
    """The keys the protocol's watch record lists (``allocated_before/after/delta`` is
    three of them)."""
    text = PROTOCOL.read_text().split("JSON of one record", 1)[1].split("\n#", 1)[0]
    out = set()
    for token in re.findall(r"`([a-z_/]+)`", text):
        first, *others = token.split("/")
        stem = first.rsplit("_", 1)[0] + "_" if others and "_" in first else ""
        out |= {first} | {stem + o for o in others}
    return out


def test_watch_record_lists_only_documented_keys(tensors):
    run(tensors, "%%gpuwatch -o w --device cpu\nt = torch.ones(100_000)\ndel y")
    data = tensors.user_ns["w"].to_json()
    documented = _watch_keys() | {"schema"} | UNLISTED.get("watch", set())
    assert data["schema"] == "jupyter_gpumem.watch/1"
    for part in [data] + data["devices"] + data["changes"]:
        assert [k for k in part if k not in documented] == []
    assert {"t", "y"} <= {c["name"] for c in data["changes"]}


def test_cluster_objects():
    from jupyter_gpumem.cluster.result import (ClusterHolder, ClusterPurgeResult,
                                               ClusterSnapshot, UnclaimedKey, WorkerKey,
                                               WorkerReport)
    from jupyter_gpumem.core.devices import read_devices_now

    w = "tcp://127.0.0.1:40125"
    key = WorkerKey(("x", 0), {"cpu": 8}, 8, "Tensor", ["torch"], [1])
    report = WorkerReport(w, "0", "vm", 42, read_devices_now("cpu"), {("x", 0): key},
                          {1: (8, "cpu")}, {"cpu": 8}, {("y", 1): 4})
    holder = ClusterHolder("x", "Future", 1, 1, {w: {"cpu": 8}}, unique=8, purge="x",
                           largest_key="('x', 0)", largest_path="x")
    lost = UnclaimedKey(("z", 2), w, {"cpu": 4}, 4, ["another client Client-2"], "memory")
    snap = ClusterSnapshot("tcp://127.0.0.1:8786", "Client-1", "cpu", workers=[report],
                           holders=[holder], unclaimed=[lost], held={w: {"cpu": 8}},
                           records={("x", 0): {}})
    data = snap.to_json()
    check("ClusterSnapshot", data)
    check("ClusterSnapshot", data["workers"][0], ("workers", "[]"))
    check("ClusterSnapshot", data["unclaimed"][0], ("unclaimed", "[]"))
    check("ClusterHolder", data["holders"][0])
    for d in data["workers"][0]["devices"]:
        check("DeviceUsage", d)
    assert data["workers"][0]["keys"] == 1 and data["workers"][0]["spilled"] == {"('y', 1)": 4}
    purge = ClusterPurgeResult(["x"], ["x"], 1, {w: {"cpu": 8}}).to_json()
    assert list(purge)[:2] == ["schema", "dry_run"] and purge["freed"] == {}


# -- the helper ----------------------------------------------------------------------------------
@dataclass
class _Part(JsonFields):
    name: str
    nbytes: int = json_field(key="bytes")
    sizes: list[int] = field(default_factory=list)


@dataclass
class _Whole(JsonFields):
    schema = "demo/1"
    JSON_AFTER = {"schema": None, "label": "schema", "count": "label",
                  "twice": ("count", "_twice"), "words": "parts"}

    parts: list[_Part]
    label: str
    secret: str = json_field("s", leave_out=True)
    seconds: float = json_field(0.0, convert=lambda s: round(s, 1))
    notes: dict[str, int] = json_field(default_factory=dict, if_any=True)

    @property
    def count(self) -> int:
        return len(self.parts)

    def _twice(self) -> int:
        return 2 * self.count

    def words(self) -> str:
        return f"{self.count} parts"


@dataclass
class _Child(_Whole):
    JSON_AFTER = {"extra": None}

    extra: int = 7


def test_json_fields_writes_fields_renamed_converted_moved_and_derived():
    parts = [_Part("a", 1, [1, 2]), _Part("b", 2)]
    whole = _Whole(parts, "w", seconds=1.26)
    data = whole.to_json()
    assert data == {"schema": "demo/1", "label": "w", "count": 2, "twice": 4,
                    "parts": [{"name": "a", "bytes": 1, "sizes": [1, 2]},
                              {"name": "b", "bytes": 2, "sizes": []}],
                    "words": "2 parts", "seconds": 1.3}
    assert list(data) == ["schema", "label", "count", "twice", "parts", "words", "seconds"]
    assert data["parts"][0]["sizes"] is not parts[0].sizes          # a copy
    whole.notes = {"cpu": 1}
    assert list(whole.to_json())[-1] == "notes"
    child = _Child(parts, "c").to_json()
    assert list(child)[:3] == ["extra", "schema", "label"] and child["extra"] == 7


def test_json_fields_names_a_bad_anchor():
    @dataclass
    class Bad(JsonFields):
        JSON_AFTER = {"x": "nowhere"}
        a: int = 1

    with pytest.raises(TypeError, match="'x' follows 'nowhere'"):
        Bad().to_json()
