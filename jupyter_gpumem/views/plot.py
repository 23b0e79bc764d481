"""``%gpumem plot`` and ``%%gpuwatch --plot``: memory over time, cell boundaries marked.

The x axis is time inside watched cells: idle time between cells is left
out, so a session of short cells separated by hours stays readable. Lines
come from the sampler's series (sampled); each cell adds its peak markers
per device and its before/after values. The whole process (RSS, NVML) and the
tensors (the allocator's counts, the tracked host tensors) are two panels with
scales of their own, each legend entry naming its measure and how it was taken.
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


def _process_peak(d) -> tuple[int | None, str]:
    """The process's own peak in the cell, and what it is (the whole process: not tensors)."""
    if d.peak_rss is not None:
        return d.peak_rss, "RSS of the process (exact high-water)"
    if d.process_peak_sampled is not None:
        return d.process_peak_sampled, "memory of the process (NVML, sampled)"
    return None, ""


def _sampled_label(dev: str, field: str) -> tuple[str, str]:
    """(line style, legend label) of a sampled series: what the measure is, said."""
    if field == "used_process":
        what = "RSS of the process" if dev == "cpu" else "memory of the process (NVML)"
        return ":", f"{dev} {what} (sampled)"
    what = "tracked tensors" if dev == "cpu" else field
    return ("-" if field == "allocated" else "--"), f"{dev} {what} (sampled)"


def figure(records, points, devices=None, title: str | None = None):
    """A Figure of ``records`` (WatchResult list) and series ``points``; a
    :class:`~jupyter_gpumem.units.MissingPackage` where matplotlib is not installed.

    Two measures never share an axis: the whole process (RSS on the host, NVML's figure
    on a GPU) is one panel, the tensors (the allocator's counts, the tracked tensors on
    the host) another, each with its own scale; every legend entry says which measure
    it is. The cells' labels sit above the panels, where no marker is."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingPackage("plotting", "matplotlib", "plot") from None

    offsets = layout(records)
    ids = []
    for r in records:
        for d in r.devices:
            if d.id not in ids and (devices is None or d.id in devices):
                ids.append(d.id)
    # panel -> label -> (style, xs, ys); "process": the whole process, "tensors": tensors
    series: dict[str, dict[str, list]] = {"process": {}, "tensors": {}}

    def add(panel: str, label: str, style: str, x: float, y: float) -> None:
        entry = series[panel].setdefault(label, [style, [], []])
        entry[1].append(x)
        entry[2].append(y)

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
                        style, label = _sampled_label(dev, field)
                        add("process" if field == "used_process" else "tensors", label, style,
                            x0 + t - r.start, v)
            j += 1
        for dev in ids:
            d = r.device(dev)
            if d is None:
                continue
            if d.allocated_before is not None and d.allocated_after is not None:
                what = "tracked tensors" if dev == "cpu" else "allocated"
                label = f"{dev} {what} at cell start/end"
                add("tensors", label, "o", x0, d.allocated_before)
                add("tensors", label, "o", x0 + r.wall, d.allocated_after)
            if d.peak_allocated is not None:
                add("tensors", f"{dev} allocated (allocator, exact), {PEAK_LABEL}", "v",
                    x0 + r.wall / 2, d.peak_allocated)
            peak, what = _process_peak(d)
            if peak is not None:
                add("process", f"{dev} {what}, {PEAK_LABEL}", "v", x0 + r.wall / 2, peak)
    panels = [p for p in ("process", "tensors") if series[p]] or ["tensors"]
    fig = Figure(figsize=(9, 2.2 + 2.1 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    kinds = {d == "cpu" for d in ids}
    tensor_words = ("tracked tensors" if kinds == {True} else "allocator" if kinds == {False}
                    else "allocator · tracked tensors")
    span = (offsets[-1] + records[-1].wall) if records else 1.0
    for ax, panel in zip(axes, panels):
        values = [y for _, _, ys in series[panel].values() for y in ys]
        scale, unit = _unit(max(values) if values else 1)
        for label, (style, xs, ys) in series[panel].items():
            if style == "v":
                ax.plot(xs, [y / scale for y in ys], "v", ms=7, linestyle="none", label=label)
            elif style == "o":
                ax.plot(xs, [y / scale for y in ys], "o", ms=3, linestyle="none", label=label)
            else:
                ax.plot(xs, [y / scale for y in ys], style, lw=1, label=label)
        for r, x0 in zip(records, offsets):
            ax.axvline(x0, color="0.6", lw=0.8)
            ax.axvspan(x0, x0 + r.wall, color="0.92", zorder=0)
        if records:
            ax.axvline(span, color="0.6", lw=0.8)
            ax.set_xlim(0, span or 1.0)
        ax.set_ylim(0, (max(values) / scale if values else 1) * 1.12 or 1)  # room for the markers
        words = "whole process" if panel == "process" else tensor_words
        ax.set_ylabel(f"{words} ({unit})", fontsize=8)
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    top = axes[0]
    texts = [r.label.replace("In ", "") for r in records]
    rows = label_rows(offsets, texts, span or 1.0, _axes_points(fig))
    for x0, text, row in zip(offsets, texts, rows):
        if row is not None:     # above the panels: never under a marker
            top.annotate(text, (x0, 1), xycoords=("data", "axes fraction"),
                         xytext=(2, 3 + _ROW_POINTS * row), textcoords="offset points",
                         fontsize=_LABEL_SIZE, color="0.35", va="bottom",
                         annotation_clip=False)
    axes[-1].set_xlabel("seconds inside watched cells (idle time between cells left out)")
    fig.suptitle(title or f"memory over {len(records)} watched cell(s)", fontsize=10)
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
                rich: bool = True, where: str = "--save FILE to choose where") -> Any:
    """Build the figure, display it as PNG where the frontend shows images (``rich``)
    and save it; return the Figure. Where no display shows images (a terminal, a plain
    shell) it is saved and its path printed instead, with ``where``: how to choose the
    file (the command's own option)."""
    if save:
        save = check_file(save)      # refused before anything is drawn or shown
    fig = figure(records, points, devices=devices)
    if not rich and not save:
        with tempfile.NamedTemporaryFile(prefix="gpumem-", suffix=".png", delete=False) as f:
            save = f.name
        save_figure(fig, save)
        print(f"no display here shows the figure: saved it to {save} ({where})")
        return fig
    if save:
        save_figure(fig, save)
        print(f"saved the figure to {save}")
    if rich:
        display(Image(data=png(fig), format="png"))
    return fig
