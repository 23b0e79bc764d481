"""Notebook cells: IPython's cell events paired, which cell a code file is, and when each
cell ran.

:class:`CellNames` maps a frame's code file to the cell's execution count and source;
:class:`CellSpans` is the record of the outer cells' spans (the session's
``Session.cells``, read by the panel's timeline and by trace); :class:`CellEvents` pairs
IPython's ``pre_run_cell`` with its ``post_run_cell`` (:func:`hook_cells`,
:func:`unhook_cells`). How: docs/ARCHITECTURE.md#notebook-cells.
"""
from __future__ import annotations

import ast
import linecache
import re
import sys
import threading
from bisect import bisect_right
from collections import deque
from typing import Any, Callable, Iterator

from .scan import LIB_DIRS
from ..backends.base import is_a

INPUT_RE = re.compile(r"^<ipython-input-(\d+)-[0-9a-fA-F]+>$")
IN_RE = re.compile(r"^In\s*\[(\d+)\]$")
#: how IPython rewrites a cell that starts with a cell magic
MAGIC_CALL = "get_ipython().run_cell_magic("
#: how IPython rewrites a line with a line magic or a shell escape (``%time x = f()``,
#: ``files = !ls``): the call, and the form the user typed for each method
_ESCAPE_CALL = re.compile(r"get_ipython\(\)\.(run_line_magic|system|getoutput)\((.*)\)\s*$")
_ESCAPES = {"run_line_magic": "%", "system": "!", "getoutput": "!"}
#: the files IPython compiles a timing magic's code into (``%%time``, ``%%timeit``,
#: ``%time``): their frames belong to the cell whose magic line called them
MAGIC_BODIES = frozenset({"<timed exec>", "<timed eval>", "<magic-timeit>"})
#: the name :meth:`CellNames.magic_body` gives a timing cell's body (its lines cached)
BODY_RE = re.compile(r"^<In \[(\d+)\] %%[\w.]+>$")


def typed_line(line: str) -> str:
    """The line as the user typed it: IPython's rewriting of a line magic or a shell
    escape (``get_ipython().run_line_magic('time', 'x = f()')``) back to ``%time x = f()``;
    any other line as it is."""
    m = _ESCAPE_CALL.search(line)
    if m is None:
        return line
    try:
        args = ast.literal_eval(f"({m.group(2)},)")
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return line
    if not all(type(a) is str for a in args) or not args:
        return line
    if m.group(1) == "run_line_magic":
        if len(args) != 2:
            return line
        typed = f"%{args[0]} {args[1]}".rstrip()
    else:
        typed = _ESCAPES[m.group(1)] + args[0]
    return line[:m.start()] + typed


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
        m = INPUT_RE.match(filename) or IN_RE.match(filename) or BODY_RE.match(filename)
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
            hit = self._magic[key] = _cached_line(filename, line).startswith(MAGIC_CALL)
            if len(self._magic) > 100_000:
                self._magic.clear()
        return hit

    def magic_body(self, filename: str, line: Any) -> str | None:
        """The name of the body of the timing cell magic (``%%time``, ``%%timeit``) that
        line ``line`` of a cell's file calls, its lines cached as the cell's own (numbered
        inside the body, as a ``%%gpuwatch`` body is): a frame in ``<timed exec>`` then
        names that cell. ``None`` when the line is no cell magic's call."""
        n = self.number(filename)
        text = _cached_line(filename, line)
        if n is None or not text.startswith(MAGIC_CALL):
            return None
        try:
            args = ast.literal_eval(f"({text[len(MAGIC_CALL):].rstrip()[:-1]},)")
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        if len(args) != 3 or not all(type(a) is str for a in args):
            return None
        name = f"<In [{n}] %%{args[0]}>"
        if name not in linecache.cache:
            linecache.cache[name] = (len(args[2]), None,
                                     [ln + "\n" for ln in args[2].splitlines()], name)
        return name

    @staticmethod
    def is_body(filename: Any) -> bool:
        """Whether ``filename`` is a timing magic's code (``<timed exec>``)."""
        return filename in MAGIC_BODIES

    def joined(self, body: tuple, filename: str, line: Any) -> tuple | None:
        """The frame ``body`` (``(filename, line, name)`` in ``<timed exec>``) as a frame of
        the cell whose cell-magic line (``filename``, ``line``) called it, else ``None``.
        The one rule both walks of a stack (the host's and the allocator history's) follow."""
        name = self.magic_body(filename, line)
        return None if name is None else (name, body[1], body[2])

    @staticmethod
    def source(filename: str | None, line: int | None) -> str:
        """Line ``line`` of ``filename`` as the user typed it (:func:`typed_line`)."""
        return typed_line(_cached_line(filename, line))


def _cached_line(filename: str | None, line: Any) -> str:
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


# -- pairing IPython's cell events ---------------------------------------------------------------
class Cell:
    """One cell seen by :class:`CellEvents`; ``payload`` is what its user keeps for it."""

    __slots__ = ("info", "frame", "thread", "outer", "payload")

    def __init__(self, info: object, frame: int | None, outer: bool) -> None:
        self.info = info
        self.frame = frame      # id() of the run_cell_async frame that announced it (not the frame)
        self.thread = threading.get_ident()
        self.outer = outer      # no other cell of ours was running when it began
        self.payload: object = None

    def gone(self, frames: set[int]) -> bool:
        """Its announcing frame is not among ``frames`` (of this thread's stack)."""
        return (self.frame is not None and self.thread == threading.get_ident()
                and self.frame not in frames)


#: per process: the code object of IPython's ``run_cell_async`` (the same for every
#: shell of the process), looked up once
_RUN_CELL_ASYNC: list = []


def _run_cell_async_code():
    """The code of IPython's ``InteractiveShell.run_cell_async``, once a shell's IPython is
    imported (the core never imports it); None before, and where it cannot be read
    (then cells pair by their ExecutionInfo only)."""
    if not _RUN_CELL_ASYNC:
        module = sys.modules.get("IPython.core.interactiveshell")
        if module is None:
            return None
        try:
            _RUN_CELL_ASYNC.append(module.InteractiveShell.run_cell_async.__code__)
        except Exception:  # noqa: BLE001
            _RUN_CELL_ASYNC.append(None)
    return _RUN_CELL_ASYNC[0]


def _running_cell_frames(first_only: bool = False) -> list[int]:
    """ids of the frames of IPython's ``run_cell_async`` on this stack, innermost first
    (``first_only``: the innermost alone)."""
    code = _run_cell_async_code()
    if code is None:
        return []
    ids = []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            ids.append(id(frame))
            if first_only:
                break
        frame = frame.f_back
    del frame
    return ids


def hook_cells(shell: object, pre: Callable, post: Callable) -> None:
    """Register ``pre`` and ``post`` for IPython's ``pre_run_cell`` / ``post_run_cell``."""
    events = getattr(shell, "events", None)
    if events is not None:
        events.register("pre_run_cell", pre)
        events.register("post_run_cell", post)


def unhook_cells(shell: object, pre: Callable, post: Callable) -> None:
    """Undo :func:`hook_cells` (what is not registered is left alone)."""
    events = getattr(shell, "events", None)
    if events is None:
        return
    for name, fn in (("pre_run_cell", pre), ("post_run_cell", post)):
        try:
            events.unregister(name, fn)
        except ValueError:
            pass


class CellEvents:
    """Pairs ``pre_run_cell`` with ``post_run_cell``, which IPython does not do.

    IPython fires "pre" without "post" for a cell run by awaiting
    ``run_cell_async`` (IPython's own tests do that at the top level; a cell
    can do it inside a cell) and "post" without "pre" for an empty cell run
    with ``run_cell('')``; ipykernel fires "post" with no result when an async
    cell is interrupted. So a "post" ends the cell whose ``ExecutionInfo`` it
    carries (``result.info is info``), and a cell whose "post" never came is
    dropped as soon as it is known to have ended: it was the last cell
    IPython finished (``shell.last_execution_result``), or the frame of
    ``run_cell_async`` that announced it is no longer on the stack of a later
    cell. A cell that begins while one of ours runs is nested (``outer`` is
    False): its enclosing cell counts for both. Main thread only.
    """

    def __init__(self, shell: object) -> None:
        self.shell = shell
        self._open: list[Cell] = []

    def running(self) -> bool:
        """True while an outer cell is open."""
        return any(c.outer for c in self._open)

    def payloads(self) -> list:
        """The payloads of the cells open now, outermost first."""
        return [c.payload for c in self._open if c.payload is not None]

    def outer_payload(self) -> object:
        for c in self._open:
            if c.outer:
                return c.payload
        return None

    def pre(self, info: object) -> tuple[Cell, list]:
        """A cell begins: (its :class:`Cell`, payloads of cells found to have ended unseen)."""
        # with no cell of ours open only the innermost frame is needed: the walk stops at
        # it (that is every cell but nested ones)
        frames = _running_cell_frames(first_only=not self._open)
        current = frames[0] if frames else None
        enclosing = set(frames[1:])
        last = getattr(getattr(self.shell, "last_execution_result", None), "info", None)
        keep, ended = [], []
        for c in self._open:
            gone = ((last is not None and c.info is last)
                    or (current is not None and c.gone(enclosing)))
            (ended if gone else keep).append(c)
        if not any(c.outer for c in keep):
            ended += keep       # nested cells of an outer cell that ended: nothing to keep
            keep = []
        cell = Cell(info, current, outer=not keep)
        keep.append(cell)
        self._open = keep
        return cell, [c.payload for c in ended if c.payload is not None]

    def post(self, result: object) -> tuple[object, list]:
        """A cell ended: (payload of the cell it ends or None, payloads of cells ended with it)."""
        info = getattr(result, "info", None)
        index = None
        if info is not None:
            for i in range(len(self._open) - 1, -1, -1):
                if self._open[i].info is info:
                    index = i
                    break
        elif self._open:
            # no result to pair with: the outermost of our cells whose frame is gone ended
            live = set(_running_cell_frames())
            for i, c in enumerate(self._open):
                if c.gone(live):
                    index = i
                    break
        if index is None:
            return None, []     # a "post" without its "pre": nothing of ours ended
        cell, rest = self._open[index], self._open[index + 1:]
        del self._open[index:]
        return cell.payload, [c.payload for c in rest if c.payload is not None]
