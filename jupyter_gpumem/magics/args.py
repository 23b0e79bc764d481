"""What every magic shares: the line splitter, the error guard and one parser for the
common options (``--device``, ``-o``)."""
from __future__ import annotations

import argparse
import functools
import inspect
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from ..units import complain

DEVICE_HELP = "which devices count: auto (accelerators, else cpu), all, cpu, cuda:N"
PACKAGE = Path(__file__).resolve().parents[1]


def guide(package: Path = PACKAGE) -> str:
    """Where the guide to every command and setting is: ``docs/GUIDE.md`` in a checkout
    (a clone, an editable install), else the copy the wheel carries in the package."""
    root = package.parent   # a checkout: the project's files beside the package
    if (root / "docs" / "GUIDE.md").is_file() and (root / "pyproject.toml").is_file():
        return "docs/GUIDE.md"
    packed = package / "GUIDE.md"
    return str(packed) if packed.is_file() else "docs/GUIDE.md of the project's source"


#: the pointer every --help and %gpumem? ends with
GUIDE = guide()


class HelpShown(Exception):
    """``-h``/``--help`` printed its command's help: the command stops there, and nothing
    more is said (caught by :func:`help_stops` and :func:`report_errors`)."""


def help_stops(fn: Callable) -> Callable:
    """A magic (or its awaited form) that ends quietly, returning None, once ``--help``
    has printed the help. Its frame is hidden from the tracebacks IPython shows (a cell
    magic runs the user's cell inside it)."""
    if inspect.iscoroutinefunction(fn):
        async def waiter(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # noqa: F841 - a user's cell raising shows its own frames
            try:
                return await fn(*args, **kwargs)
            except HelpShown:
                return None
        return functools.wraps(fn)(waiter)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - a user's cell raising shows its own frames
        try:
            return fn(*args, **kwargs)
        except HelpShown:
            return None
    return functools.wraps(fn)(wrapper)


class _Help(argparse.Action):
    """``-h``/``--help`` of a command: its help printed, the command not run."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show this help; nothing runs")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        text = parser.format_help()   # (IPython's form: "::" and one more % before prog)
        text = text[2:].lstrip("\n") if text.startswith("::") else text
        text = text.replace("%" + parser.prog, parser.prog, 1)
        print(text.rstrip() + f"\nEvery command and setting: {GUIDE}")
        raise HelpShown(parser.prog)


def parser(prog: str, description: str, *, device: bool = True,
           output: str | None = "return the result object") -> MagicArgumentParser:
    """A parser for ``prog`` with the common options: ``--device`` (unless ``device`` is
    false) and ``-o`` (store true; ``output`` is its help, ``None`` leaves it out)."""
    p = MagicArgumentParser(prog=prog, description=description, add_help=False)
    p.add_argument("-h", "--help", action=_Help)
    if device:
        p.add_argument("--device", default=None, help=DEVICE_HELP)
    if output is not None:
        p.add_argument("-o", dest="output", action="store_true", help=output)
    return p


def expand_line(shell: Any, line: str) -> str:
    """``$name`` and ``{expr}`` in a magic's line, expanded as IPython expands a line (in
    the frame that ran the magic: its locals in a function); a line with neither is
    returned as it is. (The magic opts out of IPython's own expansion, which copies the
    whole user namespace for every line: at 100,000 names, milliseconds a call.)"""
    if "$" not in line and "{" not in line:
        return line
    from IPython.core.interactiveshell import InteractiveShell
    target = InteractiveShell.run_line_magic.__code__
    frame, depth = sys._getframe(1), 1
    while frame is not None and frame.f_code is not target:
        frame, depth = frame.f_back, depth + 1
    if frame is None:   # not run by run_line_magic: the user's namespace alone
        return shell.var_expand(line, 0)
    # (var_expand reads the frame ``depth`` frames above this one: the one that called
    # run_line_magic, or magic() above it, as IPython counts it)
    return shell.var_expand(line, depth + frame.f_locals.get("_stack_depth", 1))


def split_line(line: str) -> list[str]:
    """Split a magic line on the spaces outside quotes and brackets, so that a path keeps
    its quotes and the spaces of its keys (``cfg['a b']``, ``globals()['my tensor']``).

    A token that is quoted as a whole (``"my file.csv"``) loses its quotes, as a shell's
    would (``shlex``); a quote left open is a UsageError. A ``#`` outside quotes and
    brackets that starts a token begins a comment: the rest of the line is not read
    (``%gpumem  # who holds what``), as in Python.
    """
    tokens: list[str] = []
    token: list[str] = []
    quote, depth, i = "", 0, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\" and i + 1 < len(line):
                token.append(line[i:i + 2])
                i += 2
                continue
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "[":
            depth += 1
        elif c == "]":
            depth = max(depth - 1, 0)
        elif c == "#" and depth == 0 and not token:
            break                                   # a comment: the rest is not read
        elif c.isspace() and depth == 0:
            if token:
                tokens.append("".join(token))
                token = []
            i += 1
            continue
        token.append(c)
        i += 1
    if quote:
        raise UsageError(f"cannot parse {line!r}: a quote ({quote}) is not closed")
    if token:
        tokens.append("".join(token))
    return [_unquoted(t) for t in tokens]


def _unquoted(token: str) -> str:
    """``"my file.csv"`` -> ``my file.csv``; a token not quoted as a whole stays."""
    if len(token) < 2 or token[0] not in "'\"" or token[-1] != token[0]:
        return token
    try:
        parts = shlex.split(token)
    except ValueError:
        return token
    return parts[0] if len(parts) == 1 else token


def usage_errors(fn: Callable[[], Any], errors, prefix: str = "") -> Any:
    """``fn()``; its ``errors`` become a UsageError, raised once the except clause is left so
    that no frame of the scan or the plan stays alive in the traceback."""
    message = None
    try:
        return fn()
    except errors as exc:   # (a message that names the option already is not prefixed again)
        text = str(exc)
        message = text if prefix and text.startswith(prefix.rstrip(": ")) else f"{prefix}{text}"
    raise UsageError(message)


def report_errors(fn: Callable) -> Callable:
    """Never raise into the user's cell: UsageError stays, anything else is one line."""
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except HelpShown:
            return None
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
            complain("", exc)
            return None
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper
