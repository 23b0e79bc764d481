"""The search of ``%%gpumem fit``: the largest size on a grid (multiples of a step) whose
trial runs on the memory free now, in few trials.

The smallest size runs first; its peak, taken as all per sample, says how far a second
trial may go and still fit (a share of that, 4 to 64 times the first size). The line
through their peaks (``peak = fixed + per_sample * size``) predicts where the peak reaches
the memory free now; a line of two trials knows nothing of the curvature, so the third
trial goes only part of the way there and runs, most likely: its peak makes three, and the
parabola through them predicts again. From then on each trial is the prediction rounded to
the nearest size of the grid, inside the sizes not yet decided, so that it and its
neighbour settle the answer (the largest size that ran, its neighbour above out of memory)
wherever the answer lies within half a step of the prediction.

Trials that contradict the curve move it. One that fails where the curve says it fits
either asked for more than the free memory (its peak and the request that failed: the chord
from the largest trial that ran to that figure predicts), or shows that the step may take
less than the free memory as read (a GPU's cache fragments, the resident set lags the
address space): the level the curve must reach moves down, by twice what the failure
showed; one that runs with a peak over the free memory moves it up likewise. One that runs
where the curve said it would not, and moves the prediction up (the peak dropped: a kernel
chosen by size), sends the next only half way. Where three trials did not halve the sizes
not yet decided, the next one does. On the generated steps of ``benchmarks/fit_search.py``
(straight or bent) this takes five trials, fewer than a bisection of a grid of 64 sizes or
more. The trials themselves (running the cell, reading its peak, cleaning up) are the
caller's: ``run(size) -> Trial``.
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
#: without --max, the sizes stop here
NO_MAX = 1 << 24
#: the second trial: this share of the size that fits if the first peak were all per sample
#: (a peak that grows faster than linearly reaches the free memory sooner)...
SECOND_SHARE = 0.6
#: ... from 4 to 64 times the first size
SECOND_MIN, SECOND_MAX = 4, 64
#: the third trial goes this share of the way from the second to the line's prediction (a
#: step whose per-sample peak grows by half over the grid needs 0.65 or less)
THIRD_SHARE = 0.6
#: a parabola of noisy peaks may reach far: no farther (nor nearer) than this factor of the
#: line through the smallest and the largest trials that ran
BEND_REACH = 3.0
#: a trial that ran where the curve said it would not, and moved the prediction up by more
#: than a step: the next trial goes this share of the way (the peak jumped down there, a
#: kernel chosen by size: the curve above it is the less certain)
SURPRISE_SHARE = 0.5
#: where the sizes not yet decided did not halve in this many trials, the next trial halves
#: them (before any failed: where the largest that ran moved a step a trial at most, the
#: next trial moves twice as far as those did together)
STALL = 3


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


def curve(points: list[tuple[int, int]]) -> Callable[[float], float] | None:
    """From the trials that ran, ``(size, peak)`` sorted by size: the size (a float) at
    which the peak reaches a figure, for figures above the largest trial's peak.

    One trial: its whole peak taken as per sample (a line through zero: where the fixed
    part is not negative and the peak grows no faster than linearly, the size it gives
    fits). Two: the line through them. Three or more: the parabola through the largest,
    the smallest and the one between that spreads them most (its curvature read where the
    noise of a peak weighs least), its reach past the largest within ``BEND_REACH`` times
    the line's (straight on where it would bend back)."""
    if not points:
        return None
    sb, pb = points[-1]
    if len(points) == 1:
        return None if pb <= 0 else (lambda level: sb * level / pb)
    s0, p0 = points[0]
    wide = (pb - p0) / (sb - s0)
    if len(points) == 2:
        if wide <= 0:
            return None
        return lambda level: sb + (level - pb) / wide
    sm, pm = max(points[1:-1], key=lambda q: (sb - q[0]) * (q[0] - s0))
    near = (pb - pm) / (sb - sm)
    bend = (near - (pm - p0) / (sm - s0)) / (sb - s0)
    slope = near + bend * (sb - sm)            # the parabola's slope at the largest
    if slope <= 0:
        if wide <= 0:
            return None
        slope, bend = wide, 0.0

    def at(level: float) -> float:
        need = level - pb
        if wide <= 0 or need <= 0:
            return sb + need / slope
        straight = need / wide
        u = straight
        disc = slope * slope + 4 * bend * need
        if bend != 0.0 and disc > 0:
            u = 2 * need / (slope + disc ** 0.5)
        return sb + min(max(u, straight / BEND_REACH), straight * BEND_REACH)
    return at


def peak_at(size: Callable[[float], float], at: float) -> float:
    """The peak the curve gives at a size (its inverse ``size`` solved by bisection)."""
    a, b = 0.0, 1.0
    while size(b) < at and b < 1e30:
        b *= 2
    for _ in range(100):
        m = (a + b) / 2
        if size(m) < at:
            a = m
        else:
            b = m
    return (a + b) / 2


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

    def upper() -> int:
        return grid.count - 1 if hi is None else hi - 1

    def room() -> int | None:
        """The memory free now (read before each prediction: what the next trial may use),
        at most what was free when the search began."""
        if budget is None:
            return None
        now = free()
        if now is None:
            frees = [t.free for t in tried.values() if t.free is not None]
            now = frees[-1] if frees else budget
        return min(budget, now)

    def predict() -> float | None:
        """The size (a float) at which the curve of the trials that ran reaches the level
        a step may take: the room as read, unless the trials at the ends of the sizes not
        yet decided say otherwise."""
        points = sorted((t.size, t.peak) for t in tried.values() if t.ok and t.peak is not None)
        level = room()
        size = curve(points) if level is not None else None
        if size is None:
            return None
        if len(points) < 2:
            return size(level)
        low = tried[lo].peak
        if low is not None and low > level:
            # a trial ran with a peak over the room: the room is more than read (the
            # resident set lags the address space), by twice what shows
            level = low + (low - level)
        top = tried.get(hi) if hi is not None else None
        if top is None or low is None:
            return size(level)
        reach = size(level)
        if reach < grid.size(hi):
            return reach                   # the failure is where the curve says
        demand = None if top.peak is None or not top.requested else top.peak + top.requested
        if demand is not None and demand > level:
            # it failed where the curve says it fits, asking for more than the level (its
            # peak and the request that failed: at least that much): the chord from the
            # largest trial that ran to it reaches the level where a curve that bends
            # between them does
            return min(reach, grid.size(lo) + (level - low) * (grid.size(hi) - grid.size(lo))
                       / (demand - low))
        high = peak_at(size, grid.size(hi))
        if level >= high:
            # it failed where the curve says it fits: the level is lower than the room,
            # by twice what shows at least
            level = high - (level - high)
            if level <= low:
                level = (low + high) / 2
        return size(level)

    record(0)
    first: int | None = None
    widths: list[int | None] = []
    lows: list[int] = []
    surprised = False
    while lo >= 0 and lo < upper():
        x = predict()
        ran = sum(t.ok and t.peak is not None for t in tried.values())
        if len(tried) == 1:
            # the second trial: a share of the size that fits if the first peak were all
            # per sample (without a figure for the free memory: four times the first)
            s0 = grid.size(0)
            x = SECOND_MIN * s0 if x is None else \
                min(max(x * SECOND_SHARE, SECOND_MIN * s0), SECOND_MAX * s0)
            guess = grid.index_below(x)
        elif x is None or (ran < 2 and hi is not None and hi in tried):
            # no curve (no figure for the free memory, peaks that do not grow), or the
            # second trial failed: halve, or double where no trial failed yet
            guess = (lo + hi) // 2 if hi is not None and hi in tried else \
                min(2 * lo + 1, upper())
        else:
            if first is None:
                first = grid.index_below(x)
            base = grid.size(lo)
            if surprised and x > base + grid.step:
                x = base + (x - base) * SURPRISE_SHARE
            # the prediction rounded to the grid: that size and its neighbour (above if it
            # runs, below if not) settle the answer wherever it lies within half a step
            guess = grid.index_below(x + grid.step / 2)
            if ran == 2:
                # a line of two trials knows nothing of the curvature: part of the way,
                # where the trial runs (most likely) and its peak makes a parabola
                short = grid.index_below(base + (x - base) * THIRD_SHARE)
                if short > lo:
                    guess = short
        # the safeguard: where the sizes not yet decided did not halve in STALL trials, the
        # next one halves them; where none failed yet and the largest that ran moved up a
        # step a trial at most, the next one moves twice as far
        widths.append(None if hi is None or hi not in tried else hi - lo)
        lows.append(lo)
        if len(widths) > STALL and widths[-1] is not None and widths[-1 - STALL] is not None \
                and 2 * widths[-1] > widths[-1 - STALL]:
            guess = (lo + hi) // 2
        elif len(lows) > STALL and widths[-1] is None and lo - lows[-1 - STALL] <= STALL:
            guess = max(guess, lo + 2 * max(lo - lows[-1 - STALL], 1))
        guess = min(max(guess, lo + 1), upper())
        record(guess)
        # ran where the curve said it would not (the first time in a row)
        surprised = not surprised and x is not None and ran >= 3 and tried[guess].ok \
            and x < grid.size(guess)

    if first is None:
        # the answer came before a prediction was needed (the grid's top ran, or its bottom
        # failed): the curve of what ran, for the answer to quote
        x = predict()
        first = None if x is None else grid.index_below(x)
    result.predicted = None if first is None else grid.size(max(first, 0))
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
