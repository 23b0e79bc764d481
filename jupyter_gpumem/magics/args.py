"""What every magic shares: the line splitter, the error guard and one parser for the
common options (``--device``, ``-o``)."""
from __future__ import annotations

import shlex
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from ..units import complain

DEVICE_HELP = "which devices count: auto (accelerators, else cpu), all, cpu, cuda:N"


def parser(prog: str, description: str, *, device: bool = True,
           output: str | None = "return the result object") -> MagicArgumentParser:
    """A parser for ``prog`` with the common options: ``--device`` (unless ``device`` is
    false) and ``-o`` (store true; ``output`` is its help, ``None`` leaves it out)."""
    p = MagicArgumentParser(prog=prog, description=description, add_help=False)
    if device:
        p.add_argument("--device", default=None, help=DEVICE_HELP)
    if output is not None:
        p.add_argument("-o", dest="output", action="store_true", help=output)
    return p


def split_line(line: str) -> list[str]:
    """Split a magic line on spaces, keeping quotes inside paths (``cfg['runs']``).

    A token that is quoted as a whole (``"my file.csv"``) loses its quotes.
    """
    try:
        tokens = shlex.split(line, posix=False)
    except ValueError as exc:
        raise UsageError(f"cannot parse {line!r}: {exc}") from None
    return [t[1:-1] if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"" else t for t in tokens]


def usage_errors(fn: Callable[[], Any], errors, prefix: str = "") -> Any:
    """``fn()``; its ``errors`` become a UsageError, raised once the except clause is left so
    that no frame of the scan or the plan stays alive in the traceback."""
    message = None
    try:
        return fn()
    except errors as exc:
        message = f"{prefix}{exc}"
    raise UsageError(message)


def report_errors(fn: Callable) -> Callable:
    """Never raise into the user's cell: UsageError stays, anything else is one line."""
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
            complain("", exc)
            return None
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper
