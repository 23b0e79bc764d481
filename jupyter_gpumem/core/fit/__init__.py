"""The search of ``%%gpumem fit``: the largest size on a grid (multiples of a step) whose
trial runs on the memory free now, in few trials.

Two small trials measure how the peak grows per sample (``peak = fixed + per_sample *
size``); the line predicts the largest size whose peak fits in the free memory; real
trials confirm it: the predicted size, then its neighbour on the side not known yet.
Where they disagree with the line (a model that switches kernels by size, a cache that
grows), the line is fitted again on the trials that ran, and every other trial halves the
interval left (or doubles the size where no upper bound is known), so the search never
takes many more trials than a bisection. The trials themselves (running the cell, reading
its peak, cleaning up) are the caller's: ``run(size) -> Trial``.
"""
from __future__ import annotations

import time
from typing import Callable

from .result import FitResult, Trial
from ...units import fmt_bytes

#: a peak off the line by more than this share (and MIN_OFF bytes) makes the fit non-linear
OFF_SHARE = 0.05
MIN_OFF = 1 << 20
#: ... and by more than this share of the free memory (less cannot move the answer a step)
SHARE_OF_FREE = 0.01
#: free memory that moves by more than this share (and MIN_MOVE bytes) is reported
MOVE_SHARE = 0.05
MIN_MOVE = 32 << 20
#: the measuring trials go on until the peak grows by this much (and doubles)
MIN_GROWTH = 8 << 20
#: without --max, doubling stops here (sizes)
NO_MAX = 1 << 24


class Grid:
    """Sizes ``start + i * step`` for i = 0 .. count-1 (``count`` None: unbounded)."""

    def __init__(self, smallest: int, biggest: int | None, step: int) -> None:
        self.step = step
        self.start = -(-smallest // step) * step
        stop = NO_MAX if biggest is None else biggest
        self.count = max((stop - self.start) // step + 1, 0)
        self.bounded = biggest is not None
        #: the bound asked for (``--max``), None without one
        self.biggest = biggest

    def size(self, i: int) -> int:
        return self.start + i * self.step

    def index_below(self, size: float) -> int:
        """The index of the largest grid size at most ``size`` (-1 below the grid)."""
        return int((size - self.start) // self.step)


def line(trials: list[Trial]) -> tuple[float, float] | None:
    """``(fixed, per_sample)`` through the smallest and the largest trials that ran."""
    ok = sorted((t for t in trials if t.ok and t.peak is not None), key=lambda t: t.size)
    if not ok:
        return None
    lo, hi = ok[0], ok[-1]
    if hi.size == lo.size:
        return 0.0, lo.peak / max(lo.size, 1)
    slope = (hi.peak - lo.peak) / (hi.size - lo.size)
    return lo.peak - slope * lo.size, slope


def _grew(small: Trial, big: Trial) -> bool:
    """Whether ``big``'s peak is clearly above ``small``'s (noise is a few pages)."""
    if small.peak is None or big.peak is None:
        return True
    return big.peak - small.peak > max(MIN_GROWTH, small.peak)


def search(run: Callable[[int], Trial], grid: Grid, free: Callable[[], int | None],
           *, variable: str, device: str, measure: str) -> FitResult:
    """The largest grid size whose trial runs; ``free()``: the memory free now (bytes)."""
    t0 = time.perf_counter()
    tried: dict[int, Trial] = {}
    budget = free()

    def at(i: int) -> Trial:
        if i not in tried:
            trial = run(grid.size(i))
            tried[i] = trial
        return tried[i]

    lo, hi = -1, (grid.count if grid.bounded else None)
    result = FitResult(variable=variable, device=device, measure=measure, free=budget,
                       largest=None, step=grid.step, smallest=grid.start,
                       biggest=grid.size(grid.count - 1) if grid.bounded else None)

    def record(i: int) -> None:
        nonlocal lo, hi
        if at(i).ok:
            lo = max(lo, i)
        else:
            hi = i if hi is None else min(hi, i)

    def predict() -> int | None:
        """The line's largest size under the free memory, the line scaled by what the
        failed trials showed: each asked for ``requested`` bytes on top of its peak then,
        so a size's real demand is at least that (on the host the resident set lags the
        address space a step reserves)."""
        trials = list(tried.values())
        fit = line(trials)
        frees = [t.free for t in trials if t.free is not None]
        room = min([budget] + frees[-1:]) if budget is not None else None
        if fit is None or room is None:
            return None
        fixed, slope = fit
        if slope <= 0:
            return None
        below, above = 1.0, float("inf")
        for t in trials:
            on_line = fixed + slope * t.size
            if on_line <= 0:
                continue
            if not t.ok and t.peak is not None and t.requested:
                below = max(below, (t.peak + t.requested) / on_line)
            elif t.ok:
                above = min(above, room / on_line)
        scale = below if below <= above else (below + above) / 2
        guess = grid.index_below((room / scale - fixed) / slope)
        ran = sorted((t for t in trials if t.ok and t.peak is not None), key=lambda t: t.size)
        if len(ran) >= 3 and ran[-1].peak > ran[-2].peak:
            # where the peak bends, the two largest trials that ran say more about the
            # sizes just above them than the line through the smallest does
            a, b = ran[-2], ran[-1]
            guess = grid.index_below(b.size + (room - b.peak) * (b.size - a.size) / (b.peak - a.peak))
        top = tried.get(hi) if hi is not None else None
        if lo >= 0 and top is not None and top.peak is not None \
                and top.requested and tried[lo].peak is not None:
            # once a trial failed, the two trials that bracket the answer (the one that
            # ran, the one that did not) say where it lies too; the failed one's demand
            # (its peak and the request that failed) is a lower bound, so their line
            # reaches too far: the lower of the two guesses
            low = tried[lo].peak
            high = top.peak + top.requested
            if high > low:
                size = grid.size(lo) + (room - low) * (grid.size(hi) - grid.size(lo)) / (high - low)
                bracket = grid.index_below(size)
                # two sizes left between them: the line of the trials that ran decides
                # (its peaks are exact; the failed one's figure is only a bound)
                if hi - lo != 3:
                    guess = min(guess, bracket)
        return guess

    def upper() -> int:
        return grid.count - 1 if hi is None else hi - 1

    # small trials measure the growth per sample: the smallest size, then four times
    # the last until the peak grows clearly (a small size's peak is mostly noise)
    record(0)
    i = 0
    while lo == i and i < upper():
        nxt = min(max(grid.index_below(4 * grid.size(i)), i + 1), upper())
        record(nxt)
        i = nxt
        if lo == i and _grew(tried[0], tried[i]):
            break
    first = predict()
    result.predicted = None if first is None else grid.size(max(first, 0))
    rounds = 0
    while lo >= 0 and lo < upper():
        # the line's prediction, within the bounds the trials set (just above the
        # largest that ran where it says no more: its neighbour confirms it); every
        # third round halves what is left or, before any trial failed, moves up
        # 1, 2, 4... steps (the grid's end is no failure)
        guess = predict() if rounds % 3 != 2 else None
        if guess is not None:
            guess = min(max(guess, lo + 1), upper())
        if guess is None or guess in tried:
            guess = (lo + hi) // 2 if hi is not None and hi in tried else \
                min(lo + (2 << (rounds // 3)), upper())
        record(guess)
        rounds += 1

    result.trials = list(tried.values())
    result.largest = grid.size(lo) if lo >= 0 else None
    result.seconds = time.perf_counter() - t0
    fit = line(result.trials)
    if fit is not None:
        result.fixed, result.per_sample = fit
    result.notes += _notes(result, fit, first, lo, grid)
    return result


def _top_note(first: int | None, lo: int, grid: Grid) -> str | None:
    """Where the answer is the grid's top (``--max``, or the search's own limit without
    one): larger sizes were not tried, which is no error of the prediction."""
    if grid.count < 1 or lo != grid.count - 1:
        return None
    top = grid.size(lo)
    if grid.bounded:
        what = f"{top} is --max" if top == grid.biggest else \
            f"{top} is the largest multiple of {grid.step} up to --max {grid.biggest}"
    else:
        what = f"{top} is the most the search tries without --max"
    note = f"{what}: larger sizes were not tried"
    if first is not None and first > lo:
        note += f" (the line predicts up to {grid.size(first)} would fit)"
    return note


def _notes(result: FitResult, fit, first: int | None, lo: int, grid: Grid) -> list[str]:
    notes = []
    capped = _top_note(first, lo, grid)
    if fit is not None:
        fixed, slope = fit
        floor = max(MIN_OFF, SHARE_OF_FREE * (result.free or 0))
        off = [t for t in result.trials if t.ok and t.peak is not None
               and abs(t.peak - (fixed + slope * t.size)) > max(OFF_SHARE * t.peak, floor)]
        if off:
            notes.append("the peak is not linear in the size (" + ", ".join(
                f"{t.size}: {fmt_bytes(t.peak)} against {fmt_bytes(round(fixed + slope * t.size))}"
                f" on the line" for t in off[:3]) + "): the confirming trials decided")
        elif first is not None and lo >= 0 and abs(first - lo) > 1 and capped is None:
            notes.append(f"the first prediction ({grid.size(max(first, 0))}) was off by "
                         f"{abs(first - lo)} steps: the confirming trials decided")
    if capped is not None:
        notes.append(capped)
    frees = [t.free for t in result.trials if t.free is not None]
    if frees and result.free is not None:
        moved = max(frees) - min(frees + [result.free])
        if moved > max(MOVE_SHARE * result.free, MIN_MOVE):
            notes.append(f"the free memory moved during the search (from {fmt_bytes(result.free)},"
                         f" between {fmt_bytes(min(frees))} and {fmt_bytes(max(frees))}: another "
                         f"process, or this one's own caches?): the answer holds for the memory as the trials found it")
    return notes
