"""Text and HTML for snapshots and purge results (bytes are formatted here only)."""
from __future__ import annotations

import html

from ..units import esc, fmt_bytes, html_table, text_table


# -- devices -------------------------------------------------------------------
def device_line(d) -> str:
    """SPEC's reconciliation line for one device."""
    if d.kind == "cpu":
        return (f"cpu · host memory {fmt_bytes(d.total)} · this process {fmt_bytes(d.used_process)}"
                f" · tracked tensors {fmt_bytes(d.attributed)}")
    parts = [f"{d.id} {d.name or ''}".rstrip(), f"total {fmt_bytes(d.total)}"]
    if d.used_all is not None:
        parts.append(f"used {fmt_bytes(d.used_all)} (this process {fmt_bytes(d.used_process)},"
                     f" others {fmt_bytes(d.other_processes)})")
    for fw in d.frameworks:
        text = f"{fw.name} reserved {fmt_bytes(fw.reserved)}, allocated {fmt_bytes(fw.allocated)}"
        if fw.pool is not None:
            text += f", pool {fmt_bytes(fw.pool)}"
        parts.append(text)
    if not d.frameworks:
        parts.append("no framework has used it yet")
    if d.non_framework is not None:
        parts.append(f"rest {fmt_bytes(d.non_framework)} (context, cuBLAS/cuDNN, NCCL, other libraries)")
    return " · ".join(parts)


def rest_line(parts) -> str | None:
    """The rest of a device's line, itemised where the process lets us know (the
    ``"outside"`` internals of the snapshot), and which parts a purge cannot return."""
    if not parts:
        return None
    items = [f"{i.label} {fmt_bytes(i.nbytes)}" if i.nbytes is not None else i.label
             + (f" ({i.count})" if i.count else "") for i in parts]
    kept = [i for i in parts if not i.freed_by_purge]
    tail = ("no purge inside the process returns any of it (only ending the process does)"
            if len(kept) == len(parts) else
            "no purge inside the process returns " + ", ".join(i.label for i in kept))
    return "  rest: " + " · ".join(items) + " · " + tail


def fragmentation_line(d) -> str | None:
    frag = d.fragmentation
    if not frag or not frag.get("free_in_reserved"):
        return None
    text = f"  fragmentation: {fmt_bytes(frag['free_in_reserved'])} reserved but unallocated"
    if frag.get("largest_free_block") is not None:
        text += f", largest free block {fmt_bytes(frag['largest_free_block'])}"
    return text


def _devices_of(h) -> str:
    return ",".join(sorted(h.devices)) or "-"


#: what the last reports laid out, with what it was made of: "rows" -> (the holders list,
#: its rows), "text" / "html" -> (rows, the table), "text hints" / "html hints" -> (the
#: hints, their lines). A report after a cell that changed no holder has the same rows
#: and hints: compared, not laid out again (200 outputs' rows cost milliseconds), and
#: the text and HTML of one report make its rows once.
_LAST_TABLE: dict[str, tuple] = {}


def _rows_of(holders) -> list[list[str]]:
    last = _LAST_TABLE.get("rows")
    if last is not None and last[0] is holders:   # held there: not another list
        return last[1]
    rows = _holder_rows(holders)
    _LAST_TABLE["rows"] = (holders, rows)
    return rows


def _holders_table(holders, form: str):
    """The holders table as text lines (``form`` "text") or HTML."""
    rows = _rows_of(holders)
    last = _LAST_TABLE.get(form)
    if last is not None and last[0] == rows:
        return last[1]
    out = text_table(_HEADERS, rows, {1, 2}) if form == "text" else \
        html_table(_HEADERS, rows, {1, 2})
    _LAST_TABLE[form] = (rows, out)
    return out


#: holders named on a hint line shared by several (the rest are counted)
HINT_NAMES = 3


def _hint_lines(holders, form: str) -> list[str]:
    """One line per hint, as text or HTML: a hint that names its holder itself stands
    alone; the holders that share one hint (200 values in Out) share its line, the first
    few named and the rest counted."""
    items = [(h.label, h.hint, names_itself(h)) for h in holders if h.hint]
    key = form + " hints"
    last = _LAST_TABLE.get(key)
    if last is not None and last[0] == items:
        return last[1]
    lines: dict = {}   # (hint, names its holder) -> the labels of the others
    for label, hint, alone in items:
        labels = lines.setdefault((hint, alone), [])
        if not alone:
            labels.append(label)
    out = []
    for (hint, _), labels in lines.items():
        named = labels[:HINT_NAMES] if labels else []
        more = f" and {len(labels) - HINT_NAMES} more" if labels and len(labels) > HINT_NAMES \
            else ""
        if form == "text":
            out.append(f"hint: {', '.join(named)}{more}: {hint}" if named else f"hint: {hint}")
        else:
            who = ", ".join(f"<b>{esc(label)}</b>" for label in named)
            out.append(f"<div>hint: {f'{who}{more}: ' if named else ''}{code_html(hint)}</div>")
    _LAST_TABLE[key] = (items, out)
    return out


def _holder_rows(holders) -> list[list[str]]:
    rows = []
    for h in holders:
        name = h.label + (f" ({', '.join(h.aliases)})" if h.aliases else "")
        rows.append([name, fmt_bytes(h.unique), fmt_bytes(h.shared), _devices_of(h), h.type,
                     h.largest_path or ""])
    return rows


_HEADERS = ["holder", "only it", "shared", "device", "what", "largest path"]
_INTERNAL_HEADERS = ["framework internal", "bytes", "count", "device", "kind", "purge frees it",
                     "what it is"]
_KIND_WORDS = {"allocated": "allocated", "cached": "cached, free"}


def _short(note: str | None) -> str:
    return (note or "").split(";")[0].strip()


def _internal_rows(internals) -> list[list[str]]:
    return [[f"{i.framework}: {i.label}" if i.framework else i.label,
             fmt_bytes(i.nbytes), "" if i.count is None else f"{i.count:,}", i.device,
             _KIND_WORDS.get(i.kind, i.kind), "yes" if i.freed_by_purge else "no", _short(i.note)]
            for i in internals]


def _listed_internals(s) -> list:
    return [i for i in getattr(s, "internals", ()) if i.kind in _KIND_WORDS]


def _rest_parts(s, dev: str) -> list:
    return [i for i in getattr(s, "internals", ()) if i.device == dev and i.kind == "outside"]


def processes_line(s, dev: str) -> str | None:
    """The line under a device that sums up the other processes on it (a
    :class:`.processes.DeviceProcesses` says it)."""
    for dp in getattr(s, "processes", ()):
        if dp.device == dev:
            return dp.summary()
    return None
def names_itself(h) -> bool:
    """Whether a holder's hint starts with its name (`` `opt` holds ...``): then the
    report gives the hint alone, not ``opt: `opt` holds ...``."""
    return h.hint.startswith(f"`{h.name}` ")


def snapshot_text(s) -> str:
    """Aligned plain text of a snapshot."""
    lines: list[str] = []
    for d in s.devices:
        lines.append(device_line(d))
        others = processes_line(s, d.id)
        if others:
            lines.append(others)
        rest = rest_line(_rest_parts(s, d.id))
        if rest:
            lines.append(rest)
        frag = fragmentation_line(d)
        if frag:
            lines.append(frag)
    for m in s.messages:
        lines.append(f"note: {m}")
    if s.details:   # %gpumem NAME: that name's storages, not the holders table again
        for h in s.details:
            lines.append("")
            lines.append(f"{h.name}: {fmt_bytes(h.total)} in {h.tensors} storage(s)")
            lines += text_table(*_detail_table(h), {1}, indent="  ")
        return "\n".join(lines).rstrip()
    lines.append("")
    if s.holders:
        lines += _holders_table(s.holders, "text")
    else:
        lines.append("no name holds tensor memory on " + ", ".join(d.id for d in s.devices))
    listed = _listed_internals(s)
    if listed:
        lines.append("")
        lines += text_table(_INTERNAL_HEADERS, _internal_rows(listed), {1, 2})
    un = {k: v for k, v in s.unattributed.items() if v}
    if un:
        lines.append("unattributed (allocated, reached by no name): " +
                     ", ".join(f"{fmt_bytes(v)} on {k}" for k, v in un.items()))
        for dev, groups in s.unattributed_sites.items():
            lines += [f"  {dev}: {g['text']}" for g in groups]
    hints = _hint_lines(s.holders, "text")
    if hints:
        lines.append("")
        lines += hints
    return "\n".join(lines).rstrip()


def _detail_table(h) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of ``%gpumem NAME``: its storages (and, while trace is on,
    where each was allocated)."""
    sited = any(r.allocated_at for r in h.rows)
    headers = ["path", "bytes", "device", "what", "shared with"] + (["allocated at"] if sited else [])
    rows = [[r.path, fmt_bytes(r.nbytes), r.device, r.what or "", ", ".join(r.shared_with)]
            + ([r.allocated_at or "allocated before trace was on"] if sited else [])
            for r in h.rows]
    return headers, rows


def code_html(text) -> str:
    """Escaped HTML of a hint or note, its backticked spans as ``<code>`` (what the
    text form shows between backticks is what the user types)."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:   # an unpaired backtick: shown as it is
        return html.escape(str(text))
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p)
                   for i, p in enumerate(parts))




def snapshot_html(s) -> str:
    """Rich HTML of a snapshot (the same facts as the text)."""
    parts = ["<div class='jupyter-gpumem'>"]
    for d in s.devices:
        parts.append(f"<div><code>{esc(device_line(d))}</code></div>")
        others = processes_line(s, d.id)
        if others:
            parts.append(f"<div>{code_html(others.strip())}</div>")
        rest = rest_line(_rest_parts(s, d.id))
        if rest:
            parts.append(f"<div><code>{esc(rest.strip())}</code></div>")
        frag = fragmentation_line(d)
        if frag:
            parts.append(f"<div><code>{esc(frag.strip())}</code></div>")
    for m in s.messages:
        parts.append(f"<div><em>note: {code_html(m)}</em></div>")
    if s.details:   # %gpumem NAME: that name's storages, not the holders table again
        for h in s.details:
            parts.append(f"<h4>{esc(h.name)}: {esc(fmt_bytes(h.total))}</h4>")
            parts.append(html_table(*_detail_table(h), {1}))
        parts.append("</div>")
        return "".join(parts)
    if s.holders:
        parts.append(_holders_table(s.holders, "html"))
    else:
        parts.append("<div>no name holds tensor memory</div>")
    listed = _listed_internals(s)
    if listed:
        parts.append(html_table(_INTERNAL_HEADERS, _internal_rows(listed), {1, 2}))
    un = {k: v for k, v in s.unattributed.items() if v}
    if un:
        parts.append("<div>unattributed (allocated, reached by no name): " + esc(
            ", ".join(f"{fmt_bytes(v)} on {k}" for k, v in un.items())) + "</div>")
        for dev, groups in s.unattributed_sites.items():
            parts += [f"<div style='margin-left:1em'>{esc(dev)}: {esc(g['text'])}</div>"
                      for g in groups]
    parts += _hint_lines(s.holders, "html")
    parts.append("</div>")
    return "".join(parts)


# -- purge ---------------------------------------------------------------------------
def _allocated_column(r) -> bool:
    """Whether any device of the purge has allocator counters (none on the host)."""
    return any(c.allocated_before is not None for c in r.changes)


def _purge_rows(r) -> list[list[str]]:
    if r.dry_run:
        return [[dev, fmt_bytes(n)] for dev, n in sorted(r.predicted.items())]
    allocated = _allocated_column(r)
    return [[c.device, c.measure, fmt_bytes(c.before), fmt_bytes(c.after), fmt_bytes(c.freed)]
            + ([("" if c.allocated_before is None else
                 f"{fmt_bytes(c.allocated_before)} → {fmt_bytes(c.allocated_after)}")]
               if allocated else [])
            for c in r.changes]


def _purge_headers(r) -> list[str]:
    return ["device", "would free"] if r.dry_run else \
        ["device", "measure", "before", "after", "freed"] + (
            ["allocated"] if _allocated_column(r) else [])


def purge_text(r) -> str:
    """Plain text of a purge result."""
    head = "dry run: would remove " if r.dry_run else "removed "
    lines = [head + (", ".join(r.removed) if r.removed else "nothing")]
    lines += text_table(_purge_headers(r), _purge_rows(r), {1} if r.dry_run else {2, 3, 4})
    lines += [f"note: {m}" for m in r.messages]
    return "\n".join(lines)


def purge_html(r) -> str:
    head = "dry run: would remove " if r.dry_run else "removed "
    parts = [f"<div class='jupyter-gpumem'><div>{esc(head)}<code>"
             f"{esc(', '.join(r.removed) if r.removed else 'nothing')}</code></div>",
             html_table(_purge_headers(r), _purge_rows(r), {1} if r.dry_run else {2, 3, 4})]
    parts += [f"<div><em>note: {code_html(m)}</em></div>" for m in r.messages]
    parts.append("</div>")
    return "".join(parts)
