"""``%gpumem panel``: a live panel of standard ipywidgets in the output area.

Device bars and a timeline move from the session's sampling thread (device counters
only); the holders table (:mod:`.panel_table`, a page at a time) is rebuilt on the main
thread from the session's snapshot after each cell; the Orphans section
(:mod:`.panel_orphans`) reads the same snapshot. What reads or changes the namespace goes
through the session's ``handoff``. Everything shown is drawn from the JSON of
docs/PROTOCOL.md. One panel per shell; ipywidgets is imported only when a panel is
made. The story: docs/ARCHITECTURE.md#the-live-panel-and-the-sidebars-comm.
"""
from __future__ import annotations

import bisect
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

from ..core import purge as _purge
from ..core.sampler import SharedSampler, Subscription, Series, device_point
from ..session import session_of
from ..watch.scope import history_for
from . import panel_render as _render
from .panel_orphans import OrphanSection
from .panel_table import HolderTable
from .routes import Route
from .question import Question, guarded, status_html

INTERVAL = 1.0  # seconds between two readings of the device bars
WINDOW = 300.0  # seconds of history the timeline shows
TIMELINE_REDRAW = 5.0  # seconds between redraws of a timeline whose values hold still
MIN_INTERVAL = 0.05
MIN_WINDOW, MAX_WINDOW = 10.0, 86400.0
MAX_READINGS = 100_000  # readings the timeline keeps, whatever the window and interval
QUEUED = "queued: runs when the cell ends"
HOLDERS_TITLE = "<b>Holders</b> <span style='opacity:.6'>(after each cell)</span>"
STALE_TITLE = ("<b>Holders</b> <span data-stale='1' style='color:var(--jp-warn-color0, #b65c00)'>"
               "from before the running cell</span> <span style='opacity:.6'>(scanned when it "
               "ends)</span>")
MISSING = ("jupyter_gpumem: the live panel needs ipywidgets: run `pip install ipywidgets` "
           "in this kernel's environment, restart the kernel, then `%gpumem panel` again.")



def widgets():
    """ipywidgets, imported on first use; a clear ImportError when missing."""
    try:
        import ipywidgets
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    return ipywidgets


def current(shell: Any) -> "Panel | None":
    """The running panel of ``shell``, if one is open."""
    session = session_of(shell)
    panel = session.panel if session is not None else None
    return panel if panel is not None and not panel.closed else None


def close(shell: Any) -> bool:
    """Close the panel of ``shell`` and stop its thread; False when none was open."""
    session = session_of(shell)
    panel = session.panel if session is not None else None
    if panel is None:
        return False
    session.panel = None
    return panel.close()


_box_classes: dict[int, type] = {}


def _panel_box(w) -> type:
    """A VBox that closes its panel when closed (same model and view as VBox)."""
    cls = _box_classes.get(id(w))
    if cls is None:
        class PanelBox(w.VBox):
            """The panel's outer box; closing it closes the panel."""

            def close(self):
                panel = getattr(self, "_panel_ref", lambda: None)()
                super().close()
                if panel is not None:
                    panel.close()

            def __repr__(self) -> str:
                return ("jupyter_gpumem live panel: shown by JupyterLab, Notebook 7, VS Code or "
                        "Colab; in a terminal use %gpumem")

        cls = _box_classes[id(w)] = PanelBox
    return cls


class Panel:
    """The live panel of one shell: widgets and a subscription to the session's
    sampling thread. ``session`` is the shell's :class:`~jupyter_gpumem.session.Session`:
    it refreshes the holders after each cell, keeps the cells the timeline marks and
    owns the sampling thread.

    ``widget`` is the box to display. ``series`` holds the readings of the
    device bars (``(time, {device: {field: bytes}})``), ``snapshot`` the last
    holders scan as PROTOCOL JSON.
    """

    def __init__(self, shell: Any, device: str = "auto", *, interval: float = INTERVAL,
                 window: float = WINDOW, time_limit: float = 3.0, session: Any):
        if session is None:
            raise ValueError("the live panel needs its shell's session: "
                             "`%load_ext jupyter_gpumem` first")
        self.shell = shell
        #: the shell's session: it builds the snapshot after each cell for every view
        self.session = session
        self.device = device
        self.interval = float(interval)
        self.window = float(window)
        self.time_limit = time_limit
        self.series = Series(maxlen=self._series_len())
        self.snapshot: dict | None = None
        self.closed = False
        #: its subscription to the session's sampling thread while the panel runs
        self.sampler: Subscription | None = None
        self.refreshes = 0
        #: what the panel itself costs: device readings and their CPU seconds (in
        #: its thread), holders scans and their wall seconds (on the main thread)
        self.stats = {"ticks": 0, "tick_cpu_seconds": 0.0, "scans": 0, "scan_seconds": 0.0}
        self._lock = threading.RLock()
        self._attributed: dict[str, int] = {}
        #: spans from the watch's history that none of the session's cells covers (a
        #: ``with jupyter_gpumem.watch()`` block, cells from before the session)
        self._extra: deque = deque(maxlen=500)
        #: the session's purge count after the purge whose result is shown, and the
        #: figures of the first snapshot after it (a later one with other figures clears it)
        self._result_purges: int | None = None
        self._result_figures: tuple | None = None
        #: a purge or refresh asked while a cell runs, waiting for its end (cancellable)
        self._queued: Any = None
        # held while a click is handed over and "queued" said (not while it runs: the bars
        # keep moving during a purge)
        self._handing = threading.RLock()
        self._stale = False
        self._said_purged = False
        self._thread_error: str | None = None
        self._watched_until = float("-inf")   # start of the newest watched span merged in
        self._drawn: tuple | None = None  # (time, point, cells version) of the last timeline
        self._build_widgets()

    def _series_len(self) -> int:
        return min(int(self.window / self.interval) + 16, MAX_READINGS)

    # -- widgets -------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        w = widgets()
        self._w = w
        #: the subshell the frontend sends the panel's clicks on, kept as their route
        self.route = Route()
        self.title = w.HTML()
        self.refresh_button = w.Button(description="Refresh", icon="refresh",
                                       tooltip="scan the holders now",
                                       layout=w.Layout(width="auto"))
        self.close_button = w.Button(icon="times", tooltip="close the panel and stop its thread",
                                     layout=w.Layout(width="36px"))
        header = w.HBox([self.title, self.refresh_button, self.close_button],
                        layout=w.Layout(justify_content="space-between", align_items="center",
                                        flex_flow="row wrap"))
        self.bars = w.HTML()
        #: one bar per device of each Dask worker, when a client is connected
        self.cluster_bars = w.HTML(layout=w.Layout(display="none"))
        self.timeline = w.HTML()
        #: the holders, a page at a time, and the checked names (views/panel_table.py)
        self.holders_table = HolderTable(w, changed=self._update_purge_button, guard=self._guard,
                                         follow=self.route.follow_widget)
        self.table = self.holders_table.grid
        self.holders_title = w.HTML(HOLDERS_TITLE)
        self.footer = w.HTML()
        #: the names that hold keys on the Dask cluster, when a client is connected
        self.cluster_table = w.HTML(layout=w.Layout(display="none"))
        self.purge_button = w.Button(description="Purge checked", icon="trash",
                                     button_style="", disabled=True,
                                     tooltip="delete the checked names and free their memory",
                                     layout=w.Layout(width="auto"))
        self.status = w.HTML()
        self.cancel_queued = w.Button(description="Cancel queued", icon="times",
                                      tooltip="drop the request that waits for the running cell",
                                      layout=w.Layout(width="auto", display="none"))
        # the purge's question takes the purge button's place
        self.question = Question(
            w, "Yes, purge", changed=self._update_purge_button, confirmed=self._purge_confirmed,
            cancelled=lambda: self._say("purge cancelled: nothing changed"), guard=self._guard)
        q = self.question
        self.confirm_text, self.confirm_button, self.confirm_box = q.text, q.yes, q.box
        self.cancel_button = q.cancel
        self.result = w.HTML()
        self.widget = _panel_box(w)([
            header, w.HTML("<b>Devices</b>"), self.bars, self.cluster_bars,
            w.HTML("<b>This process, recent minutes</b>"), self.timeline,
            self.holders_title, self.holders_table.bar,
            self.table, self.footer, self.cluster_table, self.confirm_box,
            w.HBox([self.purge_button, self.cancel_queued, self.status],
                   layout=w.Layout(align_items="center", flex_flow="row wrap")),
            self.result,
        ], layout=w.Layout(border="1px solid var(--jp-border-color1, #bbb)", padding="4px 8px",
                           max_width="100%", overflow="hidden"))
        self.widget._panel_ref = weakref.ref(self)
        self.refresh_button.on_click(self._guard(lambda _b: self.refresh()))
        self.close_button.on_click(self._guard(lambda _b: self.close()))
        self.purge_button.on_click(self._guard(self._on_purge))
        self.cancel_queued.on_click(self._guard(lambda _b: self._cancel_queued()))
        if getattr(self.widget, "comm", None) is not None:
            self.widget.comm.on_close(lambda _msg: self.close())
        self._update_title()
        self.orphan_section = OrphanSection(self, self._w)
        # what the frontend clicks or types into answers on its subshell, even during a cell
        for widget in (self.refresh_button, self.close_button, self.purge_button,
                       self.cancel_queued, q.yes, q.cancel, self.orphan_section.button,
                       self.orphan_section.question.yes, self.orphan_section.question.cancel,
                       *self.holders_table.inputs()):
            self.route.follow_widget(widget)

    def _guard(self, fn):
        """Widget callbacks never raise into the kernel: a failure is one status line."""
        return guarded(fn, self._say)

    def _say(self, text: str, error: bool = False) -> None:
        self._said_purged = False
        with self._lock:
            if not self.closed:
                self.status.value = status_html(text, error)

    def _update_title(self, devices: list | None = None) -> None:
        """The title: what the bars are (the sidebar's rule, from the devices shown; before
        the first reading, from the device asked), the device and the pace."""
        if devices is not None:
            self._title_words = _render.title_for(devices)
        words = getattr(self, "_title_words", None) or \
            ("Host memory" if self.device == "cpu" else "GPU memory")
        value = (f"<b>{words}</b> · device <code>{_render.esc(self.device)}</code>"
                 f" · bars every {self.interval:g} s · holders after each cell")
        if self.title.value != value:
            self.title.value = value

    # -- lifetime --------------------------------------------------------------------------
    def start(self) -> None:
        """Join the session's views, scan once, and subscribe to its sampling thread."""
        self.session.add_view(self)
        self._refresh_now()         # the magic's own cell, on the main thread: at once
        self._start_sampler()

    def _source(self) -> SharedSampler:
        """The sampling thread the panel subscribes to: its session's (shared with the
        watch and the sidebar)."""
        return self.session.sampler

    def _start_sampler(self) -> None:
        self.sampler = self._source().subscribe(self._tick, self.interval, name="panel",
                                                on_failure=self._sampler_failed)

    def _sampler_failed(self, failure: str) -> None:
        """In the thread as it ends: say so in the panel (never in the cell's output)."""
        self._say(f"device readings stopped: {failure}; `%gpumem panel` starts them again",
                  error=True)

    def configure(self, device: str | None = None, interval: float | None = None,
                  window: float | None = None) -> None:
        """Change what a running panel shows (``%gpumem panel`` again with options)."""
        if window is not None and window != self.window:
            self.window = float(window)
        if interval is not None and interval != self.interval:
            self.interval = float(interval)
            if self.sampler is not None and not self.sampler.stopped:
                self.sampler.interval = self.interval
            else:
                self._start_sampler()
        elif self.sampler is None or self.sampler.stopped:
            self._start_sampler()
            self._say("device readings started again")
        if window is not None or interval is not None:
            series = Series(maxlen=self._series_len())
            for t, values in self.series.points():
                series.append(t, values)
            self.series = series
        if device is not None and device != self.device:
            self.device = device
            self._refresh_now()     # the magic's own cell, on the main thread: at once
        self._update_title()

    def close(self) -> bool:
        """Stop the thread, unhook the events and close every widget; False if already closed."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
        if self.sampler is not None:
            self.sampler.stop()
        self.session.remove_view(self)
        if self.session.panel is self:
            self.session.panel = None
        _close_tree(self.widget)
        for widget in self.holders_table.close():
            _close_tree(widget)
        return True

    # -- background thread: device counters only -----------------------------------------
    def _tick(self) -> None:
        """One reading of the bars (on the sampling thread: its reading is shared with the
        thread's other subscribers that read the same devices in the same tick)."""
        if self.closed:
            return
        cpu0 = time.thread_time()
        try:
            self._read_and_show(self._source().read)
        finally:
            self.stats["ticks"] += 1
            self.stats["tick_cpu_seconds"] += time.thread_time() - cpu0

    def _read_and_show(self, read_devices) -> None:
        try:
            usages = read_devices(self.device)
            t = time.time()
            self.series.append(t, device_point(usages))
            devices = [d.to_json() for d in usages]
            point = device_point(usages)
            cells, version = self._spans()
            with self._lock:
                attributed = dict(self._attributed)
            # while a cell runs, the tracked tensors are the last scan's: from before it
            running = self.session.handoff.cell_running
            bars = _render.bars_html(devices, attributed, stale=running)
            timeline = None
            if self._timeline_due(t, point, version):
                timeline = _render.timeline_html(self.series.points(since=t - self.window),
                                                 [d["id"] for d in devices], window=self.window,
                                                 cells=cells, now=t)
        except Exception as exc:  # noqa: BLE001 - report once, keep sampling
            line = f"reading devices failed: {type(exc).__name__}: {exc}"
            if line != self._thread_error:
                self._thread_error = line
                self._say(line, error=True)
            return
        self._thread_error = None
        # traitlets sends only what changed: an idle device costs no message
        with self._lock:
            if self.closed:
                return
            self._update_title(devices)
            self._mark_stale(running)
            with self.bars.hold_sync(), self.timeline.hold_sync():
                self.bars.value = bars
                if timeline is not None:
                    self.timeline.value = timeline
                    self._drawn = (t, point, version)

    def _timeline_due(self, t: float, point: dict, version: int) -> bool:
        """Redraw when a value moved visibly, a cell began or ended, or time moved on."""
        if self._drawn is None:
            return True
        drawn_t, drawn, drawn_version = self._drawn
        if version != drawn_version or t - drawn_t >= TIMELINE_REDRAW:
            return True
        for dev, fields in point.items():
            old = drawn.get(dev) or {}
            for field, value in fields.items():
                before = old.get(field)
                if (value is None) != (before is None):
                    return True
                if value is not None and abs(value - before) > max(1 << 20, 0.005 * max(value, before)):
                    return True
        return False

    # -- main thread: cell marks, holders, purge ------------------------------------------
    def cell_spans(self) -> list[tuple[float, float | None]]:
        """The cells the timeline marks, ``(start, end)`` in unix seconds (end None while
        the cell runs), oldest first: the session's cells and the watched spans none of
        them covers."""
        return self._spans()[0]

    def _spans(self) -> tuple[list[tuple], tuple]:
        """(the cell spans, a version that moves whenever one of them does); any thread."""
        own = [tuple(c) for c in self.session.cells]
        extra = list(self._extra)
        version = (self.session.cells_version, len(extra), self._watched_until)
        if extra:
            own = sorted(own + extra, key=lambda c: c[0])
        return own, version

    def _merge_watched(self) -> None:
        """Add the watch's history newer than what was merged before (main thread)."""
        watched = _watch_cells(self.shell, after=self._watched_until)
        if not watched:
            return
        self._watched_until = max(start for start, _ in watched)
        own = [list(c) for c in self.session.cells]
        added = _uncovered(own + list(self._extra), watched)
        if added:
            with self._lock:
                self._extra.extend(added)

    def refresh(self) -> None:
        """Scan the holders and redraw table and bars, on the main thread between cells
        (the session's ``handoff``: at once from a click between cells, else queued): the
        session builds the snapshot, and every other view of the shell (the sidebar) gets
        it too."""
        if not self.closed:
            self._hand_over(self._refresh_now, "the panel's refresh")

    def _refresh_now(self) -> None:
        if self.closed:
            return
        t0 = time.perf_counter()
        try:
            self.session.refresh_now()
        except Exception as exc:  # noqa: BLE001
            self._say(f"scan failed: {type(exc).__name__}: {exc}", error=True)
            return
        self.stats["scans"] += 1
        self.stats["scan_seconds"] += time.perf_counter() - t0

    def _hand_over(self, fn, what: str) -> Any:
        """Run ``fn`` on the main thread between cells; while a cell runs say it waits and
        offer to cancel it (a click may come in on any thread: a kernel subshell's)."""
        def run() -> None:
            with self._handing:
                if self._queued is ticket_box[0]:
                    self._queued = None
                    self.cancel_queued.layout.display = "none"
            fn()

        ticket_box: list = [None]
        with self._handing:
            ticket = ticket_box[0] = self.session.handoff.submit(run, what=what)
            if ticket.queued and not ticket.done:
                previous, self._queued = self._queued, ticket
                if previous is not None:
                    previous.cancel()       # the newer request stands for the panel
                self.cancel_queued.layout.display = None
                self._say(f"{what[4:] if what.startswith('the ') else what} {QUEUED}")
        return ticket

    def _cancel_queued(self) -> None:
        with self._handing:
            ticket, self._queued = self._queued, None
            self.cancel_queued.layout.display = "none"
        if ticket is not None and ticket.cancel():
            self._say("cancelled: nothing changed")
        else:
            self._say("nothing waits to be cancelled (it ran)")

    def _mark_stale(self, running: bool) -> None:
        """Say whether the holders shown are from before the running cell (lock held)."""
        if running != self._stale:
            self._stale = running
            self.holders_title.value = STALE_TITLE if running else HOLDERS_TITLE

    def show_snapshot(self, data: dict) -> None:
        """The session's snapshot after a cell (or a purge elsewhere): show it."""
        if not self.closed:
            self.apply_snapshot(data)

    def show_error(self, text: str) -> None:
        self._say(text, error=True)

    def apply_snapshot(self, data: dict) -> None:
        """Show a PROTOCOL snapshot: holders table, bars, notes; with a ``cluster`` part,
        the workers' device bars under the local ones and the cluster's holders. A purge
        result shown goes once another purge (from any view) ran after it, or once memory
        changed (a snapshot after it whose figures differ from the first one after it)."""
        self._merge_watched()
        figures = _figures(data)
        if self._result_purges is not None and (
                self.session.purges != self._result_purges
                or (self._result_figures is not None and figures != self._result_figures)):
            self._result_purges = self._result_figures = None
            self.result.value = ""
            if self._said_purged:
                self._say("")
        elif self._result_purges is not None and self._result_figures is None:
            self._result_figures = figures
        holders = data.get("holders") or []
        attributed = {d["id"]: d.get("attributed") or 0 for d in data.get("devices") or ()}
        with self._lock:
            if self.closed:
                return
            self.snapshot = data
            self.refreshes += 1
            self._attributed = attributed
            self.holders_table.show(holders)
            self._mark_stale(bool(data.get("cell_running")))
            with self.footer.hold_sync(), self.bars.hold_sync():
                self.footer.value = _render.footer_html(data)
                self.bars.value = _render.bars_html(data.get("devices") or (), attributed)
            for widget, html in ((self.cluster_bars, _render.cluster_bars_html(data)),
                                 (self.cluster_table, _render.cluster_holders_html(data))):
                with widget.hold_sync():
                    widget.value = html
                    widget.layout.display = None if html else "none"
            self._update_purge_button()
            self._update_title(data.get("devices") or None)
        self.orphan_section.show(data)

    def _update_purge_button(self) -> None:
        """The button follows the checked set (any thread, any page)."""
        n = len(self.holders_table.checked())
        with self.purge_button.hold_sync():
            disabled = n == 0 or self.question.open
            self.purge_button.disabled = disabled
            # grey while it cannot purge, as the sidebar's; orange once it can
            self.purge_button.button_style = "" if disabled else "warning"
            self.purge_button.description = f"Purge {n} checked" if n else "Purge checked"
            self.purge_button.layout.display = "none" if self.question.open else None

    def checked(self) -> list[str]:
        """The checked names, in table order (every page)."""
        return self.holders_table.checked()

    def checkbox(self, name: str) -> Any:
        """The checkbox of the holder whose purge name (or label) is ``name`` (its page
        shown)."""
        return self.holders_table.checkbox(name)

    def _on_purge(self, _button: Any = None) -> None:
        names = self.checked()
        if not names:
            self._say("check the names to purge first")
            return
        self._hand_over(lambda: self._ask_purge(names), "the panel's purge")

    def _ask_purge(self, names: list[str]) -> None:
        """The dry run, then the question (main thread, between cells)."""
        try:
            dry = self.session.purge(names, device=self.device, dry_run=True,
                                     time_limit=self.time_limit).to_json()
        except _purge.PurgeError as exc:
            self._say(str(exc), error=True)
            return
        self.question.ask(_render.confirm_html(names, dry, notebook=notebook_of(self.shell)),
                          names)
        self._say("confirm or cancel the purge")

    def _purge_confirmed(self, names: list[str]) -> None:
        self._hand_over(lambda: self._purge_now(names), "the panel's purge")

    def _purge_now(self, names: list[str]) -> None:
        error = None
        try:
            data = self.session.purge(names, device=self.device,
                                      time_limit=self.time_limit).to_json()
        except _purge.PurgeError as exc:
            error = str(exc)
        if error is not None:
            self._say(error, error=True)
        else:
            when = time.strftime("%H:%M:%S")
            self.result.value = _render.purge_result_html(data, when)
            self._result_purges = self.session.purges
            self._result_figures = None
            self.holders_table.uncheck_names(names)
            shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10
                                             else "")
            self._say(f"purged {shown} at {when}")
            self._said_purged = True
        self._refresh_now()


def notebook_of(shell: Any) -> str | None:
    """The notebook this kernel runs for, where the server said it (``JPY_SESSION_NAME``,
    which IPython keeps as ``__session__``), else None."""
    name = os.environ.get("JPY_SESSION_NAME") or \
        (getattr(shell, "user_ns", None) or {}).get("__session__")
    return name if isinstance(name, str) and name.strip() else None


def _figures(data: dict) -> tuple:
    """What a purge result is about: each device's framework figures and each holder's
    bytes (the host's resident size, which moves all the time, left out)."""
    devices = tuple((d.get("id"), d.get("allocated"), d.get("reserved"), d.get("attributed"))
                    for d in data.get("devices") or () if isinstance(d, dict))
    holders = tuple(sorted((str(h.get("name")), h.get("total") or 0)
                           for h in data.get("holders") or () if isinstance(h, dict)))
    return devices, holders


def _close_tree(widget: Any) -> None:
    """Close a widget, its children, and its layout and style models."""
    for child in getattr(widget, "children", ()) or ():
        _close_tree(child)
    for part in ("layout", "style"):
        sub = getattr(widget, part, None)
        if sub is not None and hasattr(sub, "close"):
            sub.close()
    widget.close()


_WATCH_START = ("start", "started", "start_time", "t0", "begin")
_WATCH_END = ("end", "ended", "end_time", "t1", "finish")


def _field(entry: Any, names: tuple[str, ...]) -> float | None:
    for name in names:
        value = entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


#: how many spans starting before a watched span may cover it (spans of nested
#: ``watch()`` blocks and cells from before the session may overlap a few)
_NEAR = 4


def _uncovered(own: list[list], watched: list[list]) -> list[list]:
    """The watched spans that none of ``own`` covers, give or take half a second (a
    ``with jupyter_gpumem.watch():`` block, a cell from before the session). Each watched
    span is checked against the few spans of ``own`` that start just before it (cells
    follow one another), found by bisection: a run of cells costs no more than a cell."""
    own = sorted(own, key=lambda c: c[0])
    starts = [c[0] for c in own]
    added = []
    for start, end in watched:
        i = bisect.bisect_right(starts, start + 0.5)
        if not any(s - 0.5 <= start <= (e if e is not None else s) + 0.5
                   for s, e in own[max(i - _NEAR, 0):i]):
            added.append([start, end])
    return added


def _watch_cells(shell: Any, after: float = float("-inf")) -> list[list] | None:
    """Cell spans from %%gpuwatch's history (``start``, ``end`` in unix seconds) that
    start after ``after``: the history only grows, so each cell reads what is new."""
    try:
        history = history_for(shell) or ()
        entries = []
        for entry in reversed(history):     # newest first, up to the first one seen before
            start = _field(entry, _WATCH_START)
            if start is not None and start <= after:
                break
            entries.append((start, entry))
            if len(entries) >= 500:
                break
    except Exception:  # noqa: BLE001 - optional, never in the way
        return None
    spans = []
    for start, entry in reversed(entries):
        if start is None or start < 1e9:  # not unix seconds: cannot place it on the timeline
            return None
        spans.append([start, _field(entry, _WATCH_END)])
    return spans or None
