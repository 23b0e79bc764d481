"""Notebook cells for trace: which cell a code file is, and when each cell ran.

* :class:`CellNames` maps a frame's code file to the cell's execution count through
  IPython's compiler (``shell.compile._filename_map``: ``<ipython-input-8-…>`` in
  IPython, ``/tmp/ipykernel_*/….py`` in ipykernel) and reads its source from
  ``linecache`` (IPython puts each cell's source there). The line a cell magic is
  rewritten to (``get_ipython().run_cell_magic('gpuwatch', '', '…')``) is not the
  user's: frames on it are passed over, so the body's own line (numbered inside the
  body) names the site.
* :class:`CellSpans` is the record of the outer cells' spans, ``[start, end]`` in
  unix seconds with the cell's execution count (``span.count``): the shell's session
  keeps one (``Session.cells``, which the panel's timeline reads too) and trace reads
  it to map a block to the cell during which it was allocated, from the allocator
  history's own timestamps.
"""
from __future__ import annotations

import linecache
import re
import sys
from bisect import bisect_right
from collections import deque
from typing import Any, Iterator

from ..scan_types import LIB_DIRS
from ...backends.base import is_a

INPUT_RE = re.compile(r"^<ipython-input-(\d+)-[0-9a-fA-F]+>$")
IN_RE = re.compile(r"^In\s*\[(\d+)\]$")
#: how IPython rewrites a cell that starts with a cell magic
MAGIC_CALL = "get_ipython().run_cell_magic("


def short_path(filename: str) -> str:
    """A library file relative to its site-packages (``torch/nn/modules/linear.py``)."""
    if not filename or filename.startswith("<"):
        return filename
    for root in LIB_DIRS:
        if filename.startswith(root):
            return filename[len(root):]
    return filename


class CellNames:
    """Which notebook cell a code file name is, through the shell's compiler."""

    def __init__(self, shell: Any = None) -> None:
        self.shell = shell
        self._fallback: dict[str, int | None] = {}
        self._magic: dict[tuple, bool] = {}

    def filename_map(self) -> dict:
        compiler = getattr(self.shell, "compile", None)
        fmap = getattr(compiler, "_filename_map", None)
        return fmap if is_a(fmap, dict) else {}

    def number(self, filename: Any) -> int | None:
        """The execution count of the cell whose code file this is, else ``None``."""
        if type(filename) is not str:
            return None
        n = self.filename_map().get(filename)
        if type(n) is int:
            return n
        try:
            return self._fallback[filename]
        except KeyError:
            pass
        m = INPUT_RE.match(filename) or IN_RE.match(filename)
        out = int(m.group(1)) if m else None
        if len(self._fallback) > 100_000:
            self._fallback.clear()
        self._fallback[filename] = out
        return out

    def magic_line(self, filename: str, line: Any) -> bool:
        """Whether line ``line`` of a cell's file is IPython's rewriting of a cell magic
        (the body runs in a file of its own, under the same execution count)."""
        key = (filename, line)
        hit = self._magic.get(key)
        if hit is None:
            hit = self._magic[key] = self.source(filename, line).startswith(MAGIC_CALL)
            if len(self._magic) > 100_000:
                self._magic.clear()
        return hit

    @staticmethod
    def source(filename: str | None, line: int | None) -> str:
        if not filename or not line:
            return ""
        try:
            return linecache.getline(filename, int(line)).strip()
        except Exception:  # noqa: BLE001 - a source we cannot read is left out
            return ""


def ipython_offset() -> int:
    """How far ``shell.execution_count`` is past the running cell's number in
    ``pre_run_cell`` (IPython 9 counts the cell first); learnt again after each cell."""
    ipy = sys.modules.get("IPython")
    major = getattr(ipy, "version_info", (0,))[0] if ipy is not None else 0
    return 1 if major >= 9 else 0


class CellSpan(list):
    """``[start, end]`` of one outer cell (unix seconds; end ``None`` while it runs);
    ``count``: its execution count (while it runs, the one the shell will give it)."""

    __slots__ = ("count",)

    def __init__(self, start: float, count: int | None) -> None:
        super().__init__((start, None))
        self.count = count


#: what :meth:`CellSpans.at` says of a time no cell covers
BETWEEN = "between"
OLDER = "older"


class CellSpans:
    """The outer cells' spans, oldest first (a ring of ``maxlen``): spans are begun and
    ended on the main thread; any thread may read them."""

    def __init__(self, maxlen: int = 500) -> None:
        self._spans: deque = deque(maxlen=maxlen)
        self._offset = ipython_offset()
        self._cache: tuple | None = None    # (version, spans, starts)
        self._version = 0
        self.seconds = 0.0      # the time the ended cells ran, together

    # -- the record (main thread) -------------------------------------------------------
    def begin(self, shell: Any, info: Any, start: float) -> CellSpan:
        count = getattr(shell, "execution_count", None)
        if type(count) is not int or (info is not None and not getattr(info, "store_history", True)):
            count = None            # run without history: no number of its own
        else:
            count -= self._offset
        span = CellSpan(start, count)
        self._spans.append(span)
        self._version += 1
        return span

    def end(self, span: list, end: float, result: Any = None) -> None:
        if span[1] is not None:
            return
        span[1] = end
        self._version += 1
        if end > span[0]:
            self.seconds += end - span[0]
        if result is None or not is_a(span, CellSpan):
            return
        n = getattr(result, "execution_count", None)
        info = getattr(result, "info", None)
        if type(n) is not int or (info is not None and not getattr(info, "store_history", True)):
            span.count = None       # a cell run without history has no number of its own
            return
        if span.count is not None:
            # IPython 9 counts the cell before pre_run_cell, older ones after it
            self._offset += span.count - n
        span.count = n

    def clear(self) -> None:
        self._spans.clear()
        self._version += 1

    # -- reading (any thread) -----------------------------------------------------------
    def __iter__(self) -> Iterator[CellSpan]:
        return iter(list(self._spans))

    def __len__(self) -> int:
        return len(self._spans)

    def __getitem__(self, i: int) -> CellSpan:
        return self._spans[i]

    def at(self, t: float) -> int | str | None:
        """The execution count of the cell running at ``t`` (unix seconds); :data:`BETWEEN`
        when no cell ran then, :data:`OLDER` when ``t`` is before the oldest span kept;
        ``None`` for a cell with no count."""
        cache = self._cache
        if cache is None or cache[0] != self._version:
            spans = list(self._spans)
            cache = self._cache = (self._version, spans, [s[0] for s in spans])
        _, spans, starts = cache
        if not spans or t < spans[0][0]:
            return OLDER
        i = bisect_right(starts, t) - 1
        s = spans[i]
        if s[1] is None or t <= s[1]:
            return getattr(s, "count", None)
        return BETWEEN

    def overlapping(self, t0: float, t1: float) -> list:
        """The spans that overlap ``[t0, t1]``."""
        return [s for s in list(self._spans)
                if s[0] <= t1 and (s[1] is None or s[1] >= t0)]

    def span_of(self, n: int) -> tuple[float, float | None] | None:
        """``(start, end)`` of the last cell with execution count ``n``."""
        for s in reversed(list(self._spans)):
            if getattr(s, "count", None) == n:
                return s[0], s[1]
        return None
