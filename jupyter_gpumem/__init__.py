"""jupyter_gpumem: which notebook names hold accelerator memory, and how to get it back.

Load it in IPython or Jupyter with ``%load_ext jupyter_gpumem``; from a script
use :func:`snapshot`, :func:`purge` and :func:`watch`.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_loaded: dict[int, Any] = {}


def snapshot(namespace: dict | None = None, *, shell: Any = None, names=None,
             device: str = "auto", time_limit: float = 3.0):
    """Who holds memory now: a :class:`~jupyter_gpumem.snapshot.Snapshot`.

    Give a ``shell`` (IPython) to include its hidden holders, or a plain
    ``namespace`` dict such as ``globals()`` from a script.
    """
    from .snapshot import build

    return build(shell=shell, namespace=namespace, device=device, names=names,
                 time_limit=time_limit)


def purge(names=(), *, namespace: dict | None = None, shell: Any = None, all: bool = False,
          dry_run: bool = False, device: str = "auto", time_limit: float = 3.0):
    """Delete ``names`` and every hidden reference to their memory; see :mod:`.purge`."""
    from .purge import purge as _purge

    return _purge(names, shell=shell, namespace=namespace, all=all, dry_run=dry_run,
                  device=device, time_limit=time_limit)


def watch(*args, **kwargs):
    """Context manager reporting what a block did to memory; see :mod:`.watch`."""
    from .watch import watch as _watch

    return _watch(*args, **kwargs)


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
                             ("jupyter_gpumem.backends.tame", "on_load")):
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
