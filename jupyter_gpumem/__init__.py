"""jupyter_gpumem: which notebook names hold accelerator memory, and how to get it back.

Load it in IPython or Jupyter with ``%load_ext jupyter_gpumem``; from a script
use :func:`snapshot`, :func:`purge` and :func:`watch`.
"""
from __future__ import annotations

import sys as _sys
import types as _types
from typing import Any

__version__ = "0.1.0"

_loaded: dict[int, Any] = {}


def snapshot(namespace: dict | None = None, *, shell: Any = None, names=None,
             device: str = "auto", time_limit: float = 3.0, cluster: Any = None):
    """Who holds memory now: a :class:`~jupyter_gpumem.snapshot.Snapshot`.

    Give a ``shell`` (IPython) to include its hidden holders, or a plain
    ``namespace`` dict such as ``globals()`` from a script.

    ``cluster``: a ``distributed.Client`` (or ``True`` for the one in the namespace,
    else ``Client.current()``): the Dask cluster it drives instead, as a
    :class:`~jupyter_gpumem.cluster.ClusterSnapshot` of its workers' devices and the
    names that hold their keys (what ``%gpumem --cluster`` shows). Raises
    :class:`~jupyter_gpumem.cluster.ClusterError` without a client.
    """
    if cluster is not None and cluster is not False:
        from . import cluster as _cluster

        if names:
            raise _cluster.ClusterError("a cluster snapshot covers every name: give no names")
        return _cluster.snapshot(None if cluster is True else cluster, namespace=namespace,
                                 shell=shell, device=device, time_limit=time_limit)
    from .snapshot import build

    return build(shell=shell, namespace=namespace, device=device, names=names,
                 time_limit=time_limit)


def purge(names=(), *, namespace: dict | None = None, shell: Any = None, all: bool = False,
          dry_run: bool = False, device: str = "auto", time_limit: float = 3.0,
          cluster: Any = None):
    """Delete ``names`` and every hidden reference to their memory; see :mod:`.purge`.

    ``cluster``: a ``distributed.Client`` (or ``True``, as for :func:`snapshot`):
    release what the names hold on that Dask cluster (their Futures, persisted
    collections), wait until the workers dropped the keys, free the workers'
    caches, and return a :class:`~jupyter_gpumem.cluster.ClusterPurgeResult`
    (what ``%gpumem purge NAME --cluster`` does). Bad input raises
    :class:`~jupyter_gpumem.cluster.ClusterPurgeError` (a ``PurgeError``) having
    deleted nothing.
    """
    if cluster is not None and cluster is not False:
        from . import cluster as _cluster

        return _cluster.purge(names, client=None if cluster is True else cluster,
                              namespace=namespace, shell=shell, all=all, dry_run=dry_run,
                              device=device, time_limit=time_limit)
    from .purge import purge as _purge

    return _purge(names, shell=shell, namespace=namespace, all=all, dry_run=dry_run,
                  device=device, time_limit=time_limit)


def watch(*args, **kwargs):
    """Context manager reporting what a block did to memory; see :mod:`.watch`."""
    from .watch import watch as _watch

    return _watch(*args, **kwargs)


#: the package's own functions, kept for when a submodule of the same name shadows them
_PUBLIC = {"snapshot": snapshot, "purge": purge}


class _Package(_types.ModuleType):
    """Importing the submodule ``jupyter_gpumem.snapshot`` (or ``.purge``) binds the
    package's ``snapshot`` attribute to that module, which is made callable; here its
    call is pointed at the package's function, so ``jupyter_gpumem.snapshot(cluster=...)``
    keeps every option of this module whatever was imported first."""

    def __setattr__(self, name: str, value: Any) -> None:
        fn = _PUBLIC.get(name)
        if fn is not None and isinstance(value, _types.ModuleType) \
                and value.__name__ == f"{__name__}.{name}":
            from ._callable import make_module_callable

            make_module_callable(value.__name__, fn)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name == "PurgeError":
        from .purge import PurgeError

        return PurgeError
    raise AttributeError(name)


def load_ipython_extension(ip) -> None:
    """``%load_ext jupyter_gpumem``: register the magics and the sidebar's comm target."""
    if id(ip) in _loaded:
        return
    from .magics import GpuMemMagics
    from .session import open_session

    magics = GpuMemMagics(shell=ip)
    ip.register_magics(magics)
    _loaded[id(ip)] = magics
    open_session(ip, magics)
    for module, register in (("jupyter_gpumem.comm", "register_comm"),
                             ("jupyter_gpumem.watch", "on_load"),
                             ("jupyter_gpumem.backends.tame", "on_load"),
                             ("jupyter_gpumem.trace", "on_load")):
        _call_optional(module, register, ip, magics)


def unload_ipython_extension(ip) -> None:
    """``%unload_ext jupyter_gpumem``: remove every magic, hook, thread and comm target."""
    magics = _loaded.pop(id(ip), None)
    if magics is None:
        return
    _call_optional("jupyter_gpumem.comm", "unregister_comm", ip, magics)
    magics.run_cleanups()
    from .session import close_session

    close_session(ip)
    mm = ip.magics_manager
    for kind, names in (("line", ("gpumem",)), ("cell", ("gpuwatch",))):
        for name in names:
            mm.magics[kind].pop(name, None)
    mm.registry.pop(type(magics).__name__, None)


def _call_optional(module: str, func: str, ip, magics) -> None:
    import importlib
    import sys

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return  # that part of the product is not installed in this build
        raise
    fn = getattr(mod, func, None)
    if fn is None:
        return
    try:
        fn(ip, magics) if func not in ("register_comm", "unregister_comm") else fn(ip)
    except Exception as exc:  # noqa: BLE001 - loading must never break the kernel
        print(f"jupyter_gpumem: {module}.{func} failed: {exc}", file=sys.stderr)


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "jupyter-gpumem"}]
