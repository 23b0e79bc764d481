"""How long ``%gpumem`` takes on a realistic namespace, against a gc sweep.

The namespace: a model of about 2,000 parameter tensors, its Adam state,
200 output-history entries, a 50,000-entry plain dict, and an extra heap of
about 2 million unrelated objects that no name reaches. Printed, measured
side by side in one run:

- the median time of ``%gpumem`` (target: under 50 ms);
- the median time of a ``gc.get_objects()`` sweep for tensors (the way
  pytorch_memlab finds them) and the ratio (target: at least 5x);
- the median time of ``%gpumem`` again once the unrelated heap is 10x
  larger, and the ratio (target: at most 1.5x).

Run: ``python benchmarks/scan.py [--device cpu|cuda] [--repeat 15]``.
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

HEAP: list = []          # the unrelated objects: reachable from no user name


def build_namespace(heap_scale: int = 1, device: str = "cpu") -> dict:
    """The benchmark's user namespace (a plain dict); grows the unrelated heap too."""
    import torch

    grow_heap(heap_scale)
    torch.manual_seed(0)
    model = torch.nn.ModuleList([torch.nn.Linear(32, 32) for _ in range(1000)]).to(device)
    opt = torch.optim.Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    return {
        "torch": torch,
        "model": model,
        "opt": opt,
        "cfg": {f"key{i}": i for i in range(50_000)},
        "batch": torch.ones(64, 32, device=device),
    }


def grow_heap(scale: int) -> None:
    """Make the unrelated heap about ``scale`` x 2 million objects."""
    want = 2_000_000 * scale
    while len(HEAP) * 10 < want:  # ten objects the garbage collector tracks per entry
        HEAP.append([[i] for i in range(9)])


def install(shell, heap_scale: int = 1, device: str = "cpu") -> None:
    """Put the namespace into an IPython shell, with 200 output-history entries."""
    import torch

    shell.user_ns.update(build_namespace(heap_scale, device))
    out = shell.history_manager.output_hist
    for i in range(1, 201):
        value = torch.ones(16, device=device) if i % 2 else [i, str(i)]
        out[i] = value
        shell.user_ns[f"_{i}"] = value


def gc_sweep() -> int:
    """Find every tensor by scanning the whole heap (what a gc-based tool does)."""
    import torch

    seen = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                s = obj.untyped_storage()
                seen[(obj.device, s.data_ptr())] = s.nbytes()
        except Exception:
            pass
    return sum(seen.values())


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext jupyter_gpumem")
    install(shell, 1, args.device)
    gc.collect()
    sink = io.StringIO()

    def gpumem():
        with contextlib.redirect_stdout(sink):
            shell.run_line_magic("gpumem", f"--device {args.device}")
        sink.seek(0)
        sink.truncate()

    t0 = time.perf_counter()
    gpumem()  # the first call also fills the caches (type tables, NVML, tensor storages)
    first = (time.perf_counter() - t0) * 1000
    with contextlib.redirect_stdout(sink):
        snap = shell.run_line_magic("gpumem", f"--device {args.device} -o")
    print(f"first %gpumem: {first:.1f} ms")
    print(f"objects: {len(gc.get_objects()):,} tracked by gc; holders: "
          f"{[(h.name, h.tensors) for h in snap.holders[:3]]}; partial={snap.partial}")
    ours = median_ms(gpumem, args.repeat)
    sweep = median_ms(gc_sweep, max(3, args.repeat // 3))
    grow_heap(10)
    gc.collect()
    print(f"objects after growing the heap: {len(gc.get_objects()):,}")
    ours10 = median_ms(gpumem, args.repeat)

    ok1, ok2, ok3 = ours < 50, sweep / ours >= 5, ours10 / ours <= 1.5
    print(f"%gpumem median: {ours:.1f} ms (target < 50 ms) {'PASS' if ok1 else 'FAIL'}")
    print(f"gc.get_objects() sweep median: {sweep:.1f} ms; sweep / %gpumem = {sweep / ours:.1f}x "
          f"(target >= 5x) {'PASS' if ok2 else 'FAIL'}")
    print(f"%gpumem median with a 10x heap: {ours10:.1f} ms; ratio {ours10 / ours:.2f}x "
          f"(target <= 1.5x) {'PASS' if ok3 else 'FAIL'}")
    return 0 if ok1 and ok2 and ok3 else 1


if __name__ == "__main__":
    sys.exit(main())
