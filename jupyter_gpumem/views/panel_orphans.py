"""The live panel's Orphans section (``%gpumem panel``): this user's orphans on the GPUs.

Under the device bars, it lists the orphans of the panel's last snapshot (its
``processes``, what ``%gpumem --processes`` lists), so it reads nothing while a cell
runs. Its button ends the ones a kernel left after a confirmation that names each of
them, with the code of ``%gpumem purge --orphans`` (:mod:`jupyter_gpumem.core.processes.orphans`),
and shows every step. Its callbacks never raise into the kernel: an error is one line
in the section.
"""
from __future__ import annotations

import time
from typing import Any

from ..backends import nvml as _nvml
from ..core import devices as _devices
from ..core.processes import orphans as _orphans
from ..core.render import fmt_bytes
from .panel_render import FONT, cell, esc, positive
from .question import Question, guarded, status_html


# -- the section's HTML (the snapshot's "processes", an OrphanPurge) -------------------
def orphans_of(snap: dict) -> list[dict]:
    """This user's orphans in a snapshot's ``processes`` (``DeviceProcesses`` objects,
    what ``%gpumem --processes`` lists), one per pid, largest first: ``pid``, ``bytes``
    (all its devices), ``devices`` (device -> bytes), ``command``, ``label``, ``path``,
    ``started`` and ``purgeable`` (left by a kernel: ``purge --orphans`` ends it)."""
    out: dict[int, dict] = {}
    for dp in snap.get("processes") or ():
        if not isinstance(dp, dict):
            continue
        for p in dp.get("processes") or ():
            if not isinstance(p, dict) or p.get("relation") != "orphan" \
                    or not isinstance(p.get("pid"), int):
                continue
            o = out.setdefault(p["pid"], {
                "pid": p["pid"], "bytes": 0, "devices": {}, "command": p.get("command") or "",
                "label": p.get("label") or "", "path": p.get("path"),
                "started": p.get("started"), "purgeable": bool(p.get("purgeable"))})
            o["devices"][str(dp.get("device"))] = positive(p.get("bytes"))
            o["bytes"] = sum(o["devices"].values())
    return sorted(out.values(), key=lambda o: (not o["purgeable"], -o["bytes"], o["pid"]))


def orphans_button_text(orphans: list[dict]) -> str:
    """``End 2 orphans (1.9 GiB)``: the purgeable ones."""
    ours = [o for o in orphans if o.get("purgeable")]
    if not ours:
        return "End orphans"
    n = len(ours)
    return (f"End {n} orphan{'' if n == 1 else 's'} "
            f"({fmt_bytes(sum(o.get('bytes') or 0 for o in ours))})")


_ORPHAN_COLUMNS = (("pid", "5em", "right"), ("bytes", "6.5em", "right"),
                   ("device", "5.5em", "left"), ("what it is", "22em", "left"))


def _orphan_row(o: dict) -> str:
    values = (esc(o.get("pid")), esc(fmt_bytes(o.get("bytes"))),
              esc(",".join(sorted(o.get("devices") or {})) or "-"), esc(o.get("label") or ""))
    cells = "".join(cell(v, w, a) for v, (_, w, a) in zip(values, _ORPHAN_COLUMNS))
    return (f"<div data-orphan='{esc(o.get('pid'))}' data-bytes='{positive(o.get('bytes'))}'"
            f" data-purgeable='{1 if o.get('purgeable') else 0}'"
            f" style='{FONT};line-height:22px'>{cells}"
            f"<code title='{esc(o.get('command') or '')}'>{esc(o.get('command') or '')}</code>"
            f"</div>")


def orphans_html(orphans: list[dict], note: str | None = None) -> str:
    """The orphans on the GPUs, one row each (pid, bytes, device, what it is, command);
    without any, the magic's line and ``note`` (why NVML cannot tell)."""
    if not orphans:
        line = "no orphan of this user holds GPU memory"
        if note:
            line += f" · {note}"
        return f"<div data-orphans='0' style='{FONT};opacity:.75'>{esc(line)}</div>"
    ours = [o for o in orphans if o.get("purgeable")]
    total = sum(o.get("bytes") or 0 for o in orphans)
    head = (f"{len(orphans)} orphaned process{'' if len(orphans) == 1 else 'es'} of this user "
            f"{'holds' if len(orphans) == 1 else 'hold'} {fmt_bytes(total)}")
    if len(ours) < len(orphans):
        head += f" · {len(orphans) - len(ours)} that no kernel started: left alone"
    cols = "".join(cell(f"<b>{esc(c)}</b>", w, a) for c, w, a in _ORPHAN_COLUMNS)
    rows = "".join(_orphan_row(o) for o in orphans)
    return (f"<div data-orphans='{len(orphans)}' style='{FONT}'><div>{esc(head)}</div>"
            f"<div style='line-height:22px'>{cols}<b>command</b></div>{rows}</div>")


def orphans_confirm_html(orphans: list[dict], grace: float) -> str:
    """The question before ending orphans (the sidebar's words): what gets SIGTERM."""
    n = len(orphans)
    total = sum(o.get("bytes") or 0 for o in orphans)
    text = (f"End <b>{n}</b> orphaned process{'' if n == 1 else 'es'} that a kernel left, "
            f"holding <b>{esc(fmt_bytes(total))}</b>: SIGTERM, then SIGKILL after "
            f"{grace:g} s?")
    rows = "".join(
        f"<tr data-confirm-orphan='{esc(o.get('pid'))}'><td style='text-align:right'>"
        f"{esc(o.get('pid'))}</td><td><code>{esc(o.get('command') or '')}</code></td>"
        f"<td style='text-align:right'>{esc(fmt_bytes(o.get('bytes')))}</td></tr>"
        for o in orphans)
    table = ("<table><thead><tr><th>pid</th><th>command</th><th>bytes</th></tr></thead>"
             f"<tbody>{rows}</tbody></table>")
    return f"<div style='{FONT}'>{text}{table}</div>"


def _step_line(s: dict) -> str:
    seconds = s.get("seconds") if isinstance(s.get("seconds"), (int, float)) else 0.0
    return (f"<div data-step='{esc(s.get('pid'))}'><code>{seconds:6.2f} s  pid "
            f"{esc(s.get('pid'))}  {esc(s.get('signal'))}  {esc(s.get('result'))}</code></div>")


def orphans_steps_html(steps: list[dict]) -> str:
    """The steps so far, while the orphans are being ended."""
    return (f"<div data-orphans-result='running' style='{FONT}'>ending the orphans…"
            f"{''.join(_step_line(s) for s in steps)}</div>")


def orphans_result_html(result: dict, when: str | None = None) -> str:
    """What ``purge --orphans`` did (an ``OrphanPurge`` object): the magic's first line,
    every step, the devices' used bytes before and after, what was left alone and why."""
    targets = result.get("targets") or []
    steps = [s for s in result.get("steps") or () if isinstance(s, dict)]
    total = sum(t.get("bytes") or 0 for t in targets if isinstance(t, dict))
    ended = {s.get("pid") for s in steps if s.get("result") == "ended"}
    if not targets:
        head = "no orphan of this user holds GPU memory: nothing ended"
    else:
        head = f"ended {len(ended)} of {len(targets)} orphan(s) holding {fmt_bytes(total)}"
    at = f" at {esc(when)}" if when else ""
    after = result.get("after") or {}
    rows = "".join(
        f"<tr><td>{esc(dev)}</td>"
        f"<td style='text-align:right'>{esc(fmt_bytes((result.get('before') or {}).get(dev)))}</td>"
        f"<td style='text-align:right'>{esc(fmt_bytes(after.get(dev)))}</td>"
        f"<td style='text-align:right'><b>{esc(fmt_bytes((result.get('freed') or {}).get(dev)))}"
        f"</b></td></tr>" for dev in after)
    table = ("<table><thead><tr><th>device</th><th>used before</th><th>used after</th>"
             f"<th>freed</th></tr></thead><tbody>{rows}</tbody></table>") if rows else ""
    alone = "".join(f"<div>left alone: pid {esc(a.get('pid'))}: {esc(a.get('why'))}</div>"
                    for a in result.get("left_alone") or () if isinstance(a, dict))
    notes = "".join(f"<div><em>note: {esc(m)}</em></div>" for m in result.get("messages") or ())
    return (f"<div data-orphans-result='done' style='{FONT}'><div>orphans{at}: {esc(head)}</div>"
            f"{''.join(_step_line(s) for s in steps)}{table}{alone}{notes}</div>")


# -- the section ----------------------------------------------------------------------
END_TIP = ("end this user's orphans that a kernel left: SIGTERM, then SIGKILL after a "
           "grace period")


#: why there is no GPU figure, in the words the server's kernel list uses
NO_NVML = "GPU figures need NVML (the NVIDIA driver); none here"


class OrphanSection:
    """The Orphans section of one panel: the list, the button, its question, the steps."""

    def __init__(self, panel: Any, widgets: Any) -> None:
        """Build the section into ``panel``'s widget, right under its cluster bars
        (``widgets`` is the ipywidgets module the panel uses)."""
        self.panel = panel
        w = widgets
        self._rows: list[dict] = []
        self.list = w.HTML()
        self.button = w.Button(
            description="End orphans", icon="stop", button_style="", disabled=True,
            tooltip=END_TIP, layout=w.Layout(width="auto"))
        self.status = w.HTML()
        # as the purge's question: it takes the button's place
        self.question = Question(
            w, "Yes, end them", changed=self._update_button, confirmed=self._end_confirmed,
            cancelled=lambda: self._say("cancelled: no process was ended"), guard=self._guard)
        self.result = w.HTML()
        self.box = w.VBox([
            w.HTML("<b>Orphans</b> <span style='opacity:.6'>(this user's processes on the "
                   "GPUs whose parent is gone: a restarted kernel's left-overs)</span>"),
            self.list, self.question.box,
            w.HBox([self.button, self.status],
                   layout=w.Layout(align_items="center")),
            self.result,
        ], layout=w.Layout(display="none"))
        children = list(self.panel.widget.children)
        children.insert(children.index(self.panel.cluster_bars) + 1, self.box)
        self.panel.widget.children = children
        self.button.on_click(self._guard(self._on_end))

    def _guard(self, fn):
        """The Orphans section's callbacks never raise into the kernel: one line in it."""
        return guarded(fn, self._say)

    def _say(self, text: str, error: bool = False) -> None:
        if not self.panel.closed:
            self.status.value = status_html(text, error)

    def rows(self) -> list[dict]:
        """The orphans the section lists (see :func:`orphans_of`)."""
        return [dict(o) for o in self._rows]

    def show(self, data: dict) -> None:
        """The orphans of a snapshot (main thread; no reading of its own but NVML's
        status, kept since the snapshot's reading, when it lists none)."""
        try:
            if self.panel.closed:
                return
            if self.panel.device == "cpu":       # no GPU selected: no process to name
                self._rows = []
                self.box.layout.display = "none"
                return
            rows = orphans_of(data)
            note = None
            if not rows:
                # never the library's own error text: one plain line (what the server's
                # kernels list says too)
                if not _nvml.available():
                    note = NO_NVML
                elif not _nvml.device_count():
                    note = "no GPU: NVML sees no device"
            self._rows = rows
            self.list.value = orphans_html(rows, note)
            self._update_button()
            # no GPU to tell of (no NVML, no device): no section that speaks of GPUs
            self.box.layout.display = None if rows or note is None else "none"
        except Exception as exc:  # noqa: BLE001 - the holders shown stand
            self._say(f"orphans: {type(exc).__name__}: {exc}", error=True)

    def _update_button(self) -> None:
        ours = [o for o in self._rows if o.get("purgeable")]
        pending = self.question.open
        button = self.button
        with button.hold_sync():
            button.description = orphans_button_text(self._rows)
            button.disabled = not ours or pending
            button.button_style = "" if button.disabled else "warning"
            button.tooltip = END_TIP if ours else "no orphan here was left by a kernel: left alone"
            # no orphan: no button; while the question is open it takes the button's place
            button.layout.display = "none" if pending or not self._rows else None

    def _devices(self) -> list | None:
        """The devices ``purge --orphans`` reads for this panel (as the magic's
        ``--device``: every NVML device for ``auto``, ``all`` and ``cuda``)."""
        if self.panel.device in ("auto", "all", "cuda"):
            return None
        return [d for d in _devices.read_devices_now(self.panel.device) if d.kind != "cpu"]

    def _on_end(self, _button: Any = None) -> None:
        """Ask first: a dry run of ``purge --orphans`` names what would get SIGTERM now."""
        self.result.value = ""
        dry = _orphans.purge_orphans(dry_run=True, devices=self._devices())
        targets = [{"pid": t.pid, "bytes": t.nbytes or 0, "command": t.command,
                    "devices": dict(t.devices), "label": t.label, "started": t.started}
                   for t in dry.targets]
        if not targets:
            self._say("no orphan a kernel left holds GPU memory now: nothing to end")
            self.panel.refresh()
            return
        self.question.ask(orphans_confirm_html(targets, dry.grace), targets)
        self._say("confirm or cancel: nothing is ended before you confirm")

    def _end_confirmed(self, pending: list[dict]) -> None:
        """End the confirmed orphans, and no other (``purge --orphans`` checks each again
        just before each signal), showing each step as it is reported."""
        steps: list[dict] = []

        def on_step(step) -> None:
            steps.append(step.to_json())
            self.result.value = orphans_steps_html(steps)

        self.result.value = orphans_steps_html(steps)
        try:
            result = _orphans.purge_orphans(devices=self._devices(), on_step=on_step,
                                            only={o["pid"]: o["started"] for o in pending})
        except Exception as exc:  # noqa: BLE001 - one line; the steps so far stay shown
            self._say(f"ending the orphans failed: {type(exc).__name__}: {exc}",
                              error=True)
        else:
            when = time.strftime("%H:%M:%S")
            self.result.value = orphans_result_html(result.to_json(), when)
            self._say(f"ended {len(result.ended)} of {len(result.targets)} "
                              f"orphan(s) at {when}")
        self.panel.refresh()
