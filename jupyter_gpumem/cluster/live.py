"""The live part of a Dask cluster in the session's snapshots (docs/PROTOCOL.md).

When the notebook drives a Dask cluster (``distributed`` imported by the user and a
client connected), each snapshot of a live view gains a ``cluster`` part: the
workers' devices and the names that hold their keys. The names are walked on the
main thread (:func:`~jupyter_gpumem.cluster.held_names`); the cluster is asked in an
:class:`Offload` step, which a kernel's refresh runs on :class:`LiveCluster`'s one
thread while the kernel's loop stays free (at once, without a loop:
:func:`drive_now`); the whole part is bounded by the time limit: a slow or lost
worker gives a partial part, never a longer wait.

Nothing here knows the session: what it needs (the shell, the time limit, whether
a refresh went stale) is given.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable

from .. import cluster as _cluster     # looked up at each use: a test may stand in for one

#: share of the time limit the walk of the names for cluster keys may take
CLUSTER_WALK_SHARE = 0.3
#: the least the cluster is given to answer (seconds)
CLUSTER_MIN_WAIT = 0.05
#: keys held by no name that a snapshot's cluster part lists (the rest are counted)
CLUSTER_UNCLAIMED_SHOWN = 50


class Offload:
    """A step of a refresh that waits on something else than this process (the
    cluster): the driver runs ``fn`` off the main thread (in a kernel) or at once, and
    sends its result back into the steps."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


def drive_now(steps) -> Any:
    """Run a generator of steps to its end on this thread (offloaded steps at once)."""
    value = None
    while True:
        try:
            step = steps.send(value)
        except StopIteration as done:
            return done.value
        value = step.fn() if isinstance(step, Offload) else None


def cluster_part(client: Any, names: Any, device: str, time_limit: float) -> dict | str:
    """The cluster part of a snapshot (JSON), or a one-line note of why there is none.
    Asks only the cluster (``names`` were walked on the main thread): any thread."""
    try:
        part = _cluster.snapshot(client, names=names, device=device,
                                time_limit=time_limit).to_json()
    except _cluster.ClusterError as exc:
        return f"cluster: {exc}"
    except Exception as exc:  # noqa: BLE001 - the local snapshot stands
        return f"cluster: {type(exc).__name__}: {exc}"
    rest = part.get("unclaimed") or []
    if len(rest) > CLUSTER_UNCLAIMED_SHOWN:
        left = rest[CLUSTER_UNCLAIMED_SHOWN:]
        part["unclaimed"] = rest[:CLUSTER_UNCLAIMED_SHOWN]
        part["unclaimed_left_off"] = {"keys": len(left),
                                      "bytes": sum(u.get("bytes") or 0 for u in left)}
    return part


def add_cluster(data: dict, part: dict | str | None) -> None:
    """Put the cluster part into a PROTOCOL snapshot, or its note into the messages."""
    if isinstance(part, dict):
        data["cluster"] = part
    elif isinstance(part, str):
        data["messages"] = list(data.get("messages") or ()) + [part]


class LiveCluster:
    """The cluster parts of one shell's snapshots, and the one thread that asks the
    cluster for them (made on first use, joined by :meth:`close`)."""

    def __init__(self, shell: Any, time_limit: Callable[[], float]) -> None:
        self.shell = shell
        self.time_limit = time_limit        # seconds, read at each use (the user's setting)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._threads: list[threading.Thread] = []

    def steps(self, devices: list[str], stale: Callable[[], bool] | None = None):
        """Steps that give device -> the cluster part (JSON) or a note, for the
        devices given; nothing when Dask is not in use or no client is connected.
        The walk of the names runs here (main thread), the question to the cluster
        is an :class:`Offload`; together within the time limit. ``stale()`` true:
        a newer refresh was asked, the devices left are not asked."""
        if not _cluster.dask_imported():
            return {}
        client = _cluster.find_client(shell=self.shell)
        if client is None:
            return {}
        start = time.perf_counter()
        limit = self.time_limit()
        try:
            names = _cluster.held_names(client, shell=self.shell,
                                        time_limit=limit * CLUSTER_WALK_SHARE)
        except Exception as exc:  # noqa: BLE001 - an asynchronous client, say
            note = f"cluster: {exc}" if isinstance(exc, _cluster.ClusterError) \
                else f"cluster: {type(exc).__name__}: {exc}"
            return {device: note for device in devices}
        out: dict[str, Any] = {}
        for device in devices:
            if stale is not None and stale():
                return out
            left = max(limit - (time.perf_counter() - start), CLUSTER_MIN_WAIT)
            out[device] = yield Offload(
                lambda device=device, left=left: cluster_part(client, names, device, left))
        return out

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The one thread that asks the cluster (made on first use)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="jupyter_gpumem-cluster",
                initializer=lambda: self._threads.append(threading.current_thread()))
        return self._pool

    def close(self) -> None:
        """End the thread: a question under way ends within the time limit; wait for
        it, no longer."""
        if self._pool is None:
            return
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(self.time_limit() + 1.0)
        self._threads.clear()
