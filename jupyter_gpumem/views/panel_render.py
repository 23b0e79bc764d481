"""HTML for the live panel, drawn from the JSON of docs/PROTOCOL.md.

Pure functions: JSON (``DeviceUsage``, ``Holder``, ``PurgeResult`` objects,
timeline points) in, HTML strings out. No widgets, no user objects, no
JavaScript: the panel puts these strings into standard ``ipywidgets.HTML``.

Colours that sit on the page's background come from JupyterLab's theme variables
(``--jp-ui-font-color1``, ``--jp-layout-color3``, ``--jp-border-color1``, with a fallback
for other frontends), so a dark theme reads as well as a light one; nothing has a fixed
width: rows wrap in a narrow notebook column, and the timeline scales to it.
"""
from __future__ import annotations

import math
import time
from typing import Iterable

from ..core.render import code_html, fmt_bytes
from ..units import esc

#: stacked-bar segments of an accelerator (PROTOCOL.md), in order: key, label, colour
GPU_SEGMENTS = (
    ("allocated", "allocated", "#e45756"),
    ("reserved_free", "reserved, free", "#f2a541"),
    ("non_framework", "non-framework", "#9d7fd6"),
    ("other_processes", "other processes", "#8c8c8c"),
    ("free", "free", "var(--jp-layout-color3, rgba(128,128,128,0.25))"),
)
#: host memory has no allocator counters: tensors the scan found stand for "allocated"
CPU_SEGMENTS = (
    ("tensors", "tracked tensors", "#e45756"),
    ("process_rest", "rest of this process", "#9d7fd6"),
    ("other_processes", "other processes", "#8c8c8c"),
    ("free", "free", "var(--jp-layout-color3, rgba(128,128,128,0.25))"),
)
#: what the host's "tracked tensors" are while a cell runs (the last scan's)
STALE_TENSORS = "tracked tensors, from before the running cell"
#: the ink of text on the page's background (and of the free part of a bar)
INK = "var(--jp-ui-font-color1, inherit)"
#: lines and borders on the page's background
LINE = "var(--jp-border-color1, #999)"
#: timeline lines: field of a point, label, colour
LINES = (
    ("used_process", "this process", "#9d7fd6"),
    ("reserved", "reserved", "#f2a541"),
    ("allocated", "allocated", "#e45756"),
)
SVG_WIDTH, SVG_HEIGHT = 560, 72
FONT = "font-family:var(--jp-ui-font-family, sans-serif);font-size:11px"


def positive(value) -> int:
    """A byte count from a JSON value: a positive number as an int, anything else 0."""
    return int(value) if isinstance(value, (int, float)) and value > 0 else 0


# -- device bars ----------------------------------------------------------------------
def bar_segments(dev: dict, attributed: int | None = None,
                 stale: bool = False) -> list[tuple[str, str, int, str]]:
    """``(key, label, bytes, colour)`` for one device's stacked bar.

    ``attributed`` (bytes the last scan reached on this device) stands in for
    allocator counters on host memory, which has none; ``stale``: a cell runs, so
    those are from before it (the label says so).
    """
    total = dev.get("total")
    if dev.get("kind") == "cpu":
        tensors = positive(attributed if attributed is not None else dev.get("attributed"))
        process = positive(dev.get("used_process"))
        used_all = dev.get("used_all")
        others = max(positive(used_all) - process, 0) if used_all is not None else 0
        values = {"tensors": min(tensors, process) if process else tensors,
                  "process_rest": max(process - tensors, 0), "other_processes": others}
        spec = CPU_SEGMENTS
    else:
        allocated = positive(dev.get("allocated"))
        values = {"allocated": allocated,
                  "reserved_free": max(positive(dev.get("reserved")) - allocated, 0),
                  "non_framework": positive(dev.get("non_framework")),
                  "other_processes": positive(dev.get("other_processes"))}
        spec = GPU_SEGMENTS
    free = dev.get("free")
    if free is None and total is not None:
        free = max(int(total) - sum(values.values()), 0)
    values["free"] = positive(free)
    return [(key, STALE_TENSORS if stale and key == "tensors" else label, values[key], colour)
            for key, label, colour in spec]


def device_bar_html(dev: dict, attributed: int | None = None, *,
                    worker: str | None = None, stale: bool = False) -> str:
    """One device: a title line, the stacked bar, and every segment's figure.

    Only shown figures (rounded) go into the HTML, so a reading that changes
    nothing visible gives the same string and the widget sends nothing.
    ``worker``: the address of the Dask worker the device belongs to; its title
    then reads ``worker host:port cuda:N``.
    """
    segments = bar_segments(dev, attributed, stale)
    scale = dev.get("total") or sum(s[2] for s in segments) or 1
    label = dev.get("id") if worker is None else f"worker {worker_label(worker)} {dev.get('id')}"
    title = f"<b>{esc(label)}</b> {esc(dev.get('name') or '')}"
    title += f" · total {esc(fmt_bytes(dev.get('total')))}"
    cells, legend = _bar(segments, scale)
    process = ""
    if dev.get("kind") == "cpu" and positive(dev.get("used_process")):
        # this process on a scale of its own: its tensors are too small a part of the
        # host's memory to be seen on the host's bar
        mine = [s for s in segments if s[0] in ("tensors", "process_rest")]
        own_cells, _ = _bar(mine, sum(s[2] for s in mine) or 1)
        process = (f"<div>this process {esc(fmt_bytes(dev.get('used_process')))}</div>"
                   f"<div data-bar='process' style='{_BAR_STYLE}'>{''.join(own_cells)}</div>")
    notes = "".join(f"<div><em>{esc(n)}</em></div>" for n in dev.get("notes") or ())
    where = f" data-worker='{esc(worker)}'" if worker is not None else ""
    return (f"<div data-device='{esc(dev.get('id'))}'{where} style='margin:4px 0;{FONT}'>"
            f"<div>{title}</div>"
            f"<div data-bar='device' style='{_BAR_STYLE}'>{''.join(cells)}</div>"
            f"<div>{''.join(legend)}</div>{process}{notes}</div>")


#: the narrowest a segment that holds bytes is drawn (the sidebar's MIN_SEGMENT_PX)
MIN_SEGMENT_PX = 3
_BAR_STYLE = (f"display:flex;width:100%;height:18px;border:1px solid {LINE};border-radius:3px;"
              "overflow:hidden;box-sizing:border-box")


def _bar(segments: list, scale: int) -> tuple[list[str], list[str]]:
    """The cells of a stacked bar of ``segments`` on ``scale`` bytes, and their legend."""
    cells, legend = [], []
    for key, label, nbytes, colour in segments:
        share = 100.0 * nbytes / scale
        figure = fmt_bytes(nbytes)
        text = esc(figure) if share >= 9 else ""
        ink = INK if key == "free" else "#fff"
        # a small segment that holds something is still seen (MIN_SEGMENT_PX wide); the
        # free part gives way for it
        flex = f"1 1 {share:.1f}%" if key == "free" else f"0 0 {share:.1f}%"
        least = f"{MIN_SEGMENT_PX}px" if nbytes > 0 and key != "free" else "0"
        cells.append(
            f"<div data-segment='{key}' title='{esc(label)}: {esc(figure)}'"
            f" style='flex:{flex};min-width:{least};background:{colour};color:{ink};"
            f"overflow:hidden;white-space:nowrap;text-align:center;line-height:18px'>{text}</div>")
        # a swatch with an outline: the free part's colour is the page's, nearly
        swatch = (f"<span style='display:inline-block;width:0.8em;height:0.8em;"
                  f"background:{colour};border:1px solid {LINE};vertical-align:-0.05em'></span>")
        legend.append(f"<span data-legend='{key}' style='white-space:nowrap;margin-right:10px;"
                      f"display:inline-block'>{swatch} {esc(label)} <b>{esc(figure)}</b></span>")
    return cells, legend


def title_for(devices: Iterable[dict]) -> str:
    """What the bars are, the sidebar's rule (``titleFor`` in labextension/src/sidebar.ts):
    ``GPU memory``, ``Host memory`` (no accelerator, or device ``cpu``) or ``GPU and host
    memory``, from the kinds of the devices shown."""
    kinds = {d.get("kind") for d in devices if isinstance(d, dict)}
    host, accelerator = "cpu" in kinds, bool(kinds - {"cpu"})
    if host and accelerator:
        return "GPU and host memory"
    return "Host memory" if host else "GPU memory"


def bars_html(devices: Iterable[dict], attributed: dict[str, int] | None = None,
              stale: bool = False) -> str:
    """The bars of every device, one HTML string (``stale``: a cell runs)."""
    attributed = attributed or {}
    parts = [device_bar_html(d, attributed.get(d.get("id")), stale=stale) for d in devices]
    return "".join(parts) or f"<div style='{FONT}'>no device</div>"


# -- a Dask cluster (the snapshot's "cluster" part) -----------------------------------------
def worker_label(address) -> str:
    """``tcp://10.0.0.5:40123`` -> ``10.0.0.5:40123``."""
    text = str(address or "?")
    return text.split("://", 1)[1] if "://" in text else text


def _cluster_part(snap: dict) -> dict | None:
    part = snap.get("cluster") if isinstance(snap, dict) else None
    return part if isinstance(part, dict) and isinstance(part.get("workers"), list) else None


def cluster_title(part: dict) -> str:
    """``cluster tcp://...:8786 · 2 of 2 workers answered · 3 names hold 328.0 MiB``."""
    workers = [w for w in part.get("workers") or () if isinstance(w, dict)]
    missing = part.get("missing") or {}
    holders = part.get("holders") or []
    return (f"cluster {part.get('scheduler') or '(scheduler did not answer)'} · "
            f"{len(workers)} of {len(workers) + len(missing)} workers answered · "
            f"{len(holders)} {'name holds' if len(holders) == 1 else 'names hold'} "
            f"{fmt_bytes(part.get('held_bytes') or 0)}")


def cluster_bars_html(snap: dict) -> str:
    """One bar per device of every worker of the snapshot's cluster part (empty without
    one), with a line per worker that did not answer."""
    part = _cluster_part(snap)
    if part is None:
        return ""
    bars = []
    for w in part["workers"]:
        if not isinstance(w, dict):
            continue
        for dev in w.get("devices") or ():
            if isinstance(dev, dict):
                bars.append(device_bar_html(dev, worker=w.get("address")))
    for address, why in (part.get("missing") or {}).items():
        bars.append(f"<div data-missing-worker='{esc(address)}'><em>worker "
                    f"{esc(worker_label(address))}: {esc(why)}</em></div>")
    return (f"<div data-cluster='{esc(part.get('scheduler') or '')}' style='{FONT}'>"
            f"<div style='margin-top:4px'>{esc(cluster_title(part))}</div>{''.join(bars)}</div>")


_CLUSTER_COLUMNS = (("holds", "6.5em", "right"), ("where", "16em", "left"),
                    ("what", "14em", "left"), ("keys in memory", "8em", "right"))
_UNCLAIMED_SHOWN = 5


def _where(h: dict) -> str:
    """``worker 10.0.0.5:40123 cuda:1`` or ``4 workers``."""
    held = {w: per for w, per in (h.get("workers") or {}).items()
            if isinstance(per, dict) and any(per.values())}
    if len(held) == 1:
        (address, per), = held.items()
        devs = ",".join(sorted(d for d, n in per.items() if n))
        return f"worker {worker_label(address)} {devs}".rstrip()
    return f"{len(held)} workers" if held else "no worker"


def cluster_holders_html(snap: dict) -> str:
    """The names that hold keys on the cluster, largest first, and the keys in worker
    memory that no name holds (empty without a cluster part)."""
    part = _cluster_part(snap)
    if part is None:
        return ""
    head = "".join(cell(f"<b>{esc(c)}</b>", w, a) for c, w, a in _CLUSTER_COLUMNS)
    rows = [f"<div style='{FONT};line-height:24px'>{cell('<b>name</b>', '12em', 'left')}"
            f"{head}</div>"]
    for h in part.get("holders") or ():
        if not isinstance(h, dict):
            continue
        keys = f"{h.get('in_memory', 0)} of {h.get('keys', 0)}"
        values = (esc(fmt_bytes(h.get("total"))), esc(_where(h)), esc(h.get("what") or ""),
                  esc(keys))
        cells = "".join(cell(v, w, a) for v, (_, w, a) in zip(values, _CLUSTER_COLUMNS))
        extra = []
        if h.get("aliases"):
            extra.append("also " + ", ".join(map(str, h["aliases"])))
        if h.get("shared_with"):
            extra.append("shares with " + ", ".join(map(str, h["shared_with"])))
        absent = h.get("not_in_memory") or {}
        if absent:
            extra.append("not in memory: " + ", ".join(f"{n} {s}" for s, n in absent.items()))
        if h.get("largest_path"):
            extra.append(f"largest: {h['largest_path']}")
        more = (f"<div style='opacity:.75;white-space:normal;line-height:1.4;"
                f"padding:0 0 4px 1em'>{esc(' · '.join(extra))}</div>") if extra else ""
        name = cell(f"<code>{esc(h.get('name'))}</code>", "12em", "left",
                     title=h.get("purge") and f"%gpumem purge {h['purge']} --cluster")
        rows.append(f"<div data-cluster-holder='{esc(h.get('name'))}' "
                    f"style='{FONT};line-height:24px'>{name}{cells}{more}</div>")
    if len(rows) == 1:
        rows = [f"<div style='{FONT}'>no name of this notebook holds a key on the cluster</div>"]
    unclaimed = [u for u in part.get("unclaimed") or () if isinstance(u, dict)]
    left_off = part.get("unclaimed_left_off") or {}
    if unclaimed:
        n = len(unclaimed) + int(left_off.get("keys") or 0)
        nbytes = sum(u.get("bytes") or u.get("sizeof") or 0 for u in unclaimed) \
            + int(left_off.get("bytes") or 0)
        lines = [f"<div>in worker memory, held by no name of this notebook: {n} "
                 f"key{'' if n == 1 else 's'}, {esc(fmt_bytes(nbytes))}</div>"]
        for u in unclaimed[:_UNCLAIMED_SHOWN]:
            lines.append(f"<div data-unclaimed='{esc(u.get('key'))}' style='padding-left:1em'>"
                         f"<code>{esc(u.get('key'))}</code> "
                         f"{esc(fmt_bytes(u.get('bytes') or u.get('sizeof')))} on worker "
                         f"{esc(worker_label(u.get('worker')))}: held by "
                         f"{esc('; '.join(map(str, u.get('held_by') or ())) or 'no one')}</div>")
        if n > _UNCLAIMED_SHOWN:
            lines.append(f"<div style='padding-left:1em'>… and {n - _UNCLAIMED_SHOWN} more</div>")
        rows.append(f"<div style='{FONT}'>{''.join(lines)}</div>")
    rows += [f"<div style='{FONT}'><em>note: {esc(m)}</em></div>"
             for m in part.get("messages") or ()]
    return (f"<div data-cluster-holders='1'><div style='{FONT}'><b>On the cluster</b> "
            f"<span style='opacity:.6'>(purge with <code>%gpumem purge NAME --cluster</code>)"
            f"</span></div>{''.join(rows)}</div>")


# -- timeline ------------------------------------------------------------------------------
def _buckets(points: list, t0: float, t1: float, n: int, dev: str, field: str):
    """Max of ``field`` per time bucket: peaks and steps survive the downsampling."""
    width = (t1 - t0) / n
    out: dict[int, int] = {}
    for t, values in points:
        v = (values.get(dev) or {}).get(field)
        if v is None or t < t0:
            continue
        i = min(int((t - t0) / width), n - 1)
        if v > out.get(i, -1):
            out[i] = v
    return sorted(out.items())


_UNIT_SIZES = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
_AXIS_LEFT = 52           # pixels left of the plot for the byte ticks


def byte_ticks(top: float, count: int = 3) -> tuple[list[int], str, int]:
    """Round byte values from 0 that cover ``top`` in about ``count`` steps (1, 2 or 5
    times a power of ten of one binary unit), the unit's name and size."""
    top = max(float(top), 1.0)
    size, unit = next((s, u) for s, u in _UNIT_SIZES if top >= s)
    raw = top / size / count
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    if size == 1:
        step = max(round(step), 1)
    n = math.ceil(top / size / step - 1e-9)
    return [round(i * step * size) for i in range(n + 1)], unit, size


def _fmt_tick(value: int, unit: str, size: int) -> str:
    return f"{value / size:g} {unit}" if value else "0"


def time_ticks(window: float, count: int = 4) -> list[float]:
    """Seconds before now at round steps (5 s, 10 s, 30 s, 1 min, ...), about ``count``."""
    step = next((s for s in _TIME_STEPS if window / s <= count), _TIME_STEPS[-1])
    return [i * step for i in range(int(window // step) + 1)]


def _fmt_ago(seconds: float) -> str:
    if seconds == 0:
        return "now"
    if seconds >= 60 and seconds % 60 == 0:
        return f"-{seconds / 60:g} min"
    return f"-{seconds:g} s"


def timeline_svg(points: list, dev: str, *, window: float, now: float | None = None,
                 cells: Iterable[tuple[float, float | None]] = (), buckets: int = 140) -> str:
    """An inline SVG of one device over the last ``window`` seconds, with ticks at round
    values on both axes (bytes from 0; seconds before now).

    ``points`` are ``(time, {device: {field: bytes}})`` (core.sampler.Series);
    ``cells`` are ``(start, end or None)`` spans drawn as shaded bands. A line of one
    reading is drawn as a dot.
    """
    now = time.time() if now is None else now
    t0 = now - window
    series = {}
    for field, _, _ in LINES:
        pts = _buckets(points, t0, now, buckets, dev, field)
        if pts:
            series[field] = pts
    highest = max((v for pts in series.values() for _, v in pts), default=0)
    ticks, unit, size = byte_ticks(highest)
    top = max(ticks[-1], 1)
    left, w, h = _AXIS_LEFT, SVG_WIDTH - _AXIS_LEFT - 4, SVG_HEIGHT
    xs = w / buckets
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {SVG_WIDTH} {h + 16}'"
             f" data-device='{esc(dev)}' style='display:block;width:100%;max-width:{SVG_WIDTH}px;"
             f"height:auto;{FONT}'>",
             f"<rect x='{left}' y='0' width='{w}' height='{h}' fill='none' stroke='#999'"
             f" stroke-width='0.5'/>"]
    for value in ticks:
        y = h - value / top * (h - 2)
        parts.append(f"<line data-ytick='{value}' x1='{left}' x2='{left + w}' y1='{y:.1f}'"
                     f" y2='{y:.1f}' stroke='#999' stroke-opacity='0.35' stroke-width='0.5'/>")
        parts.append(f"<text x='{left - 4}' y='{min(max(y + 3.5, 9), h):.1f}' text-anchor='end'"
                     f" fill='currentColor'>{esc(_fmt_tick(value, unit, size))}</text>")
    for ago in time_ticks(window):
        x = left + (window - ago) / window * w
        anchor = "end" if ago == 0 else "middle" if ago < window else "start"
        parts.append(f"<line data-xtick='{ago:g}' x1='{x:.1f}' x2='{x:.1f}' y1='{h}'"
                     f" y2='{h + 3}' stroke='#999' stroke-width='0.5'/>")
        parts.append(f"<text x='{x:.1f}' y='{h + 13}' text-anchor='{anchor}'"
                     f" fill='currentColor'>{esc(_fmt_ago(ago))}</text>")
    for start, end in cells:
        end = now if end is None else end
        if end < t0:
            continue
        x0 = max(start - t0, 0) / window * w
        x1 = max(min(end - t0, window) / window * w, x0 + 1)
        parts.append(f"<rect data-cell='1' x='{left + x0:.1f}' y='0' width='{x1 - x0:.1f}'"
                     f" height='{h}' fill='#4c9be8' fill-opacity='0.12'/>")
    for field, label, colour in LINES:
        pts = series.get(field)
        if not pts:
            continue
        coords = [(left + (i + 0.5) * xs, h - v / top * (h - 2)) for i, v in pts]
        if len(coords) == 1:   # one reading: a dot, not an invisible line of one point
            (x, y), = coords
            coords = [(x - 1.5, y), (x + 1.5, y)]
        text = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(f"<polyline data-line='{field}' points='{text}' fill='none'"
                     f" stroke='{colour}' stroke-width='1.5'><title>{esc(label)}</title></polyline>")
    parts.append("</svg>")
    return "".join(parts)


MIN_SPAN = 60.0  # seconds the timeline shows at least, while its history is shorter


def timeline_html(points: list, devices: Iterable[str], *, window: float,
                  cells: Iterable[tuple[float, float | None]] = (), now: float | None = None) -> str:
    """Every device's timeline with a legend; shaded bands are cells that ran.

    The time axis spans the history there is, from one minute up to ``window``.
    """
    cells = list(cells)
    now = time.time() if now is None else now
    if points:
        window = min(window, max(MIN_SPAN, now - points[0][0]))
    present = {f for _, values in points for d in values.values() for f, v in d.items()
               if v is not None}
    legend = "".join(f"<span style='margin-right:10px'><span style='color:{c}'>━</span> "
                     f"{esc(label)}</span>" for f, label, c in LINES if f in present)
    legend += ("<span style='margin-right:10px'><span style='color:#4c9be8;opacity:.5'>█</span>"
               " cell running</span>")
    svgs = "".join(f"<div style='margin-top:2px'>{esc(dev)}</div>"
                   + timeline_svg(points, dev, window=window, now=now, cells=cells)
                   for dev in devices)
    return f"<div style='{FONT}'><div>{legend}</div>{svgs}</div>"


# -- holders ---------------------------------------------------------------------------------
_COLUMNS = (("only it", "6.5em", "right"), ("shared", "6.5em", "right"),
            ("device", "5.5em", "left"), ("what", "7em", "left"))


def cell(text: str, width: str, align: str, title: str | None = None) -> str:
    """One cell of a row: at least ``width`` wide where there is room (the columns line
    up), narrower in a narrow column (the row wraps, cells stay whole)."""
    tip = f" title='{esc(title)}'" if title else ""
    return (f"<span{tip} style='display:inline-block;min-width:{width};max-width:100%;"
            f"text-align:{align};padding-right:0.8em;overflow:hidden;text-overflow:ellipsis;"
            f"white-space:nowrap;vertical-align:top;box-sizing:border-box'>{text}</span>")


def holders_header_html() -> str:
    cells = "".join(cell(f"<b>{esc(c)}</b>", w, a) for c, w, a in _COLUMNS)
    return (f"<div style='{FONT};line-height:28px;white-space:normal'>{cells}"
            f"<b>largest path</b></div>")


def holder_row_html(h: dict) -> str:
    """The figures of one holder, aligned with :func:`holders_header_html`."""
    devices = ",".join(sorted(h.get("devices") or {})) or "-"
    what = esc(h.get("type") or "")
    values = (esc(fmt_bytes(h.get("unique"))), esc(fmt_bytes(h.get("shared"))), esc(devices), what)
    cells = "".join(cell(v, w, a) for v, (_, w, a) in zip(values, _COLUMNS))
    path = esc(h.get("largest_path") or "")
    extra = []
    if h.get("aliases"):
        extra.append("also " + esc(", ".join(h["aliases"])))
    if h.get("shared_with"):
        extra.append("shares with " + esc(", ".join(h["shared_with"])))
    lines = [" · ".join(extra)] if extra else []
    if h.get("hint"):   # a row of its own
        lines.append("hint: " + code_html(h["hint"]))
    more = "".join(f"<div style='opacity:.75;white-space:normal;line-height:1.4;"
                   f"padding-bottom:4px'>{line}</div>" for line in lines)
    return (f"<div data-holder='{esc(h.get('name'))}' style='{FONT};line-height:28px;"
            f"white-space:normal;overflow-wrap:anywhere'>"
            f"{cells}<code title='{path}'>{path}</code>{more}</div>")


def internals_lines(snap: dict) -> list[str]:
    """The framework internals of a snapshot (``Internal`` objects), one HTML line each
    (the ones inside a pool; the rest's parts come last, marked as such)."""
    out = []
    for i in snap.get("internals") or ():
        if not isinstance(i, dict):
            continue
        kind = i.get("kind")
        label = (f"{i.get('framework')}: " if i.get("framework") else "") + str(i.get("label") or "")
        count = f" ×{i['count']:,}" if isinstance(i.get("count"), int) and i["count"] > 1 else ""
        where = "in the rest" if kind == "outside" else "cached, free" if kind == "cached" else "allocated"
        purge = "purge frees it" if i.get("freed_by_purge") else "purge cannot free it"
        out.append(f"<span data-internal='{esc(i.get('label'))}' title='{esc(i.get('note') or '')}'>"
                   f"{esc(label)}{esc(count)}: <b>{esc(fmt_bytes(i.get('bytes')))}</b> on "
                   f"{esc(i.get('device'))} ({where}; {purge})</span>")
    return out


def footer_html(snap: dict) -> str:
    """Unattributed bytes, scan notes and the time of the scan."""
    lines = []
    if not snap.get("holders"):
        lines.append("no name holds tensor memory on "
                     + esc(", ".join(d.get("id", "?") for d in snap.get("devices") or ())))
    lines += internals_lines(snap)
    un = {k: v for k, v in (snap.get("unattributed") or {}).items() if v}
    if un:
        lines.append("unattributed (allocated, reached by no name): " + esc(
            ", ".join(f"{fmt_bytes(v)} on {k}" for k, v in un.items())))
    lines += [f"<em>note: {esc(m)}</em>" for m in snap.get("messages") or ()]
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.get("time") or time.time()))
    ms = 1000 * (snap.get('scan_seconds') or 0)
    took = "<1 ms" if ms < 1 else f"{ms:.0f} ms"
    lines.append(f"<span style='opacity:.6'>holders scanned at {stamp} in {esc(took)}</span>")
    return f"<div style='{FONT}'>" + "".join(f"<div>{x}</div>" for x in lines) + "</div>"


# -- purge -------------------------------------------------------------------------------------
def _per_device(values: dict) -> str:
    parts = [f"{fmt_bytes(v)} on {k}" for k, v in sorted((values or {}).items()) if v is not None]
    return ", ".join(parts) or "nothing"


#: names a confirmation spells out; the rest are counted
CONFIRM_NAMES = 12


def _some(names: list[str]) -> str:
    if len(names) <= CONFIRM_NAMES:
        return ", ".join(names)
    return ", ".join(names[:CONFIRM_NAMES - 2]) + f" and {len(names) - CONFIRM_NAMES + 2} more"


def confirm_html(names: list[str], dry: dict, notebook: str | None = None) -> str:
    """The question before a purge, with what the dry run predicts, naming the notebook
    whose kernel it purges in (``notebook``, where known)."""
    removed = dry.get("removed") or names
    also = [r for r in removed if r not in names]
    where = (f"the kernel of <b data-notebook='1'>{esc(notebook)}</b>" if notebook
             else "this kernel")
    count = f" ({len(names)} names)" if len(names) > CONFIRM_NAMES else ""
    text = (f"Delete <b>{esc(_some(names))}</b>{count} from {where}"
            + (f" (with {esc(_some(also))})" if also else "")
            + f" and free about <b>{esc(_per_device(dry.get('predicted')))}</b>?")
    notes = "".join(f"<div><em>{esc(m)}</em></div>" for m in dry.get("messages") or ())
    return f"<div style='{FONT}'>{text}{notes}</div>"


def purge_result_html(result: dict, when: str | None = None) -> str:
    """What a purge removed and freed per device (a ``PurgeResult`` object); ``when``
    (``13:02:11``) says when it ran."""
    removed = ", ".join(result.get("removed") or ()) or "nothing"
    rows = "".join(
        f"<tr><td>{esc(c.get('device'))}</td><td>{esc(c.get('measure'))}</td>"
        f"<td style='text-align:right'>{esc(fmt_bytes(c.get('before')))}</td>"
        f"<td style='text-align:right'>{esc(fmt_bytes(c.get('after')))}</td>"
        f"<td style='text-align:right'><b>{esc(fmt_bytes(c.get('freed')))}</b></td></tr>"
        for c in result.get("changes") or ())
    table = ("<table><thead><tr><th>device</th><th>measure</th><th>before</th><th>after</th>"
             f"<th>freed</th></tr></thead><tbody>{rows}</tbody></table>") if rows else ""
    notes = "".join(f"<div><em>note: {esc(m)}</em></div>" for m in result.get("messages") or ())
    at = f" at {esc(when)}" if when else ""
    return (f"<div data-purge-result='1' style='{FONT}'>purge{at}: removed "
            f"<code>{esc(removed)}</code>"
            f" · freed {esc(_per_device(result.get('freed')))}{table}{notes}</div>")
