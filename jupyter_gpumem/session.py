"""One :class:`Session` per shell: the one owner of what the extension keeps for it.

It owns and closes (:meth:`Session.close` the only teardown, :func:`open_session` the
only place a session is made) the settings, the cell dispatch (:mod:`.dispatch`), the
refresher (:mod:`.refresh`) with the cluster's live part, the sampling thread, the
handoff (:mod:`.handoff`), the count of purges (every purge goes through :func:`purge`)
and the upper layers' objects. Ownership only: a new job is a module beside it. Nothing
here imports a widget, a framework or Dask; it holds no user object beyond the last
snapshot's JSON. What each part is: docs/ARCHITECTURE.md#one-owner-per-shell.
"""
from __future__ import annotations

from typing import Any, Callable

from .cluster.live import LiveCluster
from .core.scan import WarmScan
from .core import sampler as _sampler
from .core import cells as _cells
from .core import purge as _purge
from .core import devices as _devices
from .core import trace as _trace
from . import cluster as _cluster
from .dispatch import CellFollower, CellDispatch, guarded
from .handoff import MainThreadQueue
from .refresh import Refresher, View
from .settings import GpuMemSettings

#: the name of the session's sampling thread
SAMPLER_NAME = "jupyter_gpumem-sampler"
#: seconds closing the session waits for its sampling thread
SAMPLER_JOIN_TIMEOUT = 5.0


class Session:
    """What the extension keeps for one shell (see the module docstring)."""

    def __init__(self, shell: Any, settings: GpuMemSettings | None = None) -> None:
        self.shell = shell
        #: the user's settings: the magics (a :class:`GpuMemSettings`) once loaded
        self.settings = settings if settings is not None else GpuMemSettings()
        #: what the upper layers keep for this shell, owned here and nowhere else:
        #: the watch state (history, timeline, footer), the live panel, the comm hub
        self.watch: Any = None
        self.panel: Any = None
        self.comm_hub: Any = None
        #: the out-of-memory rescue (its pending offer) and the rerun record (watch/)
        self.rescue: Any = None
        self.reruns: Any = None
        #: the shell's one sampling thread: the watch, the panel and the comm hub subscribe
        #: to it (``sampler.subscribe``); it starts with the first and ends with the last
        self.sampler = _sampler.SharedSampler(read=_devices.read_devices_now, name=SAMPLER_NAME)
        self._closers: list[Callable[[], Any]] = []
        #: the allocation trace this shell's ``%gpumem trace on`` started (a
        #: :class:`~jupyter_gpumem.core.trace.Tracer`), stopped when the session closes
        self.tracer: Any = None
        #: purges of this shell's names so far (dry runs aside), whichever way they came
        #: (:func:`purge`): a reading or a result from before one is stale (the footer and
        #: the panel ask)
        self.purges = 0
        #: what the last scans walked, per name: a root proved unchanged is not walked
        #: again (core/scan/warm.py; every snapshot of this shell goes through it)
        self.warm = WarmScan()
        #: the Dask cluster's part of the snapshots, and its one thread
        self.cluster = LiveCluster(shell, lambda: self.time_limit)
        #: the live views and the snapshot after each cell (jupyter_gpumem/refresh.py)
        self.refresher = Refresher(shell, warm=self.warm, cluster=self.cluster,
                                   running=lambda: self.dispatch.running(),
                                   time_limit=lambda: self.time_limit)
        #: device -> the JSON snapshot after the last cell, and what refreshing costs
        #: (the refresher's, read here)
        self.last = self.refresher.last
        self.stats = self.refresher.stats
        #: the shell's one pairing of IPython's cell events (jupyter_gpumem/dispatch.py):
        #: an outer cell's end refreshes the views
        self.dispatch = CellDispatch(shell, outer_ended=self.refresher.cell_ended)
        #: the outer cells' spans (a :class:`~jupyter_gpumem.core.trace.CellSpans`)
        self.cells = self.dispatch.cells
        #: what reads or changes the namespace from another thread, or while a cell runs,
        #: goes through here (jupyter_gpumem/handoff.py): run on the main thread, between cells
        self.handoff = MainThreadQueue(loop_of=lambda: _kernel_loop(shell))
        self.follow_cells(self.handoff)

    # -- settings ----------------------------------------------------------------
    @property
    def time_limit(self) -> float:
        return float(self.settings.scan_time_limit)

    @property
    def default_device(self) -> str:
        return str(self.settings.default_device)

    # -- views (the refresher's) --------------------------------------------------
    def add_view(self, view: View) -> None:
        self.refresher.add_view(view)

    def remove_view(self, view: View) -> None:
        self.refresher.remove_view(view)

    def snapshot_json(self, device: str, names: list[str] | None = None) -> dict:
        """A fresh snapshot now (main thread), with the session's time limit (and the
        cluster part when a Dask client is connected)."""
        return self.refresher.snapshot_json(device, names)

    def refresh_now(self) -> None:
        """Build the snapshots now and show them in every view (after a purge, say)."""
        self.refresher.refresh_now()

    # -- purges ------------------------------------------------------------------------
    def purge(self, names=(), **options: Any) -> Any:
        """:func:`purge` of this shell's names (``options`` as there)."""
        options.setdefault("shell", self.shell)
        return purge(names, **options)

    def purged(self) -> None:
        """A purge of this shell's names ran (called by :func:`purge`)."""
        self.purges += 1

    # -- cell events (the dispatch's; main thread) ------------------------------------
    @property
    def cells_version(self) -> int:
        """A count that moves whenever an outer cell begins or ends."""
        return self.dispatch.version

    def hook_cells(self, pre: Callable, post: Callable) -> None:
        """Call ``pre(info)`` and ``post(result)`` around every cell, after the session's own."""
        self.dispatch.hook_cells(pre, post)

    def unhook_cells(self, pre: Callable, post: Callable) -> None:
        self.dispatch.unhook_cells(pre, post)

    def follow_cells(self, follower: CellFollower) -> None:
        """Tell ``follower`` of every outer cell from the next one on."""
        self.dispatch.follow_cells(follower)

    def unfollow_cells(self, follower: CellFollower) -> list:
        """Stop telling ``follower``; what it kept for the cells running now (to let go)."""
        return self.dispatch.unfollow_cells(follower)

    def kept_by(self, follower: CellFollower) -> Any:
        """What ``follower`` keeps for the outer cell running now, if any."""
        return self.dispatch.kept_by(follower)

    # -- teardown ----------------------------------------------------------------------
    def on_close(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` when the session closes (the last given first): what the magics
        added to the shell beside the session (an input transformer, the magics
        themselves) goes with it."""
        self._closers.append(fn)

    def close(self) -> None:
        """The one teardown of what the extension added to the shell: the upper layers'
        objects (the sidebar's comm hub, the panel, the watch state: each closed), what
        was given to :meth:`on_close`, the pending refresh, the sampling thread (joined),
        the cluster's thread, the trace this shell started, and the cell hooks."""
        self.refresher.cancel()
        self.handoff.close()
        for name in ("comm_hub", "panel", "watch", "rescue", "reruns"):
            part = getattr(self, name)
            setattr(self, name, None)
            if part is not None:
                guarded(part.close)
        while self._closers:
            guarded(self._closers.pop())
        self.refresher.close()      # a refresh a closer asked for, and the views
        self.dispatch.followers.clear()
        self.sampler.close(SAMPLER_JOIN_TIMEOUT)
        self.cluster.close()
        self.stop_trace()
        self.warm.clear()
        self.dispatch.close()

    def stop_trace(self) -> str:
        """Stop the allocation trace this shell started, if it still records."""
        tracer, self.tracer = self.tracer, None
        if tracer is None:
            return "trace was off"
        return _trace.stop() if _trace.tracer() is tracer else tracer.stop()


def hook_cells(shell: Any, pre: Callable, post: Callable) -> None:
    """Hook ``pre``/``post`` around the cells of ``shell``: through its session where the
    extension is loaded, else on the shell's events directly."""
    session = session_of(shell)
    if session is not None:
        session.hook_cells(pre, post)
    else:
        _cells.hook_cells(shell, pre, post)


def unhook_cells(shell: Any, pre: Callable, post: Callable) -> None:
    """Undo :func:`hook_cells` (both ways: the session may have come or gone since)."""
    session = session_of(shell)
    if session is not None:
        session.unhook_cells(pre, post)
    _cells.unhook_cells(shell, pre, post)


def _kernel_loop(shell: Any) -> Any:
    """The kernel's main event loop (ipykernel's ``io_loop``: ``add_callback`` from any
    thread), or None outside a kernel."""
    return getattr(getattr(shell, "kernel", None), "io_loop", None)


def purge(names=(), *, shell: Any = None, namespace: dict | None = None, cluster: Any = None,
          **options: Any) -> Any:
    """Every purge goes through here: :func:`jupyter_gpumem.core.purge.purge` (``options``:
    ``all``, ``dry_run``, ``device``, ``time_limit``), or with ``cluster`` (a Dask client,
    or True for the one in use) :func:`jupyter_gpumem.cluster.purge`. The session of the
    shell whose names go (``shell``, or the shell whose namespace ``namespace`` is) hears
    of it (:attr:`Session.purges`), unless it was a dry run or it refused the names
    (a ``PurgeError``: nothing was deleted)."""
    session = session_of(shell) if shell is not None else _session_of_namespace(namespace)
    dry_run = bool(options.get("dry_run", False))
    device = options.get("device", "auto")
    if cluster is None or cluster is False:
        try:            # a bad text is refused before anything is deleted, as a PurgeError
            options["device"] = selection(device)
        except ValueError as exc:
            raise _purge.PurgeError(str(exc)) from None
    try:
        if cluster is not None and cluster is not False:
            if type(device) is _devices.DeviceSelection:   # the workers' devices: their own
                options["device"] = device.device
            result = _cluster.purge(names, client=None if cluster is True else cluster,
                                    namespace=namespace, shell=shell, **options)
        else:
            result = _purge.purge(names, shell=shell, namespace=namespace, **options)
    except (_purge.PurgeError, _cluster.ClusterError):
        raise               # refused before anything was deleted
    except BaseException:
        if session is not None and not dry_run:
            session.purged()        # it may have deleted some before it failed
        raise
    if session is not None and not dry_run:
        session.purged()
    return result


def selection(device: _devices.DeviceSelection | str) -> _devices.DeviceSelection:
    """The selection of a view's device text (checked where it entered: the comm's
    ``set_device``, the panel's and the watch's magics), listed now; one made at the
    edge (the magics, the script API) passes as it is."""
    return device if type(device) is _devices.DeviceSelection else \
        _devices.select(device, present=False)


#: the one per-shell registry: id(shell) -> its session
_sessions: dict[int, Session] = {}


def open_session(shell: Any, settings: GpuMemSettings | None = None) -> Session:
    """The session of ``shell``, made on first use; ``settings`` (the magics, at load)
    become its settings."""
    session = _sessions.get(id(shell))
    if session is None or session.shell is not shell:
        session = _sessions[id(shell)] = Session(shell, settings)
    elif settings is not None:
        session.settings = settings
    return session


def _session_of_namespace(namespace: dict | None) -> Session | None:
    """The session of the shell whose user namespace ``namespace`` is (a cell's
    ``globals()``), if any."""
    if namespace is None:
        return None
    for session in list(_sessions.values()):
        if getattr(session.shell, "user_ns", None) is namespace:
            return session
    return None


def session_of(shell: Any) -> Session | None:
    """The session of ``shell`` while the extension is loaded in it."""
    session = _sessions.get(id(shell))
    return session if session is not None and session.shell is shell else None


def close_session(shell: Any) -> None:
    """Close the session of ``shell`` (:meth:`Session.close`: everything of the extension
    in that shell goes), if it has one."""
    session = _sessions.get(id(shell))
    if session is not None and session.shell is shell:
        del _sessions[id(shell)]
        session.close()
