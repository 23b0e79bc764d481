"""What trace's queries return (:class:`Site`, :class:`SiteGroup`, :class:`CellLines`) and
how a stack of frames becomes a site (:class:`Resolver`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ...units import JsonFields, fmt_bytes, json_field
from ..cells import CellNames, short_path
from ...backends.base import is_a

BEFORE_TEXT = "allocated before trace was on"
BETWEEN_TEXT = "allocated between cells (by a background thread or a callback)"
NO_FRAME = " (no Python frame: a C++ thread, e.g. autograd's backward)"


@dataclass(frozen=True)
class Site(JsonFields):
    """Where a block of memory was allocated.

    ``cell``/``line``/``source``: the innermost frame that is in a notebook cell (for
    :func:`cell_lines`, the outermost), else the innermost frame (``cell`` None,
    ``line`` in ``filename``). ``inner``: the innermost frame when it is not that one
    (``torch/nn/modules/linear.py:125 in forward``). ``how``: ``"stack"`` (from the
    allocation's own frames), ``"nearest"`` (no Python frame: the cell line that
    allocated last before it), ``"cell"`` (no Python frame: the cell only, from the
    time), ``"time"`` (trace at cell depth: the cell during which it was allocated,
    from the history's timestamps), ``"between"`` (allocated while no cell ran),
    ``"before"`` (allocated before trace was on), ``"rounding"`` (the allocator's
    rounding inside blocks that names hold) or ``"unknown"``.
    """

    JSON_AFTER = {"text": "note"}

    cell: int | None
    line: int | None
    source: str = ""
    filename: str | None = None
    function: str | None = None
    inner: str | None = None
    how: str = "stack"
    note: str | None = None

    @property
    def in_cell(self) -> bool:
        return self.cell is not None and self.line is not None

    @property
    def text(self) -> str:
        """``cell [12] line 3: out = model(x)`` (one line)."""
        if self.how == "before":
            return BEFORE_TEXT
        if self.how == "between":
            return BETWEEN_TEXT
        if self.how == "unknown":
            return self.note or "no allocation site recorded"
        if self.how == "rounding":
            return ROUNDING_TEXT + (f" allocated in cell [{self.cell}]"
                                    if self.cell is not None else "")
        if self.cell is not None and self.line is None:
            head = f"cell [{self.cell}]"
        elif self.cell is not None:
            head = f"cell [{self.cell}] line {self.line}"
        else:
            where = short_path(self.filename or "?")
            head = f"{where}:{self.line}" + (f" in {self.function}" if self.function else "")
        text = f"{head}: {self.source}" if self.source else head
        if self.how in ("nearest", "cell"):
            text += NO_FRAME
        return text

    def key(self) -> tuple:
        return (self.how, self.cell, self.line, self.filename if self.cell is None else None,
                self.function if self.cell is None else None)

    def __str__(self) -> str:
        return self.text


BEFORE = Site(None, None, how="before",
              note="the block was allocated before trace was on, so it has no record: "
                   "`c.GpuMemMagics.trace = True` records from the first cell")
BETWEEN = Site(None, None, how="between",
               note="allocated while no cell ran: a thread of the user's or a library's, or a "
                    "callback of the event loop")
ROUNDING_TEXT = "the allocator's rounding past named storages in their blocks"
ROUNDING_NOTE = ("blocks are whole multiples of 512 bytes: the part of a named storage's block "
                 "past its size is allocated, and reached by no name")


@dataclass
class SiteGroup(JsonFields):
    """Blocks no name reaches that share an allocation site."""

    JSON_AFTER = {"text": "device"}

    site: Site
    nbytes: int = json_field(key="bytes")
    count: int
    device: str

    @property
    def text(self) -> str:
        blocks = f"{self.count} block{'s' if self.count != 1 else ''}"
        return f"{fmt_bytes(self.nbytes)} in {blocks} · {self.site.text}"


class LineAlloc(NamedTuple):
    """A line of a cell and the bytes it allocated while the cell ran (``line`` None at
    cell depth: the cell as a whole)."""

    line: int | None
    source: str
    bytes: int


class CellLines(list):
    """The lines of one cell that allocated the most, largest first, as
    :class:`LineAlloc` ``(line, source, bytes)``; ``peak``: the line whose allocation
    reached the cell's peak and that peak above the cell's start (``None`` where the
    device keeps no history: the host); ``held``: line -> bytes still allocated at the
    end; ``peaks``: device -> its peak line. At cell depth (``lines`` False) one item,
    ``line`` None: what the cell allocated."""

    def __init__(self, cell: int, items=(), *, peak: LineAlloc | None = None,
                 held: dict | None = None, peaks: dict | None = None,
                 note: str | None = None, lines: bool = True) -> None:
        super().__init__(items)
        self.cell = cell
        self.peak = peak
        self.held = dict(held or {})
        self.peaks = dict(peaks or {})
        self.note = note
        self.lines = lines

    def _item(self, la: LineAlloc) -> str:
        kept = self.held.get(la.line)
        text = f"line {la.line} {fmt_bytes(la.bytes)}" if la.line is not None \
            else fmt_bytes(la.bytes)
        if kept:
            text += f", {fmt_bytes(kept)} kept"
        return text + (f" ({la.source})" if la.source else "")

    def text(self, top: int = 3) -> str:
        """One line for ``%%gpuwatch`` and the footer; '' when nothing was recorded."""
        parts = []
        if self:
            head = "allocated most: " if self.lines else "allocated "
            parts.append(head + "; ".join(self._item(la) for la in self[:top]))
        if self.peak is not None:
            if not self.lines:
                at = ""
            elif self.peak.line is not None:
                at = f" at line {self.peak.line}"
            else:
                at = " outside its lines"
            parts.append(f"peak +{fmt_bytes(self.peak.bytes)}{at}"
                         + (f" ({self.peak.source})" if self.peak.source else ""))
        return f"cell [{self.cell}] " + " · ".join(parts) if parts else ""

    def to_json(self) -> dict:
        return {"cell": self.cell, "lines": [la._asdict() for la in self],
                "peak": self.peak._asdict() if self.peak else None,
                "held": {str(k): v for k, v in self.held.items()},
                "peaks": {d: p._asdict() for d, p in self.peaks.items()}, "note": self.note}


# -- frames -> sites -------------------------------------------------------------------------
def frame_tuple(f: Any) -> tuple | None:
    if is_a(f, dict):
        return (f.get("filename"), f.get("line"), f.get("name"))
    if is_a(f, tuple) and len(f) == 3:
        return f
    return None


def is_python(f: Any) -> bool:
    fn = f.get("filename") if is_a(f, dict) else f[0] if is_a(f, tuple) else None
    return type(fn) is str and (fn.endswith(".py") or fn.startswith("<"))


def frame_text(fr: tuple) -> str:
    return f"{short_path(fr[0] or '?')}:{fr[1]} in {fr[2]}"


class Resolver:
    """Frames (innermost first) -> (innermost, innermost cell frame, outermost cell
    frame), with a cache by frame dict (torch shares one dict per distinct frame).
    A frame on the line a cell magic was rewritten to is no cell frame: the magic's
    body (its own file, the same execution count) names the line."""

    def __init__(self, cells: CellNames) -> None:
        self.cells = cells
        self._memo: dict[int, tuple] = {}
        self._keep: list = []   # the frame dicts whose ids the memo uses

    def cell_of(self, f: Any) -> tuple | None:
        """``(cell, filename, line, name)`` when frame ``f`` is in a cell, else None."""
        key = id(f)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[0]
        fr = frame_tuple(f)
        out = None
        if fr is not None:
            n = self.cells.number(fr[0])
            if n is not None and not self.cells.magic_line(fr[0], fr[1]):
                out = (n, fr[0], fr[1], fr[2])
        if is_a(f, dict):
            self._memo[key] = (out,)
            self._keep.append(f)
        return out

    def pick(self, frames) -> tuple:
        """Python frames only: with ``stacks="all"`` torch adds C++ frames, and an
        allocation with C++ frames alone (autograd's thread) has no Python frame."""
        inner = cin = cout = body = None
        cells = self.cells
        for f in frames or ():
            c = self.cell_of(f)
            fr = frame_tuple(f) if c is None else None
            if fr is not None and cin is None and body is None and cells.is_body(fr[0]):
                body = fr                       # %%time's body: the cell that called it
            elif fr is not None and body is not None and cells.number(fr[0]) is not None:
                j = cells.joined(body, fr[0], fr[1])
                if j is not None:
                    c = (cells.number(j[0]), *j)
                    if inner == body:
                        inner = j
                body = None
            if inner is None and (c is not None or is_python(f)):
                inner = frame_tuple(f)
            if c is not None:
                if cin is None:
                    cin = c
                cout = c
        return inner, cin, cout

    def site(self, frames, *, outer: bool = False) -> Site | None:
        inner, cin, cout = self.pick(frames)
        if inner is None:
            return None
        c = cout if outer else cin
        if c is not None:
            n, filename, line, name = c
            extra = None
            if inner[:2] != (filename, line):
                extra = frame_text(inner)
            return Site(n, line, CellNames.source(filename, line), filename, name, extra)
        return Site(None, inner[1], CellNames.source(inner[0], inner[1]), inner[0], inner[2])
