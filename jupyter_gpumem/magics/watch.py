"""``%gpumem watch|history|plot`` and ``%%gpuwatch``: argument parsing over the watch model."""
from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
from typing import Any

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError

from ..core import devices as _devices
from ..core.scan import Root
from ..watch import export as _export
from ..session import session_of
from ..settings import fmt_share, parse_share
from ..units import MissingPackage, complain
from ..watch.footer import start_footer, stop_footer, traced_lines
from ..watch.frames import current_count
from ..watch.result import fmt_seconds
from ..watch.scope import Watch
from ..watch.state import WatchState, state_for
from ..views.plot import show_figure
from .args import parser, split_line, usage_errors

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


_TOP_LEVEL_AWAIT = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)


def _is_coroutine(code) -> bool:
    return code is not None and bool(code.co_flags & inspect.CO_COROUTINE)


def _compile_cell(shell, cell: str, number: int):
    """The cell as IPython would run it: (statements, last expression or None).

    With IPython's autoawait on, top-level ``await`` compiles as IPython
    compiles it; such code objects are coroutine code (see :func:`_is_coroutine`).
    """
    __tracebackhide__ = True  # noqa: F841 - a SyntaxError shows the cell, not this frame
    transformed = shell.transform_cell(cell)
    tree = shell.compile.ast_parse(transformed)
    tree = shell.transform_ast(tree)
    name = shell.compile.cache(transformed, number, raw_code=cell)
    body, last = list(tree.body), None
    if body and isinstance(body[-1], ast.Expr):
        last = body.pop()
    flags = _TOP_LEVEL_AWAIT if getattr(shell, "autoawait", False) else 0
    extra = getattr(shell.compile, "extra_flags", None)
    with (extra(flags) if flags and extra is not None else contextlib.nullcontext()):
        statements = shell.compile(ast.Module(body, []), name, "exec")
        expression = shell.compile(ast.Expression(last.value), name, "eval") if last else None
    return statements, expression


def _run_compiled(shell, statements, expression):
    __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of tracebacks
    exec(statements, shell.user_global_ns, shell.user_ns)
    if expression is not None:
        return eval(expression, shell.user_global_ns, shell.user_ns)
    return None


async def _run_compiled_async(shell, statements, expression):
    """As IPython's ``run_code`` runs a cell with top-level ``await``."""
    __tracebackhide__ = True  # noqa: F841
    if _is_coroutine(statements):
        await eval(statements, shell.user_global_ns, shell.user_ns)
    else:
        exec(statements, shell.user_global_ns, shell.user_ns)
    if expression is None:
        return None
    value = eval(expression, shell.user_global_ns, shell.user_ns)
    if _is_coroutine(expression):
        value = await value
    return value


class _GpuwatchCell:
    """One ``%%gpuwatch`` cell: parsed, compiled and watched; it runs in between."""

    def __init__(self, magics, line: str, cell: str) -> None:
        __tracebackhide__ = True  # noqa: F841
        args = _gpuwatch_parser().parse_args(split_line(line))
        if args.output is not None and not args.output.isidentifier():
            raise UsageError(f"-o needs a variable name, not {args.output!r}")
        interval = magics.interval(args.interval) if args.interval is not None \
            else magics.sample_interval
        device = magics.device(args.device)
        shell = self.shell = magics.shell
        self.magics, self.args = magics, args
        self.number = current_count(shell) or 0
        self.statements, self.expression = _compile_cell(shell, cell, self.number)
        self.silenced = _ends_with_semicolon(cell)
        self.awaits = _is_coroutine(self.statements) or _is_coroutine(self.expression)
        state = state_for(shell)
        footer_open = state.footer is not None and state.footer.watch is not None
        self._state = state
        self._record = not footer_open
        self._device, self._interval = device, interval
        self.watch: Watch | None = None

    def start(self) -> None:
        try:
            self.watch = Watch(shell=self.shell, device=self._device, interval=self._interval,
                               label=f"In [{self.number}]", report=False,
                               time_limit=self.magics.scan_time_limit, source="%%gpuwatch",
                               state=self._state, record=self._record).start()
        except Exception as exc:  # noqa: BLE001 - run the cell unwatched rather than not at all
            complain("%%gpuwatch could not start; the cell runs unwatched", exc)
            self.watch = None

    def failed(self, error: BaseException) -> None:
        _finish(self.magics, self.watch, self.args, self.number, error=error)

    def done(self, value: Any) -> Any:
        w, number = self.watch, self.number
        if self.silenced:
            value = None   # a cell ending with `;` shows no value, so none goes to Out
        if w is not None and value is not None and not _quiet(self.shell):
            w.add_root(Root(f"Out[{number}]", value, hidden=True, kind="output",
                                  purge=f"Out[{number}]"))
        _finish(self.magics, w, self.args, number)
        return value

    def run(self) -> Any:
        __tracebackhide__ = True  # noqa: F841
        self.start()
        try:
            value = _run_compiled(self.shell, self.statements, self.expression)
        except BaseException as exc:
            self.failed(exc)
            raise
        return self.done(value)

    async def run_async(self) -> Any:
        __tracebackhide__ = True  # noqa: F841
        self.start()
        try:
            value = await _run_compiled_async(self.shell, self.statements, self.expression)
        except BaseException as exc:
            self.failed(exc)
            raise
        return self.done(value)


def cell_magic_gpuwatch(magics, line: str, cell: str) -> Any:
    """``%%gpuwatch [-o NAME] [--interval S] [--plot] [--device D]``: run the cell, report.

    Like ``%time``: the cell runs in the user's namespace, its last
    expression is the magic's value (shown as ``Out``), and an exception it
    raises propagates after the report. A cell with top-level ``await`` is
    turned by :func:`async_cells_transform` into an awaited call of
    :func:`cell_magic_gpuwatch_async`, so IPython runs it as any async cell;
    called some other way (``run_cell_magic``), this runs it with IPython's
    loop runner where no event loop is running already.
    """
    __tracebackhide__ = True  # noqa: F841
    run = _GpuwatchCell(magics, line, cell)
    if not run.awaits:
        return run.run()
    if _loop_running():
        raise UsageError("%%gpuwatch: this cell awaits, and an event loop already runs here; "
                         "run it as a cell of its own (IPython's autoawait runs it then)")
    return magics.shell.loop_runner(run.run_async())


async def cell_magic_gpuwatch_async(magics, line: str, cell: str) -> Any:
    """``%%gpuwatch`` over a cell with top-level ``await``; IPython awaits it."""
    __tracebackhide__ = True  # noqa: F841
    run = _GpuwatchCell(magics, line, cell)
    if run.awaits:
        return await run.run_async()
    return run.run()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _needs_await(shell, cell: str) -> bool:
    """Whether IPython would run ``cell`` as a coroutine (top-level ``await``)."""
    if not getattr(shell, "autoawait", False) or not _TOP_LEVEL_AWAIT:
        return False
    try:
        code = compile(shell.transform_cell(cell), "<gpuwatch>", "exec", flags=_TOP_LEVEL_AWAIT,
                       dont_inherit=True)
    except Exception:  # noqa: BLE001 - not valid code: the magic reports it as IPython would
        return False
    return _is_coroutine(code)


def async_cells_transform(shell):
    """An input transformer (``input_transformers_cleanup``) for ``%%gpuwatch`` cells that
    await: the cell becomes one awaited call, so IPython (and ipykernel, inside its own
    event loop) sees a cell with top-level ``await`` and runs it as it runs any such cell.
    Other cells pass unchanged; this never raises."""
    def gpuwatch_async_cells(lines: list[str]) -> list[str]:
        try:
            if not lines or not lines[0].startswith("%%gpuwatch"):
                return lines
            name, _, line = lines[0][2:].rstrip().partition(" ")
            body = "".join(lines[1:])
            if name != "gpuwatch" or not _needs_await(shell, body):
                return lines
            return ["await get_ipython().magics_manager.registry['GpuMemMagics']"
                    f".gpuwatch_async({line!r}, {body!r})\n"]
        except Exception:  # noqa: BLE001 - IPython's own path then reports what is wrong
            return lines

    gpuwatch_async_cells.__jupyter_gpumem__ = True
    # check_complete (the terminal's "is the cell finished?") leaves it out: a cell magic
    # there ends with a blank line, which this one-line rewrite would hide
    gpuwatch_async_cells.has_side_effects = True
    return gpuwatch_async_cells


def _ends_with_semicolon(cell: str) -> bool:
    """Whether the cell's last token is ``;`` (IPython then shows no value)."""
    try:
        return bool(DisplayHook.semicolon_at_end_of_expression(cell))
    except Exception:  # noqa: BLE001 - not valid code: the run reports it
        return False


def _quiet(shell) -> bool:
    try:
        return bool(shell.displayhook.quiet())
    except Exception:  # noqa: BLE001
        return False


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
                        rich=_shows_images(magics.shell))
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
    transforms = getattr(ip, "input_transformers_cleanup", None)
    transform = async_cells_transform(ip)
    if transforms is not None:
        transforms.append(transform)

    def cleanup() -> None:
        if transforms is not None and transform in transforms:
            transforms.remove(transform)
        try:
            magics.unobserve(on_watch_trait, names="watch")
        except ValueError:
            pass

    session_of(ip).on_close(cleanup)      # the watch state closes with the session
