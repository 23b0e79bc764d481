"""Text and HTML of the cluster results, in the style of the notebook's own reports
(the same device line per worker device, the same tables)."""
from __future__ import annotations

from typing import Any

from ..core.render import device_line
from ..units import esc, fmt_bytes, html_table, shorten, text_table


def key_text(key: Any) -> str:
    """A Dask key as a user reads it: ``'x-1a2b'`` or ``('emb-1a2b', 0, 3)``."""
    return key if isinstance(key, str) else repr(key)

_HOLDER_HEADERS = ["holder", "what", "bytes", "where", "keys in memory"]
_UNCLAIMED_HEADERS = ["key", "bytes", "worker", "held by"]
_SHOWN_UNCLAIMED = 20
_CSS = "jupyter-gpumem jupyter-gpumem-cluster"


def _holder_rows(s) -> list[list[str]]:
    rows = []
    for h in s.holders:
        name = h.name + (f" ({', '.join(h.aliases)})" if h.aliases else "")
        keys = f"{h.in_memory} of {h.keys}"
        if h.not_in_memory:
            keys += " (" + ", ".join(f"{n} {state}" for state, n in h.not_in_memory.items()) + ")"
        rows.append([name, h.what, fmt_bytes(h.total), h.where(), keys])
    return rows


def _unclaimed_rows(s) -> list[list[str]]:
    return [[shorten(key_text(u.key)), fmt_bytes(u.nbytes if u.nbytes else u.sizeof),
             u.worker, "; ".join(u.held_by)] for u in s.unclaimed[:_SHOWN_UNCLAIMED]]


def _worker_head(w) -> str:
    n = len(w.keys)
    parts = [f"host {w.host}" if w.host else "", f"pid {w.pid}" if w.pid else "",
             f"{n} key{'' if n == 1 else 's'} in memory"]
    if w.spilled:
        parts.append(f"{len(w.spilled)} spilled ({fmt_bytes(sum(w.spilled.values()))} on disk)")
    name = f" ({w.name})" if w.name and w.name != w.address else ""
    return f"worker {w.address}{name} · " + " · ".join(p for p in parts if p)


def _more_unclaimed(s) -> str | None:
    rest = s.unclaimed[_SHOWN_UNCLAIMED:]
    if not rest:
        return None
    return f"… and {len(rest)} more keys ({fmt_bytes(sum(u.nbytes for u in rest))})"


def _title(s) -> str:
    return (f"cluster {s.scheduler or '(scheduler did not answer)'} · "
            f"{len(s.workers)} of {len(s.workers) + len(s.missing)} workers answered · "
            f"{len(s.holders)} name(s) hold {fmt_bytes(s.held_bytes)}")


def snapshot_text(s) -> str:
    """Aligned plain text of a cluster snapshot."""
    lines = [_title(s)]
    for w in s.workers:
        lines.append(_worker_head(w))
        lines += ["  " + device_line(d) for d in w.devices]
    for address, why in s.missing.items():
        lines.append(f"worker {address}: {why}")
    lines.append("")
    if s.holders:
        lines += text_table(_HOLDER_HEADERS, _holder_rows(s), {2})
    else:
        lines.append("no name of this notebook holds a key on the cluster")
    if s.unclaimed:
        lines.append("")
        lines.append("in worker memory, held by no name of this notebook:")
        lines += text_table(_UNCLAIMED_HEADERS, _unclaimed_rows(s), {1}, indent="  ")
        more = _more_unclaimed(s)
        if more:
            lines.append("  " + more)
    for m in s.messages:
        lines.append(f"note: {m}")
    return "\n".join(lines).rstrip()


def snapshot_html(s) -> str:
    """Rich HTML of a cluster snapshot (the same facts as the text)."""
    parts = [f"<div class='{_CSS}'>", f"<div><b>{esc(_title(s))}</b></div>"]
    for w in s.workers:
        parts.append(f"<div>{esc(_worker_head(w))}</div>")
        parts += [f"<div style='margin-left:1em'><code>{esc(device_line(d))}</code></div>"
                  for d in w.devices]
    for address, why in s.missing.items():
        parts.append(f"<div><em>worker {esc(address)}: {esc(why)}</em></div>")
    if s.holders:
        parts.append(html_table(_HOLDER_HEADERS, _holder_rows(s), {2}))
    else:
        parts.append("<div>no name of this notebook holds a key on the cluster</div>")
    if s.unclaimed:
        parts.append("<div>in worker memory, held by no name of this notebook:</div>")
        parts.append(html_table(_UNCLAIMED_HEADERS, _unclaimed_rows(s), {1}))
        more = _more_unclaimed(s)
        if more:
            parts.append(f"<div>{esc(more)}</div>")
    parts += [f"<div><em>note: {esc(m)}</em></div>" for m in s.messages]
    parts.append("</div>")
    return "".join(parts)


# -- purge -------------------------------------------------------------------------------
def _tracked(c) -> str:
    if c.tracked_before is None:
        return ""
    return f"{fmt_bytes(c.tracked_before)} → {fmt_bytes(c.tracked_after)}"


def _purge_rows(r) -> list[list[str]]:
    if r.dry_run:
        return [[w, dev, fmt_bytes(n)] for w, per in sorted(r.predicted.items())
                for dev, n in sorted(per.items())]
    return [[c.worker, c.device, c.measure, fmt_bytes(c.before), fmt_bytes(c.after),
             fmt_bytes(c.freed), _tracked(c)] for c in r.changes]


def _purge_headers(r) -> list[str]:
    return ["worker", "device", "would free"] if r.dry_run else \
        ["worker", "device", "measure", "before", "after", "freed", "tracked"]


def _purge_head(r) -> str:
    head = "dry run: would remove " if r.dry_run else "removed "
    head += ", ".join(r.removed) if r.removed else "nothing"
    if r.dry_run:
        return head + f" · {r.keys} key(s) would be released"
    return head + f" · {r.keys} key(s) released on the cluster"


def _still_lines(r) -> list[str]:
    out = []
    for s in r.still_held:
        where = f"{fmt_bytes(s.nbytes)}" + (f" on {s.worker}" if s.worker else "")
        if s.key == s.by:   # a name that holds the Future itself
            out.append(f"still held by {s.by} ({where})")
        else:
            out.append(f"still held: {s.key} ({where}) by {s.by}")
    return out


def purge_text(r) -> str:
    """Plain text of a cluster purge result."""
    lines = [_purge_head(r)]
    lines += text_table(_purge_headers(r), _purge_rows(r), {2} if r.dry_run else {3, 4, 5})
    lines += _still_lines(r)
    lines += [f"worker {w}: {why}" for w, why in r.missing.items()]
    lines += [f"note: {m}" for m in r.messages]
    return "\n".join(lines)


def purge_html(r) -> str:
    """Rich HTML of a cluster purge result."""
    parts = [f"<div class='{_CSS}'><div>{esc(_purge_head(r))}</div>",
             html_table(_purge_headers(r), _purge_rows(r), {2} if r.dry_run else {3, 4, 5})]
    parts += [f"<div>{esc(x)}</div>" for x in _still_lines(r)]
    parts += [f"<div><em>worker {esc(w)}: {esc(why)}</em></div>" for w, why in r.missing.items()]
    parts += [f"<div><em>note: {esc(m)}</em></div>" for m in r.messages]
    parts.append("</div>")
    return "".join(parts)
