"""The live panel's holders table: pages of rows, a filter, and the checked names.

A notebook may have thousands of holders (300 values in ``Out``, 2,000 names): a widget
per holder would flood the frontend (each widget is several comm messages, and Jupyter's
IOPub rate limit drops what comes too fast). So the table shows a page of at most
:data:`PAGE` rows (a checkbox and a line of figures each, the same widgets from page to
page), with Previous/Next and a filter box, and every check is kept by name in one set,
whatever page shows it: the purge button's state is always read from that set
(:meth:`HolderTable.checked`), never from the widgets of a page.

Rows are in display order: largest "only it" first, then by name with the numbers in a
name read as numbers (``Out[2]`` before ``Out[100]``). A checkbox change may come in on
any thread (a widget message over a kernel subshell): it is applied under the table's
lock to the name the row showed when the change came, and a change the table made itself
while drawing a page (on the drawing thread) is not a user's check.
"""
from __future__ import annotations

import re
import threading
from typing import Any, Callable

from . import panel_render as _render

#: rows a page shows
PAGE = 50
_DIGITS = re.compile(r"(\d+)")


def display_key(holder: dict) -> tuple:
    """Largest ``unique`` first, then the name with its numbers read as numbers (a split
    on runs of digits alternates text and number, so keys compare part by part)."""
    parts = _DIGITS.split(str(holder.get("name") or ""))
    parts[1::2] = map(int, parts[1::2])
    unique = holder.get("unique")
    return (-(unique if isinstance(unique, (int, float)) else 0), parts)


def in_display_order(holders: list[dict]) -> list[dict]:
    return sorted(holders, key=display_key)


def matches(holder: dict, text: str) -> bool:
    """The filter: a case-blind part of the holder's name, purge name or label."""
    if not text:
        return True
    text = text.lower()
    return any(text in str(holder.get(k) or "").lower() for k in ("name", "purge", "label"))


class HolderTable:
    """The holders of the last snapshot, a page at a time (see the module docstring).
    ``changed()`` runs after every change of the checked set (the panel's button follows);
    ``guard`` wraps widget callbacks (they never raise into the kernel)."""

    def __init__(self, widgets: Any, *, changed: Callable[[], None],
                 guard: Callable[[Callable], Callable],
                 follow: Callable[[Any], None] = lambda widget: None) -> None:
        w = self._w = widgets
        self._changed = changed
        self._guard = guard
        self._follow = follow       # each checkbox made is followed (views/routes.py)
        self._lock = threading.RLock()
        self._drawing: threading.Thread | None = None     # the thread drawing a page now
        self.holders: list[dict] = []     # every holder, in display order
        self.shown: list[dict] = []       # those the filter lets through
        self.page = 0
        self._checked: set[str] = set()
        self._row_names: list[str | None] = []            # the purge name of each row shown
        self._rows: list[tuple[Any, Any]] = []
        self._row_layout = w.Layout(width="auto", min_width="6em", max_width="100%")
        self.header = (w.HTML("<b>holder</b> <span style='opacity:.6'>(check to purge)</span>"),
                       w.HTML(_render.holders_header_html()))
        self.grid = w.GridBox(list(self.header), layout=w.Layout(
            grid_template_columns="minmax(6em, max-content) minmax(12em, 1fr)",
            grid_gap="0 0.5em", align_items="flex-start", width="100%"))
        auto = w.Layout(width="auto")
        self.filter = w.Text(placeholder="filter names", continuous_update=True,
                             layout=w.Layout(width="12em", min_width="6em", flex="0 1 12em"))
        self.prev = w.Button(description="Previous", icon="chevron-left", layout=auto,
                             disabled=True, tooltip="the previous page of holders")
        self.next = w.Button(description="Next", icon="chevron-right", layout=auto,
                             disabled=True, tooltip="the next page of holders")
        self.where = w.HTML()
        self.check_all = w.Button(description="Check all shown", layout=auto,
                                  tooltip="check every holder the filter lets through, "
                                          "on every page")
        self.uncheck = w.Button(description="Uncheck all", layout=auto,
                                tooltip="uncheck every holder")
        self.bar = w.HBox([self.filter, self.prev, self.where, self.next, self.check_all,
                           self.uncheck],
                          layout=w.Layout(flex_flow="row wrap", align_items="center",
                                          grid_gap="0 4px", width="100%"))
        self.filter.observe(guard(lambda change: self.set_filter(change["new"])), "value")
        self.prev.on_click(guard(lambda _b: self.go(self.page - 1)))
        self.next.on_click(guard(lambda _b: self.go(self.page + 1)))
        self.check_all.on_click(guard(lambda _b: self.check_shown(True)))
        self.uncheck.on_click(guard(lambda _b: self.check_shown(False, every=True)))

    # -- what is checked (any thread) ------------------------------------------------
    def checked(self) -> list[str]:
        """The checked names, in display order."""
        with self._lock:
            return [h["purge"] for h in self.holders if h.get("purge") in self._checked]

    def uncheck_names(self, names) -> None:
        with self._lock:
            self._checked -= set(names)
            self._draw()
        self._changed()

    def check_shown(self, value: bool, every: bool = False) -> None:
        """Check (or uncheck) every holder the filter lets through, on every page."""
        with self._lock:
            names = {h.get("purge") for h in (self.holders if every else self.shown)} - {None}
            if value:
                self._checked |= names
            else:
                self._checked -= names
            self._draw()
        self._changed()

    def _on_check(self, index: int, change: dict) -> None:
        with self._lock:
            if self._drawing is threading.current_thread() or index >= len(self._row_names):
                return          # the table set it while drawing a page: no one's check
            name = self._row_names[index]
            if name is None:
                return
            if change["new"]:
                self._checked.add(name)
            else:
                self._checked.discard(name)
        self._changed()

    # -- pages (any thread) -------------------------------------------------------------
    def show(self, holders: list[dict]) -> None:
        """A new snapshot's holders; the checks of names it no longer lists go."""
        ordered = in_display_order([h for h in holders if isinstance(h, dict)])
        with self._lock:
            self.holders = ordered
            self._checked &= {h.get("purge") for h in ordered} - {None}
            self._filter_and_draw()
        self._changed()

    def set_filter(self, text: str) -> None:
        with self._lock:
            if self.filter.value != text:
                self.filter.value = text
            self.page = 0
            self._filter_and_draw()

    def go(self, page: int) -> None:
        with self._lock:
            self.page = page
            self._draw()

    def pages(self) -> int:
        return max((len(self.shown) + PAGE - 1) // PAGE, 1)

    def checkbox(self, name: str) -> Any:
        """The checkbox of holder ``name`` (purge name, name or label), its page shown."""
        with self._lock:
            for i, h in enumerate(self.shown):
                if name in (h.get("purge"), h.get("name"), h.get("label")):
                    if i // PAGE != self.page:
                        self.go(i // PAGE)
                    return self._rows[i % PAGE][0]
        raise KeyError(f"no holder {name!r} in the panel")

    def _filter_and_draw(self) -> None:
        text = self.filter.value.strip()
        self.shown = [h for h in self.holders if matches(h, text)]
        self._draw()

    def _new_row(self) -> tuple[Any, Any]:
        w = self._w
        index = len(self._rows)
        checkbox = w.Checkbox(value=False, indent=False, layout=self._row_layout)
        checkbox.observe(self._guard(lambda change: self._on_check(index, change)), "value")
        self._follow(checkbox)
        row = (checkbox, w.HTML())
        self._rows.append(row)
        return row

    def _draw(self) -> None:
        """Draw the current page (under the lock)."""
        self.page = min(max(self.page, 0), self.pages() - 1)
        page = self.shown[self.page * PAGE:(self.page + 1) * PAGE]
        while len(self._rows) < len(page):
            self._new_row()
        self._row_names = [h.get("purge") for h in page]
        self._drawing = threading.current_thread()
        try:
            for (checkbox, html), h in zip(self._rows, page):
                with checkbox.hold_sync():
                    checkbox.description = h.get("label") or h.get("name") or "?"
                    checkbox.value = h.get("purge") in self._checked
                    checkbox.disabled = h.get("purge") is None
                    checkbox.tooltip = h.get("hint") or f"purge {h.get('purge')}"
                html.value = _render.holder_row_html(h)
        finally:
            self._drawing = None
        children = list(self.header)
        for row in self._rows[:len(page)]:
            children += row
        with self.grid.hold_sync():
            if tuple(self.grid.children) != tuple(children):
                self.grid.children = children
        n, pages = len(self.shown), self.pages()
        several = len(self.holders) > PAGE
        first = self.page * PAGE + 1 if n else 0
        where = (f"{first}–{min((self.page + 1) * PAGE, n)} of {n}"
                 + (f" (filter of {len(self.holders)})" if n != len(self.holders) else ""))
        with self.where.hold_sync():
            self.where.value = f"<span data-page='{self.page + 1}/{pages}'>{_render.esc(where)}</span>"
        with self.prev.hold_sync():
            self.prev.disabled = self.page == 0
        with self.next.hold_sync():
            self.next.disabled = self.page >= pages - 1
        display = None if several or self.filter.value else "none"
        if self.bar.layout.display != display:
            self.bar.layout.display = display
        label = f"Check all {n} shown" if n != len(self.holders) else f"Check all {n}"
        if self.check_all.description != label:
            self.check_all.description = label

    def inputs(self) -> list:
        """The widgets of the table the user types into or clicks (the checkboxes aside)."""
        return [self.filter, self.prev, self.next, self.check_all, self.uncheck]

    def close(self) -> list:
        """Every widget of the table (for the panel's close)."""
        out = [self.grid, self.bar, *self.header]
        for checkbox, html in self._rows:
            out += [checkbox, html]
        return out
