"""Where a cell's extra work goes, counted exactly: the interpreter's opcodes on a kernel's
main thread per run-all cell, in a plain kernel and in one with the views on.

Times on a shared 2-core machine move by several percent from one minute to the next;
opcode counts do not (the same code, data and cells give the same counts), so a change
to the per-cell path can be judged here before ``cell_latency.py`` times it. Each kernel
holds ``records`` and a few tensors as ``cell_latency.py``'s do; the views kernel has
``%gpumem watch on``, ``%gpumem panel`` and a sidebar comm open. After a warm-up, a
tracer (``sys.settrace`` with ``f_trace_opcodes``, the main thread only) counts the
opcodes of ``--cells`` cells of ``x = 1`` sent back to back in runs of 20. It prints,
per kernel, the opcodes per cell; for the views kernel, the extension's own per cell, by
module and its busiest functions. Code run from the loop between cells (the views'
refresh after a run, off the cells' path) counts too, spread over the cells.

    python benchmarks/cell_opcodes.py [--records 100000] [--cells 100] [--top 25]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cell_latency import SETUP, Kernel  # noqa: E402

# the tracer keeps its counts on ``sys``, not in the user's namespace (where the footer would
# see a name that grows every cell and rescan it)
TRACER = r'''
def _gm_start():
    import collections, sys
    counts, on = collections.Counter(), [True]

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = (code.co_filename, getattr(code, "co_qualname", code.co_name))

        def local(frame, event, arg):
            if event == "opcode" and on[0]:
                counts[key] += 1
            return local
        return local
    sys._jupyter_gpumem_opcodes = (counts, on)
    sys.settrace(trace)
_gm_start(); del _gm_start
'''
DUMP = r'''
__import__("sys").settrace(None); __import__("sys")._jupyter_gpumem_opcodes[1][0] = False
__import__("json").dump([[f, q, n] for (f, q), n in __import__("sys")._jupyter_gpumem_opcodes[0].items()], open({path!r}, "w"))
'''
PACKAGE = "jupyter_gpumem"


def count(name: str, records: int, cells: int) -> list[tuple[str, str, int]]:
    """(file, function, opcodes) over ``cells`` run-all cells of one kernel."""
    kernel = Kernel(name)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        kernel.run(SETUP.format(n=records))
        if name == "views":
            kernel.open_views()
        time.sleep(1.5)
        for _ in range(5):          # warm up: the caches, the tracker, the first refreshes
            kernel.back_to_back("x = 1", 20)
            time.sleep(0.3)
        kernel.run(TRACER)
        for _ in range(max(cells // 20, 1)):
            kernel.back_to_back("x = 1", 20)
            time.sleep(0.3)
        kernel.run(DUMP.format(path=path))
        with open(path) as f:
            return [tuple(row) for row in json.load(f)]
    finally:
        kernel.stop()
        os.unlink(path)


def ours(filename: str) -> bool:
    """Code of the extension: its modules, and the ``__init__`` its dataclasses compile."""
    return f"{os.sep}{PACKAGE}{os.sep}" in filename or filename == "<string>"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--cells", type=int, default=100, help="traced cells (runs of 20)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    cells = max(args.cells // 20, 1) * 20
    plain = count("plain", args.records, cells)
    views = count("views", args.records, cells)
    total = {k: sum(n for *_, n in rows) / cells for k, rows in (("plain", plain), ("views", views))}
    own = [(f, q, n) for f, q, n in views if ours(f)]
    own_total = sum(n for *_, n in own) / cells
    print(f"records held: {args.records:,} · {cells} cells of x = 1 back to back, traced "
          f"(the traced cells' own two and the loop between runs included)")
    print(f"opcodes per cell on the main thread: plain kernel {total['plain']:,.0f} · "
          f"with watch on + panel + sidebar {total['views']:,.0f} "
          f"({total['views'] / total['plain']:.3f}x) · the extension's own {own_total:,.0f}")
    modules = Counter()
    for f, _, n in own:
        modules[f.split(PACKAGE + os.sep, 1)[-1]] += n
    print("the extension's, by module: " + ", ".join(
        f"{m} {n / cells:,.0f}" for m, n in modules.most_common()))
    print(f"its {args.top} busiest functions (opcodes per cell):")
    for f, q, n in sorted(own, key=lambda r: -r[2])[:args.top]:
        print(f"  {n / cells:7,.0f}  {Path(f).name}:{q}")


if __name__ == "__main__":
    main()
