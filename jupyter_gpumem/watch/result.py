"""What a watched cell or block did to memory: :class:`WatchResult` and its forms.

One result is the report of ``%%gpuwatch``, a line of the ``watch on``
footer, a record of the per-cell history and what ``with watch()`` gives.
It holds no reference to user objects (names, bytes and text only), so
keeping it in ``Out`` or in a variable pins no memory. ``to_json()`` gives
the ``jupyter_gpumem.watch/1`` object described in :mod:`jupyter_gpumem.watch`.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..units import JsonFields, esc, fmt_bytes, html_table, json_field, round6, text_table

WATCH_SCHEMA = "jupyter_gpumem.watch/1"
_KIND_WORDS = {"created": "new", "grew": "grew", "shrank": "shrank", "deleted": "deleted"}
_FOOTER_NAMES = 3
#: the holders every short message shows (the footer's, the summary's, ``--warn-at``'s),
#: and so the most a suggested purge command names: a command names only what is shown
HOLDERS_NAMED = 5


def signed(n: int | None) -> str:
    """``+1.2 GiB`` / ``-512.0 MiB`` / ``n/a``."""
    if n is None:
        return "n/a"
    return ("+" if n >= 0 else "") + fmt_bytes(n)


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a


def allocator_measure(usage: Any) -> str:
    """How a device's allocated figure was measured: the allocators of the frameworks
    that report it there (``torch allocator``, ``cupy + jax allocators``)."""
    names = [f.name for f in getattr(usage, "frameworks", None) or () if f.allocated is not None]
    if not names:
        return "no framework allocator"
    return " + ".join(names) + (" allocator" if len(names) == 1 else " allocators")


@dataclass
class DeviceWatch(JsonFields):
    """One device before, during and after the watched code (bytes)."""

    JSON_AFTER = {"allocated_delta": "allocated_after", "reserved_delta": "reserved_after",
                  "share_after": "used_all_after"}

    id: str
    kind: str
    total: int | None = None
    allocated_before: int | None = None
    allocated_after: int | None = None
    allocated_measure: str = "no framework allocator"
    reserved_before: int | None = None
    reserved_after: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    peak_measure: str | None = None
    peak_rss: int | None = None
    peak_traced: int | None = None
    traced_before: int | None = None
    process_before: int | None = None
    process_after: int | None = None
    process_peak_sampled: int | None = None
    process_measure: str = "NVML"
    samples: int = 0
    used_all_after: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def allocated_delta(self) -> int | None:
        return _delta(self.allocated_before, self.allocated_after)

    @property
    def reserved_delta(self) -> int | None:
        return _delta(self.reserved_before, self.reserved_after)

    @property
    def process_delta(self) -> int | None:
        return _delta(self.process_before, self.process_after)

    @property
    def share_after(self) -> float | None:
        """Share of the device in use after the code (all processes; host RAM for cpu)."""
        used = self.used_all_after
        if used is None and self.kind != "cpu":
            used = self.reserved_after
        if used is None or not self.total:
            return None
        return used / self.total


@dataclass
class HolderChange(JsonFields):
    """A name (or hidden holder) the code created, grew, shrank or deleted."""

    JSON_AFTER = {"delta": "after"}

    name: str
    change: str                 # created | grew | shrank | deleted
    before: int
    after: int
    devices: dict[str, int] = field(default_factory=dict)   # device -> change in bytes
    hidden: bool = False
    shared: int = 0             # bytes other names reach too
    type: str = ""
    purge: str | None = None

    @property
    def delta(self) -> int:
        return self.after - self.before


@dataclass
class HolderEntry(JsonFields):
    """One of the biggest holders, named when the code raised or a device is full."""

    name: str
    nbytes: int = json_field(key="bytes")
    devices: dict[str, int] = field(default_factory=dict)
    hidden: bool = False
    shared: int = 0
    type: str = ""
    purge: str | None = None


def _error_json(error: dict | None) -> dict | None:
    return dict(error) if error else None


@dataclass
class WatchResult(JsonFields):
    """The report of one watched cell or block; text, HTML and JSON forms (JSON: the
    ``jupyter_gpumem.watch/1`` object)."""

    schema = WATCH_SCHEMA
    JSON_AFTER = {"schema": None, "end": "start", "purge_command": "holders"}

    label: str
    source: str                          # "%%gpuwatch" | "watch on" | "watch()"
    execution_count: int | None = None
    start: float = 0.0                   # unix seconds
    wall: float = json_field(0.0, convert=round6)        # seconds the code ran
    interval: float = 0.05
    devices: list[DeviceWatch] = field(default_factory=list)
    changes: list[HolderChange] = field(default_factory=list)
    holders_mode: str = "none"
    partial: bool = False
    error: dict | None = json_field(None, convert=_error_json)   # {"type", "message", "oom"}
    holders: list[HolderEntry] = field(default_factory=list)
    #: how many holders there were (``holders`` keeps only the biggest of them)
    holders_total: int = json_field(0, leave_out=True)
    purge_names: list[str] = json_field(default_factory=list, leave_out=True)   # purge_command
    context: str = json_field("ipython", leave_out=True)         # "ipython" | "script"
    warning: str | None = None
    auto_purge: dict | None = None
    messages: list[str] = field(default_factory=list)
    overhead: float = json_field(0.0, convert=round6)    # seconds the watch itself took
    verbose: bool = json_field(False, leave_out=True)   # text: every figure (``%%gpuwatch -v``)

    @property
    def end(self) -> float:
        return self.start + self.wall

    @property
    def purge_command(self) -> str | None:
        """The command that frees the holders named on error or warning: only those the
        messages show (the first :data:`HOLDERS_NAMED` holders), never one left unshown."""
        names = self.purge_named
        if not names:
            return None
        if self.context == "ipython":
            return "%gpumem purge " + " ".join(_magic_arg(n) for n in names)
        return f"jupyter_gpumem.purge({names!r}, namespace=globals())"

    @property
    def purge_named(self) -> list[str]:
        """The holders' purge arguments the purge command names, in its order."""
        shown = {h.purge for h in self.holders[:HOLDERS_NAMED] if h.purge}
        return [n for n in self.purge_names if n in shown]

    def holders_left(self, shown: int) -> int:
        """Holders not among the first ``shown`` listed: every one found, not only those
        kept in ``holders``."""
        total = max(self.holders_total, len(self.holders))
        return max(total - min(shown, len(self.holders)), 0)

    def purge_note(self, listed: int) -> str:
        """`` (the 5 largest)`` where the purge command names fewer holders than the
        ``listed`` first ones a message shows (empty where it names them all)."""
        named = self.purge_named
        listed = min(listed, len(self.holders))
        if not named or len(named) >= listed:
            return ""
        first = [h.purge for h in self.holders[:len(named)]]
        if first == named:
            return " (the largest)" if len(named) == 1 else f" (the {len(named)} largest)"
        return f" ({len(named)} of the {listed} listed)"

    def purge_text(self, listed: int) -> str | None:
        """The purge command and, where it names fewer holders than ``listed``, a note."""
        command = self.purge_command
        return None if command is None else command + self.purge_note(listed)

    @property
    def hidden_purge_command(self) -> str | None:
        """``%gpumem purge``, when some named holders are hidden ones (no user name touched)."""
        if self.context == "ipython" and any(h.hidden and h.purge for h in self.holders):
            return "%gpumem purge"
        return None

    def device(self, dev: str) -> DeviceWatch | None:
        return next((d for d in self.devices if d.id == dev), None)

    def change(self, name: str) -> HolderChange | None:
        return next((c for c in self.changes if c.name == name), None)

    # -- text ------------------------------------------------------------------------------
    def footer(self, summary: bool = True) -> str:
        """The one-line ``watch on`` footer (a second line when the cell raised);
        ``summary=False``: only its warning and automatic purge (a cell that reported
        itself, ``%%gpuwatch``, has said the rest)."""
        if not summary:
            return "\n".join(([self.warning] if self.warning else []) +
                             ([auto_purge_line(self.auto_purge)] if self.auto_purge else []))
        parts = []
        multi = len(self.devices) > 1
        for d in self.devices:
            text = device_short(d)
            parts.append(f"{d.id} {text}" if multi else text)
        names = changes_short(self.changes)
        if names:
            parts.append(names)
        parts.append(fmt_seconds(self.wall))
        if self.error:
            parts.append(f"raised {self.error['type']}")
        lines = [" · ".join(parts)]
        if self.error and self.error.get("oom") and self.holders:
            lines.append("  " + holders_short(self))
        if self.warning:
            lines.append(self.warning)
        if self.auto_purge:
            lines.append(auto_purge_line(self.auto_purge))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return watch_text(self) if self.verbose else watch_summary(self)

    def verbose_text(self) -> str:
        """The full plain-text report: every exact figure and how it was measured."""
        return watch_text(self)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        return watch_html(self)


# -- rendering ---------------------------------------------------------------------------------
def fmt_seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min"


def device_short(d: DeviceWatch) -> str:
    if d.kind == "cpu":
        text = f"{signed(d.allocated_delta)} tensors"
        if d.peak_rss is not None:
            text += f" (peak RSS {fmt_bytes(d.peak_rss)})"
        return text
    text = f"{signed(d.allocated_delta)} allocated"
    if d.peak_allocated is not None:
        text += f" (peak {fmt_bytes(d.peak_allocated)})"
    elif d.process_peak_sampled is not None:
        text += f" (sampled peak {fmt_bytes(d.process_peak_sampled)})"
    return text


def changes_short(changes: list[HolderChange]) -> str:
    groups: dict[str, list[HolderChange]] = {}
    for c in changes:
        groups.setdefault(c.change, []).append(c)
    parts = []
    for kind in ("created", "grew", "shrank", "deleted"):
        items = sorted(groups.get(kind, []), key=lambda c: -abs(c.delta))
        if not items:
            continue
        shown = []
        for c in items[:_FOOTER_NAMES]:
            amount = fmt_bytes(c.after) if kind == "created" else \
                fmt_bytes(c.before) if kind == "deleted" else signed(c.delta)
            shown.append(f"{c.name} {amount}")
        more = f" +{len(items) - _FOOTER_NAMES} more" if len(items) > _FOOTER_NAMES else ""
        parts.append(f"{_KIND_WORDS[kind]}: " + ", ".join(shown) + more)
    return " · ".join(parts)


def _magic_arg(name: str) -> str:
    """``name`` as one argument of a magic line: quoted where it must be, in double
    quotes where it holds a single one (``"IPython's _"``; the magics read a token
    quoted as a whole, never a shell's joined quotes)."""
    quoted = shlex.quote(name)
    if quoted != name and "'" in name and '"' not in name:
        return f'"{name}"'
    return quoted


def holders_short(r: WatchResult, n: int = HOLDERS_NAMED) -> str:
    shown = ", ".join(f"{h.name} {fmt_bytes(h.nbytes)}" for h in r.holders[:n])
    left = r.holders_left(n)
    more = f" +{left} more" if left else ""
    text = f"biggest holders: {shown}{more}"
    if r.purge_command:
        text += f" · free them: {r.purge_text(n)}"
    return text


def _more_holders(r: WatchResult) -> str | None:
    """``+20 more holders, not listed`` under the full list, where it was capped."""
    left = r.holders_left(len(r.holders))
    return f"+{left} more holder{'s' if left != 1 else ''}, not listed" if left else None


def auto_purge_line(info: dict) -> str:
    removed = ", ".join(info.get("removed") or []) or "nothing"
    freed = ", ".join(f"{fmt_bytes(v)} on {k}" for k, v in (info.get("freed") or {}).items()
                      if v is not None)
    return f"auto-purge of hidden holders and caches: removed {removed}" + \
        (f"; freed {freed}" if freed else "")


def _range(a: int | None, b: int | None) -> str:
    return f"{fmt_bytes(a)} → {fmt_bytes(b)}"


def _one(present: bool, text, absent: str | None = None) -> list[str]:
    """``[text()]`` when the figure is there, else ``[absent]`` (or nothing)."""
    return [text()] if present else [absent] if absent else []


def device_lines(d: DeviceWatch, interval: float) -> list[str]:
    """The facts of one device, a phrase each."""
    if d.kind == "cpu":
        facts = [f"tensors {signed(d.allocated_delta)} "
                 f"({_range(d.allocated_before, d.allocated_after)}, {d.allocated_measure})"]
        facts += _one(d.peak_rss is not None, lambda: f"process peak RSS {fmt_bytes(d.peak_rss)} "
                      "(exact, VmHWM: all host memory of this process)", "no exact peak on cpu here")
        facts += _one(d.peak_traced is not None, lambda: f"Python heap peak {fmt_bytes(d.peak_traced)} "
                      f"(tracemalloc, exact; from {fmt_bytes(d.traced_before)})")
        facts.append("no allocator peak for tensors on cpu")
    else:
        facts = [f"allocated {signed(d.allocated_delta)} "
                 f"({_range(d.allocated_before, d.allocated_after)}, {d.allocated_measure})"]
        facts += _one(d.reserved_before is not None or d.reserved_after is not None,
                      lambda: f"reserved {signed(d.reserved_delta)} "
                      f"({_range(d.reserved_before, d.reserved_after)})")
        facts += _one(d.peak_allocated is not None, lambda: f"peak {fmt_bytes(d.peak_allocated)} "
                      f"allocated, {fmt_bytes(d.peak_reserved)} reserved ({d.peak_measure})",
                      "no allocator peak (no framework counters on this device yet)")
    facts += _one(d.process_peak_sampled is not None, lambda: (
        f"{'RSS' if d.kind == 'cpu' else 'process'} {signed(d.process_delta)}, "
        f"sampled peak {fmt_bytes(d.process_peak_sampled)} ({d.process_measure}, "
        f"sampled every {fmt_seconds(interval)}, {d.samples} samples)"))
    return facts


def _change_rows(r: WatchResult) -> list[list[str]]:
    rows = []
    for c in sorted(r.changes, key=lambda c: -abs(c.delta)):
        amount = fmt_bytes(c.after) if c.change == "created" else \
            fmt_bytes(c.before) if c.change == "deleted" else signed(c.delta)
        what = c.type + (" (hidden)" if c.hidden else "")
        extra = f"{fmt_bytes(c.shared)} shared with other names" if c.shared else ""
        if c.change in ("grew", "shrank"):
            extra = (_range(c.before, c.after) + ("; " + extra if extra else ""))
        rows.append([_KIND_WORDS[c.change], c.name, amount, ",".join(sorted(c.devices)), what, extra])
    return rows


def _holder_rows(r: WatchResult) -> list[list[str]]:
    return [[h.name, fmt_bytes(h.nbytes), ",".join(sorted(h.devices)),
             h.type + (" (hidden)" if h.hidden else ""),
             f"{fmt_bytes(h.shared)} shared" if h.shared else ""] for h in r.holders]


def _head(r: WatchResult) -> str:
    return f"{r.source} · {r.label} · {fmt_seconds(r.wall)}"


def watch_text(r: WatchResult) -> str:
    """The full plain-text report."""
    lines = [_head(r)]
    for d in r.devices:
        lines.append(f"{d.id}  " + " · ".join(device_lines(d, r.interval)))
        lines += [f"  note: {n}" for n in d.notes]
    mode = r.holders_mode + (", partial" if r.partial else "")
    if r.changes:
        lines.append(f"names ({mode} scan):")
        lines += text_table(None, _change_rows(r), {2}, indent="  ")
    else:
        lines.append(f"names: no name gained or lost memory ({mode} scan)")
    if r.error:
        lines.append(f"raised {r.error['type']}: {r.error['message']}")
    if r.holders:
        lines.append("biggest holders:")
        lines += text_table(None, _holder_rows(r), {1}, indent="  ")
        more = _more_holders(r)
        if more:
            lines.append(f"  {more}")
    if r.purge_command:
        lines.append(f"free them: {r.purge_text(len(r.holders))}")
    if r.hidden_purge_command:
        lines.append(f"hidden holders only (no user name touched): {r.hidden_purge_command}")
    if r.warning:
        lines.append(r.warning)
    if r.auto_purge:
        lines.append(auto_purge_line(r.auto_purge))
    lines += [f"note: {m}" for m in r.messages]
    return "\n".join(lines)


def watch_summary(r: WatchResult) -> str:
    """The short report in plain words: what each device gained and its peak, which
    names changed, what to do; the exact figures are one ``-v`` away."""
    lines = [_head(r)]
    lines += _summary_lines(r)
    if r.holders:
        if not _holders_in_summary(r):
            lines.append(holders_short(r))
    elif r.purge_command:
        lines.append(f"free them: {r.purge_text(HOLDERS_NAMED)}")
    if r.hidden_purge_command:
        lines.append(f"hidden holders only (no user name touched): {r.hidden_purge_command}")
    lines += [f"note: {m}" for m in r.messages]
    lines.append("exact figures: " + ("%%gpuwatch -v" if r.source == "%%gpuwatch"
                                      else "the result's verbose_text()"))
    return "\n".join(lines)


def _holders_in_summary(r: WatchResult) -> bool:
    """Whether :func:`_summary_lines` names the holders and their purge (an
    out-of-memory error's, right under it): the short reports then say them once."""
    return bool(r.holders and r.error and r.error.get("oom"))


def _summary_lines(r: WatchResult) -> list[str]:
    """The footer's facts, one device a line when there are several."""
    lines = [f"{d.id}: {device_short(d)}" for d in r.devices]
    names = changes_short(r.changes)
    lines.append(names or "no name gained or lost memory"
                 + (" (partial scan)" if r.partial else ""))
    if r.error:
        lines.append(f"raised {r.error['type']}: {r.error['message']}")
        if _holders_in_summary(r):
            lines.append(holders_short(r))
    if r.warning:
        lines.append(r.warning)
    if r.auto_purge:
        lines.append(auto_purge_line(r.auto_purge))
    return lines


def watch_html(r: WatchResult) -> str:
    """The report as HTML: the short report, and every exact figure one click away."""
    parts = [f"<div class='jupyter-gpumem'><div><b>{esc(_head(r))}</b></div>"]
    parts += [f"<div>{esc(line)}</div>" for line in _summary_lines(r)]
    if r.holders:
        if not _holders_in_summary(r):
            parts.append(f"<div>{esc(holders_short(r))}</div>")
    elif r.purge_command:
        parts.append(f"<div>free them: <code>{esc(r.purge_command)}</code>"
                     f"{esc(r.purge_note(HOLDERS_NAMED))}</div>")
    parts += [f"<div><em>note: {esc(m)}</em></div>" for m in r.messages]
    parts.append(f"<details{' open' if r.verbose else ''}><summary>exact figures</summary>"
                 f"{_watch_html_full(r)}</details></div>")
    return "".join(parts)


def _watch_html_full(r: WatchResult) -> str:
    """Every figure of the report as HTML (the same facts as :func:`watch_text`)."""
    parts = ["<div>"]
    for d in r.devices:
        parts.append(f"<div><code>{esc(d.id)}</code> " +
                     " · ".join(esc(f) for f in device_lines(d, r.interval)) + "</div>")
        parts += [f"<div><em>note: {esc(n)}</em></div>" for n in d.notes]
    mode = r.holders_mode + (", partial" if r.partial else "")
    if r.changes:
        parts.append(html_table(["", "name", "bytes", "device", "what", ""],
                                 _change_rows(r), {2}))
    else:
        parts.append(f"<div>no name gained or lost memory ({esc(mode)} scan)</div>")
    if r.error:
        parts.append(f"<div style='color:#b00'>raised <b>{esc(r.error['type'])}</b>: "
                     f"{esc(r.error['message'])}</div>")
    if r.holders:
        parts.append("<div>biggest holders:</div>")
        parts.append(html_table(["name", "bytes", "device", "what", ""], _holder_rows(r), {1}))
        more = _more_holders(r)
        if more:
            parts.append(f"<div>{esc(more)}</div>")
    if r.purge_command:
        parts.append(f"<div>free them: <code>{esc(r.purge_command)}</code>"
                     f"{esc(r.purge_note(len(r.holders)))}</div>")
    if r.hidden_purge_command:
        parts.append(f"<div>hidden holders only (no user name touched): "
                     f"<code>{esc(r.hidden_purge_command)}</code></div>")
    if r.warning:
        parts.append(f"<div style='color:#b60'>{esc(r.warning)}</div>")
    if r.auto_purge:
        parts.append(f"<div>{esc(auto_purge_line(r.auto_purge))}</div>")
    parts += [f"<div><em>note: {esc(m)}</em></div>" for m in r.messages]
    parts.append("</div>")
    return "".join(parts)
