"""What ``%%gpumem fit`` answers: :class:`FitResult` (the largest size that runs on the memory
free now, its peak and headroom, the fit of peak against size, every trial) and its text."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...units import JsonFields, Report, esc, fmt_bytes, json_field, minus, round6

FIT_SCHEMA = "jupyter_gpumem.fit/1"
#: memory the fit may leave behind unmentioned (bytes)
DRIFT = 2 << 20


@dataclass
class Accumulation(JsonFields):
    """``micro`` x ``steps`` reaches ``target`` samples, ``micro`` at most the largest size."""

    target: int
    micro: int
    steps: int


@dataclass
class Trial(JsonFields):
    """One run of the cell at ``size``: whether it fit, its peak over the start (bytes)."""

    size: int
    ok: bool
    peak: int | None
    seconds: float = json_field(convert=round6)
    error: str | None = None
    #: the memory free before this trial (bytes)
    free: int | None = None
    #: what the allocation that failed asked for (bytes), where its message says
    requested: int | None = None


@dataclass(repr=False)
class FitResult(Report, JsonFields):
    """The answer of ``%%gpumem fit``; ``largest`` is None when not even the smallest size ran."""

    JSON_AFTER = {"schema": None, "peak": "largest", "headroom": "peak"}
    schema = FIT_SCHEMA

    variable: str
    device: str
    #: how the peak was read (the allocator's exact counter, the process's VmHWM)
    measure: str
    #: memory free when the search began (bytes): what a step may use
    free: int | None
    largest: int | None
    step: int
    smallest: int
    biggest: int | None
    trials: list[Trial] = field(default_factory=list)
    #: peak = fixed + per_sample * size, from the trials that ran
    per_sample: float | None = None
    fixed: float | None = None
    predicted: int | None = None
    seconds: float = json_field(0.0, convert=round6)
    accumulation: Accumulation | None = None
    #: what the answer assumed, and what it saw (non-linear peaks, free memory moving)
    notes: list[str] = field(default_factory=list)
    #: the device's allocated figure (or the process's resident set) before and after
    before: int | None = None
    after: int | None = None

    @property
    def peak(self) -> int | None:
        """The peak of the largest size's trial (bytes over the start)."""
        for t in self.trials:
            if t.ok and t.size == self.largest:
                return t.peak
        return None

    @property
    def headroom(self) -> int | None:
        return minus(self.free, self.peak)

    @property
    def bisection_trials(self) -> int | None:
        """Trials a bisection of the same grid takes (at most), where the grid is bounded."""
        if self.biggest is None:
            return None
        n = (self.biggest - self.smallest) // self.step + 1
        return math.ceil(math.log2(n + 1))

    def lines(self) -> list[str]:
        out = []
        if self.largest is None:
            out.append(f"{self.variable}: nothing fits on {self.device}: even "
                       f"{self.variable}={self.smallest} ran out of memory "
                       f"({fmt_bytes(self.free)} free)")
        else:
            top = "" if self.biggest is None or self.largest < self.biggest else \
                " (the largest allowed by --max)"
            out.append(f"{self.variable} = {self.largest} fits on {self.device}{top}: peak "
                       f"{fmt_bytes(self.peak)} of {fmt_bytes(self.free)} free, headroom "
                       f"{fmt_bytes(self.headroom)}")
        if self.per_sample is not None and self.fixed is not None:
            pred = "" if self.predicted is None else f"; predicted {self.variable} = {self.predicted}"
            out.append(f"peak = {fmt_bytes(round(self.fixed))} fixed + "
                       f"{fmt_bytes(round(self.per_sample))} per sample ({self.measure}){pred}")
        bis = self.bisection_trials
        bis = "" if bis is None else f"; a bisection of the grid takes up to {bis}"
        out.append(f"{len(self.trials)} trials in {self.seconds:.2f} s on multiples of "
                   f"{self.step}{bis}: " + ", ".join(
                       f"{t.size} {'ok' if t.ok else 'out of memory'}" for t in self.trials))
        if self.accumulation is not None:
            a = self.accumulation
            out.append(f"--target {a.target}: micro-batch {a.micro} x {a.steps} accumulation "
                       f"steps")
        out += self.notes
        if self.before is not None and self.after is not None \
                and abs(self.after - self.before) > DRIFT:
            what = "the process's resident set" if self.device == "cpu" else "allocated"
            out.append(f"{what} after the fit: {fmt_bytes(self.after)}, against "
                       f"{fmt_bytes(self.before)} before")
        return out

    def _text(self) -> str:
        return "\n".join(self.lines())

    def _html(self) -> str:
        return "<pre>" + esc(self._text()) + "</pre>"


def accumulation(target: int, largest: int | None) -> Accumulation | None:
    """The micro-batch and step count that reach ``target`` exactly: the largest divisor of
    ``target`` that is at most ``largest`` (1 always is)."""
    if largest is None or largest < 1:
        return None
    micro = max(d for d in range(1, min(target, largest) + 1) if target % d == 0)
    return Accumulation(target, micro, target // micro)
