"""What the product runs on a Dask worker or scheduler (through ``Client.run`` and
``Client.run_on_scheduler``): these module-level functions only, each reading the
worker's or scheduler's own records and returning plain data.

On a worker, the values it stores are scanned with the product's own scan and
backends (torch, CuPy, JAX, ...), counted by storage as in the notebook; a value
of another library that implements ``__cuda_array_interface__`` or DLPack is read
through that protocol; anything else counts by Dask's own ``sizeof`` estimate,
which the worker recorded when it stored the value.
"""
from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
from math import prod
from typing import Any

from ..backends import Backend, StorageInfo, active_backends
from ..backends.base import DLPACK_DEVICES
from ..core import devices as _devices
from ..core import scan as _scan
from ..core.scan import Root
from ..core.snapshot import Sharing
from ..core import purge as _purge

#: host arrays: counted by Dask's sizeof, not through their DLPack export
_HOST_LIBRARIES = frozenset({"numpy", "pandas", "pyarrow", "scipy"})
_MAX_PROTOCOL_TYPES = 64


# -- values held in memory ---------------------------------------------------------
def _type_has(tp: type, name: str) -> bool:
    """Whether a class defines ``name`` somewhere in its MRO (read from the classes'
    own dictionaries: no descriptor runs)."""
    try:
        return any(name in type.__dict__["__dict__"].__get__(k) for k in tp.__mro__)
    except Exception:
        return False


def _top_module(tp: type) -> str:
    try:
        return str(type.__dict__["__dict__"].__get__(tp).get("__module__", "")).partition(".")[0]
    except Exception:
        return ""


def _dlpack_device(obj: Any) -> str | None:
    try:
        kind, index = obj.__dlpack_device__()
    except Exception:
        return None
    base = DLPACK_DEVICES.get(int(kind))
    if base is None:
        return None
    return "cpu" if base == "cpu" else f"{base}:{int(index)}"


def _pointer_device(ptr: int) -> str:
    """The CUDA device of a pointer, where an active backend can ask the driver (CuPy's,
    once imported); else ``cuda:0`` when the worker sees one device (one worker per
    GPU), else ``cuda``."""
    for backend in active_backends():
        try:
            dev = backend.pointer_device(ptr)
        except Exception:
            dev = None
        if dev:
            return dev
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if visible and "," not in visible:
        return "cuda:0"
    return "cuda"


class ProtocolBackend(Backend):
    """Objects of libraries the product has no backend for, read through the array
    protocols they implement: ``__cuda_array_interface__`` (pointer, shape, strides)
    and, failing that, DLPack's ``__dlpack_device__`` with Dask's ``sizeof`` bytes."""

    name = "array protocol"

    def __init__(self, cai_types: tuple, dlpack_types: tuple, sizeof: Any = None) -> None:
        self._cai = cai_types
        self._types = cai_types + dlpack_types
        self._sizeof = sizeof

    def is_active(self) -> bool:
        return bool(self._types)

    def tensor_types(self) -> tuple:
        return self._types

    def storages(self, obj: Any) -> list[StorageInfo]:
        framework = _top_module(type(obj)) or type(obj).__name__
        if type(obj) in self._cai:
            return self._cai_storages(obj, framework)
        dev = _dlpack_device(obj)
        nbytes = self._sizeof(obj) if self._sizeof is not None and dev else 0
        if not nbytes:
            return []
        return [StorageInfo((dev, framework, id(obj)), int(nbytes), dev, framework)]

    def _cai_storages(self, obj: Any, framework: str) -> list[StorageInfo]:
        try:
            cai = obj.__cuda_array_interface__
            ptr = int(cai["data"][0])
            shape = tuple(int(n) for n in cai["shape"])
            itemsize = int(str(cai["typestr"])[2:])
            strides = cai.get("strides")
        except Exception:
            return []
        if not ptr or any(n == 0 for n in shape):
            return []
        if strides is None:
            nbytes = prod(shape) * itemsize
        else:
            nbytes = sum((n - 1) * abs(int(s)) for n, s in zip(shape, strides)) + itemsize
        dev = _dlpack_device(obj) or _pointer_device(ptr)
        return [StorageInfo((dev, ptr), nbytes, dev, framework)]


def protocol_backend(values: list, backends: list[Backend], sizeof: Any = None) -> ProtocolBackend:
    """A :class:`ProtocolBackend` for the types among ``values`` (and one level inside
    lists, tuples and dicts) that no active backend knows and that implement an array
    protocol."""
    known: tuple = ()
    for b in backends:
        try:
            known += tuple(b.tensor_types())
        except Exception:
            continue
    seen: set = set()
    cai: list = []
    dlpack: list = []

    def look(value: Any) -> None:
        tp = type(value)
        # by id: a class is never hashed (a metaclass may define __hash__ or __eq__)
        if id(tp) in seen or len(seen) > 10 * _MAX_PROTOCOL_TYPES:
            return
        seen.add(id(tp))
        if (known and issubclass(tp, known)) or _top_module(tp) in _HOST_LIBRARIES:
            return
        if len(cai) + len(dlpack) >= _MAX_PROTOCOL_TYPES:
            return
        if _type_has(tp, "__cuda_array_interface__"):
            cai.append(tp)
        elif _type_has(tp, "__dlpack_device__"):
            dlpack.append(tp)

    for value in values:
        look(value)
        tp = type(value)
        if tp is list or tp is tuple:
            for item in value[:64]:
                look(item)
        elif tp is dict:
            for item in list(dict.values(value))[:64]:
                look(item)
    return ProtocolBackend(tuple(cai), tuple(dlpack), sizeof)


def report_values(values: dict, sizeof: dict, *, device: str = "auto",
                  time_limit: float = 1.0) -> dict:
    """Bytes per device of each stored value (key -> value), counted by storage.

    ``sizeof``: key -> Dask's estimate of the value's size, used (on ``cpu``, when
    it is selected) for a value in which no framework's memory is found.
    Returns ``{"keys": {key: record}, "storages": {sid: (bytes, device)},
    "tracked": {device: bytes}, "partial", "reasons", "seconds"}``, where a record is
    ``{"devices": {device: bytes}, "frameworks": [...], "type", "sizeof",
    "shared": [sid, ...]}`` and ``sid`` numbers a storage that several keys share.
    """
    start = time.perf_counter()
    ids = set(_devices.selected_ids(device))
    backends = active_backends()
    dask_sizeof = sys.modules.get("dask.sizeof")
    extra = protocol_backend(list(values.values()), backends,
                             getattr(dask_sizeof, "sizeof", None))
    if extra.is_active():
        backends = backends + [extra]
    keys = list(values)
    roots = [Root(str(k), values[k]) for k in keys]
    # every device is walked, so that a value on devices not selected is not taken for
    # one that holds no framework's memory (and counted by sizeof); figures keep ``ids``
    result = _scan.scan(roots, devices=None, time_limit=time_limit, backends=backends)
    roots.clear()
    result.roots = []
    sharing = Sharing(result)
    sids: dict = {}
    storages: dict[int, tuple[int, str]] = {}
    records: dict = {}
    tracked: dict[str, int] = {}
    for i, key in enumerate(keys):
        reach = result.reach[i]
        rec = {"devices": {}, "frameworks": [], "type": type(values[key]).__name__,
               "sizeof": int(sizeof.get(key) or 0), "shared": []}
        if reach.storages:
            infos, _, _, places = sharing.stats(i)
            for info in infos:
                if info.device in ids:
                    rec["devices"][info.device] = rec["devices"].get(info.device, 0) + info.nbytes
            rec["frameworks"] = sorted({fw for dev, fw in places if dev in ids})
            for skey in sharing.shared_keys.get(i, ()):
                info = reach.storages[skey][0]
                if info.device not in ids:
                    continue
                sid = sids.get(skey)
                if sid is None:
                    sid = sids[skey] = len(sids)
                    storages[sid] = (info.nbytes, info.device)
                rec["shared"].append(sid)
        elif rec["sizeof"] and "cpu" in ids:
            rec["devices"]["cpu"] = rec["sizeof"]
            rec["frameworks"] = ["sizeof"]
            tracked["cpu"] = tracked.get("cpu", 0) + rec["sizeof"]
        records[key] = rec
    for dev, per in sharing.reached.items():
        if dev in ids:
            tracked[dev] = tracked.get(dev, 0) + sum(per.values())
    return {"keys": records, "storages": storages, "tracked": tracked,
            "partial": result.partial, "reasons": list(result.reasons),
            "errors": result.errors, "seconds": time.perf_counter() - start}


def _stored(dask_worker: Any) -> tuple[dict, list, str | None]:
    """(key -> value held in memory, keys spilled to disk, a note where the data store is
    of a kind not known here), without unspilling or touching the buffer's LRU order.

    Known stores: a dict, Dask's SpillBuffer (its ``fast`` LRU over a dict, ``slow`` on
    disk), and dask-cuda's DeviceHostFile (device objects in its ``device`` dict, host
    ones in ``host``)."""
    data = dask_worker.data
    if type(data) is dict:
        return dict(data), [], None
    memory: dict = {}
    known = False
    device = getattr(data, "device", None)
    if type(device) is dict:
        memory.update(device)
        known = True
    fast = getattr(data, "fast", None)
    inner = getattr(fast, "d", None)
    if type(inner) is dict:
        memory.update(inner)
        known = True
    elif type(fast) is dict:
        memory.update(fast)
        known = True
    if not known:
        return {}, [], (f"its data store ({type(data).__name__}) is not read: "
                        f"its keys count by Dask's sizeof only")
    slow = getattr(data, "slow", None)
    if slow is None:
        slow = getattr(data, "disk", None)
    try:
        spilled = [k for k in list(slow) if k not in memory] if slow is not None else []
    except Exception:
        spilled = []
    return memory, spilled, None


def worker_report(dask_worker: Any = None, device: str = "auto",
                  time_limit: float = 1.0) -> dict:
    """One worker: where it is, its devices (NVML of this process, the frameworks'
    counters, host memory of this process) and the keys it stores with their bytes."""
    start = time.perf_counter()
    memory, spilled, note = _stored(dask_worker)
    tasks = dask_worker.state.tasks
    sizes = {}
    for key in list(memory) + spilled:
        ts = tasks.get(key)
        sizes[key] = getattr(ts, "nbytes", None) or 0
    out = report_values(memory, sizes, device=device, time_limit=time_limit)
    memory.clear()
    if note is not None:   # keys and sizes from the worker's own records, values unread
        for key, ts in list(tasks.items()):
            if getattr(ts, "state", None) == "memory":
                out["keys"][key] = {"devices": {}, "frameworks": [], "type": "?",
                                    "sizeof": getattr(ts, "nbytes", None) or 0, "shared": []}
        out["reasons"].append(note)
        out["partial"] = True
    devices = _devices.read_devices_now(device)
    for du in devices:
        du.attributed = out["tracked"].get(du.id, 0)
    out.update(
        address=dask_worker.address, name=str(dask_worker.name), host=socket.gethostname(),
        ip=getattr(dask_worker, "ip", None), pid=os.getpid(), devices=devices,
        spilled={k: sizes.get(k, 0) for k in spilled},
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        seconds=time.perf_counter() - start)
    return out


def worker_keys_present(keys: list, dask_worker: Any = None) -> list:
    """Which of ``keys`` this worker still stores (in memory or spilled)."""
    data = dask_worker.data
    return [k for k in keys if k in data]


def trim_host_memory() -> bool:
    """Give freed heap pages back to the system (glibc's ``malloc_trim``), as Dask's
    documentation advises for worker memory; False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def worker_release(dask_worker: Any = None) -> dict:
    """Collect garbage and release every framework's cached memory on this worker
    (the product's own release), then trim the host heap."""
    notes = _purge.release_caches()   # collects garbage first
    trim_host_memory()
    return {"notes": notes}


# -- the scheduler's records --------------------------------------------------------
def scheduler_records(dask_scheduler: Any = None, client_id: str | None = None,
                      max_waiters: int = 3) -> dict:
    """The scheduler's view: its workers, and for every key in memory (and every key
    ``client_id`` wants) its state, who wants it (client ids; ``published-NAME`` for a
    published dataset), which workers hold it and which tasks wait on it."""
    workers = {}
    for addr, ws in dask_scheduler.workers.items():
        workers[addr] = {"name": str(ws.name), "host": ws.host, "nanny": ws.nanny,
                         "pid": getattr(ws, "pid", None)}
    tasks = {}
    for key, ts in dask_scheduler.tasks.items():
        wants = tuple(cs.client_key for cs in ts.who_wants or ())
        if ts.state != "memory" and client_id not in wants:
            continue
        waiters = ts.waiters or ()
        tasks[key] = {
            "state": ts.state, "wants": wants,
            "who_has": tuple(ws.address for ws in (ts.who_has or ())),
            "nbytes": ts.nbytes if ts.nbytes is not None and ts.nbytes >= 0 else None,
            "waiters": len(waiters),
            "waiting": [(str(w.key), w.state) for w in list(waiters)[:max_waiters]],
        }
    publish = dask_scheduler.extensions.get("publish")
    datasets = {}
    if publish is not None:
        for name, entry in dict(getattr(publish, "datasets", {})).items():
            datasets[str(name)] = list(entry.get("keys", ())) if isinstance(entry, dict) else []
    return {"address": dask_scheduler.address, "workers": workers, "tasks": tasks,
            "datasets": datasets, "clients": [str(c) for c in dask_scheduler.clients]}
