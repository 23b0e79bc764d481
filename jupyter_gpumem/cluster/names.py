"""The notebook's names that keep cluster keys alive: ``distributed.Future`` objects and
persisted Dask collections, wherever a name reaches them (a list of futures, a dict
holding a persisted array, ``Out[12]``, a closure).

The walk is the product's own scan (:mod:`jupyter_gpumem.core.scan`), given one backend
that takes a Future, or a collection of Dask's own types, as the thing it counts:
its storage key is the Dask key. Futures and collections are recognised by their
exact type (or, for collections, by being a class of Dask's own modules) and read
through Dask's public API only; the walk itself reads user objects through C-level
slots, as in the notebook.
"""
from __future__ import annotations

import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..core import scan as _scan
from ..core.scan import Root
from ..backends import Backend, StorageInfo
from ..core.snapshot import type_name

FUTURE = "Future"


def dask_types() -> tuple[type | None, tuple, type | None, type | None, type | None]:
    """(Future, collection base classes, HighLevelGraph, MaterializedLayer, DataNode) of
    the Dask already imported (``None`` / ``()`` for what is not)."""
    client_mod = sys.modules.get("distributed.client")
    future = getattr(client_mod, "Future", None)
    bases: tuple = ()
    base_mod = sys.modules.get("dask.base")
    mixin = getattr(base_mod, "DaskMethodsMixin", None)
    if isinstance(mixin, type):
        bases += (mixin,)
    hlg_mod = sys.modules.get("dask.highlevelgraph")
    spec = sys.modules.get("dask._task_spec")
    return (future if isinstance(future, type) else None, bases,
            getattr(hlg_mod, "HighLevelGraph", None), getattr(hlg_mod, "MaterializedLayer", None),
            getattr(spec, "DataNode", None))


def machinery_types() -> tuple:
    """Client, Cluster and Server (scheduler, worker, nanny) of the Dask imported."""
    out = []
    for module, name in (("distributed.client", "Client"), ("distributed.core", "Server"),
                         ("distributed.deploy.cluster", "Cluster")):
        tp = getattr(sys.modules.get(module), name, None)
        if isinstance(tp, type):
            out.append(tp)
    return tuple(out)


def _class_dict(tp: type) -> dict:
    return type.__dict__["__dict__"].__get__(tp)


def dask_collection_label(tp: type) -> str | None:
    """``dask.array``, ``dask.bag``, ``dask.dataframe``, ``dask.delayed`` for a class that
    is one of Dask's own (defined in a ``dask.`` module under its own name); else None."""
    try:
        module = _class_dict(tp).get("__module__")
        qualname = type.__dict__["__qualname__"].__get__(tp)
    except Exception:
        return None
    if not isinstance(module, str) or not module.startswith("dask.") or "tests" in module:
        return None
    mod = sys.modules.get(module)
    if not isinstance(mod, types.ModuleType) or mod.__dict__.get(qualname) is not tp:
        return None
    parts = module.split(".")
    return ".".join(parts[:2])


@dataclass
class CollectionInfo:
    """What a walk learnt of one collection object."""

    label: str
    persisted: bool
    chunks: int


class DaskKeyBackend(Backend):
    """Counts the Dask keys a Future or a Dask collection keeps alive (one "storage"
    per key: ``("dask", key)``, its framework field the client's id)."""

    name = "dask"

    def __init__(self, remember: bool = False) -> None:
        (self.future, self.bases, self.hlg, self.layer, self.datanode) = dask_types()
        self.collections: dict[int, CollectionInfo] = {}
        #: with ``remember``: a weak reference to every Future met, by key
        self.futures: dict | None = {} if remember else None

    def is_active(self) -> bool:
        return self.future is not None

    def tensor_types(self) -> tuple:
        return ((self.future,) if self.future is not None else ()) + self.bases

    def container_types(self) -> tuple:
        """Dask's machinery: a client, a cluster, a scheduler or worker object (in the
        notebook's process with a LocalCluster). The walk does not enter them: their
        bookkeeping is Dask's, not a name of the notebook."""
        return machinery_types()

    def children(self, obj: Any):
        return iter(())

    def _info(self, fut: Any, what: str) -> StorageInfo | None:
        try:
            key = fut.key
            client_id = fut.client.id
        except Exception:
            return None
        if self.futures is not None:
            try:
                self.futures.setdefault(key, []).append(weakref.ref(fut))
            except TypeError:
                pass
        return StorageInfo(("dask", key), 0, what, str(client_id))

    def storages(self, obj: Any) -> list[StorageInfo]:
        tp = type(obj)
        if tp is self.future:
            info = self._info(obj, FUTURE)
            return [info] if info is not None else []
        label = dask_collection_label(tp)
        if label is None:
            return []
        out: list[StorageInfo] = []
        seen: set = set()
        for fut in self._graph_futures(obj):
            info = self._info(fut, label)
            if info is not None and info.key not in seen:
                seen.add(info.key)
                out.append(info)
        persisted = False
        if out:
            try:
                from dask.core import flatten

                outputs = list(flatten(obj.__dask_keys__()))
                persisted = bool(outputs) and all(("dask", k) in seen for k in outputs)
            except Exception:
                persisted = False
        self.collections[id(obj)] = CollectionInfo(label, persisted, len(out))
        return out

    def _graph_futures(self, obj: Any):
        """The Futures a Dask collection's graph holds (materialized layers only: a lazy
        layer holds no computed key)."""
        graph = obj.__dask_graph__()
        if graph is None:
            return
        if self.hlg is not None and type(graph) is self.hlg:
            mappings = [layer.mapping for layer in graph.layers.values()
                        if type(layer) is self.layer]
        elif type(graph) is dict:
            mappings = [graph]
        else:
            return
        future, datanode = self.future, self.datanode
        for mapping in mappings:
            for value in (dict.values(mapping) if type(mapping) is dict else mapping.values()):
                if type(value) is future:
                    yield value
                elif datanode is not None and type(value) is datanode \
                        and type(value.value) is future:
                    yield value.value


@dataclass
class NameKeys:
    """One notebook name (or hidden holder) and the cluster keys it keeps alive."""

    name: str
    what: str
    keys: dict          # dask key -> path inside the name (``futs[3]``)
    hidden: bool = False
    aliases: list[str] = field(default_factory=list)
    purge: str | None = None
    kind: str = "user"


def _what(obj: Any, n_keys: int, kinds: set, backend: DaskKeyBackend) -> str:
    tp = type(obj)
    if tp is backend.future:
        return FUTURE
    info = backend.collections.get(id(obj))
    if info is not None:
        if info.persisted:
            return f"persisted {info.label}, {info.chunks} chunk{'s' if info.chunks != 1 else ''}"
        return f"{info.label} holding {info.chunks} key{'s' if info.chunks != 1 else ''}"

    base = type_name(obj) if tp is not tuple or n_keys else "tuple"
    if kinds == {FUTURE}:
        return f"{base} of {n_keys} Future{'s' if n_keys != 1 else ''}"
    return f"{base} holding {n_keys} key{'s' if n_keys != 1 else ''}"


@dataclass
class NameScan:
    """The roots walked, and per root the keys it reaches (``keys[i]``: key -> path)."""

    roots: list[Root]
    keys: list[dict]
    clients: list[str]          # per root: the client id of each reached key, once
    whats: list[str]
    partial: bool = False
    reasons: list[str] = field(default_factory=list)
    other_clients: dict = field(default_factory=dict)   # root name -> keys of other clients
    futures: dict = field(default_factory=dict)   # with ``remember``: key -> weak refs

    def release(self) -> None:
        """Drop the references to the user's objects."""
        self.roots.clear()


def scan_roots(roots: list[Root], *, client_id: str, shell: Any = None,
               namespace: dict | None = None, time_limit: float = 1.0,
               extra_stop: set | None = None, remember: bool = False) -> NameScan:
    """Walk ``roots`` for the keys of client ``client_id`` they keep alive (``remember``:
    keep a weak reference to each Future met, to tell later whether it is gone)."""
    backend = DaskKeyBackend(remember)
    result = _scan.scan(roots, devices=None, shell=shell, namespace=namespace,
                        time_limit=time_limit, extra_stop=extra_stop, backends=[backend])
    keys: list[dict] = []
    whats: list[str] = []
    others: dict = {}
    for root, reach in zip(roots, result.reach):
        mine: dict = {}
        kinds: set = set()
        for skey, (info, node, _) in reach.storages.items():
            if info.framework != client_id:
                others.setdefault(root.name, []).append(skey[1])
                continue
            mine[skey[1]] = _scan.format_path(node) if node is not None else root.name
            kinds.add(info.device)
        keys.append(mine)
        whats.append(_what(root.obj, len(mine), kinds, backend) if mine else "")
    backend.collections.clear()
    return NameScan(roots, keys, [client_id] * len(roots), whats, result.partial,
                    list(result.reasons), others, backend.futures or {})


def scan_names(*, client_id: str, namespace: dict | None = None, shell: Any = None,
               time_limit: float = 1.0) -> NameScan:
    """The user's names and IPython's hidden holders, walked for cluster keys."""
    roots = _scan.collect_roots(namespace, shell)
    return scan_roots(roots, client_id=client_id, shell=shell, namespace=namespace,
                      time_limit=time_limit)


def holders_of(found: NameScan) -> list[NameKeys]:
    """The roots that hold keys, as :class:`NameKeys` (no reference to user objects)."""
    out = []
    for root, keys, what in zip(found.roots, found.keys, found.whats):
        if keys:
            out.append(NameKeys(root.name, what, dict(keys), root.hidden, list(root.aliases),
                                root.purge, root.kind))
    return out
