"""``%gpumem tame``: argument parsing over :mod:`..backends.tame`, and the ``tame`` setting."""
from __future__ import annotations

import os
import sys

from IPython.core.error import UsageError

from ..backends.tame import USAGE, TameResult, settings, status, tame, untame


def _print(result: TameResult) -> None:
    for line in result.lines():
        print(line)
    for text in result.warnings:
        print(f"jupyter_gpumem: warning: {text}", file=sys.stderr)


def magic_tame(magics, argv: list[str]) -> TameResult | None:
    """``%gpumem tame [--give-back] | off | status``."""
    args = [a for a in argv if a != "-o"]
    output = len(args) != len(argv)
    if args == ["status"]:
        result = TameResult(frameworks=status())
        result.changed = {k: os.environ.get(k) for k in settings(give_back=True)}
    elif args == ["off"]:
        result = untame()
    elif args in ([], ["--give-back"]):
        result = tame(give_back=bool(args))
    else:
        raise UsageError(f"unknown arguments {' '.join(args)!r}: {USAGE}")
    _print(result)
    return result if output else None


def on_load(ip, magics) -> None:
    """On ``%load_ext``: tame when ``GpuMemMagics.tame`` is set; follow later changes."""
    def apply(change=None) -> None:
        if magics.tame:
            result = tame()
            for text in result.warnings:
                print(f"jupyter_gpumem: warning: {text}", file=sys.stderr)

    apply()
    magics.observe(apply, names="tame")
    magics.add_cleanup(lambda: magics.unobserve(apply, names="tame"))
