"""``%load_ext jupyter_gpumem`` / ``%unload_ext jupyter_gpumem``: what the extension adds
to a shell and takes away again (magics, event hooks, threads, the comm target)."""
from __future__ import annotations

from typing import Any, Callable

from . import session as _session
from .magics import tame as _tame
from .magics import trace as _trace
from .magics import GpuMemMagics
from .views import comm as _comm
from .units import complain
from .magics import watch as _watch


def load(ip) -> None:
    """Register the magics, the session and the sidebar's comm target on the shell ``ip``."""
    session = _session.session_of(ip)
    if session is not None and isinstance(session.settings, GpuMemMagics):
        return      # loaded already
    magics = GpuMemMagics(shell=ip)
    ip.register_magics(magics)
    session = _session.open_session(ip, magics)
    session.on_close(lambda: _unregister_magics(ip, magics))
    _guarded("comm", lambda: _comm.register_comm(ip))
    for name, on_load in (("watch", _watch.on_load), ("tame", _tame.on_load),
                          ("trace", _trace.on_load)):
        _guarded(name, lambda on_load=on_load: on_load(ip, magics))


def unload(ip) -> None:
    """Remove every magic, hook, thread and comm target :func:`load` added: the session
    closes (:meth:`~jupyter_gpumem.session.Session.close`, the one teardown)."""
    session = _session.session_of(ip)
    if session is not None and isinstance(session.settings, GpuMemMagics):
        _session.close_session(ip)


def _unregister_magics(ip, magics: GpuMemMagics) -> None:
    mm = ip.magics_manager
    for kind, names in (("line", ("gpumem",)), ("cell", ("gpuwatch", "gpumem"))):
        for name in names:
            mm.magics[kind].pop(name, None)
    mm.registry.pop(type(magics).__name__, None)


def _guarded(what: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - loading must never break the kernel
        complain(f"{what} failed", exc)
