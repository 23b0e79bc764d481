"""``%gpumem rescue [NAME ...]``: after an out-of-memory error, clear the hidden holders
(and the names given) and run the failed cell again; and the two followers of the cells
that make it possible (:mod:`..watch.rescue`, :mod:`..watch.reruns`), set up at load.

A failed cell with top-level ``await`` is rerun awaited: an input transformer turns a
cell that is only ``%gpumem rescue ...`` into an awaited call of :func:`run_async` while
such a rescue is pending, so IPython (and ipykernel, in its own loop) runs it as any
async cell.
"""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from ..core import purge as _purge
from ..session import session_of
from ..views.rescue import RescueButton
from ..watch.reruns import RerunWatch
from ..watch.rescue import Offer, RescueError, Rescues, rescue, rescue_async
from . import watch as _watch
from .args import help_stops, parser, split_line, usage_errors
from .watched_cell import input_transformer, install_transformer, loop_running

MODULE = __name__


def _parser():
    p = parser("%gpumem rescue", "after an out-of-memory error: clear the hidden holders "
               "(and the names given), then run the failed cell again", device=False,
               output="return the rescue's result")
    p.add_argument("names", nargs="*", help="names or paths to purge too")
    return p


def magic_rescue(magics: Any, argv: list[str]) -> Any:
    """``%gpumem rescue [NAME ...] [-o]``."""
    args = _parser().parse_args(argv)
    session = session_of(magics.shell)
    offer = _offer(session)
    if offer.awaits and loop_running():
        raise UsageError("%gpumem rescue: the failed cell awaits; run `%gpumem rescue` as a "
                         "cell of its own, so it is awaited")
    result = usage_errors(lambda: rescue(session, args.names), (RescueError, _purge.PurgeError))
    return _finish(result, args.output)


@help_stops
async def run_async(shell: Any, line: str) -> Any:
    """What a ``%gpumem rescue`` cell becomes when the failed cell awaits (see the module)."""
    args = _parser().parse_args(split_line(line)[2:])
    session = session_of(shell)
    _offer(session)
    try:
        result = await rescue_async(session, args.names)
    except (RescueError, _purge.PurgeError) as exc:
        raise UsageError(str(exc)) from None
    return _finish(result, args.output)


def _offer(session: Any) -> Offer:
    rescues = session.rescue if session is not None else None
    if rescues is None or rescues.offer is None:
        raise UsageError("%gpumem rescue: no out-of-memory error to rescue from; it follows "
                         "a cell that failed for lack of memory")
    return rescues.offer


def _finish(result: Any, output: bool) -> Any:
    for line in result.lines()[1:]:     # the first (what was freed) came before the rerun
        print(line)
    return result if output else None


def rescue_cells_transform(shell: Any):
    """An input transformer: ``%gpumem rescue ...`` alone in a cell, while the pending
    rescue's cell awaits, becomes one awaited call of :func:`run_async`."""
    def rewrite(lines: list[str]) -> list[str] | None:
        text = "".join(lines).strip()
        if not text.startswith("%gpumem rescue") or "\n" in text:
            return None
        session = session_of(shell)
        offer = session.rescue.offer if session is not None and session.rescue else None
        if offer is None or not offer.awaits:
            return None
        return [f"await __import__('sys').modules[{MODULE!r}].run_async(get_ipython(), "
                f"{text[1:]!r})\n"]

    return input_transformer("gpumem_rescue_cells", rewrite)


def _in_kernel(shell: Any) -> bool:
    return getattr(shell, "kernel", None) is not None


def _presenter(session: Any):
    """Show an offer: its lines, and in a notebook the button (views/rescue.py)."""
    def present(offer: Offer) -> None:
        print(offer.text())
        if _in_kernel(session.shell):
            try:
                display(RescueButton(session, offer).widget)
            except ImportError:     # no ipywidgets: the command in the text stands
                return
    return present


def on_load(ip: Any, magics: Any) -> None:
    """Called by ``%load_ext``: the rescue's and the reruns' followers, the button, and the
    transformer for awaiting cells; all go when the session closes."""
    session = session_of(ip)
    session.reruns = RerunWatch(session)
    session.rescue = Rescues(session)
    session.rescue.presenters.append(_presenter(session))
    session.on_close(install_transformer(ip, rescue_cells_transform(ip)))


def offered_flags(session: Any) -> dict:
    """The rerun flags given so far (execution count -> flag), for ``%gpumem history``."""
    reruns = session.reruns if session is not None else None
    return dict(reruns.tracker.flags) if reruns is not None else {}

def magic_history(magics: Any, argv: list[str]) -> Any:
    """``%gpumem history``, with the cells flagged for creeping memory beside their number."""
    result = _watch.magic_history(magics, argv)
    flags = offered_flags(session_of(magics.shell))
    if flags and result is None and "--clear" not in argv:
        print("cells flagged for memory that creeps up on reruns:")
        for count, flag in sorted(flags.items()):
            print("  " + flag.line().replace("jupyter_gpumem: cell ", "", 1))
    return result
