"""How a ``%%gpuwatch`` cell runs: compiled as IPython compiles it, run in the user's
namespace (with top-level ``await`` as IPython runs such a cell), and watched.

The magic (magics/watch.py) parses its arguments and hands over a
:class:`WatchedCell`; what the arguments ask to show at the end is its ``report``.
"""
from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
from typing import Any, Callable

from IPython.core.displayhook import DisplayHook
from IPython.core.error import UsageError

from ..core.scan import Root
from ..units import complain
from ..watch.frames import current_count
from ..watch.scope import Watch
from ..watch.state import state_for

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


class WatchedCell:
    """One ``%%gpuwatch`` cell: compiled and watched; it runs in between. At its end
    ``report(watch, execution_count, error=None)`` shows what the watch saw (the watch
    None where it could not start)."""

    def __init__(self, shell: Any, cell: str, *, device: str, interval: float,
                 time_limit: float, report: Callable[..., None]) -> None:
        __tracebackhide__ = True  # noqa: F841
        self.shell, self.report = shell, report
        self.number = current_count(shell) or 0
        self.statements, self.expression = _compile_cell(shell, cell, self.number)
        self.silenced = _ends_with_semicolon(cell)
        self.awaits = _is_coroutine(self.statements) or _is_coroutine(self.expression)
        self._state = state_for(shell)
        self._device, self._interval, self._time_limit = device, interval, time_limit
        self.watch: Watch | None = None

    def start(self) -> None:
        try:
            self.watch = Watch(shell=self.shell, device=self._device, interval=self._interval,
                               label=f"In [{self.number}]", report=False,
                               time_limit=self._time_limit, source="%%gpuwatch",
                               state=self._state, record=not self._footer_open()).start()
            self._state.self_reporting = self.number
        except Exception as exc:  # noqa: BLE001 - run the cell unwatched rather than not at all
            complain("%%gpuwatch could not start; the cell runs unwatched", exc)
            self.watch = None

    def _footer_open(self) -> bool:
        """Whether the ``watch on`` footer watches this cell now (it records the cell)."""
        footer = self._state.footer
        return footer is not None and footer.watch is not None

    def _report(self, error: BaseException | None = None) -> None:
        """Show the report. The cell's one record in the history is this report (source
        ``%%gpuwatch``, the wall time it shows): recorded by its watch, or, where the
        ``watch on`` footer watches the cell, handed to the footer, which records it in
        place of its own at the cell's end (with its warning, if any)."""
        w = self.watch
        handed = w is not None and self._footer_open()
        if w is not None:
            w.record = not handed
        if error is None:
            self.report(w, self.number)
        else:
            self.report(w, self.number, error=error)
        if handed and w.result is not None:
            self._state.reported = (self.number, w.result)

    def failed(self, error: BaseException) -> None:
        self._report(error)

    def done(self, value: Any) -> Any:
        w, number = self.watch, self.number
        if self.silenced:
            value = None   # a cell ending with `;` shows no value, so none goes to Out
        if w is not None and value is not None and not _quiet(self.shell):
            w.add_root(Root(f"Out[{number}]", value, hidden=True, kind="output",
                                  purge=f"Out[{number}]"))
        self._report()
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

    def run_here(self) -> Any:
        """Run it from a plain call: a cell that awaits runs with IPython's loop runner,
        where no event loop is running already."""
        __tracebackhide__ = True  # noqa: F841
        if not self.awaits:
            return self.run()
        if loop_running():
            raise UsageError("%%gpuwatch: this cell awaits, and an event loop already runs here; "
                             "run it as a cell of its own (IPython's autoawait runs it then)")
        return self.shell.loop_runner(self.run_async())

    async def run_awaited(self) -> Any:
        """Run it where IPython awaits it (a cell with top-level ``await``)."""
        __tracebackhide__ = True  # noqa: F841
        if self.awaits:
            return await self.run_async()
        return self.run()


def loop_running() -> bool:
    """Whether an event loop runs on this thread now (a cell that awaits cannot be run
    to its end from inside it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def input_transformer(name: str, rewrite: Callable[[list], "list | None"]) -> Callable:
    """An IPython input transformer (``input_transformers_cleanup``) named ``name``:
    ``rewrite(lines)`` gives the cell's new lines, or None to leave them. It never raises
    (IPython's own path then reports what is wrong), is marked as the package's, and has
    side effects, so the terminal's ``check_complete`` leaves it out (a cell magic there
    ends with a blank line, which a one-line rewrite would hide)."""
    def transform(lines: list) -> list:
        try:
            new = rewrite(lines)
        except Exception:  # noqa: BLE001 - IPython's own path then reports what is wrong
            return lines
        return lines if new is None else new

    transform.__name__ = transform.__qualname__ = name
    transform.__jupyter_gpumem__ = True
    transform.has_side_effects = True
    return transform


def install_transformer(shell: Any, transform: Callable) -> Callable[[], None]:
    """Add ``transform`` to the shell's ``input_transformers_cleanup`` (where it has
    them); what takes it out again (for the session's close)."""
    transforms = getattr(shell, "input_transformers_cleanup", None)
    if transforms is not None:
        transforms.append(transform)

    def remove() -> None:
        if transforms is not None and transform in transforms:
            transforms.remove(transform)
    return remove


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
    def rewrite(lines: list[str]) -> list[str] | None:
        if not lines or not lines[0].startswith("%%gpuwatch"):
            return None
        name, _, line = lines[0][2:].rstrip().partition(" ")
        body = "".join(lines[1:])
        if name != "gpuwatch" or not _needs_await(shell, body):
            return None
        return ["await get_ipython().magics_manager.registry['GpuMemMagics']"
                f".gpuwatch_async({line!r}, {body!r})\n"]

    return input_transformer("gpuwatch_async_cells", rewrite)


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
