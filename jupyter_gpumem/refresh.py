"""The snapshot after each cell, for the live views: the session's refresh engine.

The live views register with their session (:meth:`Refresher.add_view`) and never scan;
after a cell the :class:`Refresher` builds one snapshot per set of devices the views show
and hands it to each of them: in a kernel after the cell's reply, on the event loop, in
steps (:func:`jupyter_gpumem.core.snapshot.build_many_steps`), dropped when a new cell
ran meanwhile; without a loop at once. The session owns it (``session.refresher``) and
tells it of each outer cell's end; nothing here imports a widget, a framework or Dask.
The story: docs/ARCHITECTURE.md#the-refresh-after-each-cell.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Protocol

from .cluster.live import LiveCluster, Offload, add_cluster, drive_now
from .core.scan import WarmScan
from .core import devices as _devices
from .core.snapshot import build, build_many_steps
from .units import complain

#: seconds the kernel must have been idle after a cell before the views refresh
IDLE_GRACE = 0.02
#: seconds the refresh leaves the event loop between two of its steps, so a request
#: that arrives meanwhile (the next cell) is received and dispatched through the
#: kernel's hops before the next step
STEP_PAUSE = 0.001


class View(Protocol):
    """What a live view gives the session."""

    device: str

    def show_snapshot(self, data: dict) -> None:
        """Show a PROTOCOL snapshot (JSON); called on the main thread."""

    def show_error(self, text: str) -> None:
        """Say in one line that the refresh failed."""


class Refresher:
    """The live views of one shell and the snapshots they are shown (see the module
    docstring). ``running()`` says whether a cell runs now (the snapshots say so);
    ``time_limit()`` is the user's ``scan_time_limit``, read at each use."""

    def __init__(self, shell: Any, *, warm: WarmScan, cluster: LiveCluster,
                 running: Callable[[], bool], time_limit: Callable[[], float]) -> None:
        self.shell = shell
        self.warm = warm
        self.cluster = cluster
        self.running = running
        self.time_limit = time_limit
        #: the open views, in the order they came (a dict as an ordered set)
        self.views: dict[View, None] = {}
        self._generation = 0          # cells ended so far; a refresh from an older one is dropped
        self._task: asyncio.Task | None = None    # the refresher waiting or refreshing
        #: the cell that just ended, for its snapshots: start/end (unix s), execution count
        self._last_cell: dict | None = None
        self._cell_task: Any = None               # the task that sends the last cell's reply
        self.last: dict[str, dict] = {}   # device -> the JSON snapshot after the last cell
        #: what refreshing costs: how many, their wall seconds, how many were dropped
        self.stats = {"refreshes": 0, "seconds": 0.0, "dropped": 0, "deferred": 0}

    def add_view(self, view: View) -> None:
        self.views.setdefault(view)

    def remove_view(self, view: View) -> None:
        self.views.pop(view, None)

    def snapshot_json(self, device: str, names: list[str] | None = None) -> dict:
        """A fresh snapshot now (main thread), with the session's time limit (and the
        cluster part when a Dask client is connected)."""
        data = build(shell=self.shell, device=_devices.select(device, present=False),
                     names=names,
                     time_limit=self.time_limit(), warm=self.warm).to_json()
        data["cell_running"] = self.running()
        if not names:
            try:
                part = drive_now(self.cluster.steps([device])).get(device)
            except Exception as exc:  # noqa: BLE001 - the local snapshot stands
                part = f"cluster: {type(exc).__name__}: {exc}"
            add_cluster(data, part)
            self.last[device] = data
        return data

    def refresh_now(self) -> None:
        """Build the snapshots now and show them in every view (after a purge, say)."""
        self._last_cell = None      # not a cell's end: the snapshot has no ``cell``
        self._generation += 1
        self.cancel()
        drive_now(self._refresh_steps(self._generation))

    def cell_ended(self, span: Any, now: float, result: Any) -> None:
        """An outer cell ended (main thread; ``span`` its record, or None): refresh the
        views at once without an event loop, else after the cell's reply has gone."""
        self._generation += 1
        count = getattr(result, "execution_count", None)
        self._last_cell = None if span is None else {
            "start": span[0], "end": now,
            "execution_count": count if type(count) is int else None}
        if not self.views:
            return
        loop, cell_task = _running_loop_and_task(self.shell)
        if loop is None:
            self.cancel()
            drive_now(self._refresh_steps(self._generation))
            return
        self.stats["deferred"] += 1
        self._cell_task = cell_task
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._refresher())
        # else the refresher already waiting sees the new cell and waits for it (one
        # task for a run of cells, however many: run-all makes no task per cell)

    def cancel(self) -> None:
        """Drop the refresh waiting or under way."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self.stats["dropped"] += 1
        self._task = None

    def close(self) -> None:
        self.cancel()
        self.views.clear()

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
                value = await asyncio.wrap_future(self.cluster.pool().submit(step.fn))
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
        views = list(self.views)
        devices = list(dict.fromkeys(v.device for v in views))
        built: dict[str, dict] = {}
        failed: dict[str, BaseException] = {}
        try:
            # views of selections that cover the same devices share one scan; one that
            # fails leaves the others' snapshots standing
            steps = build_many_steps(shell=self.shell, devices=_selections(devices, failed),
                                     time_limit=self.time_limit(), errors=failed, warm=self.warm)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    for device, snapshot in done.value.items():
                        built[device] = snapshot.to_json()
                        built[device]["cell_running"] = self.running()
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
                parts = yield from self.cluster.steps(
                    list(built), lambda: generation != self._generation)
            except Exception as exc:  # noqa: BLE001 - the local snapshot stands
                parts = {d: f"cluster: {type(exc).__name__}: {exc}" for d in built}
            if generation != self._generation:
                return
            for device, data in built.items():
                add_cluster(data, parts.get(device))
        self.last.update(built)
        self.stats["refreshes"] += 1
        self.stats["seconds"] += time.perf_counter() - start
        for view in views:
            if view in self.views and view.device in built:
                try:
                    view.show_snapshot(built[view.device])
                except Exception as exc:  # noqa: BLE001 - one view must not stop the others
                    complain("a view failed", exc)

    def _tell(self, device: str, text: str) -> None:
        for view in list(self.views):
            if view.device == device:
                try:
                    view.show_error(text)
                except Exception:  # noqa: BLE001
                    pass


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


def _selections(texts: list[str], failed: dict) -> list[_devices.DeviceSelection]:
    """The views' device texts as selections, the accelerators listed once for all; a
    text that names no selection gets its error in ``failed``."""
    accs = _devices.accelerators()
    out = []
    for text in texts:
        try:
            out.append(_devices.select(text, present=False, accs=accs))
        except Exception as exc:  # noqa: BLE001 - that view's failure alone
            failed[text] = exc
    return out
