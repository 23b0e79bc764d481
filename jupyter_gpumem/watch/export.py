"""``%gpumem history``: the per-cell records as a table, CSV, JSON or TensorBoard scalars."""
from __future__ import annotations

import csv
import json
import os
import sys
import types

from ..backends import active_backends
from ..core.files import check_folder, write_file
from ..units import MissingPackage, esc, fmt_bytes, html_table, text_table
from .result import changes_short, device_short, fmt_seconds

CSV_FIELDS = [
    "execution_count", "label", "source", "start", "wall", "device",
    "allocated_before", "allocated_after", "allocated_delta", "reserved_before", "reserved_after",
    "reserved_delta", "peak_allocated", "peak_reserved", "peak_rss", "process_before",
    "process_after", "process_peak_sampled", "samples", "share_after", "error", "changes",
]


def rows(records) -> list[dict]:
    """One flat row per record and device."""
    out = []
    for r in records:
        changes = ";".join(f"{c.change}:{c.name}:{c.delta}" for c in r.changes)
        for d in r.devices:
            dj = d.to_json()
            row = {"execution_count": r.execution_count, "label": r.label, "source": r.source,
                   "start": round(r.start, 6), "wall": round(r.wall, 6), "device": d.id,
                   "error": r.error["type"] if r.error else "", "changes": changes}
            for f in CSV_FIELDS:
                if f not in row:
                    row[f] = dj.get(f)
            out.append(row)
    return out


def _write_json(records, f) -> None:
    json.dump([r.to_json() for r in records], f, indent=1)


def _write_csv(records, f) -> None:
    writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for row in rows(records):
        writer.writerow({k: "" if v is None else v for k, v in row.items()})


def save(records, path: str) -> int:
    """Write ``records`` to ``path`` as CSV or JSON (by its extension), whole or not at
    all (:func:`..core.files.write_file`); return how many."""
    ext = os.path.splitext(str(path))[1].lower()
    writers = {".json": _write_json, ".csv": _write_csv}
    if ext not in writers:
        raise ValueError(f"{path!r}: use a .csv or .json file name")
    write = writers[ext]
    write_file(path, lambda f: write(records, f), text=True)
    return len(records)


def _keep_frameworks_out(backends) -> None:
    """TensorBoard imports TensorFlow when it is installed, and TensorFlow takes the GPU.

    Unless an active backend says TensorBoard may import its framework (TensorFlow,
    once the user has imported it), mark TensorBoard as TF-free (its own
    ``tensorboard.compat.notf`` switch), so it uses its stub.
    """
    if "tensorboard.compat.notf" in sys.modules or any(b.tensorboard_may_import()
                                                        for b in backends):
        return
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")


def summary_writer(logdir: str):
    """TensorBoard's ``SummaryWriter``: the first an active backend brings (PyTorch's),
    else tensorboardX's; or ImportError."""
    backends = active_backends()
    _keep_frameworks_out(backends)
    errors = []
    for backend in backends:
        try:
            writer = backend.summary_writer(logdir)
        except ImportError as exc:
            errors.append(str(exc))
            continue
        if writer is not None:
            return writer
    try:
        from tensorboardX import SummaryWriter  # type: ignore

        return SummaryWriter(logdir)
    except ImportError as exc:
        errors.append(str(exc))
    raise MissingPackage("--tensorboard", "tensorboard", "tensorboard")   # (or tensorboardX)


def tensorboard(records, logdir: str) -> int:
    """Per-cell scalars under ``gpumem/<device>/...``, step = cell number; return how many.
    ``logdir`` must be a real directory or new (:func:`..core.files.check_folder`)."""
    writer = summary_writer(check_folder(logdir))
    n = 0
    try:
        for i, r in enumerate(records):
            step = r.execution_count if r.execution_count is not None else i
            writer.add_scalar("gpumem/wall_seconds", r.wall, step)
            n += 1
            for d in r.devices:
                for field in ("allocated_after", "allocated_delta", "reserved_after",
                              "peak_allocated", "peak_reserved", "peak_rss",
                              "process_peak_sampled"):
                    value = getattr(d, field)
                    if value is not None:
                        writer.add_scalar(f"gpumem/{d.id}/{field}", value, step)
                        n += 1
    finally:
        writer.close()
    return n


_HEADERS = ["cell", "wall", "memory", "names", ""]


class HistoryTable:
    """The records as a table (text and HTML); ``records`` holds the WatchResults."""

    def __init__(self, records) -> None:
        self.records = list(records)

    def _rows(self) -> list[list[str]]:
        out = []
        for r in self.records:
            dev = " · ".join((f"{d.id} " if len(r.devices) > 1 else "") + device_short(d)
                             for d in r.devices)
            out.append([r.label, fmt_seconds(r.wall), dev, changes_short(r.changes),
                        f"raised {r.error['type']}" if r.error else ""])
        return out

    def __repr__(self) -> str:
        if not self.records:
            return "no watched cells yet: `%gpumem watch on` or a `%%gpuwatch` cell records them"
        return "\n".join(text_table(_HEADERS, self._rows()))

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        if not self.records:
            return f"<div>{esc(repr(self))}</div>"
        return html_table(_HEADERS, self._rows())

    def to_json(self) -> list[dict]:
        return [r.to_json() for r in self.records]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):
        return self.records[i]


__all__ = ["save", "rows", "tensorboard", "HistoryTable", "fmt_bytes"]
