"""What watching costs: %%gpuwatch and `%gpumem watch on` against a plain cell.

1. A CPU-bound cell of about 2 s runs plain, under ``%%gpuwatch`` and with
   ``%gpumem watch on``, alternating (the order turns each round), in one
   process. Target: the median over rounds of each round's wall-time ratio to
   its plain run is at most 1.02 for both. Process CPU time (all threads,
   the sampler's included) is printed too: on a shared machine it is the
   steadier figure.
2. The per-cell footer's own cost (before + after the cell, as the footer
   measures it) on the namespace of ``benchmarks/scan.py`` (its
   ``install``/``build_namespace``), over a run of small cells. Target:
   median under 10 ms.

Run: ``python benchmarks/watch_overhead.py [--rounds 7] [--cell-seconds 2]``.
It prints the figures; ``--check`` makes it exit 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SMALL_CELLS = [
    "pass",
    "a = 1",
    "y = batch + 1",
    "z = [batch, y]",
    "del y",
    "cfg['extra'] = 1",
    "w = torch.ones(256, 32)",
    "del w, z",
]


def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance(colors="nocolor")
    ip.run_cell("%load_ext jupyter_gpumem", store_history=False)
    return ip


CPU_TIMES: list[float] = []   # process CPU seconds of each quiet_run (all threads)


def quiet_run(ip, code: str) -> float:
    """Wall seconds of one stored cell, its output discarded; fails loudly on an error."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = ip.run_cell(code, store_history=True)
        elapsed = time.perf_counter() - t0
        CPU_TIMES.append(time.process_time() - c0)
    if not result.success:
        raise RuntimeError(f"benchmark cell failed: {code!r}\n{sink.getvalue()[-2000:]}")
    return elapsed


def calibrate(ip, seconds: float) -> str:
    """A pure-Python CPU-bound cell that takes about ``seconds``."""
    n = 200_000
    while True:
        t = quiet_run(ip, f"_r = sum(i * i for i in range({n}))")
        if t > 0.5:
            break
        n *= 2
    t = min(t, quiet_run(ip, f"_r = sum(i * i for i in range({n}))"))  # the less disturbed
    n = int(n * seconds / t)
    return f"_r = sum(i * i for i in range({n}))"


def overhead(ip, rounds: int, seconds: float) -> dict:
    cell = calibrate(ip, seconds)
    times: dict[str, list[float]] = {"plain": [], "%%gpuwatch": [], "watch on": []}
    cpu: dict[str, list[float]] = {k: [] for k in times}

    def timed(mode: str, code: str) -> None:
        times[mode].append(quiet_run(ip, code))
        cpu[mode].append(CPU_TIMES[-1])

    def watched_on() -> None:
        quiet_run(ip, "%gpumem watch on")
        timed("watch on", cell)
        quiet_run(ip, "%gpumem watch off")

    steps = [lambda: timed("plain", cell), lambda: timed("%%gpuwatch", "%%gpuwatch\n" + cell),
             watched_on]
    for i in range(rounds):          # the order turns each round: no mode always runs first
        for k in range(3):
            steps[(i + k) % 3]()
    plain = statistics.median(times["plain"])

    def paired(mode: str) -> float:  # each round's ratio to its own plain run, then the median
        return statistics.median(m / p for m, p in zip(times[mode], times["plain"]))

    return {"cell": cell, "plain_s": plain, "times": times, "cpu": cpu,
            "ratio_gpuwatch": paired("%%gpuwatch"), "ratio_watch_on": paired("watch on")}


def load_scan_benchmark():
    """benchmarks/scan.py, loaded by path (its name would clash with jupyter_gpumem.scan)."""
    path = os.path.join(HERE, "scan.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("bench_scan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in_namespace() -> dict:
    """Used only while benchmarks/scan.py does not exist."""
    import torch

    model = torch.nn.ModuleList([torch.nn.Linear(32, 32) for _ in range(1000)])
    return {"torch": torch, "model": model, "opt": torch.optim.Adam(model.parameters()),
            "cfg": {f"key{i}": i for i in range(50_000)}, "batch": torch.ones(64, 32)}


def footer_cost(ip, cells: int) -> dict:
    watch = importlib.import_module("jupyter_gpumem.watch.scope")
    bench = load_scan_benchmark()
    if bench is not None and hasattr(bench, "install"):
        bench.install(ip)
        source = "benchmarks/scan.py install() (build_namespace + 200 Out entries)"
    elif bench is not None:
        ip.user_ns.update(bench.build_namespace(heap_scale=1))
        source = "benchmarks/scan.py build_namespace()"
    else:
        ip.user_ns.update(stand_in_namespace())
        source = "stand-in namespace (benchmarks/scan.py missing)"
    t0 = time.perf_counter()
    quiet_run(ip, "%gpumem watch on")
    seed = time.perf_counter() - t0
    state = importlib.import_module("jupyter_gpumem.watch.state").state_for(ip)
    before = len(state.costs)
    for i in range(cells):
        quiet_run(ip, SMALL_CELLS[i % len(SMALL_CELLS)])
    costs = list(state.costs)[before:]
    modes = [r.holders_mode for r in watch.history_for(ip)[-cells:]]
    quiet_run(ip, "%gpumem watch off")
    costs_ms = sorted(c * 1000 for c in costs)
    return {"source": source, "cells": len(costs_ms), "seed_s": seed,
            "full_scan_s": state.tracker.full_cost,
            "median_ms": statistics.median(costs_ms),
            "p90_ms": costs_ms[int(0.9 * (len(costs_ms) - 1))], "max_ms": costs_ms[-1],
            "modes": {m: modes.count(m) for m in set(modes)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--cell-seconds", type=float, default=2.0)
    p.add_argument("--footer-cells", type=int, default=40)
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    ip = shell()
    quiet_run(ip, "import torch")
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    o = overhead(ip, args.rounds, args.cell_seconds)
    ok1 = o["ratio_gpuwatch"] <= 1.02 and o["ratio_watch_on"] <= 1.02
    print(f"CPU-bound cell, {args.rounds} alternating rounds, plain median {o['plain_s']:.3f} s")
    cpu_plain = statistics.median(o["cpu"]["plain"])
    for mode, ts in o["times"].items():
        cpu = statistics.median(o["cpu"][mode])
        print(f"  {mode:11s} median {statistics.median(ts):.3f} s  "
              f"(min {min(ts):.3f}, max {max(ts):.3f}); process CPU time (all threads) "
              f"median {cpu:.3f} s, {cpu / cpu_plain:.4f} x plain")
    print(f"  median of per-round ratios: %%gpuwatch / plain {o['ratio_gpuwatch']:.4f}, "
          f"watch on / plain {o['ratio_watch_on']:.4f}   (target <= 1.02: "
          f"{'met' if ok1 else 'MISSED'})")
    f = footer_cost(ip, args.footer_cells)
    ok2 = f["median_ms"] < 10
    full = f"{f['full_scan_s'] * 1000:.1f} ms" if f["full_scan_s"] is not None else "n/a"
    print(f"footer on {f['source']}: {f['cells']} cells, median {f['median_ms']:.2f} ms, "
          f"p90 {f['p90_ms']:.2f} ms, max {f['max_ms']:.2f} ms (target median < 10 ms: "
          f"{'met' if ok2 else 'MISSED'})")
    print(f"  holder scans per cell: {f['modes']}; one full scan of this namespace: {full}; "
          f"`%gpumem watch on` (seeds the holders) took {f['seed_s'] * 1000:.0f} ms")
    return 0 if (ok1 and ok2) or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
