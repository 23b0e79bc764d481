"""``%gpumem`` with the package's C core and without it, side by side in one process.

Without a compiler at install (or with the source tree on ``PYTHONPATH``) the scan
runs in Python: the same walk, the same answers, more slowly. This measures both
forms on the same namespaces, the two alternating call by call after a warm-up
each, and checks that each gives the same holders (bytes, sharing, largest path).
The Python form is what ``JUPYTER_GPUMEM_PURE_SCAN=1`` gives a whole process; here
it is switched per call (every use of the C core: the walk, its batch loop over a
model's tensors and the pass over the namespace).

Run: ``python benchmarks/scan_forms.py [--device cpu] [--repeat 9]``, or
``python benchmarks/scan.py --forms`` (the same, after scan.py's own scenarios).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))


@contextlib.contextmanager
def python_form():
    """Every use of the C core takes its Python form while inside."""
    from jupyter_gpumem.core.scan import roots, reach as scan_reach

    saved = scan_reach.NATIVE, scan_reach.TAKE_BATCH, roots._items_except
    scan_reach.NATIVE = scan_reach.TAKE_BATCH = None
    roots._items_except = roots._items_except_py
    try:
        yield
    finally:
        scan_reach.NATIVE, scan_reach.TAKE_BATCH, roots._items_except = saved


def _rows(snap) -> list:
    return sorted((h.name, h.unique, h.shared, h.largest_path, h.tensors) for h in snap.holders)


def compare(shell, device: str, repeat: int) -> tuple[float, float, bool]:
    """Median ms of ``%gpumem`` in each form on the shell's namespace, and whether the
    two gave the same holders."""
    sink = io.StringIO()

    def snap():
        with contextlib.redirect_stdout(sink):
            out = shell.run_line_magic("gpumem", f"--device {device} -o")
        sink.seek(0)
        sink.truncate()
        return out

    native = _rows(snap())                # warm-ups, and the answers of each form
    with python_form():
        python = _rows(snap())
    times: dict[str, list[float]] = {"c": [], "py": []}
    for _ in range(repeat):
        for form in ("c", "py"):
            with python_form() if form == "py" else contextlib.nullcontext():
                t0 = time.perf_counter()
                snap()
                times[form].append((time.perf_counter() - t0) * 1000)
    return statistics.median(times["c"]), statistics.median(times["py"]), native == python


def run_all(shell, device: str = "cpu", repeat: int = 9) -> bool:
    """Each scenario of benchmarks/scan.py (the model without its extra heap) in both forms."""
    import scan as bench
    from jupyter_gpumem.core.scan import reach as scan_reach

    if scan_reach.NATIVE is None:
        print("== forms: the C core is not loaded here (not built, or JUPYTER_GPUMEM_PURE_SCAN=1):"
              " nothing to compare")
        return False
    print("== the same %gpumem with the C core and in Python (alternating, one process)")
    ok = True
    scenarios = [(title, *bench.PLAIN[title]) for title in bench.PLAIN] + \
        [("model (2,000 parameters, Adam, 200 outputs, a 50k dict)", None, None)]
    for title, name, build in scenarios:
        if build is None:
            bench.install(shell, 0, device)
        else:
            shell.user_ns.update(bench.small_tensors(device))
            shell.user_ns[name] = build()
        gc.collect()
        reps = repeat if "1M" not in title and "2M" not in title else max(3, repeat // 3)
        c_ms, py_ms, same = compare(shell, device, reps)
        ok &= same
        print(f"{title}: C core {c_ms:.1f} ms, Python {py_ms:.1f} ms, "
              f"Python / C = {py_ms / c_ms:.1f}x; same holders: {'yes' if same else 'NO'}")
        bench.uninstall(shell)
        for key in ("torch", "net", "net_opt", "x", name):
            shell.user_ns.pop(key, None)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext jupyter_gpumem")
    return 0 if run_all(shell, args.device, args.repeat) else 1


if __name__ == "__main__":
    sys.exit(main())
