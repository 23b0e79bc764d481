"""``%gpumem panel``: argument parsing over the live panel (:mod:`..views.panel`)."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from ..core import snapshot as _snapshot
from ..core.sampler import MAX_INTERVAL, check_interval
from ..session import session_of
from ..views.panel import (INTERVAL, MAX_WINDOW, MIN_INTERVAL, MIN_WINDOW, WINDOW, Panel,
                           close, current, widgets)
from .args import parser


def _parser():
    p = parser("%gpumem panel", "a live panel: device bars, timeline, holders, purge",
               output=None)
    p.add_argument("--interval", type=float, default=None,
                   help=f"seconds between device readings (default {INTERVAL:g})")
    p.add_argument("--window", type=float, default=None,
                   help=f"seconds of history in the timeline (default {WINDOW:g})")
    p.add_argument("--close", action="store_true", help="close the running panel")
    return p


def magic_panel(magics: Any, argv: list[str]) -> None:
    """``%gpumem panel [--device D] [--interval S] [--window S] [--close]``."""
    args = _parser().parse_args(argv)
    shell = magics.shell
    if args.close:
        print("jupyter_gpumem: live panel closed" if close(shell)
              else "jupyter_gpumem: no live panel is open")
        return None
    for option, value, low, high in (("--interval", args.interval, MIN_INTERVAL, MAX_INTERVAL),
                                     ("--window", args.window, MIN_WINDOW, MAX_WINDOW)):
        if value is not None:
            try:
                check_interval(value, option, minimum=low, maximum=high)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    device = magics.device(args.device) if args.device is not None else None
    try:
        widgets()
    except ImportError as exc:
        _text_report(magics, device or magics.device(None), str(exc))
        return None
    panel = current(shell)
    if panel is None:
        panel = Panel(shell, device=device or magics.device(None),
                      interval=args.interval or INTERVAL, window=args.window or WINDOW,
                      time_limit=magics.scan_time_limit, session=session_of(shell))
        session_of(shell).panel = panel
        panel.start()
    else:
        panel.configure(device=device, interval=args.interval, window=args.window)
    display(panel.widget)
    return None


def _text_report(magics: Any, device: str, reason: str) -> None:
    session = session_of(magics.shell)
    snap = _snapshot.build(shell=magics.shell, device=magics.selection(device),
                           time_limit=magics.scan_time_limit,
                           warm=session.warm if session else None)
    print(repr(snap))
    print()
    print(reason)
