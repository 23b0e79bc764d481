"""The Python API: :func:`snapshot`, :func:`purge` and :func:`watch`, what the magics wrap.

Each returns the same result objects as the magics' ``-o``. Nothing here imports
IPython: a script passes ``namespace=globals()``, a notebook ``shell=get_ipython()``.
"""
from __future__ import annotations

from typing import Any

from . import cluster as _cluster
from . import session as _session
from .core.purge import PurgeError, PurgeResult
from .core.snapshot import Snapshot, build
from .settings import check_time_limit, select_device
from .watch.scope import Watch, watch

__version__ = "0.1.0"

__all__ = ["snapshot", "purge", "watch", "PurgeError", "PurgeResult", "Snapshot", "Watch"]


def _checked(device: str, time_limit: float, cluster: Any) -> tuple[Any, float]:
    """The arguments checked where they enter, as the magics check theirs: a device this
    process has, as its selection, made here once (a cluster's workers have their own:
    its text goes on, its form checked there) and a finite, positive time limit; one
    ValueError otherwise."""
    if cluster is None or cluster is False:
        device = select_device(device)
    return device, check_time_limit(time_limit)


def snapshot(namespace: dict | None = None, *, shell: Any = None, names=None,
             device: str = "auto", time_limit: float = 3.0, cluster: Any = None):
    """Who holds memory now: a :class:`~jupyter_gpumem.core.snapshot.Snapshot`.

    Give a ``shell`` (IPython) to include its hidden holders, or a plain
    ``namespace`` dict such as ``globals()`` from a script.

    ``cluster``: a ``distributed.Client`` (or ``True`` for the one in the namespace,
    else ``Client.current()``): the Dask cluster it drives instead, as a
    :class:`~jupyter_gpumem.cluster.ClusterSnapshot` of its workers' devices and the
    names that hold their keys (what ``%gpumem --cluster`` shows). Raises
    :class:`~jupyter_gpumem.cluster.ClusterError` without a client.
    """
    device, time_limit = _checked(device, time_limit, cluster)
    if cluster is not None and cluster is not False:
        if names:
            raise _cluster.ClusterError("a cluster snapshot covers every name: give no names")
        return _cluster.snapshot(None if cluster is True else cluster, namespace=namespace,
                                 shell=shell, device=device, time_limit=time_limit)
    return build(shell=shell, namespace=namespace, device=device, names=names,
                 time_limit=time_limit)


def purge(names=(), *, namespace: dict | None = None, shell: Any = None, all: bool = False,
          dry_run: bool = False, device: str = "auto", time_limit: float = 3.0,
          cluster: Any = None):
    """Delete ``names`` and every hidden reference to their memory; see :mod:`.core.purge`.

    ``cluster``: a ``distributed.Client`` (or ``True``, as for :func:`snapshot`):
    release what the names hold on that Dask cluster (their Futures, persisted
    collections), wait until the workers dropped the keys, free the workers'
    caches, and return a :class:`~jupyter_gpumem.cluster.ClusterPurgeResult`
    (what ``%gpumem purge NAME --cluster`` does). Bad input raises
    :class:`~jupyter_gpumem.cluster.ClusterPurgeError` (a ``PurgeError``) having
    deleted nothing.

    In a shell with the extension loaded (``shell``, or ``namespace`` its ``globals()``),
    its session hears of the purge, as of one from the magics or the views.
    """
    device, time_limit = _checked(device, time_limit, cluster)
    return _session.purge(names, shell=shell, namespace=namespace, cluster=cluster, all=all,
                          dry_run=dry_run, device=device, time_limit=time_limit)
