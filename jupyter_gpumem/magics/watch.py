"""``%gpumem watch|history|plot`` and ``%%gpuwatch``: argument parsing over the watch model."""
from __future__ import annotations

from typing import Any

from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError

from ..core import devices as _devices
from ..watch import export as _export
from ..session import session_of
from ..settings import fmt_share, parse_share
from ..units import MissingPackage, complain
from ..views.footer import start_footer, stop_footer, traced_lines
from ..watch.result import fmt_seconds
from ..watch.scope import Watch
from ..watch.state import WatchState, state_for
from ..views.plot import show_figure
from .args import parser, split_line, usage_errors
from .watched_cell import WatchedCell, async_cells_transform, install_transformer


def _watch_parser():
    p = parser("%gpumem watch", "a one-line memory footer after every cell", output=None)
    p.add_argument("state", nargs="?", choices=["on", "off", "status"], default="status")
    p.add_argument("--warn-at", default=None, metavar="SHARE",
                   help="warn when a cell leaves a device above this share (80%% or 0.8; off)")
    p.add_argument("--auto-purge-hidden", dest="auto_purge", action="store_const", const=True,
                   default=None, help="past --warn-at, clear hidden holders and caches")
    p.add_argument("--no-auto-purge-hidden", dest="auto_purge", action="store_const", const=False)
    p.add_argument("--interval", type=float, default=None, metavar="S",
                   help="seconds between samples of the process's memory")
    return p


def magic_watch(magics, argv: list[str]) -> None:
    """``%gpumem watch on|off [--warn-at 80%] [--auto-purge-hidden] [--interval S] [--device D]``."""
    args = _watch_parser().parse_args(argv)
    interval = magics.interval(args.interval) if args.interval is not None else None
    state = state_for(magics.shell)
    if args.warn_at is not None:
        try:
            share = parse_share(args.warn_at)
        except ValueError as exc:
            raise UsageError(f"--warn-at: {exc}") from None
        magics.warn_at = None if share is None else fmt_share(share)
    if args.auto_purge is not None:
        magics.auto_purge_hidden = args.auto_purge
    if interval is not None:
        magics.sample_interval = interval
    if args.device is not None:
        state.footer_device = magics.device(args.device)
    if args.state == "on":
        magics.watch = True
        start_footer(state)
    elif args.state == "off":
        magics.watch = False
        stop_footer(state)
    print(_status(magics, state))


def _status(magics, state: WatchState) -> str:
    on = state.footer is not None
    share = magics.warn_share
    parts = [f"watch is {'on' if on else 'off'}"]
    if on:
        parts.append(f"device {state.footer_device or magics.default_device}")
        parts.append(f"warn at {fmt_share(share)}" if share is not None else "no warning threshold")
        if share is not None:
            parts.append(f"auto-purge-hidden {'on' if magics.auto_purge_hidden else 'off'}")
        failure = state.hub.failure
        parts.append(f"sampling every {fmt_seconds(magics.sample_interval)}" if not failure
                     else f"sampling stopped ({failure}); it starts again with the next cell")
    parts.append(f"{len(state.history)} cell(s) in history")
    return " · ".join(parts)


def _gpuwatch_parser():
    p = parser("%%gpuwatch", "run the cell and report what it did to memory", output=None)
    p.add_argument("-o", dest="output", default=None, metavar="NAME",
                   help="also store the result object in NAME")
    p.add_argument("--interval", type=float, default=None, metavar="S")
    p.add_argument("--plot", action="store_true", help="show the cell's memory over time")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="every exact figure and how it was measured (the report is short)")
    return p


def _gpuwatch_cell(magics, line: str, cell: str) -> WatchedCell:
    """The cell of ``%%gpuwatch`` ``line``: its arguments parsed, compiled, to run."""
    __tracebackhide__ = True  # noqa: F841
    args = _gpuwatch_parser().parse_args(split_line(line))
    if args.output is not None and not args.output.isidentifier():
        raise UsageError(f"-o needs a variable name, not {args.output!r}")
    interval = magics.interval(args.interval) if args.interval is not None \
        else magics.sample_interval
    device = magics.device(args.device)

    def report(w: Watch | None, number: int, error: BaseException | None = None) -> None:
        _finish(magics, w, args, number, error=error)

    return WatchedCell(magics.shell, cell, device=device, interval=interval,
                       time_limit=magics.scan_time_limit, report=report)


def cell_magic_gpuwatch(magics, line: str, cell: str) -> Any:
    """``%%gpuwatch [-o NAME] [--interval S] [--plot] [--device D]``: run the cell, report.

    Like ``%time``: the cell runs in the user's namespace, its last
    expression is the magic's value (shown as ``Out``), and an exception it
    raises propagates after the report. A cell with top-level ``await`` is
    turned by :func:`~.watched_cell.async_cells_transform` into an awaited call of
    :func:`cell_magic_gpuwatch_async`, so IPython runs it as any async cell;
    called some other way (``run_cell_magic``), this runs it with IPython's
    loop runner where no event loop is running already.
    """
    __tracebackhide__ = True  # noqa: F841
    return _gpuwatch_cell(magics, line, cell).run_here()


async def cell_magic_gpuwatch_async(magics, line: str, cell: str) -> Any:
    """``%%gpuwatch`` over a cell with top-level ``await``; IPython awaits it."""
    __tracebackhide__ = True  # noqa: F841
    return await _gpuwatch_cell(magics, line, cell).run_awaited()


def _finish(magics, w: Watch | None, args, number: int, error: BaseException | None = None) -> None:
    if w is None:
        return
    try:
        result = w.stop(error=error, execution_count=number)
        if result is None:
            return
        lines = traced_lines(number)
        if lines:
            result.messages.append(lines)
        result.verbose = args.verbose
        magics.show(result, False)
        if args.output:
            magics.shell.user_ns[args.output] = result
        if args.plot:
            show_figure([result], state_for(magics.shell).series.points(result.start - 0.5),
                        rich=_shows_images(magics.shell),
                        where="%gpumem plot --save FILE saves the session's plot where you choose")
    except MissingPackage as exc:   # the report stands; the plot's package is named
        complain(f"%%gpuwatch --plot: {exc}")
    except Exception as exc:  # noqa: BLE001
        complain("%%gpuwatch report failed", exc)


def _history_parser():
    p = parser("%gpumem history", "the per-cell records kept while watching", device=False,
               output="return the records")
    p.add_argument("--save", default=None, metavar="FILE", help="write CSV or JSON (by extension)")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="write per-cell scalars")
    p.add_argument("--last", type=int, default=None, metavar="N")
    p.add_argument("--clear", action="store_true", help="forget the records")
    return p


def _last_records(state: WatchState, last: int | None) -> list:
    """The per-cell records kept, or the last ``last`` of them (``--last N``)."""
    records = list(state.history)
    if last is None:
        return records
    if last < 1:
        raise UsageError("--last needs a positive number")
    return records[-last:]


def magic_history(magics, argv: list[str]) -> Any:
    """``%gpumem history [--save FILE] [--tensorboard DIR] [--last N] [--clear] [-o]``."""
    args = _history_parser().parse_args(argv)
    state = state_for(magics.shell)
    records = _last_records(state, args.last)
    done = False
    if args.save:
        n = usage_errors(lambda: _export.save(records, args.save), (ValueError, OSError),
                         "--save: ")
        print(f"wrote {n} record(s) to {args.save}")
        done = True
    if args.tensorboard:
        n = usage_errors(lambda: _export.tensorboard(records, args.tensorboard),
                         (ImportError, ValueError, OSError), "--tensorboard: ")
        print(f"wrote {n} scalar(s) for {len(records)} cell(s) to {args.tensorboard}")
        done = True
    if args.clear:
        state.history.clear()
        print("history cleared")
        done = True
    table = _export.HistoryTable(records)
    if args.output:
        return magics.show(table, True) if not done else table
    if not done:
        magics.show(table, False)
    return None


def _plot_parser():
    p = parser("%gpumem plot", "memory over time, cell boundaries marked",
               output="return the Figure")
    p.add_argument("--last", type=int, default=None, metavar="N")
    p.add_argument("--save", default=None, metavar="FILE")
    return p


def magic_plot(magics, argv: list[str]) -> Any:
    """``%gpumem plot [--last N] [--device D] [--save FILE] [-o]``."""
    args = _plot_parser().parse_args(argv)
    state = state_for(magics.shell)
    records = _last_records(state, args.last)
    if not records:
        raise UsageError("nothing to plot yet: run `%gpumem watch on` or a `%%gpuwatch` cell first")
    devices = None
    if args.device is not None:
        devices = _devices.selected_ids(magics.device(args.device))
    points = state.series.points(records[0].start - 0.5)
    try:
        fig = show_figure(records, points, devices=devices, save=args.save,
                          rich=_shows_images(magics.shell))
    except ImportError as exc:
        raise UsageError(str(exc) if isinstance(exc, MissingPackage)
                         else f"plotting needs matplotlib: {exc}") from None
    except (ValueError, OSError) as exc:
        raise UsageError(f"--save: {exc}") from None
    return fig if args.output else None


def _shows_images(shell: Any) -> bool:
    """Whether the frontend displays images: a kernel's does (its display publisher sends
    them to the frontend); a terminal's or a plain shell's prints their text instead."""
    if getattr(shell, "kernel", None) is not None:
        return True
    return type(getattr(shell, "display_pub", None)) not in (DisplayPublisher, type(None)) \
        and type(shell).__name__ != "TerminalInteractiveShell"


# -- loading -----------------------------------------------------------------------------
def on_load(ip, magics) -> None:
    """Called by ``%load_ext``: start the footer if configured; what it added goes when
    the session closes."""
    state = state_for(ip)

    def on_watch_trait(change) -> None:
        if change["new"]:
            start_footer(state)
        else:
            stop_footer(state)

    magics.observe(on_watch_trait, names="watch")
    if magics.watch:
        start_footer(state)
    remove_transformer = install_transformer(ip, async_cells_transform(ip))

    def cleanup() -> None:
        remove_transformer()
        try:
            magics.unobserve(on_watch_trait, names="watch")
        except ValueError:
            pass

    session_of(ip).on_close(cleanup)      # the watch state closes with the session
