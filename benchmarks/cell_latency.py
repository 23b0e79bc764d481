"""What the live views cost a cell, in a real kernel holding plain Python data.

Two kernels side by side, each holding ``records`` (a list of dicts, as notebooks
hold) and a few tensors: one without the extension, one with ``%gpumem watch on``,
``%gpumem panel`` and a sidebar comm open (the views refresh after every cell).
For each it prints

- the median round trip of ``x = 1`` (execute request to reply), one cell at a
  time with a pause between cells as a person leaves (``--pause``),
- the wall time of 20 such cells sent back to back (run-all), the median of
  ``--run-all-rounds`` runs that alternate between the kernels, and the median of
  each round's own ratio (its two runs are a fraction of a second apart, so it
  does not see the machine's pace drift; over some 80 rounds two identical kernels
  gave it within 0.01 of each other, where 21 rounds moved it by about 0.05),
- the kernels' CPU per run-all cell (Linux): the main thread's and all threads',

and the ratios, then what the views' refreshes after the cells cost (they run
after each cell's reply, off its path: ``Session.stats``). Round trips alternate
between the two kernels, so load on the machine falls on both alike.

``--against DIR`` adds a third kernel with the same views from another checkout of
the project (``git worktree add DIR <commit>``; build its C core or copy this one's),
run in the same rounds: its run-all ratios, and this checkout's against it round by
round, measure a change side by side.

    python benchmarks/cell_latency.py [--records 1000000] [--repeat 30] [--pause 0.5]
                                      [--against DIR]
"""
from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import jupyter_client

ROOT = Path(__file__).resolve().parent.parent

SETUP = """
import torch
records = [{{'id': i, 'text': str(i), 'tags': [i, i + 1]}} for i in range({n})]
weights = [torch.ones(256, 256) for _ in range(8)]
"""
VIEWS = """
%load_ext jupyter_gpumem
%gpumem watch on --device cpu
%gpumem panel --device cpu
"""


class Kernel:
    def __init__(self, name: str, root: Path = ROOT) -> None:
        self.name = name
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 600) -> float:
        """Execute ``code``; seconds from request to reply (errors raise)."""
        start = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=True)
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        elapsed = time.perf_counter() - start
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{self.name}: {code!r} failed: {reply['content']}")
        return elapsed

    def back_to_back(self, code: str, n: int) -> float:
        """Send ``n`` cells at once, as run-all does; seconds until the last reply."""
        start = time.perf_counter()
        ids = [self.kc.execute(code, store_history=True) for _ in range(n)]
        pending = set(ids)
        while pending:
            reply = self.kc.get_shell_msg(timeout=600)
            pending.discard(reply["parent_header"].get("msg_id"))
        return time.perf_counter() - start

    def evaluate(self, expression: str) -> object:
        """The value of a Python literal ``expression`` gives in the kernel, read through
        the reply's ``user_expressions`` (no output message to look for)."""
        msg_id = self.kc.execute("", user_expressions={"value": expression})
        while True:
            reply = self.kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        value = reply["content"]["user_expressions"]["value"]
        if value.get("status") != "ok":
            raise RuntimeError(f"{self.name}: {value}")
        return ast.literal_eval(value["data"]["text/plain"])

    def stats(self) -> dict:
        """The session's refresh figures (``Session.stats``)."""
        return self.evaluate("dict(__import__('jupyter_gpumem.session', fromlist=['_'])"
                             ".session_of(get_ipython()).stats)")

    def open_views(self) -> None:
        """``VIEWS`` (watch on, the panel) and a sidebar's comm: the views measured."""
        self.run(VIEWS)
        self.open_sidebar()

    def open_sidebar(self) -> None:
        """Open a comm on the sidebar's target, as the JupyterLab sidebar does."""
        msg = self.kc.session.msg("comm_open", {"comm_id": uuid.uuid4().hex,
                                                "target_name": "jupyter_gpumem", "data": {}})
        self.kc.shell_channel.send(msg)

    def cpu_seconds(self) -> tuple[float, float] | None:
        """(main thread, all threads) CPU seconds the kernel has used, from /proc (Linux;
        None elsewhere)."""
        try:
            pid = self.km.provisioner.process.pid
            tick = os.sysconf("SC_CLK_TCK")
            main = whole = 0.0
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick
                whole += seconds
                if tid == str(pid):
                    main = seconds
            return main, whole
        except (OSError, AttributeError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--pause", type=float, default=0.5)
    ap.add_argument("--run-all", type=int, default=20)
    ap.add_argument("--run-all-rounds", type=int, default=81,
                    help="run-all measurements per kernel (the median is printed)")
    ap.add_argument("--run-all-pause", type=float, default=0.3,
                    help="seconds between two run-all measurements (the views' refresh "
                         "after a run, about 0.1 s with 1M records, fits in it)")
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout of the project: a third kernel with the same "
                         "views on its code, in the same run-all rounds")
    args = ap.parse_args()
    plain, views = Kernel("plain"), Kernel("views")
    other = Kernel("against", args.against.resolve()) if args.against else None
    kernels = [plain, views] + ([other] if other else [])
    try:
        for k in kernels:
            k.run(SETUP.format(n=args.records))
        for k in kernels[1:]:
            k.open_views()
        time.sleep(max(args.pause, 1.0))
        for k in kernels:      # warm up
            k.run("x = 1")
        time.sleep(args.pause)
        trips: dict[str, list[float]] = {"plain": [], "views": []}
        for _ in range(args.repeat):
            for k in (plain, views):
                trips[k.name].append(k.run("x = 1"))
                time.sleep(args.pause)
        runs: dict[str, list[float]] = {k.name: [] for k in kernels}
        cpu: dict[str, list[float]] = {k.name: [0.0, 0.0] for k in kernels}
        for i in range(args.run_all_rounds):   # the order turning each round
            for k in kernels[i % len(kernels):] + kernels[:i % len(kernels)]:
                time.sleep(args.run_all_pause)
                before = k.cpu_seconds()
                runs[k.name].append(k.back_to_back("x = 1", args.run_all))
                after = k.cpu_seconds()
                if before is not None and after is not None:
                    cpu[k.name][0] += after[0] - before[0]
                    cpu[k.name][1] += after[1] - before[1]
        run_all = {name: statistics.median(v) for name, v in runs.items()}
        # each round's two runs are seconds apart: their ratio does not see the machine
        # drift over minutes (on a shared machine the pace of one core moves by 30 %)
        paired = [v / p for v, p in zip(runs["views"], runs["plain"])]
        refresh = views.stats()
    finally:
        for k in kernels:
            k.stop()
    med = {name: statistics.median(v) * 1e3 for name, v in trips.items()}
    print(f"records held: {args.records:,} · pause between cells {args.pause:g} s · "
          f"{args.repeat} round trips each, alternating")
    print(f"x = 1 round trip, median: without the extension {med['plain']:.1f} ms · "
          f"with watch on + panel + sidebar {med['views']:.1f} ms · "
          f"difference {med['views'] - med['plain']:+.1f} ms (target within 10 ms)")
    ratio = run_all["views"] / run_all["plain"]
    print(f"{args.run_all} cells back to back, median of {args.run_all_rounds}: without "
          f"{run_all['plain'] * 1e3:.0f} ms · with {run_all['views'] * 1e3:.0f} ms · "
          f"ratio {ratio:.2f}x; median of the rounds' own ratios "
          f"{statistics.median(paired):.2f}x (quartiles {_quartiles(paired)}) "
          f"(target at most 1.2x)")
    if other is not None:
        theirs = [a / p for a, p in zip(runs["against"], runs["plain"])]
        ours = [v / a for v, a in zip(runs["views"], runs["against"])]
        print(f"the same views from {args.against}: run-all {statistics.median(runs['against']) * 1e3:.0f} ms, "
              f"median of the rounds' own ratios {statistics.median(theirs):.2f}x against the plain "
              f"kernel; this checkout against it, round by round: {statistics.median(ours):.3f}x")
    cells = args.run_all * args.run_all_rounds
    if cpu["plain"][1]:
        main, whole = ({n: v[j] / cells * 1e3 for n, v in cpu.items()} for j in (0, 1))
        print(f"kernel CPU per run-all cell: main thread {main['plain']:.2f} -> "
              f"{main['views']:.2f} ms, all threads {whole['plain']:.2f} -> "
              f"{whole['views']:.2f} ms (x{whole['views'] / whole['plain']:.2f})")
    if refresh["refreshes"]:
        print(f"the views' refreshes after cells: {refresh['refreshes']}, "
              f"{refresh['seconds'] / refresh['refreshes'] * 1e3:.0f} ms each on average "
              f"(off the cells' path), {refresh['dropped']} dropped for a newer cell")
    sys.stdout.flush()


def _quartiles(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    q = statistics.quantiles(values, n=4)
    return f"{q[0]:.2f}-{q[2]:.2f}"


if __name__ == "__main__":
    main()
