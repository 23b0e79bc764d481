"""How many trials ``%%gpumem fit``'s search takes, against a bisection of the same grid.

The search (jupyter_gpumem.core.fit.search) runs on generated steps whose demand is a
formula: a fixed part and a part per sample, straight or bent (up or down) over the grid,
with a budget that puts the answer anywhere from 15 % to 90 % of the grid. A trial over
the budget fails as a real one does: its peak is what it reached before the failure (50 to
97 % of the budget) and the failed request is only part of what was still missing, so
the failure's figure is a lower bound of the demand, weak or strong. Each answer is
checked against the exhaustive one; the trials are printed beside a bisection's count.

    python benchmarks/fit_search.py [--cases 3000] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import statistics

from jupyter_gpumem.core.fit import Grid, search
from jupyter_gpumem.core.fit.result import Trial


def bisection(ok, grid: Grid) -> int:
    lo, hi, n = -1, grid.count, 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        n += 1
        lo, hi = (mid, hi) if ok(grid.size(mid)) else (lo, mid)
    return n


def case(rng: random.Random):
    step = rng.choice([8, 16, 32, 256])
    top = step * rng.choice([64, 128, 256])
    fixed, per = rng.uniform(1e7, 3e8), rng.uniform(1e4, 1e6)
    bend = rng.choice([0.0, 0.0, rng.uniform(-0.3, 0.6)]) * per / top

    def demand(s: int) -> float:
        return fixed + per * s + bend * s * s

    budget = demand(rng.uniform(0.15, 0.9) * top)
    reached, said = rng.uniform(0.5, 0.97), rng.uniform(0.2, 1.0)

    def trial(s: int) -> Trial:
        d = demand(s)
        if d <= budget:
            return Trial(size=s, ok=True, peak=int(d), seconds=0.0, free=int(budget))
        peak = budget * reached
        return Trial(size=s, ok=False, peak=int(peak), seconds=0.0, free=int(budget),
                     requested=int((d - peak) * said))

    return trial, Grid(step, top, step), budget, demand


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    ours, theirs, shapes = [], [], {"straight": [], "bent": []}
    for _ in range(args.cases):
        trial, grid, budget, demand = case(rng)
        r = search(trial, grid, lambda b=budget: int(b), variable="bs", device="cpu",
                   measure="formula")
        sizes = [grid.size(i) for i in range(grid.count)]
        exhaustive = max((s for s in sizes if demand(s) <= budget), default=None)
        assert r.largest == exhaustive, (r.largest, exhaustive, [(t.size, t.ok) for t in r.trials])
        b = bisection(lambda s: demand(s) <= budget, grid)
        ours.append(len(r.trials))
        theirs.append(b)
        line = demand(sizes[-1]) - demand(0) - (demand(sizes[1]) - demand(0)) * sizes[-1] / sizes[1]
        shapes["straight" if abs(line) < 1 else "bent"].append(len(r.trials) - b)
    diff = [a - b for a, b in zip(ours, theirs)]
    print(f"{args.cases} generated steps, every answer equal to the exhaustive search's")
    print(f"trials: the search {statistics.mean(ours):.2f} on average (most {max(ours)}), "
          f"a bisection {statistics.mean(theirs):.2f}; ratio {statistics.mean(ours) / statistics.mean(theirs):.2f}")
    print(f"fewer than the bisection in {sum(d < 0 for d in diff)} cases, as many in "
          f"{sum(d == 0 for d in diff)}, more in {sum(d > 0 for d in diff)} (at most {max(diff)} more)")
    for name, ds in shapes.items():
        if ds:
            print(f"  {name}: {len(ds)} steps, {statistics.mean(ds):+.2f} trials against a bisection")


if __name__ == "__main__":
    main()
