"""One reading's view of the process table: each process's ``stat`` read at most once.

A reading asks the same few things of many processes: a process's parent and its parent
chain, a kernel's descendants, a parent's name (a reaper?), and, for an orphan no mark
tells the kernel of, which processes' environments name the orphan's server, and their
start times. A :class:`Table` answers them, listing the processes once, reading each
process's ``/proc/PID/stat`` once at most (and only where asked about it), a kernel's
children from Linux's per-task lists, an environment's raw block once per question.
What is asked of a few processes only (owner, command line, parsed environment, open
files, memory) the callers read of those alone, with psutil. Elsewhere than Linux,
psutil answers all.

The figures are psutil's: a start time is ``create_time()`` to the bit (the boot time
plus the clock ticks of ``stat``); a name is the kernel's command name (``comm``, at most
15 characters: psutil's ``name()`` where it is shorter, and enough to tell a reaper,
whose names are all shorter). A table is one reading's: a decision that ends a process
reads live (a :class:`..Context` without a table).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import psutil

MAX_DEPTH = 64                   # parents followed at most
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = "/proc"


class Row(NamedTuple):
    """One process as the table saw it."""

    pid: int
    ppid: int
    name: str
    started: float | None        # psutil's create_time()


def read_bytes(path: str) -> bytes:
    """A file's bytes through the bare system calls (a ``/proc`` file: no buffered file
    object for a read of a few hundred bytes, done for every process)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _stat(pid: int, boot: float) -> Row | None:
    try:
        data = read_bytes(f"{PROC}/{pid}/stat")
        rpar = data.rfind(b")")
        fields = data[rpar + 2:].split()
        name = data[data.find(b"(") + 1:rpar].decode("utf-8", "surrogateescape")
        return Row(pid, int(fields[1]), name, float(fields[19]) / CLOCK_TICKS + boot)
    except (OSError, IndexError, ValueError):
        return None                  # gone, or unreadable: as psutil.process_iter skips it


def _psutil_row(pid: int) -> Row | None:
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return Row(pid, proc.ppid(), proc.name(), proc.create_time())
    except (psutil.Error, OSError):
        return None


def _children_files(pid: int) -> list[int] | None:
    """``pid``'s children from Linux's ``/proc/PID/task/TID/children`` (``None``: not here)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"{PROC}/{pid}/task")
    except FileNotFoundError:
        return []                           # gone
    except OSError:
        return None
    for tid in tasks:
        try:
            out += [int(x) for x in read_bytes(f"{PROC}/{pid}/task/{tid}/children").split()]
        except FileNotFoundError:
            if tid == str(pid):
                return None                 # a kernel built without them
        except (OSError, ValueError):
            continue
    return out


class Table:
    """The process table as one reading sees it (made by :func:`snapshot`)."""

    def __init__(self):
        self.procfs = os.path.isdir(PROC)
        self.boot = psutil.boot_time() if self.procfs else 0.0
        self.listed: list[int] | None = None
        self.known: dict[int, Row | None] = {}
        self.by_parent: dict[int, list[int]] | None = None
        self.environs: dict[tuple, bool] = {}

    def pids(self) -> list[int]:
        """Every process's pid, ascending (as ``psutil.process_iter``; listed once)."""
        if self.listed is None:
            try:
                found = [int(n) for n in os.listdir(PROC) if n.isdigit()] if self.procfs \
                    else psutil.pids()
            except OSError:
                found = psutil.pids()
            self.listed = sorted(found)
        return self.listed

    def row(self, pid: int) -> Row | None:
        """Process ``pid`` (``None``: none, or unreadable), read once."""
        if pid not in self.known:
            self.known[pid] = _stat(pid, self.boot) if self.procfs else _psutil_row(pid)
        return self.known[pid]

    def rows(self) -> list[Row]:
        """Every process, by pid (the whole table: each process read once)."""
        return [row for row in map(self.row, self.pids()) if row is not None]

    def ppid(self, pid: int) -> int | None:
        row = self.row(pid)
        return None if row is None else row.ppid

    def name(self, pid: int) -> str | None:
        row = self.row(pid)
        return None if row is None else row.name

    def ancestors(self, pid: int) -> list[int]:
        """``pid``'s parent, its parent's, ... (at most :data:`MAX_DEPTH`; the chain stops at
        a parent that cannot be read, after naming it)."""
        out: list[int] = []
        row = self.row(pid)
        for _ in range(MAX_DEPTH):
            if row is None or row.ppid <= 0 or row.ppid in out:
                break
            out.append(row.ppid)
            row = self.row(row.ppid)
        return out

    def children(self, pid: int) -> list[int]:
        """``pid``'s children: from Linux's per-task lists where it keeps them, else from
        the whole table."""
        if self.by_parent is None:
            found = _children_files(pid) if self.procfs else None
            if found is not None:
                return found
            self.by_parent = {}
            for row in self.rows():
                self.by_parent.setdefault(row.ppid, []).append(row.pid)
        return self.by_parent.get(pid, [])

    def environ_has(self, pid: int, key: str, value: str) -> bool | None:
        """Whether ``key=value`` is in process ``pid``'s environment, from its raw block
        (no parse; each asked once per table); ``None``: cannot be told this way (not
        Linux). A cheap test before psutil's ``environ()``: False only where that would
        not hold it, or cannot be read."""
        if not self.procfs:
            return None
        ask = (pid, key, value)
        if ask not in self.environs:
            try:
                block = b"\0" + read_bytes(f"{PROC}/{pid}/environ") + b"\0"
            except OSError:
                block = b""
            entry = b"\0" + f"{key}={value}".encode("utf-8", "surrogateescape") + b"\0"
            self.environs[ask] = entry in block
        return self.environs[ask]

    def descendants(self, pid: int) -> list[int]:
        """``pid``'s children, theirs, ..., sorted (never ``pid`` itself)."""
        seen: set[int] = set()
        stack = [pid]
        while stack:
            for child in self.children(stack.pop()):
                if child not in seen and child != pid:
                    seen.add(child)
                    stack.append(child)
        return sorted(seen)


def snapshot() -> Table:
    """A new view of the process table (each process read when first asked about)."""
    return Table()
