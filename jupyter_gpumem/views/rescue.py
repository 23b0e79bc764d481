"""The rescue's button in a notebook, under an out-of-memory traceback.

A text box for names (optional) and a button that does what ``%gpumem rescue [NAME ...]``
does; with names, a confirmation that names what goes comes first. The click arrives on a
comm (possibly on a subshell's thread): the rescue itself is handed to the kernel's main
thread (:func:`on_main_thread`), and what it prints, the rerun's output included, goes to
the widget's own output area.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

from ..core.purge import PurgeError
from ..units import one_line
from ..watch.rescue import Offer, RescueError, rescue, rescue_async
from .panel import widgets
from .panel_render import esc
from .question import Question, guarded, status_html


def on_main_thread(session: Any, fn: Callable[[], Any], what: str) -> Any:
    """Run ``fn`` on the kernel's main thread, between cells: through the session's
    hand-off queue where it has one (``session.handoff.submit``), else at once when this
    is the main thread; elsewhere, a RuntimeError (nothing ran)."""
    handoff = getattr(session, "handoff", None)
    if handoff is not None:
        return handoff.submit(fn, what=what)
    if threading.current_thread() is threading.main_thread():
        return fn()
    raise RuntimeError(f"the {what} runs on the kernel's main thread: type %gpumem rescue")


def parse_names(text: str) -> list[str]:
    """The names typed in the box (spaces or commas between them)."""
    return [n for n in text.replace(",", " ").split() if n]


class RescueButton:
    """The widget for one offer (``widget``); ``session`` runs the rescue."""

    def __init__(self, session: Any, offer: Offer) -> None:
        w = widgets()
        self.session = session
        self.offer = offer
        self.names = w.Text(placeholder="names to purge too (optional)",
                            layout=w.Layout(width="260px"))
        self.button = w.Button(description="Rescue and rerun", button_style="warning",
                               tooltip="clear the hidden holders (and the names given), "
                               "then run the failed cell again", layout=w.Layout(width="auto"))
        self.status = w.HTML()
        self.out = w.Output()
        guard = lambda fn: guarded(fn, self.say)   # noqa: E731
        self.question = Question(w, "Yes, rescue", changed=self._changed,
                                 confirmed=self._confirmed, cancelled=lambda: None, guard=guard)
        self.button.on_click(guard(self._clicked))
        self.widget = w.VBox([w.HBox([self.names, self.button]), self.question.box,
                              self.status, self.out])
        self.done = False

    def say(self, text: str, error: bool = False) -> None:
        self.status.value = status_html(text, error)

    def _changed(self) -> None:
        self.button.disabled = self.question.open or self.done

    def _clicked(self, _button: Any = None) -> None:
        names = parse_names(self.names.value)
        if names:
            self.question.ask(
                f"<b>The rescue deletes {esc(', '.join(names))}</b> (with the hidden holders), "
                "then runs the failed cell again; the rerun repeats what the cell did before "
                "it failed.", names)
            return
        self._start([])

    def _confirmed(self, names: list[str]) -> None:
        self._start(names)

    def _start(self, names: list[str]) -> None:
        ticket = on_main_thread(self.session, lambda: self.run(names), what="rescue")
        if getattr(ticket, "queued", False):
            self.say("the rescue runs when the kernel is between cells")

    def run(self, names: list[str]) -> None:
        """The rescue itself (the main thread): its lines and the rerun's output go to the
        widget's output area."""
        if self.session.rescue is None or self.session.rescue.offer is not self.offer:
            self.say("this offer has passed: a newer cell ran or the rescue ran already",
                     error=True)
            return
        if self.offer.awaits:
            asyncio.ensure_future(self._run_async(names))
            return
        with self.out:
            try:
                result = rescue(self.session, names)
            except (RescueError, PurgeError) as exc:
                self.say(one_line(str(exc)), error=True)
                return
        self._finished(result)

    async def _run_async(self, names: list[str]) -> None:
        with self.out:
            try:
                result = await rescue_async(self.session, names)
            except (RescueError, PurgeError) as exc:
                self.say(one_line(str(exc)), error=True)
                return
        self._finished(result)

    def _finished(self, result: Any) -> None:
        self.done = True
        self._changed()
        self.say(" · ".join(result.lines()).replace("jupyter_gpumem: ", ""),
                 error=not result.success)
