"""One :class:`Session` per shell: its settings and the snapshot after each cell.

The live views (the panel, the sidebar's comm channels) do not scan on their
own. Each registers with the session of its shell; after a cell the session
builds one snapshot per device the views show and hands it to every view of
that device (views whose selections cover the same devices, ``auto`` and ``cpu`` on a
machine without accelerators, share one scan). In a kernel this happens after the
cell's reply has gone, on the kernel's event loop, in steps
(:func:`jupyter_gpumem.core.snapshot.build_many_steps`): between steps the loop runs
whatever came in, and when a new cell ran
meanwhile the refresh is dropped, since the next cell's end brings a new one.
Without an event loop (a terminal IPython, a script) it happens at once, in
``post_run_cell``. The snapshot honours the user's settings
(``scan_time_limit``; each view's device, ``default_device`` for the sidebar).

When the notebook drives a Dask cluster (``distributed`` imported by the user
and a client connected), each snapshot gains a ``cluster`` part
(docs/PROTOCOL.md): the workers' devices and the names that hold their keys.
The names are walked on the main thread (:func:`jupyter_gpumem.cluster.held_names`);
the cluster is asked from a thread of the session's own while the kernel's loop
stays free (at once, without a loop), and the whole part is bounded by
``scan_time_limit``: a slow or lost worker gives a partial part, never a longer
wait.

The session owns the shell's one sampling thread too (:attr:`Session.sampler`, a
:class:`~jupyter_gpumem.core.sampler.SharedSampler`): the watch, the panel and the
sidebar's channels subscribe to it, each at its own interval, and the thread runs
only while one of them is subscribed.

What reads or changes the namespace at a view's request goes through
:attr:`Session.handoff` (jupyter_gpumem/handoff.py): on the main thread, between cells,
whatever thread asked.

It is the one owner of everything else the extension keeps for the shell: the one
pairing of IPython's cell events (its followers, :meth:`Session.follow_cells`, and its
hooks, :meth:`Session.hook_cells`, hear each cell through it), the record of the cells
(:attr:`Session.cells`), the count of purges of the shell's names (every purge goes
through :func:`purge`), the upper layers' objects (``watch``, ``panel``,
``comm_hub``) and their teardown: :meth:`Session.close` is the only one, and
:func:`open_session` the only place a session is made.

Nothing here imports a widget, a framework or Dask; it holds no user object beyond
the last snapshot's JSON (bytes, names and paths).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Callable, Protocol

from .core.scan import WarmScan
from .core.snapshot import build, build_many_steps
from .core import cells as _cells
from .core import sampler as _sampler
from .core import purge as _purge
from .core.devices import read_devices
from .core.cells import CellEvents
from .core import trace as _trace
from .core.trace import CellSpans
from . import cluster as _cluster
from .handoff import MainThreadQueue
from .settings import GpuMemSettings
from .units import complain


#: seconds the kernel must have been idle after a cell before the views refresh
IDLE_GRACE = 0.02
#: seconds the refresh leaves the event loop between two of its steps, so a request
#: that arrives meanwhile (the next cell) is received and dispatched through the
#: kernel's hops before the next step
STEP_PAUSE = 0.001
#: share of ``scan_time_limit`` the walk of the names for cluster keys may take
CLUSTER_WALK_SHARE = 0.3
#: the name of the session's sampling thread
SAMPLER_NAME = "jupyter_gpumem-sampler"
#: seconds closing the session waits for its sampling thread
SAMPLER_JOIN_TIMEOUT = 5.0
#: the least the cluster is given to answer (seconds)
CLUSTER_MIN_WAIT = 0.05
#: keys held by no name that a snapshot's cluster part lists (the rest are counted)
CLUSTER_UNCLAIMED_SHOWN = 50
#: the outer cells whose spans the session keeps (the panel's timeline marks them)
CELL_SPANS = 500


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


class View(Protocol):
    """What a live view gives the session."""

    device: str

    def show_snapshot(self, data: dict) -> None:
        """Show a PROTOCOL snapshot (JSON); called on the main thread."""

    def show_error(self, text: str) -> None:
        """Say in one line that the refresh failed."""


class CellFollower(Protocol):
    """What follows the outer cells of a shell through its session's one pairing of
    IPython's cell events (the ``watch on`` footer): a cell run from inside a cell is
    part of its outer cell, and a "pre" or "post" without its partner is sorted out by
    the session, once for everyone."""

    def cell_began(self, info: Any) -> Any:
        """An outer cell begins: what to keep for it (None: nothing)."""

    def cell_ended(self, kept: Any, result: Any) -> None:
        """The outer cell for which ``kept`` was kept ended with ``result``."""

    def cell_lost(self, kept: Any) -> None:
        """The cell ended unseen (its "post" never came), or the follower left while it
        ran: no end to report."""


class _CellRun:
    """An outer cell while it runs: its span and what each follower keeps for it."""

    __slots__ = ("span", "kept")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.kept: dict[Any, Any] = {}


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
        self.sampler = _sampler.SharedSampler(read=read_devices, name=SAMPLER_NAME)
        #: (pre, post) of the views and the footer: called from the session's own hooks,
        #: the shell's only pre/post_run_cell callbacks of the extension (trace's too: the
        #: magics give trace.start the session's hooks)
        self._cell_hooks: list[tuple[Callable, Callable]] = []
        #: the :class:`CellFollower` s, told of each outer cell before the hooks above
        self._followers: list[CellFollower] = []
        self._closers: list[Callable[[], Any]] = []
        self._views: list[View] = []
        #: the shell's one pairing of IPython's cell events (each outer cell a _CellRun)
        self._pairing = CellEvents(shell)
        #: the outer cells' spans ``[start, end]`` (unix s; end None while the cell runs)
        #: with their execution counts (``span.count``), oldest first, and a count that
        #: moves whenever one begins or ends: the panel's timeline reads them from its
        #: thread, trace maps allocation times to cells with them (spans are begun and
        #: ended here only)
        self.cells = CellSpans(CELL_SPANS)
        self.cells_version = 0
        #: the allocation trace this shell's ``%gpumem trace on`` started (a
        #: :class:`~jupyter_gpumem.core.trace.Tracer`), stopped when the session closes
        self.tracer: Any = None
        self._generation = 0          # cells ended so far; a refresh from an older one is dropped
        self._task: asyncio.Task | None = None    # the refresher waiting or refreshing
        #: the cell that just ended, for its snapshots: start/end (unix s), execution count
        self._last_cell: dict | None = None
        self._cell_task: Any = None               # the task that sends the last cell's reply
        self.last: dict[str, dict] = {}   # device -> the JSON snapshot after the last cell
        self._cluster_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._cluster_threads: list[threading.Thread] = []
        #: what refreshing costs: how many, their wall seconds, how many were dropped
        self.stats = {"refreshes": 0, "seconds": 0.0, "dropped": 0, "deferred": 0}
        #: purges of this shell's names so far (dry runs aside), whichever way they came
        #: (:func:`purge`): a reading or a result from before one is stale (the footer and
        #: the panel ask)
        self.purges = 0
        #: what the last scans walked, per name: a root proved unchanged is not walked
        #: again (core/scan/warm.py; every snapshot of this shell goes through it)
        self.warm = WarmScan()
        #: what reads or changes the namespace from another thread, or while a cell runs,
        #: goes through here (jupyter_gpumem/handoff.py): run on the main thread, between cells
        self.handoff = MainThreadQueue(loop_of=lambda: _kernel_loop(shell))
        self.follow_cells(self.handoff)
        _cells.hook_cells(shell, self._pre_run_cell, self._post_run_cell)

    # -- settings ----------------------------------------------------------------
    @property
    def time_limit(self) -> float:
        return float(self.settings.scan_time_limit)

    @property
    def default_device(self) -> str:
        return str(self.settings.default_device)

    # -- views -------------------------------------------------------------------
    def add_view(self, view: View) -> None:
        _add_once(self._views, view)

    def remove_view(self, view: View) -> None:
        _discard(self._views, view)

    def snapshot_json(self, device: str, names: list[str] | None = None) -> dict:
        """A fresh snapshot now (main thread), with the session's time limit (and the
        cluster part when a Dask client is connected)."""
        data = build(shell=self.shell, device=device, names=names,
                     time_limit=self.time_limit, warm=self.warm).to_json()
        data["cell_running"] = self._pairing.running()
        if not names:
            try:
                part = drive_now(self._cluster_steps([device])).get(device)
            except Exception as exc:  # noqa: BLE001 - the local snapshot stands
                part = f"cluster: {type(exc).__name__}: {exc}"
            _add_cluster(data, part)
            self.last[device] = data
        return data

    def refresh_now(self) -> None:
        """Build the snapshots now and show them in every view (after a purge, say)."""
        self._last_cell = None      # not a cell's end: the snapshot has no ``cell``
        self._generation += 1
        self._cancel()
        drive_now(self._refresh_steps(self._generation))

    # -- purges ------------------------------------------------------------------------
    def purge(self, names=(), **options: Any) -> Any:
        """:func:`purge` of this shell's names (``options`` as there)."""
        options.setdefault("shell", self.shell)
        return purge(names, **options)

    def purged(self) -> None:
        """A purge of this shell's names ran (called by :func:`purge`)."""
        self.purges += 1

    # -- cell events (main thread) ---------------------------------------------------
    def hook_cells(self, pre: Callable, post: Callable) -> None:
        """Call ``pre(info)`` and ``post(result)`` around every cell, after the session's own."""
        if (pre, post) not in self._cell_hooks:
            self._cell_hooks.append((pre, post))

    def unhook_cells(self, pre: Callable, post: Callable) -> None:
        if (pre, post) in self._cell_hooks:
            self._cell_hooks.remove((pre, post))

    def follow_cells(self, follower: CellFollower) -> None:
        """Tell ``follower`` of every outer cell from the next one on."""
        _add_once(self._followers, follower)

    def unfollow_cells(self, follower: CellFollower) -> list:
        """Stop telling ``follower``; what it kept for the cells running now (to let go)."""
        _discard(self._followers, follower)
        return [run.kept.pop(follower) for run in self._pairing.payloads()
                if follower in run.kept]

    def kept_by(self, follower: CellFollower) -> Any:
        """What ``follower`` keeps for the outer cell running now, if any."""
        run = self._pairing.outer_payload()
        return run.kept.get(follower) if run is not None else None

    def _lose(self, runs: list) -> None:
        for run in runs:        # cells whose "post" never came: their end is unknown
            _guarded(self.cells.end, run.span, run.span[0])
            for follower, kept in list(run.kept.items()):
                _guarded(follower.cell_lost, kept)
            run.kept.clear()

    def _pre_run_cell(self, info: Any = None) -> None:
        try:
            cell, ended = self._pairing.pre(info)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("cell events failed", exc)
            return
        self._lose(ended)
        run = None
        if cell.outer:      # a cell run from inside a cell is part of the outer one
            run = cell.payload = _CellRun(self.cells.begin(self.shell, info, time.time()))
        self.cells_version += 1
        if run is not None:
            for follower in list(self._followers):
                kept = _guarded(follower.cell_began, info)
                if kept is not None:
                    run.kept[follower] = kept
        for pre, _ in list(self._cell_hooks):
            _guarded(pre, info)

    def _post_run_cell(self, result: Any = None) -> None:
        try:
            run, ended = self._pairing.post(result)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("cell events failed", exc)
            run, ended = None, []
        self._lose(ended)
        self._after_cell(run, result)
        if run is not None:
            for follower, kept in list(run.kept.items()):
                _guarded(follower.cell_ended, kept, result)
            run.kept.clear()
        for _, post in list(self._cell_hooks):
            _guarded(post, result)

    def _after_cell(self, run: _CellRun | None, result: Any) -> None:
        try:
            span = run.span if run is not None else None
            now = time.time()
            if span is not None:
                self.cells.end(span, now, result)
            self.cells_version += 1
            if self._pairing.running():
                return      # an inner cell's end: the outer cell's end brings the refresh
            self._generation += 1
            count = getattr(result, "execution_count", None)
            self._last_cell = None if span is None else {
                "start": span[0], "end": now,
                "execution_count": count if type(count) is int else None}
            if not self._views:
                return
            loop, cell_task = _running_loop_and_task(self.shell)
            if loop is None:
                self._cancel()
                drive_now(self._refresh_steps(self._generation))
                return
            self.stats["deferred"] += 1
            self._cell_task = cell_task
            if self._task is None or self._task.done():
                self._task = loop.create_task(self._refresher())
            # else the refresher already waiting sees the new cell and waits for it (one
            # task for a run of cells, however many: run-all makes no task per cell)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's cell
            complain("refresh failed", exc)

    def _cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self.stats["dropped"] += 1
        self._task = None

    async def _refresher(self) -> None:
        """Wait for the last cell's reply to go and the kernel to stay idle, then refresh
        in steps; a cell that ends meanwhile starts the wait over (see the module
        docstring)."""
        try:
            while True:
                generation = self._generation
                cell_task = self._cell_task
                if cell_task is not None and not cell_task.done():
                    await asyncio.wait({cell_task})
                # a request already waiting (run-all sends every cell at once) goes first
                await asyncio.sleep(IDLE_GRACE)
                if generation != self._generation:
                    self.stats["dropped"] += 1
                    continue
                if await self._refresh_in_steps(generation):
                    return
                self.stats["dropped"] += 1      # a cell ran meanwhile: refresh after it
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - a view's failure is its own line
            complain("refresh failed", exc)
        finally:
            self._cell_task = None

    async def _refresh_in_steps(self, generation: int) -> bool:
        """One refresh on the loop, a step at a time; False when a newer cell stopped it."""
        steps = self._refresh_steps(generation)
        value = None
        while True:
            try:
                step = steps.send(value)
            except StopIteration:
                return generation == self._generation
            if isinstance(step, Offload):   # the cluster: asked off the loop
                value = await asyncio.wrap_future(self._pool().submit(step.fn))
            else:
                value = None
                await asyncio.sleep(STEP_PAUSE)
            if generation != self._generation:
                steps.close()
                return False

    def _refresh_steps(self, generation: int):
        """Build one snapshot per device the views show and hand it to them; yields
        between steps, and stops if a newer refresh was asked meanwhile."""
        start = time.perf_counter()
        views = list(self._views)
        devices = list(dict.fromkeys(v.device for v in views))
        built: dict[str, dict] = {}
        failed: dict[str, BaseException] = {}
        try:
            # views of selections that cover the same devices share one scan; one that
            # fails leaves the others' snapshots standing
            steps = build_many_steps(shell=self.shell, devices=devices,
                                     time_limit=self.time_limit, errors=failed, warm=self.warm)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    for device, snapshot in done.value.items():
                        built[device] = snapshot.to_json()
                        built[device]["cell_running"] = self._pairing.running()
                        if self._last_cell is not None:
                            built[device]["cell"] = dict(self._last_cell)
                    break
                yield
                if generation != self._generation:
                    steps.close()
                    return
        except Exception as exc:  # noqa: BLE001 - the views say so; the cell stands
            failed.update({device: exc for device in devices if device not in built})
        for device, exc in failed.items():
            self._tell(device, f"scan failed: {type(exc).__name__}: {exc}")
        if built:
            try:
                parts = yield from self._cluster_steps(list(built), generation)
            except Exception as exc:  # noqa: BLE001 - the local snapshot stands
                parts = {d: f"cluster: {type(exc).__name__}: {exc}" for d in built}
            if generation != self._generation:
                return
            for device, data in built.items():
                _add_cluster(data, parts.get(device))
        self.last.update(built)
        self.stats["refreshes"] += 1
        self.stats["seconds"] += time.perf_counter() - start
        for view in views:
            if view in self._views and view.device in built:
                try:
                    view.show_snapshot(built[view.device])
                except Exception as exc:  # noqa: BLE001 - one view must not stop the others
                    complain("a view failed", exc)

    def _cluster_steps(self, devices: list[str], generation: int | None = None):
        """Steps that give device -> the cluster part (JSON) or a note, for the
        devices given; nothing when Dask is not in use or no client is connected.
        The walk of the names runs here (main thread), the question to the cluster
        is an :class:`Offload`; together within ``scan_time_limit``."""
        if not _cluster.dask_imported():
            return {}
        client = _cluster.find_client(shell=self.shell)
        if client is None:
            return {}
        start = time.perf_counter()
        limit = self.time_limit
        try:
            names = _cluster.held_names(client, shell=self.shell,
                                       time_limit=limit * CLUSTER_WALK_SHARE)
        except Exception as exc:  # noqa: BLE001 - an asynchronous client, say
            note = f"cluster: {exc}" if isinstance(exc, _cluster.ClusterError) \
                else f"cluster: {type(exc).__name__}: {exc}"
            return {device: note for device in devices}
        out: dict[str, Any] = {}
        for device in devices:
            if generation is not None and generation != self._generation:
                return out
            left = max(limit - (time.perf_counter() - start), CLUSTER_MIN_WAIT)
            out[device] = yield Offload(
                lambda device=device, left=left: cluster_part(client, names, device, left))
        return out

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The session's one thread that asks the cluster (made on first use)."""
        if self._cluster_pool is None:
            self._cluster_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="jupyter_gpumem-cluster",
                initializer=lambda: self._cluster_threads.append(threading.current_thread()))
        return self._cluster_pool

    def _tell(self, device: str, text: str) -> None:
        for view in list(self._views):
            if view.device == device:
                try:
                    view.show_error(text)
                except Exception:  # noqa: BLE001
                    pass

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
        self._cancel()
        self.handoff.close()
        for name in ("comm_hub", "panel", "watch", "rescue", "reruns"):
            part = getattr(self, name)
            setattr(self, name, None)
            if part is not None:
                _guarded(part.close)
        while self._closers:
            _guarded(self._closers.pop())
        self._cancel()      # a refresh a closer asked for
        self._views.clear()
        self._followers.clear()
        self.sampler.close(SAMPLER_JOIN_TIMEOUT)
        if self._cluster_pool is not None:
            # a question under way ends within the time limit: wait for it, no longer
            self._cluster_pool.shutdown(wait=False, cancel_futures=True)
            self._cluster_pool = None
            for thread in self._cluster_threads:
                if thread is not threading.current_thread():
                    thread.join(self.time_limit + 1.0)
            self._cluster_threads.clear()
        self.stop_trace()
        self.warm.clear()
        self._cell_hooks.clear()
        _cells.unhook_cells(self.shell, self._pre_run_cell, self._post_run_cell)

    def stop_trace(self) -> str:
        """Stop the allocation trace this shell started, if it still records."""
        tracer, self.tracer = self.tracer, None
        if tracer is None:
            return "trace was off"
        return _trace.stop() if _trace.tracer() is tracer else tracer.stop()


def _guarded(fn: Callable, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - as IPython's own events: one line, go on
        complain(f"{getattr(fn, '__qualname__', 'a cell hook')} failed", exc)
        return None


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


def _add_cluster(data: dict, part: dict | str | None) -> None:
    """Put the cluster part into a PROTOCOL snapshot, or its note into the messages."""
    if isinstance(part, dict):
        data["cluster"] = part
    elif isinstance(part, str):
        data["messages"] = list(data.get("messages") or ()) + [part]


def _kernel_loop(shell: Any) -> Any:
    """The kernel's main event loop (ipykernel's ``io_loop``: ``add_callback`` from any
    thread), or None outside a kernel."""
    return getattr(getattr(shell, "kernel", None), "io_loop", None)


def _running_loop_and_task(shell: Any) -> tuple[Any, Any]:
    """The kernel's event loop running this cell and the task that will send the
    cell's reply; ``(None, None)`` outside a kernel (a terminal IPython runs an async
    cell in a loop of its own that stops with the cell)."""
    if getattr(shell, "kernel", None) is None:
        return None, None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None, None
    try:
        task = asyncio.current_task(loop)
    except RuntimeError:
        task = None
    return loop, task


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
    try:
        if cluster is not None and cluster is not False:
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


def _add_once(items: list, item: Any) -> None:
    if item not in items:
        items.append(item)


def _discard(items: list, item: Any) -> None:
    if item in items:
        items.remove(item)
