"""``%gpumem purge --orphans``: end this user's orphaned processes that hold GPU memory.

The targets are the ``purgeable`` processes of :mod:`jupyter_gpumem.core.processes`: this user's,
orphaned (no live parent but init or a subreaper), started by a Jupyter kernel that
is provably gone (:func:`jupyter_gpumem.core.processes.judge`). Each one is checked again just before
each signal (the same process: its start time; still this user's, still an orphan by
the same proof, still holding a GPU device file; never this process, its parent or
one of its ancestors) and then gets SIGTERM; those still running after
``grace`` seconds get SIGKILL. Every step is reported as it happens and in the
result; the devices are read again once NVML no longer lists the ended pids.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import psutil

from ...backends import nvml
from ...units import JsonFields, Report, fmt_bytes, html_table, json_field, round6, text_table
from .. import processes as _processes
from ..render import code_html

GRACE = 3.0          # seconds between SIGTERM and SIGKILL
MAX_GRACE = 60.0
KILL_WAIT = 5.0      # seconds to wait for a SIGKILLed process to be gone
SETTLE = 5.0         # seconds to wait for NVML to drop the ended pids


@dataclass
class Target(JsonFields):
    """One process to end."""

    pid: int
    nbytes: int | None = json_field(key="bytes")
    devices: dict[str, int] = field(default_factory=dict)
    user: str | None = None
    command: str = ""
    path: str | None = None
    label: str = ""
    started: float | None = json_field(None, leave_out=True)


@dataclass
class Step(JsonFields):
    """One signal, or what became of it."""

    pid: int
    signal: str
    result: str
    seconds: float = json_field(0.0, convert=round6)

    def text(self) -> str:
        return f"{self.seconds:6.2f} s  pid {self.pid}  {self.signal}  {self.result}"


@dataclass(repr=False)
class OrphanPurge(JsonFields, Report):
    """What ``purge --orphans`` ended (or would), step by step, and the devices before and
    after. Its JSON: ``OrphanPurge`` of docs/PROTOCOL.md."""

    schema = "jupyter_gpumem.orphans/1"
    JSON_AFTER = {"schema": None}

    dry_run: bool
    grace: float
    targets: list[Target] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    left_alone: list[dict] = field(default_factory=list)
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    freed: dict[str, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    seconds: float = json_field(0.0, convert=round6)

    @property
    def ended(self) -> list[int]:
        return sorted({s.pid for s in self.steps if s.result == "ended"})

    def _lines(self) -> tuple[str, list[list[str]], list[list[str]]]:
        n, total = len(self.targets), sum(t.nbytes or 0 for t in self.targets)
        if not n:
            head = "no orphan of this user holds GPU memory"
        elif self.dry_run:
            head = f"dry run: would end {n} orphan(s) holding {fmt_bytes(total)}"
        else:
            head = f"ended {len(self.ended)} of {n} orphan(s) holding {fmt_bytes(total)}"
        targets = [[str(t.pid), fmt_bytes(t.nbytes), ",".join(sorted(t.devices)), t.label,
                    t.command] for t in self.targets]
        devices = [[dev, fmt_bytes(self.before.get(dev)), fmt_bytes(self.after.get(dev)),
                    fmt_bytes(self.freed.get(dev))] for dev in self.after]
        return head, targets, devices

    def _text(self) -> str:
        head, targets, devices = self._lines()
        lines = [head]
        if targets:
            lines += text_table(_TARGET_HEADERS, targets, {0, 1}, indent="  ")
        lines += ["  " + s.text() for s in self.steps]
        if devices:
            lines += text_table(_DEVICE_HEADERS, devices, {1, 2, 3})
        lines += [f"left alone: pid {x['pid']}: {x['why']}" for x in self.left_alone]
        lines += [f"note: {m}" for m in self.messages]
        return "\n".join(lines)

    def _html(self) -> str:
        head, targets, devices = self._lines()
        parts = [f"<div class='jupyter-gpumem'><div>{code_html(head)}</div>"]
        if targets:
            parts.append(html_table(_TARGET_HEADERS, targets, {0, 1}))
        parts += [f"<div><code>{code_html(s.text())}</code></div>" for s in self.steps]
        if devices:
            parts.append(html_table(_DEVICE_HEADERS, devices, {1, 2, 3}))
        parts += [f"<div>left alone: pid {x['pid']}: {code_html(x['why'])}</div>"
                  for x in self.left_alone]
        parts += [f"<div><em>note: {code_html(m)}</em></div>" for m in self.messages]
        return "".join(parts) + "</div>"


_TARGET_HEADERS = ["pid", "bytes", "device", "what it is", "command"]
_DEVICE_HEADERS = ["device", "used before", "used after", "freed"]


def check_grace(value) -> float:
    """A grace period in seconds (0 .. 60), or ValueError."""
    try:
        grace = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"--grace must be a number of seconds, not {value!r}") from None
    if not 0 <= grace <= MAX_GRACE:
        raise ValueError(f"--grace must be between 0 and {MAX_GRACE:g} seconds, not {value!r}")
    return grace


def _used(dps) -> dict[str, int]:
    out = {}
    with nvml.reading():
        for dp in dps:
            reading = nvml.read_device(dp.nvml_index) if dp.nvml_index is not None else None
            if reading is not None:
                out[dp.device] = reading.used
    return out


def plan(ctx: _processes.Context | None = None, devices=None):
    """The targets, what is left alone and the devices' processes (``devices``: as for
    :func:`jupyter_gpumem.core.processes.read`; default every NVML device)."""
    ctx = ctx or _processes.context()
    dps = _processes.read(devices, ctx) if devices is not None else _processes.read_all(ctx)
    targets: dict[int, Target] = {}
    alone: dict[int, str] = {}
    for dp in dps:
        for p in dp.processes:
            if p.relation != "orphan":
                continue
            if not p.purgeable:
                alone[p.pid] = p.label
                continue
            t = targets.setdefault(p.pid, Target(p.pid, 0, user=p.user, command=p.command,
                                                 path=p.path, label=p.label, started=p.started))
            t.devices[dp.device] = p.nbytes or 0
            t.nbytes = sum(t.devices.values())
    ordered = sorted(targets.values(), key=lambda t: (-(t.nbytes or 0), t.pid))
    return ordered, [{"pid": pid, "why": why} for pid, why in sorted(alone.items())], dps


def refusal(t: Target, ctx: _processes.Context) -> tuple[str | None, psutil.Process | None]:
    """Why ``t`` must not get a signal now (``None``: it may), and its process."""
    if t.pid in (ctx.me, os.getpid(), os.getppid()) or t.pid in ctx.ancestors or t.pid <= 1:
        return "this process or one of its parents", None
    try:
        proc = psutil.Process(t.pid)
        with proc.oneshot():
            if t.started is not None and abs(proc.create_time() - t.started) > 0.01:
                return "gone (its pid is another process's now)", None
            if proc.uids().real != ctx.uid:
                return "another user's", None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return "gone", None
            ppid = proc.ppid()
    except psutil.NoSuchProcess:
        return "gone", None
    except (psutil.Error, OSError) as exc:
        return f"cannot be read ({type(exc).__name__})", None
    if not _processes.is_orphan(t.pid, ctx):
        return f"no longer an orphan (parent {ppid})", None
    if _processes.holds_gpu_file(t.pid) is False:
        return "holds no GPU device file", None
    return None, proc


def confirmed(targets: list[Target], only: Mapping[int, float | None]):
    """The targets a confirmation showed (``only``: pid -> its start time, or ``None``),
    and a ``left_alone`` entry for each other one, and for each pid shown that is no
    target now."""
    keep, alone = [], []
    for t in targets:
        if t.pid not in only:
            alone.append({"pid": t.pid, "why": "not in the confirmation"})
        elif only[t.pid] is not None and t.started is not None \
                and abs(only[t.pid] - t.started) > 0.01:
            alone.append({"pid": t.pid, "why": "gone (its pid is another process's now)"})
        else:
            keep.append(t)
    planned = {t.pid for t in targets}
    alone += [{"pid": pid, "why": "no orphan on the GPUs now (ended already, or NVML no "
               "longer lists it)"} for pid in sorted(only) if pid not in planned]
    return keep, alone


def purge_orphans(*, dry_run: bool = False, grace: float = GRACE, ctx=None, devices=None,
                  on_step: Callable[[Step], None] | None = None,
                  settle: float = SETTLE,
                  only: Mapping[int, float | None] | None = None) -> OrphanPurge:
    """End (or, with ``dry_run``, name) this user's orphans on the GPUs. ``only``: the
    orphans a confirmation showed (pid -> start time, or ``None``): no other gets a signal
    (see :func:`confirmed`)."""
    t0 = time.monotonic()
    grace = check_grace(grace)
    ctx = ctx or _processes.context()
    targets, alone, dps = plan(ctx, devices)
    if only is not None:
        targets, unconfirmed = confirmed(targets, only)
        known = {a["pid"] for a in alone}
        alone += [u for u in unconfirmed if u["pid"] not in known]
    out = OrphanPurge(dry_run, grace, targets, left_alone=alone)
    if not dps:
        out.messages.append(nvml.status() or "no GPU: NVML sees no device")
    if dry_run or not targets:
        out.seconds = time.monotonic() - t0
        return out
    out.before = _used(dps)

    def step(pid: int, sig: str, result: str) -> None:
        s = Step(pid, sig, result, time.monotonic() - t0)
        out.steps.append(s)
        if on_step is not None:
            try:
                on_step(s)
            except Exception:  # noqa: BLE001 - a report that fails stops nothing
                pass

    sent = _signal(targets, ctx, signal.SIGTERM, step)
    alive = _wait(sent, grace, "SIGTERM", step)
    killed = _signal([t for t, _ in alive], ctx, signal.SIGKILL, step)
    for t, _ in _wait(killed, KILL_WAIT, "SIGKILL", step):
        step(t.pid, "SIGKILL", "still running")
    _settle({s.pid for s in out.steps if s.result == "ended"}, dps, settle)
    out.after = _used(dps)
    out.freed = {d: out.before[d] - out.after[d] for d in out.after if d in out.before}
    out.seconds = time.monotonic() - t0
    return out


def _signal(targets: list[Target], ctx, sig, step) -> list[tuple[Target, psutil.Process]]:
    name = signal.Signals(sig).name
    sent = []
    for t in targets:
        why, proc = refusal(t, ctx)
        if why is not None:
            step(t.pid, name, f"refused: {why}")
            continue
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            step(t.pid, name, "gone")
            continue
        except (psutil.Error, OSError) as exc:
            step(t.pid, name, f"refused: {type(exc).__name__}")
            continue
        step(t.pid, name, "sent")
        sent.append((t, proc))
    return sent


def _ended(proc: psutil.Process) -> bool:
    """Gone, or a zombie (its memory is freed; reaping it is its new parent's job, and a
    container's first process may never do it)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):
        return False


def _wait(sent, timeout: float, name: str, step) -> list[tuple[Target, psutil.Process]]:
    """Wait up to ``timeout`` for the processes to end; report each that does; the rest."""
    left = list(sent)
    deadline = time.monotonic() + timeout
    while left:
        for t, proc in list(left):
            if _ended(proc):
                step(t.pid, name, "ended")
                left.remove((t, proc))
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return left


def _settle(pids: set[int], dps, settle: float) -> None:
    """Wait (up to ``settle`` s) until NVML lists none of ``pids``: the driver frees a
    context a moment after its process ends."""
    deadline = time.monotonic() + settle
    while pids and time.monotonic() < deadline:
        listed = set()
        for dp in dps:
            if dp.nvml_index is not None:
                listed |= {p.pid for p in (nvml.processes(dp.nvml_index) or ())}
        if not listed & pids:
            return
        time.sleep(0.05)
