"""``%gpumem watch on``: the one-line footer after every cell, its warning and auto-purge.

Its face: :func:`start_footer` / :func:`stop_footer` (on a shell's
:class:`~jupyter_gpumem.watch.state.WatchState`), :func:`traced_lines`, :func:`is_own_command`. The
footer follows the shell's cells through its session's one pairing of the cell
events (:meth:`Session.follow_cells`) and reads the user's settings from the
session (no IPython import: the shell is passed in).
"""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

from ..core import trace as _trace
from ..core.render import fmt_bytes
from ..session import purge
from ..settings import fmt_share
from ..units import complain
from ..watch.frames import current_count
from ..watch.peaks import LEDGER
from ..watch.result import HOLDERS_NAMED, WatchResult
from ..watch.scope import Watch
from ..watch.state import WatchState

#: a line that runs one of the product's own commands: ``%gpumem ...``, ``r = %gpumem -o``
_OWN_LINE = re.compile(r"\s*(?:[A-Za-z_]\w*\s*=\s*)?%gpumem(?:\s|$)")


_WATCHED_CELL = re.compile(r"\s*%%gpuwatch(?:\s|$)")


def reports_itself(cell: Any) -> bool:
    """Whether ``cell`` (its raw text) is a ``%%gpuwatch`` cell: its own report is the
    cell's one report, so the footer adds no line of its own (a warning or an automatic
    purge aside, which only the footer makes) where the cell's watch started
    (``WatchState.self_reporting``); the cell's record is that report
    (``WatchState.reported``: source ``%%gpuwatch``, its wall time), which the footer
    records in place of its own."""
    return type(cell) is str and bool(_WATCHED_CELL.match(cell))


def is_own_command(cell: Any) -> bool:
    """Whether ``cell`` (its raw text) only runs the product's own ``%gpumem`` commands
    (comments and blank lines aside): such a cell reports for itself, so it gets no footer
    line, and its readings are no cell of the user's (no record: the plot leaves it out)."""
    if type(cell) is not str:
        return False
    lines = [ln for ln in cell.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return bool(lines) and all(_OWN_LINE.match(ln) for ln in lines)


_UNSET = object()

#: the settings (traits of ``GpuMemSettings``) the footer reads every cell; ``warn_at``
#: is read as its parsed form, ``warn_share``
FOOTER_SETTINGS = ("default_device", "sample_interval", "scan_time_limit", "warn_at",
                   "auto_purge_hidden")

#: seconds after a cell's end within which the next cell (run-all, a queue of cells)
#: starts from that end's readings instead of reading the devices and the names again:
#: what happens in between (a reply sent, the next request read) counts for that cell
ARM_TTL = 0.05


def _patch(obj: Any, name: str, make) -> tuple | None:
    """Set ``obj.name = make(current)`` on the instance; (obj, name, previous, patched) or None
    where the instance takes no attribute (a C-level stream such as a terminal's stdout)."""
    try:
        previous = vars(obj).get(name, _UNSET)
        current = getattr(obj, name)
        patched = make(current)
        setattr(obj, name, patched)
    except Exception:  # noqa: BLE001
        return None
    return obj, name, previous, patched


def _unpatch(patch: tuple | None) -> None:
    """Undo :func:`_patch` unless someone patched over it since (then ours stays, inert)."""
    if patch is None:
        return
    obj, name, previous, patched = patch
    try:
        if vars(obj).get(name, _UNSET) is not patched:
            return
        if previous is _UNSET:
            delattr(obj, name)
        else:
            setattr(obj, name, previous)
    except Exception:  # noqa: BLE001
        pass


class _OpenLine:
    """Whether a cell's output left the cursor in the middle of a line (``print('x', end='')``),
    and whether the cell wrote to stdout or stderr at all.

    From each cell's :meth:`begin` to its :meth:`end` it wraps ``write`` of
    ``sys.stdout`` and ``sys.stderr`` on the instance, as IPython's own
    ``run_cell`` does to keep a cell's output (and IPython, putting its own back
    at the cell's end, takes ours away with it: :meth:`begin` wraps again where
    ours is gone), and notes whether the last text ended with a newline; a
    display (its own output area in a notebook, its own lines in a terminal)
    ends the line too. The display's wrappers stay while the footer is on (they
    only pass the call on between cells). Where a stream takes no attribute it
    knows nothing and says no (and that the cell may have written).
    """

    def __init__(self, shell: Any) -> None:
        self.open = False
        self.active = False
        #: whether the cell wrote to stdout or stderr (text a kernel may hold unsent)
        self.wrote = False
        self.stream, self.errors = sys.stdout, sys.stderr
        #: (stream, its patch, or False where it refused one) for stdout, then stderr
        self._streams = [[self.stream, None, self._write]]
        if self.errors is not None and self.errors is not self.stream:
            self._streams.append([self.errors, None, self._wrote])
        self._patches = []
        for owner, name in ((getattr(shell, "display_pub", None), "publish"),
                            (getattr(shell, "displayhook", None), "finish_displayhook")):
            if owner is not None:
                self._patches.append(_patch(owner, name, self._ends_line))

    def _write(self, original):
        def write(data, *args, **kwargs):
            result = original(data, *args, **kwargs)
            if self.active and isinstance(data, str) and data:
                self.open = not data.endswith("\n")
                self.wrote = True
            return result
        return write

    def _wrote(self, original):
        def write(*args, **kwargs):
            if self.active:
                self.wrote = True
            return original(*args, **kwargs)
        return write

    def _ends_line(self, original):
        def call(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                if self.active:
                    self.open = False
        return call

    def begin(self) -> None:
        """A cell starts: nothing written yet; the streams' wrappers in place."""
        self.open = self.wrote = False
        for entry in self._streams:
            stream, patch, make = entry
            if patch is False:
                continue
            try:
                if patch is not None and vars(stream).get("write") is patch[3]:
                    continue
            except TypeError:   # no instance dict
                entry[1] = False
                continue
            entry[1] = _patch(stream, "write", make) or False
        self.active = True

    def end(self) -> tuple[bool, bool]:
        """The cell ended: (whether the footer needs a newline first, whether the cell may
        have written text a kernel holds unsent)."""
        self.active = False
        same = self.fits()
        seen = [entry[1] for entry in self._streams]
        return (self.open and same and bool(seen[0]),
                self.wrote or not (same and all(seen)))

    def fits(self) -> bool:
        """Whether it still watches the streams the cell writes to."""
        return sys.stdout is self.stream and sys.stderr is self.errors

    def remove(self) -> None:
        self.active = False
        patches = [entry[1] or None for entry in self._streams] + self._patches
        self._streams, self._patches = [], []
        for patch in reversed(patches):
            _unpatch(patch)


class _FooterCell:
    """What the footer keeps for one outermost cell: its watch and its output's last line."""

    def __init__(self, watch: Watch | None, line: _OpenLine | None,
                 quiet: bool = False) -> None:
        self.watch = watch
        self.line = line
        self.quiet = quiet          # a %%gpuwatch cell: it reports for itself

    def abandon(self) -> None:
        line, self.line = self.line, None
        if line is not None:
            line.active = False
        w, self.watch = self.watch, None
        if w is not None:
            w.abandon()


class _Footer:
    """``%gpumem watch on`` for one shell: a :class:`Watch` per outer cell and its line.

    It follows the outer cells through the session's pairing of the cell events
    (:class:`~jupyter_gpumem.dispatch.CellFollower`): a cell run from inside a cell
    counts in its outer cell, and a "pre" or "post" without its partner never turns
    the footer off.
    """

    def __init__(self, state: WatchState) -> None:
        self.state = state
        self.session = state.session
        self._pre_cost = 0.0
        #: the cells' output watcher, made at the first cell and kept while the footer is on
        #: (a new one when the cell's ``sys.stdout`` is another stream)
        self._line: _OpenLine | None = None
        #: (when, purges so far, the last cell's ``Watch.end``): a cell that starts within
        #: ARM_TTL of the last one's end, no purge between, starts from that end
        self._armed: tuple | None = None
        #: (the settings, those the footer reads) until one of them changes
        self._kept: tuple | None = None
        self._observed: Any = None      # the settings it observes
        #: the line waiting for the kernel's flush of ``sys.stderr``: at most one (the
        #: stream's patch, as :func:`_patch` gives it, and what hands the line over)
        self._pending: list = []

    # -- on and off --------------------------------------------------------------------------
    def start(self) -> None:
        self.session.follow_cells(self)
        self.state.hub.hold()
        LEDGER.hold()
        self._seed()

    def close(self) -> None:
        """Off: no more cells followed; what the running cells kept let go."""
        self.send_pending()
        self._unobserve()
        for payload in self.session.unfollow_cells(self):
            payload.abandon()
        line, self._line = self._line, None
        if line is not None:
            line.remove()
        self.state.hub.release()
        LEDGER.release()

    def _seed(self) -> None:
        """Scan every holder once now, so the first watched cell's footer need not."""
        try:
            settings = self.settings()
            w = Watch(shell=self.state.shell, device=self.state.footer_device or
                      settings["default_device"], report=False, state=self.state,
                      record=False, time_limit=settings["scan_time_limit"])
            w.scan_holders(force_full=not self.state.tracker.seeded)
        except Exception as exc:  # noqa: BLE001
            complain("could not scan the holders", exc)

    # -- settings ----------------------------------------------------------------------------
    def _take_armed(self) -> tuple | None:
        armed, self._armed = self._armed, None
        if armed is None or time.perf_counter() - armed[0] > ARM_TTL \
                or armed[1] != self.session.purges:
            return None
        return armed[2]

    def settings(self) -> dict:
        """The settings the footer reads every cell (``FOOTER_SETTINGS``): read once, and
        again after one of them changes (traitlets tells; reading a trait costs more than
        anything else the footer reads)."""
        settings = self.state.settings
        kept = self._kept
        if kept is not None and kept[0] is settings:
            return kept[1]
        values = {name: getattr(settings, name) for name in FOOTER_SETTINGS}
        values["warn_share"] = settings.warn_share
        if self._observed is not settings:
            self._unobserve()
            settings.observe(self._forget, names=list(FOOTER_SETTINGS))
            self._observed = settings
        self._kept = (settings, values)
        return values

    def _forget(self, change: Any = None) -> None:
        self._kept = None

    def _unobserve(self) -> None:
        settings, self._observed, self._kept = self._observed, None, None
        if settings is not None:
            try:
                settings.unobserve(self._forget, names=list(FOOTER_SETTINGS))
            except Exception:  # noqa: BLE001
                pass

    # -- cells -------------------------------------------------------------------------------
    @property
    def watch(self) -> Watch | None:
        """The watch of the outermost cell running now, if any."""
        payload = self.session.kept_by(self)
        return payload.watch if payload is not None else None

    def cell_lost(self, payload: _FooterCell) -> None:
        payload.abandon()       # its "post" never came: no footer to print now

    def cell_began(self, info=None) -> _FooterCell:
        t = time.perf_counter()
        self.send_pending()      # the last cell's footer, if no flush has sent it yet
        if is_own_command(getattr(info, "raw_cell", None)):
            return _FooterCell(None, None)   # it reports for itself
        shell = self.state.shell
        w = line = None
        try:
            count = current_count(shell)
            settings = self.settings()
            device = self.state.footer_device or settings["default_device"]
            w = Watch(shell=shell, device=device,
                      interval=settings["sample_interval"],
                      label=f"In [{count}]", report=False,
                      time_limit=settings["scan_time_limit"],
                      source="watch on", state=self.state, record=True
                      ).start(self._take_armed())
            line = self._line
            if line is None or not line.fits():
                if line is not None:
                    line.remove()
                line = self._line = _OpenLine(shell)
            line.begin()
        except Exception as exc:  # noqa: BLE001 - never in the user's way
            complain("watch footer failed", exc)
        self._pre_cost = time.perf_counter() - t
        return _FooterCell(w, line, reports_itself(getattr(info, "raw_cell", None)))

    def cell_ended(self, payload: _FooterCell, result=None) -> None:
        line, payload.line = payload.line, None
        w, payload.watch = payload.watch, None
        newline, wrote = False, True    # unknown: as if the cell had written
        if line is not None:
            newline, wrote = line.end()
        count = getattr(result, "execution_count", None)
        own = self._own_report(payload, count)
        if w is None:
            if own is not None:
                self.state.record(own)
            return
        t = time.perf_counter()
        try:
            error = getattr(result, "error_in_exec", None)
            if own is not None:
                w.record = False     # the cell's %%gpuwatch report is its record
            r = w.stop(error=error, execution_count=count)
            # the exception keeps the failed cell's frames alive: drop it before an
            # automatic purge, which must find that memory unreferenced
            error = result = None
            if r is not None:
                if count is not None:
                    r.label = f"In [{count}]"
                self._thresholds(w, r)
                # a %%gpuwatch cell whose own watch started reports for itself
                quiet = payload.quiet and count is not None and \
                    self.state.self_reporting == count
                text = r.footer(summary=not quiet)
                lines = traced_lines(count)
                if lines:
                    text += ("\n" if text else "") + lines
                if text:
                    self._emit(("\n" if newline else "") + text + "\n", wrote)
                if w.end is not None and r.auto_purge is None:
                    self._armed = (time.perf_counter(), self.session.purges, w.end)
                if own is not None:
                    # what only the footer adds goes with the record
                    own.warning = own.warning or r.warning
                    own.auto_purge = own.auto_purge or r.auto_purge
        except Exception as exc:  # noqa: BLE001
            complain("watch footer failed", exc)
        finally:
            if own is not None:
                self.state.record(own)
        self.state.costs.append(self._pre_cost + time.perf_counter() - t)

    def _own_report(self, payload: _FooterCell, count: Any) -> WatchResult | None:
        """The ``%%gpuwatch`` report of this cell, where the cell is one (it reports for
        itself) and its watch handed its result over; taken (once)."""
        handed, self.state.reported = self.state.reported, None
        if handed is None or not payload.quiet or count is None or handed[0] != count:
            return None
        return handed[1]

    def _thresholds(self, w: Watch, r: WatchResult) -> None:
        settings = self.settings()
        share = settings["warn_share"]
        if share is None:
            return
        full = [d for d in r.devices if d.share_after is not None and d.share_after >= share]
        if not full:
            return
        ids = [d.id for d in full]
        if not r.holders:
            w.name_holders(r, ids)
        worst = max(full, key=lambda d: d.share_after)
        used = worst.used_all_after if worst.used_all_after is not None else worst.reserved_after
        names = ", ".join(f"{h.name} {fmt_bytes(h.nbytes)}" + (" (hidden)" if h.hidden else "")
                          for h in r.holders[:HOLDERS_NAMED]) or "no name holds memory there"
        r.warning = (f"warning: {worst.id} is {worst.share_after:.0%} full ({fmt_bytes(used)} of "
                     f"{fmt_bytes(worst.total)}) after this cell, above {fmt_share(share)}; "
                     f"purge candidates: {names}"
                     + (f" → {r.purge_text(HOLDERS_NAMED)}" if r.purge_command else ""))
        if settings["auto_purge_hidden"]:
            removed: list[str] = []
            freed: dict[str, int | None] = {}
            for dev in ids:
                res = purge(shell=self.state.shell, device=dev,
                            time_limit=settings["scan_time_limit"])
                removed += [n for n in res.removed if n not in removed]
                freed.update({k: v for k, v in res.freed.items() if k == dev})
            r.auto_purge = {"removed": removed, "freed": freed}

    # -- the line out ------------------------------------------------------------------------
    def _emit(self, text: str, wrote: bool) -> None:
        """Write the footer to ``sys.stdout``. In a kernel it goes out as a stream message
        of its own, built and sent on the kernel's I/O thread as the stream's own text is,
        and handed to that thread once the kernel has flushed the cell's text
        (``sys.stderr``'s next flush, which the kernel makes before the cell's reply): so
        it comes after the cell's text on both streams and before the kernel says it is
        idle, and the kernel's main thread, which waits for its flushes, does not wait for
        the footer's message too. Written to the stream instead, it would wake that
        thread once more and have it build the message while the cell's reply waits."""
        out = sys.stdout
        if out is None:
            return
        self.send_pending()      # a footer still waiting (its flush never came) goes first
        kernel_io = sys.modules.get("ipykernel.iostream")
        stream_type = getattr(kernel_io, "OutStream", None)
        try:
            direct = (stream_type is not None and isinstance(out, stream_type)
                      and getattr(out, "name", None) == "stdout"
                      # hooks that see (or take) its messages, registered on the stream
                      and not getattr(out, "_hooks", ())
                      and getattr(out, "echo", None) is None
                      and getattr(out.session, "pid", None) == os.getpid())
            if direct:
                session, thread, topic = out.session, out.pub_thread, out.topic
                socket, parent = thread.socket, out.parent_header
        except Exception:  # noqa: BLE001 - not the stream we know: write to it
            direct = False
        if not direct:
            out.write(text)   # one write, not print's two (text, then end)
            return
        content = {"name": "stdout", "text": text}

        def send() -> None:   # on the I/O thread, the socket's own
            try:
                session.send(socket, "stream", content, parent=parent, ident=topic)
            except Exception as exc:  # noqa: BLE001 - never stop the kernel's I/O thread
                print("jupyter_gpumem: the footer could not be sent: "
                      f"{type(exc).__name__}: {exc}", file=sys.__stderr__)

        def hand_over() -> None:
            try:
                thread.schedule(send)
            except Exception:  # noqa: BLE001 - the stream's own way, then
                out.write(text)

        errors = sys.stderr
        if isinstance(errors, stream_type) and self._after_next_flush(errors, hand_over):
            return
        if wrote:
            for stream in (out, errors):
                if stream is not None:
                    stream.flush()
        hand_over()

    def _after_next_flush(self, stream: Any, then) -> bool:
        """Call ``then()`` right after the next ``stream.flush()`` (once: the stream's own
        ``flush`` is back as soon as it is called); False where the stream takes no patch."""
        def make(original):
            def flush(*args, **kwargs):
                try:
                    return original(*args, **kwargs)
                finally:
                    self.send_pending()
            return flush

        patch = _patch(stream, "flush", make)
        if patch is None:
            return False
        self._pending.append((patch, then))
        return True

    def send_pending(self) -> None:
        """Hand over a footer that waits for a flush now (it is due, or the footer stops);
        any thread (a thread of the user's may flush the stream first): one of them takes
        it."""
        try:
            patch, then = self._pending.pop()
        except IndexError:
            return
        _unpatch(patch)
        then()


def start_footer(state: WatchState) -> None:
    """``watch on`` for the shell of ``state`` (one with a session); nothing if it is on."""
    if state.footer is not None:
        return
    footer = _Footer(state)
    state.footer = footer
    footer.start()


def stop_footer(state: WatchState) -> None:
    """``watch off``: the footer leaves the shell's cells, its sampling and patches go."""
    footer, state.footer = state.footer, None
    if footer is not None:
        footer.close()


def traced_lines(count: int | None) -> str | None:
    """While ``%gpumem trace`` is on: the lines of cell ``count`` that allocated the most,
    and the line at its peak, in one line."""
    if count is None or not _trace.is_on():
        return None
    try:
        return _trace.cell_lines(count).text() or None
    except Exception as exc:  # noqa: BLE001 - the footer stands without it
        return f"allocation sites unknown: {type(exc).__name__}: {exc}"
