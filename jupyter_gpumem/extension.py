"""``%load_ext jupyter_gpumem`` / ``%unload_ext jupyter_gpumem``: what the extension adds
to a shell and takes away again (magics, event hooks, threads, the comm target)."""
from __future__ import annotations

from typing import Any, Callable

from . import session as _session
from .core.scan import native as _native
from .core import processes as _processes
from .magics import tame as _tame
from .magics import trace as _trace
from .magics import GpuMemMagics
from .views import comm as _comm
from .units import complain
from .magics import watch as _watch
from .magics import rescue as _rescue


#: whether this process was told that the scan's C core is absent (said at the first load)
_SAID_ABSENT: list = []


def load(ip) -> None:
    """Register the magics, the session and the sidebar's comm target on the shell ``ip``."""
    session = _session.session_of(ip)
    if session is not None and isinstance(session.settings, GpuMemMagics):
        return      # loaded already
    # what this kernel starts from now on knows its kernel (pid and start time): the
    # proof :func:`~jupyter_gpumem.core.processes.judge` asks before calling one an orphan
    _guarded("kernel mark", _processes.mark_kernel)
    if _native.ABSENT and not _SAID_ABSENT:   # once per process: the first load says it
        _SAID_ABSENT.append(True)
        complain(_native.ABSENT)
    magics = GpuMemMagics(shell=ip)
    ip.register_magics(magics)
    session = _session.open_session(ip, magics)
    session.on_close(lambda: _unregister_magics(ip, magics))
    _guarded("comm", lambda: _comm.register_comm(ip))
    for name, on_load in (("watch", _watch.on_load), ("tame", _tame.on_load),
                          ("trace", _trace.on_load), ("rescue", _rescue.on_load)):
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
    # ``register_magics`` made it one of the shell's configurables: a later ``%config``
    # would still set (and complain to) the unloaded instance
    configurables = getattr(ip, "configurables", None)
    if isinstance(configurables, list):
        configurables[:] = [c for c in configurables if c is not magics]


def _guarded(what: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - loading must never break the kernel
        complain(f"{what} failed", exc)
