"""What people read: bytes in units, results as text or HTML. Imports nothing of the package."""
from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: int | None) -> str:
    """``1536`` -> ``1.5 KiB``; ``None`` -> ``n/a``."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{sign}{int(value)} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def one_line(text, limit: int = 300) -> str:
    """The first line of ``text``, trimmed to ``limit`` characters (an error, for a view)."""
    lines = str(text).strip().splitlines() or [""]
    line = lines[0].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Report:
    """A result as IPython shows it: aligned text in a terminal, HTML in a notebook.

    A subclass names its renderers: ``_text = snapshot_text`` and ``_html = snapshot_html``
    (functions of the result)."""

    def _text(self) -> str:
        raise NotImplementedError

    def _html(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self._text()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self._text())

    def _repr_html_(self) -> str:
        return self._html()
