"""Whether the footer's cost per cell grows with the cells a session has run.

IPython adds a name to the namespace every cell (``_iN``, the cell's text), and the
footer looks over the namespace after every cell. Two real kernels side by side, each
holding ``records`` (a list of dicts) and a few tensors, with ``%gpumem watch on``:

- ``memo``: the package as it is: the C pass over the namespace remembers where it
  found IPython's names and does not read them again;
- ``no memo``: the same package with that pass told to forget (every name read each
  cell, as before the memo).

Both run the same cells back to back, in turns of ``--batch`` cells (the machine's
pace drifts over a minute; turns this short see the same pace); after 200, 400, 800 ...
cells the script prints each kernel's median footer cost (``pre_run_cell`` +
``post_run_cell``, measured by the footer itself) over the last ``--window`` cells,
and their ratio: what reading every name again each cell costs, as the cells add up.

    python benchmarks/long_session.py [--cells 3000] [--window 200]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cell_latency import SETUP, Kernel  # noqa: E402

WATCH = "%load_ext jupyter_gpumem\n%gpumem watch on --device cpu"
FORGET = """
from jupyter_gpumem.core.scan import roots as _roots
_forgetful = _roots._items_except
_roots._items_except = lambda ns, types, memo=None, judge=None: _forgetful(ns, types)
"""
COSTS = ("list(__import__('jupyter_gpumem.watch.state', fromlist=['_'])"
         ".state_for(get_ipython()).costs)")


def costs(k: Kernel) -> list[float]:
    """The footer's own cost of each cell so far (seconds)."""
    value = k.evaluate(COSTS)
    while True:                 # the kernel's messages so far are not needed
        try:
            k.kc.get_iopub_msg(timeout=0.01)
        except Exception:  # noqa: BLE001 - queue.Empty: drained
            break
    return value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--cells", type=int, default=3000)
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--batch", type=int, default=20)
    args = ap.parse_args()
    kernels = {"memo": Kernel("memo"), "no memo": Kernel("no memo")}
    marks = []      # the cells run at each point read: window, twice that, ..., cells
    mark = args.window
    while mark < args.cells:
        marks.append(mark)
        mark *= 2
    marks.append(args.cells)
    seen: dict[int, dict[str, float]] = {}     # cells run -> kernel -> median footer cost
    try:
        for name, k in kernels.items():
            k.run(SETUP.format(n=args.records))
            if name == "no memo":
                k.run(FORGET)
            k.run(WATCH)
        done = 0
        for mark in marks:
            while done < mark:
                n = min(args.batch, mark - done)
                for k in kernels.values():    # side by side: load falls on both alike
                    k.back_to_back("x = 1", n)
                done += n
            seen[mark] = {name: statistics.median(costs(k)[-args.window:])
                          for name, k in kernels.items()}
    finally:
        for k in kernels.values():
            k.stop()
    print(f"records held: {args.records:,} · {args.cells} cells back to back · the footer's "
          f"own cost (µs), median of the last {args.window} cells at each point")
    print("cells run " + "".join(f"{mark:>8d}" for mark in marks))
    for name in kernels:
        print(f"{name:9s} " + "".join(f"{seen[m][name] * 1e6:8.0f}" for m in marks))
    print(f"{'ratio':9s} " + "".join(f"{seen[m]['no memo'] / seen[m]['memo']:8.2f}"
                                     for m in marks) + "   (no memo / memo)")

if __name__ == "__main__":
    main()
