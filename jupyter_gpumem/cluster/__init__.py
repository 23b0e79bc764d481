"""Beyond one machine: a Dask cluster's memory, by notebook name, purged from the notebook.

From a notebook that drives a Dask cluster, :func:`snapshot` asks the scheduler and
every worker (through ``Client.run_on_scheduler`` and ``Client.run``, running only
this package's functions of :mod:`.remote` there) what each worker stores, with its
bytes per device counted by storage as in the notebook, and blames them on the
notebook's names that hold the keys (``Future``\\ s, persisted collections, and
whatever holds those); keys that no name holds are listed with who does want them.
:func:`purge` releases what chosen names hold and frees it on the workers.

Dask is optional: nothing here imports ``distributed`` or ``dask``; they are used
only once the user has imported ``distributed`` (``pip install
distributed``, the package's ``[dask]`` extra). A slow scheduler or worker costs at most the time limit,
and the answer says who did not answer.
"""
from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ..core.devices import parse_device
from .build import build
from .build import held_names as _held_names
from .purging import ClusterPurgeError
from .purging import purge as _purge
from .result import (ClusterHolder, ClusterPurgeResult, ClusterSnapshot, KeyStillHeld,
                     UnclaimedKey, WorkerChange, WorkerKey, WorkerReport)

__all__ = [
    "ClusterError", "ClusterPurgeError", "dask_imported", "find_client", "held_names",
    "snapshot", "purge",
    "ClusterSnapshot", "ClusterHolder", "UnclaimedKey", "WorkerReport", "WorkerKey",
    "ClusterPurgeResult", "WorkerChange", "KeyStillHeld",
]


class ClusterError(ValueError):
    """No usable Dask client, or a bad argument: nothing was asked or changed."""


def dask_imported() -> bool:
    """True once the user has imported ``distributed`` (the cluster view is off before)."""
    return "distributed.client" in sys.modules


def _client_type() -> type | None:
    client = getattr(sys.modules.get("distributed.client"), "Client", None)
    return client if isinstance(client, type) else None


def find_client(namespace: dict | None = None, shell: Any = None) -> Any:
    """The ``distributed.Client`` this notebook drives, or None.

    A client held by a name of the namespace (the default client among several),
    else ``Client.current()``. Never imports Dask: None until the user has.
    """
    client_type = _client_type()
    if client_type is None:
        return None
    ns = shell.user_ns if shell is not None else (namespace or {})
    held = [v for v in list(dict.values(ns)) if type(v) is client_type]
    running = [c for c in held if _running(c)]
    try:
        current = client_type.current(allow_global=True)
    except (ValueError, AttributeError):
        current = None
    if running:
        return next((c for c in running if c is current), running[0])
    return current if current is not None and _running(current) else None


def _running(client: Any) -> bool:
    try:
        return client.status in ("running", "connecting", "newly-created")
    except Exception:
        return False


def _installed(name: str) -> bool:
    """Whether a package could be imported (looked up, never imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _resolve(client: Any, namespace: dict | None, shell: Any, device: str) -> tuple[Any, str]:
    try:
        device = parse_device(device)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    if client is None:
        client = find_client(namespace, shell)
    if client is None:
        raise ClusterError("no Dask client: connect one first (distributed.Client(...))"
                           if dask_imported() else
                           "Dask is not in use: import distributed and connect a Client first"
                           + ("" if _installed("distributed") else
                              " (it is not installed: pip install distributed, the "
                              "package's [dask] extra)"))
    if type(client) is not _client_type():
        raise ClusterError(f"not a distributed.Client: {type(client).__name__}")
    if getattr(client, "asynchronous", False):
        raise ClusterError("an asynchronous Client: use a synchronous one for this view")
    if not _running(client):
        raise ClusterError(f"the Dask client is {client.status}, not running")
    return client, device


def held_names(client: Any = None, *, namespace: dict | None = None, shell: Any = None,
               time_limit: float = 1.0):
    """The first half of :func:`snapshot`, the only one that reads the namespace (call it
    on the kernel's main thread): which names hold keys of the client, as a
    :class:`~jupyter_gpumem.cluster.build.HeldNames` (names, keys and paths, no object).
    Give it to ``snapshot(names=...)``, which then asks only the cluster."""
    client, _ = _resolve(client, namespace, shell, "auto")
    return _held_names(client, namespace=namespace, shell=shell, time_limit=time_limit)


def snapshot(client: Any = None, *, namespace: dict | None = None, shell: Any = None,
             device: str = "auto", time_limit: float = 3.0, names=None) -> ClusterSnapshot:
    """The cluster's workers, their devices and keys, and the names that hold them.

    ``client``: a ``distributed.Client`` (default: :func:`find_client`). Give a
    ``shell`` (IPython) to include its hidden holders (``Out[N]``, ``_``, the last
    traceback), or a plain ``namespace`` dict. ``device`` selects the devices that
    count on each worker, as in the notebook (``cpu`` counts host tensors). Within
    ``time_limit`` seconds, whatever answers: the result is ``partial`` and names
    the workers that did not answer. ``names``: a :func:`held_names` result, to ask
    only the cluster (from a thread other than the kernel's, say). Raises
    :class:`ClusterError` without a client.
    """
    client, device = _resolve(client, namespace, shell, device)
    if names is not None and names.client_id != client.id:
        raise ClusterError("names were walked for another client")
    return build(client, namespace=namespace, shell=shell, device=device,
                 time_limit=time_limit, names=names)


def purge(names=(), *, client: Any = None, namespace: dict | None = None, shell: Any = None,
          all: bool = False, dry_run: bool = False, device: str = "auto",
          time_limit: float = 3.0) -> ClusterPurgeResult:
    """Release what ``names`` hold on the cluster and free it on the workers.

    The names (or paths: ``cfg['emb']``, ``Out[12]``) go from the namespace with the
    hidden holders of the same objects; the workers are waited for (at most
    ``time_limit``) until they dropped the keys, then each collects garbage and
    releases its frameworks' caches. No names: only the hidden holders; ``all``:
    every name that holds a key; ``dry_run``: what would go and what it would free.
    Keys another client, a published dataset, a task or another name of this
    notebook still wants stay, and are listed. Raises
    :class:`ClusterPurgeError` (a ``PurgeError``),
    having deleted nothing, when a name is missing or holds no key.
    """
    client, device = _resolve(client, namespace, shell, device)
    return _purge(client, names, namespace=namespace, shell=shell, all=all,
                  dry_run=dry_run, device=device, time_limit=time_limit)

