"""The report kit, the bottom layer: what people read, drawn the same everywhere. More than
units (the name stays): bytes in units (:func:`fmt_bytes`), aligned text and HTML tables
(:func:`text_table`, :func:`html_table`), escaping and shortening (:func:`esc`,
:func:`shorten`, :func:`one_line`), a result as text and HTML (:class:`Report`) and as JSON
from its dataclass fields (:class:`JsonFields`, :func:`json_field`), and the one way a
failure off the main path is said (:func:`complain`). Imports nothing of the package.
See docs/ARCHITECTURE.md#the-modules-layer-by-layer."""
from __future__ import annotations

import html
import sys
from dataclasses import MISSING, field, fields
from operator import attrgetter, methodcaller
from types import FunctionType

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


# -- the kit of every report ------------------------------------------------------------
def text_table(headers: list[str] | None, rows, right=frozenset(), indent: str = "") -> list[str]:
    """Aligned lines of ``rows`` (lists of text) under ``headers`` (None: no header line),
    the columns in ``right`` aligned right, each line after ``indent``."""
    lines = ([list(headers)] if headers is not None else []) + [list(r) for r in rows]
    if not lines:
        return []
    n = max(map(len, lines))
    widths = [0] * n
    for row in lines:
        for i, w in enumerate(map(len, row)):
            if w > widths[i]:
                widths[i] = w
    # one format per row length (a short row is aligned as far as it goes)
    formats: dict[int, str] = {}
    out = []
    for row in lines:
        fmt = formats.get(len(row))
        if fmt is None:
            fmt = formats[len(row)] = "  ".join(
                ("{:>%d}" if i in right else "{:<%d}") % widths[i] if widths[i] else "{}"
                for i in range(len(row)))
        out.append(indent + fmt.format(*row).rstrip())
    return out


def esc(x) -> str:
    """``x`` as text, escaped for HTML."""
    return html.escape(str(x))


def html_table(headers, rows, right=frozenset()) -> str:
    """An HTML table of ``rows`` under ``headers``, every cell escaped, the columns in
    ``right`` aligned right."""
    def opening(tag: str, i: int) -> str:
        return f"<{tag} style='text-align:{'right' if i in right else 'left'}'>"

    head = "".join(opening("th", i) + esc(h) + "</th>" for i, h in enumerate(headers))
    width = max(map(len, rows), default=0)
    opens = [opening("td", i) for i in range(width)]
    body = "".join("<tr>" + "".join(o + esc(c) + "</td>" for o, c in zip(opens, row)) + "</tr>"
                   for row in rows)
    return f"<table class='jupyter-gpumem'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def shorten(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters, an ellipsis last where it was cut."""
    return text if len(text) <= width else text[:width - 1] + "…"


class MissingPackage(ImportError):
    """An optional feature's package is not installed: its text names the package and the
    extra that brings it (``plotting needs matplotlib, which is not installed: pip install
    matplotlib (the package's [plot] extra)``): the package is installed from its source,
    so the command names the package itself."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        super().__init__(f"{feature} needs {package}, which is not installed: "
                         f"pip install {package} (the package's [{extra}] extra)")


def complain(what: str, exc: BaseException | None = None) -> None:
    """Say one line of the product's own trouble (``jupyter_gpumem: what: Error: text``; ``what`` may be empty) on
    ``sys.stderr``. Where that stream fails (a cell set one whose ``write`` raises), the
    line goes to the process's own ``sys.__stderr__``; failing that too, nowhere:
    reporting an error never raises."""
    parts = [what] if what else []
    if exc is not None:
        parts.append(type(exc).__name__)
        try:
            parts.append(str(exc))
        except Exception:  # noqa: BLE001 - an exception whose text cannot be read
            pass
    line = "jupyter_gpumem: " + ": ".join(parts)
    for stream in (sys.stderr, sys.__stderr__):
        if stream is None:
            continue
        try:
            stream.write(line + "\n")
            return
        except Exception:  # noqa: BLE001 - the next stream, or silence
            continue


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


# -- JSON of a result --------------------------------------------------------------------------
_SCALARS = frozenset((str, int, float, bool, type(None)))
_SCALAR_NAMES = frozenset(("str", "int", "float", "bool", "None"))


def plain(value):
    """``value`` as JSON-able data: lists and dicts copied, a result object as its
    ``to_json()``, anything else as it is."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _SCALARS else plain(v) for v in value]
    if isinstance(value, dict):
        return {k: v if type(v) in _SCALARS else plain(v) for k, v in value.items()}
    to_json = getattr(value, "to_json", None)
    return value if to_json is None else to_json()


def minus(a: int | None, b: int | None) -> int | None:
    """``a - b``, or None where either is unknown (a figure a device did not give)."""
    return None if a is None or b is None else a - b


def round6(seconds: float) -> float:
    """Seconds as the JSON gives them: to the microsecond."""
    return round(seconds, 6)


def json_field(default=MISSING, *, key: str | None = None, leave_out: bool = False,
               convert=None, if_any: bool = False, **options):
    """A dataclass ``field`` that says how :class:`JsonFields` writes it: under another
    ``key``, not at all (``leave_out``), through ``convert`` (its value -> JSON-able), or
    only when it holds something (``if_any``). ``options`` go to ``dataclasses.field``."""
    metadata = {"json": (key, leave_out, convert, if_any)}
    return field(default=default, metadata=metadata, **options)


class JsonFields:
    """``to_json()`` of a dataclass from its fields: ``{field: value}`` in field order,
    each value as its annotation says (a number or text as it is, ``list[str]`` and
    ``dict[str, int]`` copied, anything else through :func:`plain`) unless its
    :func:`json_field` says otherwise.

    A class declares only what differs, in ``JSON_AFTER``: ``key -> the key it follows``
    (``None``: first), taken in turn. A key that is no field is a value of its own
    (``schema``, a derived figure): the attribute of that name gives it (a property, a
    class constant, or a method called without arguments), or, for ``key: (after,
    attribute)``, the attribute named. A key that is a field is moved there. Subclasses
    add to their bases' ``JSON_AFTER``."""

    JSON_AFTER = {}

    def to_json(self) -> dict:
        out = {}
        for key, get, convert, if_any in _PLANS.get(type(self)) or _json_plan(type(self)):
            value = get(self)
            if if_any and not value:
                continue
            out[key] = value if convert is None else convert(value)
        return out


_PLANS: dict[type, tuple] = {}


def _by_annotation(annotation):
    """How a field's value becomes JSON, from its annotation: ``None`` (as it is), ``list``
    or ``dict`` (a copy) or :func:`plain`."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = text.replace(" ", "")
    if set(text.split("|")) <= _SCALAR_NAMES:
        return None
    for kind, convert in (("list[", list), ("dict[str,", dict)):
        if text.startswith(kind) and text.endswith("]"):
            inner = text[len(kind):-1]
            if set(inner.split("|")) <= _SCALAR_NAMES:
                return convert
    return plain


def _json_plan(cls: type) -> tuple:
    """``(key, getter, converter, if_any)`` per key of ``cls``'s JSON, in order (once a class)."""
    steps = {}
    for f in fields(cls):
        key, leave_out, convert, if_any = f.metadata.get("json", (None, False, None, False))
        if not leave_out:
            steps[key or f.name] = (attrgetter(f.name), convert or _by_annotation(f.type), if_any)
    after: dict = {}
    for base in reversed(cls.__mro__):
        after.update(base.__dict__.get("JSON_AFTER", {}))
    for key, place in after.items():
        if key in steps:
            step = steps.pop(key)
        else:
            place, attribute = place if isinstance(place, tuple) else (place, key)
            call = isinstance(getattr(cls, attribute, None), FunctionType)
            step = (methodcaller(attribute) if call else attrgetter(attribute), plain, False)
        if place is not None and place not in steps:
            raise TypeError(f"{cls.__name__}.JSON_AFTER: {key!r} follows {place!r}, no key")
        items = list(steps.items())
        items.insert(0 if place is None else list(steps).index(place) + 1, (key, step))
        steps = dict(items)
    plan = _PLANS[cls] = tuple((key, *step) for key, step in steps.items())
    return plan
