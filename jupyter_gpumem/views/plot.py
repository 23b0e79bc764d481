"""``%gpumem plot`` and ``%%gpuwatch --plot``: memory over time, cell boundaries marked.

The x axis is time inside watched cells: idle time between cells is left
out, so a session of short cells separated by hours stays readable. Lines
come from the sampler's series (sampled); each cell adds one peak marker
per device (the exact allocator peak where there is one, else the exact
peak RSS on the host, else the sampled peak) and its before/after values.
Uses ``matplotlib.figure.Figure`` directly: no pyplot state, any backend.
"""
from __future__ import annotations

import io
import os
import tempfile
from typing import Any

from IPython.display import Image, display

from ..core.files import check_file, write_file
from ..units import MissingPackage

_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))
PEAK_LABEL = "cell peak"


def _unit(largest: float) -> tuple[int, str]:
    for size, name in _UNITS:
        if largest >= size:
            return size, name
    return 1, "B"


def _peak_of(d) -> int | None:
    for value in (d.peak_allocated, d.peak_rss, d.process_peak_sampled, d.allocated_after):
        if value is not None:
            return value
    return None


def layout(records) -> list[float]:
    """Where each record starts on the compressed time axis."""
    total = sum(r.wall for r in records) or 1.0
    gap = total * 0.02 / max(len(records), 1)
    offsets, x = [], 0.0
    for r in records:
        offsets.append(x)
        x += r.wall + gap
    return offsets


_LABEL_SIZE = 7                  # points, the cells' labels
_ROW_POINTS = 9                  # points between two rows of labels
_LABEL_ROWS = 2                  # rows the labels stagger over before some are left out


def _axes_points(fig) -> float:
    """About how wide the plot's axes are, in points (the legend takes the right part)."""
    return fig.get_figwidth() * 72 * 0.62


def label_rows(offsets: list[float], texts: list[str], span: float, width: float) -> list:
    """The row (0 or 1) of each cell's label on an axis ``width`` points wide covering
    ``span`` seconds, or None where it is left out: labels stagger over two rows, and a
    label that would touch the one before it in both rows is thinned out, so none overlap."""
    per_point = span / width if width > 0 else span
    ends = [float("-inf")] * _LABEL_ROWS   # where the last label of each row ends (seconds)
    rows: list = []
    for x0, text in zip(offsets, texts):
        start = x0 + 2 * per_point
        end = start + (len(text) * _LABEL_SIZE * 0.62 + 3) * per_point
        row = next((i for i in range(_LABEL_ROWS) if ends[i] <= start), None) \
            if end <= span + 2 * per_point else None
        if row is not None:
            ends[row] = end
        rows.append(row)
    return rows


def figure(records, points, devices=None, title: str | None = None):
    """A Figure of ``records`` (WatchResult list) and series ``points``; a
    :class:`~jupyter_gpumem.units.MissingPackage` where matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingPackage("plotting", "matplotlib", "plot") from None

    fig = Figure(figsize=(9, 3.8), layout="constrained")
    ax = fig.add_subplot()
    offsets = layout(records)
    ids = []
    for r in records:
        for d in r.devices:
            if d.id not in ids and (devices is None or d.id in devices):
                ids.append(d.id)
    values: list[float] = []
    lines: dict[tuple, tuple[list, list]] = {}
    steps: dict[str, tuple[list, list]] = {}
    peaks: dict[str, tuple[list, list]] = {}
    pi = 0
    points = sorted(points, key=lambda p: p[0])
    for r, x0 in zip(records, offsets):
        while pi < len(points) and points[pi][0] < r.start:
            pi += 1
        j = pi
        while j < len(points) and points[j][0] <= r.end:
            t, per_dev = points[j]
            for dev in ids:
                fields = per_dev.get(dev) or {}
                for field in ("allocated", "reserved", "used_process"):
                    v = fields.get(field)
                    if v is not None:
                        xs, ys = lines.setdefault((dev, field), ([], []))
                        xs.append(x0 + t - r.start)
                        ys.append(v)
            j += 1
        for dev in ids:
            d = r.device(dev)
            if d is None:
                continue
            if d.allocated_before is not None and d.allocated_after is not None:
                xs, ys = steps.setdefault(dev, ([], []))
                xs += [x0, x0 + r.wall]
                ys += [d.allocated_before, d.allocated_after]
            peak = _peak_of(d)
            if peak is not None:
                xs, ys = peaks.setdefault(dev, ([], []))
                xs.append(x0 + r.wall / 2)
                ys.append(peak)
    for series in (lines, steps, peaks):
        for _, ys in series.values():
            values += ys
    scale, unit = _unit(max(values) if values else 1)
    styles = {"allocated": ("-", "allocated (sampled)"), "reserved": ("--", "reserved (sampled)"),
              "used_process": (":", "process (sampled)")}
    for (dev, field), (xs, ys) in lines.items():
        style, label = styles[field]
        if dev == "cpu" and field == "used_process":
            label = "RSS (sampled)"
        ax.plot(xs, [y / scale for y in ys], style, lw=1, label=f"{dev} {label}")
    for dev, (xs, ys) in steps.items():
        what = "tensors" if dev == "cpu" else "allocated"
        ax.plot(xs, [y / scale for y in ys], "o", ms=3, label=f"{dev} {what} at cell start/end")
    for dev, (xs, ys) in peaks.items():
        ax.plot(xs, [y / scale for y in ys], "v", ms=7, linestyle="none",
                label=f"{dev} {PEAK_LABEL}")
    texts = [r.label.replace("In ", "") for r in records]
    span = (offsets[-1] + records[-1].wall) if records else 1.0
    rows = label_rows(offsets, texts, span or 1.0, _axes_points(fig))
    for r, x0, text, row in zip(records, offsets, texts, rows):
        ax.axvline(x0, color="0.6", lw=0.8)
        ax.axvspan(x0, x0 + r.wall, color="0.92", zorder=0)
        if row is not None:
            ax.annotate(text, (x0, 1), xycoords=("data", "axes fraction"),
                        xytext=(2, -10 - _ROW_POINTS * row), textcoords="offset points",
                        fontsize=_LABEL_SIZE, color="0.35")
    if records:
        ax.axvline(offsets[-1] + records[-1].wall, color="0.6", lw=0.8)
        ax.set_xlim(0, span or 1.0)
    ax.set_xlabel("seconds inside watched cells (idle time between cells left out)")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title(title or f"memory over {len(records)} watched cell(s)")
    if ax.lines:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def save_figure(fig, path: str) -> str:
    """Save ``fig`` to ``path`` in the format its extension names (PNG without one),
    whole or not at all (:func:`..core.files.write_file`); ``ValueError`` (one line) for
    a format matplotlib does not write or a path the rule refuses."""
    ext = os.path.splitext(str(path))[1].lower().lstrip(".") or "png"
    formats = fig.canvas.get_supported_filetypes()
    if ext not in formats:
        raise ValueError(f"{path}: matplotlib writes no .{ext} figure: use one of "
                         + ", ".join(f".{k}" for k in sorted(formats)))
    return write_file(path, lambda f: fig.savefig(f, format=ext))


def show_figure(records, points, devices=None, save: str | None = None,
                rich: bool = True) -> Any:
    """Build the figure, display it as PNG where the frontend shows images (``rich``)
    and save it; return the Figure. Where no display shows images (a terminal, a plain
    shell) it is saved and its path printed instead."""
    if save:
        save = check_file(save)      # refused before anything is drawn or shown
    fig = figure(records, points, devices=devices)
    if not rich and not save:
        with tempfile.NamedTemporaryFile(prefix="gpumem-", suffix=".png", delete=False) as f:
            save = f.name
        save_figure(fig, save)
        print(f"no display here shows the figure: saved it to {save} "
              "(--save FILE to choose where)")
        return fig
    if save:
        save_figure(fig, save)
        print(f"saved the figure to {save}")
    if rich:
        display(Image(data=png(fig), format="png"))
    return fig
