"""A confirmation in the live panel: it takes its button's place, Cancel and Yes first
(it opens where the click was, not below the visible part of the output), then the text
of what would happen, and it keeps what it asks about until it is answered. It defaults
to Cancel: Cancel comes first, is the highlighted button and has the keyboard focus, so
Enter or a hurried click there changes nothing."""
from __future__ import annotations

from typing import Any, Callable

from ..units import one_line
from .panel_render import esc


def guarded(fn: Callable, say: Callable[..., None]) -> Callable:
    """``fn`` as a widget callback that never raises into the kernel: a failure is one
    line, said with ``say(text, error=True)``."""
    def call(*args):
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001
            say(f"{type(exc).__name__}: {exc}", error=True)
            return None
    return call


def status_html(text: str, error: bool = False) -> str:
    """One status line (red for an error), escaped, on one line."""
    colour = "#d62728" if error else "inherit"
    return f"<span style='color:{colour}'>{esc(one_line(text))}</span>"


class Question:
    """``yes``: the Yes button's words; ``changed()`` runs when it opens or closes (the
    owner's button follows it), ``confirmed(pending)`` on Yes, ``cancelled()`` on Cancel;
    ``guard`` wraps the buttons' callbacks (an owner's: they never raise)."""

    def __init__(self, widgets: Any, yes: str, *, changed: Callable[[], None],
                 confirmed: Callable[[Any], None], cancelled: Callable[[], None],
                 guard: Callable[[Callable], Callable]) -> None:
        w = widgets
        self._changed, self._confirmed, self._cancelled = changed, confirmed, cancelled
        self.text = w.HTML()
        self.yes = w.Button(description=yes, button_style="danger",
                            layout=w.Layout(width="auto"))
        self.cancel = w.Button(description="Cancel", button_style="primary",
                               layout=w.Layout(width="auto"))
        self.box = w.VBox([w.HBox([self.cancel, self.yes],
                                  layout=w.Layout(flex_flow="row wrap")), self.text],
                          layout=w.Layout(display="none", border="1px solid #d62728",
                                          padding="4px"))
        #: what the open question asks about (None: no question open)
        self.pending: Any = None
        self.yes.on_click(guard(self._on_yes))
        self.cancel.on_click(guard(self._on_cancel))

    @property
    def open(self) -> bool:
        return self.pending is not None

    def ask(self, html: str, pending: Any) -> None:
        """Show the question ``html`` about ``pending``."""
        self.pending = pending
        with self.text.hold_sync(), self.box.layout.hold_sync():
            self.text.value = html
            self.box.layout.display = None
        self._changed()
        focus = getattr(self.cancel, "focus", None)     # ipywidgets 8: the default answer
        if focus is not None:
            focus()

    def take(self) -> Any:
        """Close the question; what it asked about (None when none was open)."""
        pending, self.pending = self.pending, None
        self.box.layout.display = "none"
        self._changed()
        return pending

    def _on_yes(self, _button: Any = None) -> None:
        pending = self.take()
        if pending:
            self._confirmed(pending)

    def _on_cancel(self, _button: Any = None) -> None:
        self.take()
        self._cancelled()
