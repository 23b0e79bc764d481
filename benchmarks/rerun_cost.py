"""What tracking reruns costs a cell (the flag for memory that creeps up on reruns).

One real IPython shell holding a few tensors (``--device cpu``). Per round, in turn:
cells ``x = 1`` run without the extension, with it loaded (rerun tracking and the
out-of-memory rescue follow every cell; ``watch`` off), with it loaded but the rerun
follower taken off (what the rest of the extension costs), and with ``%gpumem watch on``.
It prints the median per-cell time of each, their ratios side by side (each round's own
ratio, then the median: rounds are a fraction of a second apart), the follower's own
cost per cell measured directly, and what one run that grew costs (its attribution: one
snapshot, as ``%gpumem``).

    python benchmarks/rerun_cost.py [--cells 200] [--rounds 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.session import session_of
from jupyter_gpumem.core.rescue.reruns import host_allocated
from jupyter_gpumem.watch.reruns import attribution

SETUP = """
import torch
weights = [torch.ones(256, 256) for _ in range(8)]
records = [{'id': i, 'text': str(i)} for i in range(100000)]
"""


def per_cell(shell, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        shell.run_cell("x = 1")   # no history: its store grows with every cell
    return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    shell = InteractiveShell.instance()
    shell.run_cell(SETUP)
    times: dict[str, list[float]] = {k: [] for k in ("plain", "tracking", "untracked", "watch")}
    for _ in range(args.rounds):
        shell.run_cell("%unload_ext jupyter_gpumem")
        times["plain"].append(per_cell(shell, args.cells))
        shell.run_cell("%load_ext jupyter_gpumem\n%config GpuMemMagics.default_device = 'cpu'")
        session = session_of(shell)
        times["tracking"].append(per_cell(shell, args.cells))
        session.unfollow_cells(session.reruns)
        times["untracked"].append(per_cell(shell, args.cells))
        session.follow_cells(session.reruns)
        shell.run_cell("%gpumem watch on --device cpu")
        times["watch"].append(per_cell(shell, args.cells))
        shell.run_cell("%gpumem watch off")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:>10}: {v * 1e6:8.1f} µs per cell (median of {args.rounds} rounds "
              f"of {args.cells} cells)")

    def ratio(a: str, b: str) -> str:
        rounds = statistics.median(x / y for x, y in zip(times[a], times[b]))
        return f"{a}/{b}: {med[a] / med[b]:.3f} (median of per-round ratios {rounds:.3f})"
    for a, b in (("tracking", "plain"), ("tracking", "untracked"), ("watch", "plain"),
                 ("watch", "tracking")):
        print(ratio(a, b))

    session = session_of(shell)
    reruns = session.reruns

    class Info:
        raw_cell, cell_id = "x = 1", "bench"
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        kept = reruns.cell_began(Info)
        reruns.cell_ended(kept, None)
    print(f"the rerun follower alone: {(time.perf_counter() - start) / n * 1e6:.2f} µs per "
          "cell (a cell that did not grow: one read of the host allocator's counter)")
    start = time.perf_counter()
    for _ in range(1000):
        host_allocated()
    print(f"one read of the host allocator's counter (mallinfo2) here: "
          f"{(time.perf_counter() - start) * 1e3:.1f} µs (it walks the allocator's free lists)")
    costs = []
    for _ in range(5):
        start = time.perf_counter()
        attribution(session, reruns.levels().measured)
        costs.append(time.perf_counter() - start)
    print(f"a run that grew pays one attribution: {statistics.median(costs) * 1e3:.1f} ms "
          f"(median of 5; one snapshot of the {len(shell.user_ns)} names here, as %gpumem)")


if __name__ == "__main__":
    main()
