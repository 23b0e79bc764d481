"""Writing a file never blocks and never writes through (the one place it is done).

Every file the extension writes (``history --save``, ``plot --save``, ``trace --save``)
goes through :func:`write_file`, and every folder it writes into (``--tensorboard DIR``)
through :func:`check_folder`:

- a file is written only to a new path or over an existing *regular* file; a FIFO (it
  would block the kernel), a device, a directory, a symlink (it would write through to
  the file it points to), or a path whose folder is missing is refused with
  :class:`Refused`, a one-line ``ValueError``, before anything is opened;
- the data go to a temporary file beside it (``O_CREAT|O_EXCL|O_NOFOLLOW``: never an
  existing file, never through a link), which is then renamed over the path
  (``os.replace``): the path holds the old file or the whole new one, never a part.
"""
from __future__ import annotations

import os
import stat
from typing import IO, Callable
from ..backends.base import is_a

_OPEN_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0))


class Refused(ValueError):
    """A path the extension will not write (one line: the path and why)."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink (it would write to the file it points to)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (writing to it would block the kernel)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Refused(f"{path}: {exc.strerror or exc}") from None


def check_file(path: str) -> str:
    """The path to write (``~`` expanded), or :class:`Refused`: it must be new or an
    existing regular file (not followed through a link), in a folder that exists."""
    path = os.path.expanduser(os.fspath(path))
    if not path:
        raise Refused("no file name given")
    st = _lstat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise Refused(f"{path}: {_kind(st.st_mode)}: give a new file or a regular file")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        is_dir = stat.S_ISDIR(os.stat(folder).st_mode)   # a linked folder is a folder
    except OSError:
        is_dir = False
    if not is_dir:
        raise Refused(f"{path}: no such folder: {folder}")
    return path


def check_folder(path: str) -> str:
    """A folder to write files into (``~`` expanded), or :class:`Refused`: it must be a
    real directory (not a symlink) or not exist yet (the writer makes it)."""
    path = os.path.expanduser(os.fspath(path))
    if not path:
        raise Refused("no folder given")
    st = _lstat(path.rstrip(os.sep) or path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{path}: {_kind(st.st_mode)}: give a new folder or a real directory")
    return path


def write_file(path: str, write: Callable[[IO], None], text: bool = False) -> str:
    """Write the file at ``path`` whole or not at all: ``write(f)`` fills a temporary file
    beside it, which then replaces the path. Returns the path written (expanded).
    :class:`Refused` for a path :func:`check_file` refuses; an ``OSError`` of one line
    where the writing fails (nothing is left behind)."""
    path = check_file(path)
    folder, base = os.path.split(os.path.abspath(path))
    old = _lstat(path)
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, _OPEN_FLAGS, 0o666)
    except OSError as exc:
        raise OSError(f"{path}: {exc.strerror or exc}") from None
    try:
        with (os.fdopen(fd, "w", newline="", encoding="utf-8") if text
              else os.fdopen(fd, "wb")) as f:
            write(f)
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))    # keep the file's own mode
        now = _lstat(path)
        if now is not None and not stat.S_ISREG(now.st_mode):   # changed meanwhile
            raise Refused(f"{path}: {_kind(now.st_mode)}: give a new file or a regular file")
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if is_a(exc, OSError):
            raise OSError(f"{path}: {exc.strerror or exc}") from None
        raise
    return path
