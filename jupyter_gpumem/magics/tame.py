"""``%gpumem tame``: argument parsing over :mod:`..backends.tame`, and the ``tame`` setting."""
from __future__ import annotations

import os
import sys

from IPython.core.error import UsageError

from ..backends.tame import USAGE, TameResult, settings, status, tame, untame
from ..session import session_of
from .args import parser


def _parser():
    p = parser("%gpumem tame", "make JAX and TensorFlow allocate on demand", device=False,
               output="return the result object")
    p.add_argument("state", nargs="?", default=None, help="off or status")
    p.add_argument("--give-back", dest="give_back", action="store_true",
                   help="also let them give memory back")
    p.allow_abbrev = False      # `--give` is no word of tame's: refused, not guessed
    return p


def _print(result: TameResult) -> None:
    for line in result.lines():
        print(line)
    for text in result.warnings:
        print(f"jupyter_gpumem: warning: {text}", file=sys.stderr)


def magic_tame(magics, argv: list[str]) -> TameResult | None:
    """``%gpumem tame [--give-back] | off | status``."""
    unknown = UsageError(f"unknown arguments {' '.join(a for a in argv if a != '-o')!r}: {USAGE}")
    try:
        args, rest = _parser().parse_known_args(argv)
    except UsageError:
        raise unknown from None
    if rest or args.state not in (None, "off", "status") or (args.state and args.give_back):
        raise unknown
    if args.state == "status":
        result = TameResult(frameworks=status())
        result.changed = {k: os.environ.get(k) for k in settings(give_back=True)}
    elif args.state == "off":
        result = untame()
    else:
        result = tame(give_back=args.give_back)
    _print(result)
    return result if args.output else None


def on_load(ip, magics) -> None:
    """On ``%load_ext``: tame when ``GpuMemMagics.tame`` is set; follow later changes."""
    def apply(change=None) -> None:
        if magics.tame:
            result = tame()
            for text in result.warnings:
                print(f"jupyter_gpumem: warning: {text}", file=sys.stderr)

    apply()
    magics.observe(apply, names="tame")
    session_of(ip).on_close(lambda: magics.unobserve(apply, names="tame"))
