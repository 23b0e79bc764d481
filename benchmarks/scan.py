"""How long ``%gpumem`` takes on realistic namespaces, against a gc sweep.

Every figure is measured side by side in one run, in one process.

The tensor scenario (``model``): a model of about 2,000 parameter tensors,
its Adam state, 200 output-history entries, a 50,000-entry plain dict, and an
extra heap of about 2 million unrelated objects that no name reaches. Targets:
``%gpumem`` under 50 ms median, at least 5x faster than a ``gc.get_objects()``
sweep for tensors (the way pytorch_memlab finds them), and at most 1.5x slower
once the unrelated heap is 10x larger.

The plain-data scenarios hold ordinary Python data beside a few tensors (a
small model with its Adam state and a batch): 100,000 and 1,000,000 records
``{'id': i, 'text': str(i), 'tags': [i, i + 1]}``, a 50,000-entry dict of
tuples that hold lists, a 2,000,000-element list of short strings. For each,
printed: the median ``%gpumem`` time, the objects the names reach (every
distinct object, atoms included, counted once by a reference walk outside the
timing; gc-tracked ones in brackets), the cost per reached object beside the
sweep's cost per heap object (``gc.get_objects()``), and whether the report
was partial at the default 3 s limit. Targets: 100k records under 60 ms and
at most 2x the sweep's cost per object; 1M records under 600 ms, never partial.

The training-state scenario (``training``): 150 ``TransformerEncoderLayer(64, 4, 128)``
in a ``Sequential``, Adam after one step, a list of 2,000 small tensors, a 50,000-entry
dict of ``(int, str, [int])`` tuples, 200 tensors in ``Out``. Printed side by side in one
process: the first (cold) ``%gpumem``; the warm one (nothing changed, median); after a
cell that runs one optimizer step in place; after a cell that replaces one name (the
2,000-tensor list) beside that name's own walk alone (its new tensors walked alone
after the same cell: the cost a first look at them has, whatever else is held); ``%gpumem --full`` (every name
walked, as before the warm scan); and, with 2 million unrelated heap objects beside it,
the warm call against a ``gc.get_objects()`` sweep (every scenario runs beside that heap). Targets: warm under 10 ms, after the
step under 20 ms, after the replacement under 20 ms plus the name's own cost, the sweep
at least 10x the warm call.

With ``--forms`` it also runs each scenario with the C core and in Python, side by
side (``benchmarks/scan_forms.py``). With ``--against DIR`` (another checkout of the
project, its C core built) it runs these scenarios in child processes, alternately on
this checkout's package and on DIR's (``--rounds`` rounds, the order swapped each
round), and prints each scenario's median ``%gpumem`` on both and their ratio.

Run: ``python benchmarks/scan.py [--device cpu|cuda] [--repeat 15] [--only NAME ...] [--forms]
[--against DIR [--rounds 3]]``.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

#: the checkout whose package is measured: this one, or the one --against names
PACKAGE_ROOT = os.environ.get("GPUMEM_BENCH_PACKAGE_ROOT") or str(Path(__file__).resolve().parents[1])
sys.path.insert(0, PACKAGE_ROOT)
sys.path.insert(0, str(Path(__file__).resolve().parent))

HEAP: list = []          # the unrelated objects: reachable from no user name
MEDIANS: dict = {}       # scenario -> median ms of %gpumem (printed with --json)


def build_namespace(heap_scale: int = 1, device: str = "cpu") -> dict:
    """The tensor scenario's user namespace (a plain dict); grows the unrelated heap too."""
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


def small_tensors(device: str = "cpu") -> dict:
    """The few tensors the plain-data scenarios hold beside their data."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).to(device)
    opt = torch.optim.Adam(net.parameters())
    net(torch.ones(4, 64, device=device)).sum().backward()
    opt.step()
    return {"torch": torch, "net": net, "net_opt": opt, "x": torch.ones(256, 64, device=device)}


#: the plain-data scenarios: name -> (variable, how to build it)
PLAIN = {
    "records 100k": ("records", lambda: [{'id': i, 'text': str(i), 'tags': [i, i + 1]}
                                         for i in range(100_000)]),
    "records 1M": ("records", lambda: [{'id': i, 'text': str(i), 'tags': [i, i + 1]}
                                       for i in range(1_000_000)]),
    "dict of tuples 50k": ("table", lambda: {i: (str(i), [i, i + 1]) for i in range(50_000)}),
    "strings 2M": ("tokens", lambda: [str(i % 10_000) for i in range(2_000_000)]),
}


def grow_heap(scale: int) -> None:
    """Make the unrelated heap about ``scale`` x 2 million objects."""
    want = 2_000_000 * scale
    while len(HEAP) * 10 < want:  # ten objects the garbage collector tracks per entry
        HEAP.append([[i] for i in range(9)])


def install(shell, heap_scale: int = 1, device: str = "cpu") -> None:
    """Put the tensor scenario into an IPython shell, with 200 output-history entries."""
    import torch

    shell.user_ns.update(build_namespace(heap_scale, device))
    out = shell.history_manager.output_hist
    for i in range(1, 201):
        value = torch.ones(16, device=device) if i % 2 else [i, str(i)]
        out[i] = value
        shell.user_ns[f"_{i}"] = value


def uninstall(shell) -> None:
    """Take the tensor scenario out of the shell again."""
    for name in ("model", "opt", "cfg", "batch"):
        shell.user_ns.pop(name, None)
    for i in range(1, 201):
        shell.history_manager.output_hist.pop(i, None)
        shell.user_ns.pop(f"_{i}", None)


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


def reached(values: list) -> tuple[int, int]:
    """Distinct objects reachable from ``values`` (all, gc-tracked), the reference count
    of the per-object figures: what ``gc.get_referents`` links, without entering
    modules, classes, functions or code (the scan does not read a library's insides)."""
    seen: dict[int, object] = {}
    todo = list(values)
    stop = (types.ModuleType, type, types.FunctionType, types.CodeType, types.BuiltinFunctionType)
    tracked = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        tracked += gc.is_tracked(obj)
        if isinstance(obj, stop):
            continue
        todo.extend(gc.get_referents(obj))
    return len(seen), tracked


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _tensor_scenario(shell, gpumem, snap_of, args) -> bool:
    install(shell, 1, args.device)
    gc.collect()
    t0 = time.perf_counter()
    gpumem()  # the first call also fills the caches (type tables, NVML, tensor storages)
    first = (time.perf_counter() - t0) * 1000
    MEDIANS["model first"] = first
    snap = snap_of()
    print(f"== model (2,000 parameters, Adam, 200 outputs, a 50k dict of atoms)\n"
          f"first %gpumem: {first:.1f} ms")
    print(f"objects: {len(gc.get_objects()):,} tracked by gc; holders: "
          f"{[(h.name, h.tensors) for h in snap.holders[:3]]}; partial={snap.partial}")
    ours = median_ms(gpumem, args.repeat)
    sweep = median_ms(gc_sweep, max(3, args.repeat // 3))
    grow_heap(10)
    gc.collect()
    print(f"objects after growing the heap: {len(gc.get_objects()):,}")
    ours10 = median_ms(gpumem, args.repeat)
    MEDIANS.update({"model": ours, "model, 10x heap": ours10})
    uninstall(shell)
    ok1, ok2, ok3 = ours < 50, sweep / ours >= 5, ours10 / ours <= 1.5
    print(f"%gpumem median: {ours:.1f} ms (target < 50 ms) {'PASS' if ok1 else 'FAIL'}")
    print(f"gc.get_objects() sweep median: {sweep:.1f} ms; sweep / %gpumem = {sweep / ours:.1f}x "
          f"(target >= 5x) {'PASS' if ok2 else 'FAIL'}")
    print(f"%gpumem median with a 10x heap: {ours10:.1f} ms; ratio {ours10 / ours:.2f}x "
          f"(target <= 1.5x) {'PASS' if ok3 else 'FAIL'}")
    return ok1 and ok2 and ok3


def training_namespace(device: str = "cpu") -> dict:
    """The training-state scenario's names (see the module docstring)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(64, 4, 128)
                                  for _ in range(150)]).to(device)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 2, 64, device=device)).sum().backward()
    opt.step()
    return {"torch": torch, "model": model, "opt": opt,
            "batches": [torch.randn(4, 4, device=device) for _ in range(2000)],
            "table": {i: (i, str(i), [i]) for i in range(50_000)}}


def _training_scenario(shell, gpumem, args) -> bool:
    import torch

    from jupyter_gpumem.session import session_of

    names = training_namespace(args.device)
    shell.user_ns.update(names)
    out = shell.history_manager.output_hist
    for i in range(1, 201):
        out[i] = shell.user_ns[f"_{i}"] = torch.ones(16, device=args.device)
    gc.collect()
    # (a checkout from before the warm scan, run with --against, has no WarmScan)
    warm_state = getattr(session_of(shell), "warm", None)
    t0 = time.perf_counter()
    gpumem()
    cold = (time.perf_counter() - t0) * 1000
    warm = median_ms(gpumem, args.repeat)
    reused = (warm_state.reused, warm_state.walked) if warm_state is not None else ("-", "-")

    def after(cell: str) -> float:
        times = []
        for _ in range(max(5, args.repeat // 3)):
            shell.run_cell(cell, store_history=False)
            t = time.perf_counter()
            gpumem()
            times.append((time.perf_counter() - t) * 1000)
        return statistics.median(times)

    replace = "batches = [torch.randn(4, 4) for _ in range(2000)]"
    step = after("opt.step()")
    replaced = after(replace)

    def own_walk() -> float:
        # the replaced name's own cost: its new tensors walked alone, as new as the
        # replacement's are (the tensors of a list walked before are known already)
        shell.run_cell(replace, store_history=False)
        t = time.perf_counter()
        _scan_one(shell, "batches", args.device)
        return (time.perf_counter() - t) * 1000

    own = statistics.median(own_walk() for _ in range(max(5, args.repeat // 3)))
    own_known = median_ms(lambda: _scan_one(shell, "batches", args.device), args.repeat)
    full = median_ms(lambda: gpumem("--full" if warm_state is not None else ""),
                     max(5, args.repeat // 3))
    warm_heap = median_ms(gpumem, args.repeat)   # the unrelated heap (grow_heap) is beside it
    sweep = median_ms(gc_sweep, 3)
    MEDIANS.update({"training first": cold, "training warm": warm,
                    "training after a step": step, "training after a replacement": replaced})
    for name in ("model", "opt", "batches", "table"):
        shell.user_ns.pop(name, None)
    for i in range(1, 201):
        out.pop(i, None)
        shell.user_ns.pop(f"_{i}", None)
    checks = [("warm < 10 ms", warm < 10), ("after a step < 20 ms", step < 20),
              ("after a replacement < 20 ms + its own", replaced < 20 + own),
              ("sweep >= 10x warm", sweep >= 10 * warm_heap)]
    print(f"== training state (150 encoder layers, Adam, 2,000 tensors, a 50k dict, 200 Out)\n"
          f"first %gpumem {cold:.1f} ms; warm {warm:.1f} ms (names reused {reused[0]}, walked "
          f"{reused[1]}); --full {full:.1f} ms; full / warm {full / warm:.1f}x\n"
          f"after a cell running opt.step(): {step:.1f} ms; after a cell replacing `batches`: "
          f"{replaced:.1f} ms (its own walk {own:.1f} ms; walked again once known {own_known:.1f} ms)\n"
          f"with {len(gc.get_objects()):,} heap objects: warm {warm_heap:.1f} ms, sweep "
          f"{sweep:.1f} ms = {sweep / warm_heap:.1f}x\n   "
          + "; ".join(f"{text} {'PASS' if ok else 'FAIL'}" for text, ok in checks))
    return all(ok for _, ok in checks)


def _scan_one(shell, name: str, device: str) -> None:
    """One name walked alone, as a full scan walks it (the replaced name's own cost)."""
    from jupyter_gpumem.core import scan as _scan
    Root = getattr(_scan, "Root", None)
    if Root is None:        # a checkout from before core/scan/ (--against)
        from jupyter_gpumem.core.roots import Root

    _scan.scan([Root(name, shell.user_ns[name])], devices=None, shell=shell)


def _plain_scenario(shell, gpumem, snap_of, args, title: str) -> bool:
    name, build = PLAIN[title]
    base = small_tensors(args.device)
    shell.user_ns.update(base)
    shell.user_ns[name] = build()
    gc.collect()
    t0 = time.perf_counter()
    gpumem()   # fills the caches (cold: nothing of these names was walked before)
    MEDIANS[f"{title} first"] = (time.perf_counter() - t0) * 1000
    snap = snap_of()
    repeat = args.repeat if "1M" not in title and "2M" not in title else max(3, args.repeat // 3)
    ours = median_ms(gpumem, repeat)
    MEDIANS[title] = ours
    sweep = median_ms(gc_sweep, max(3, args.repeat // 5))
    heap = len(gc.get_objects())
    values = [v for k, v in base.items() if k != "torch"] + [shell.user_ns[name]]
    n_all, n_tracked = reached(values)
    per_ours = ours * 1e6 / n_all
    per_sweep = sweep * 1e6 / heap
    del shell.user_ns[name]
    for k in base:
        shell.user_ns.pop(k, None)
    checks = []
    if title == "records 100k":
        checks = [("< 60 ms", ours < 60), ("<= 2x sweep per object", per_ours <= 2 * per_sweep)]
    elif title == "records 1M":
        checks = [("< 600 ms", ours < 600), ("not partial", not snap.partial)]
    verdict = "; ".join(f"{text} {'PASS' if ok else 'FAIL'}" for text, ok in checks)
    print(f"== {title}: `{name}` beside a few tensors\n"
          f"%gpumem median {ours:.1f} ms; reached {n_all:,} objects ({n_tracked:,} gc-tracked); "
          f"{per_ours:.0f} ns per reached object ({ours * 1e6 / n_tracked:.0f} per tracked one); "
          f"sweep {sweep:.1f} ms over {heap:,} heap objects = {per_sweep:.0f} ns each; "
          f"ratio {per_ours / per_sweep:.2f}x; partial={snap.partial}"
          + (f"\n   {verdict}" if verdict else ""))
    return all(ok for _, ok in checks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--only", nargs="*", default=None,
                    help="scenarios to run: model and/or the plain-data titles' first word "
                         "with their size (records-100k, records-1M, dict, strings)")
    ap.add_argument("--forms", action="store_true",
                    help="then each scenario with the C core and in Python, side by side "
                         "(benchmarks/scan_forms.py)")
    ap.add_argument("--against", default=None,
                    help="another checkout: the scenarios on its package and on this one, "
                         "alternately in child processes, side by side")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --against")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.against:
        return against(args)

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext jupyter_gpumem")
    grow_heap(1)
    sink = io.StringIO()

    def gpumem(extra: str = ""):
        with contextlib.redirect_stdout(sink):
            shell.run_line_magic("gpumem", f"--device {args.device} {extra}")
        sink.seek(0)
        sink.truncate()

    def snap_of():
        with contextlib.redirect_stdout(sink):
            return shell.run_line_magic("gpumem", f"--device {args.device} -o")

    def wanted(title: str) -> bool:
        if not args.only:
            return True
        key = title.replace(" ", "-").lower()
        return any(key.startswith(o.lower()) for o in args.only)

    ok = True
    for title in PLAIN:
        if wanted(title):
            ok &= _plain_scenario(shell, gpumem, snap_of, args, title)
    if wanted("training"):   # before the model: that one grows the unrelated heap tenfold
        ok &= _training_scenario(shell, gpumem, args)
    if args.forms:       # before the model: that one grows the unrelated heap tenfold
        import scan_forms

        ok &= scan_forms.run_all(shell, args.device, max(3, args.repeat // 2))
    if wanted("model"):   # last: it grows the unrelated heap tenfold
        ok &= _tensor_scenario(shell, gpumem, snap_of, args)
    if args.json:
        print("RESULT " + json.dumps(MEDIANS), flush=True)
    return 0 if ok else 1


def against(args) -> int:
    """This checkout's package and ``args.against``'s, the same scenarios (this file's)
    in a fresh child process each, alternately; each scenario's median of the rounds."""
    here = str(Path(__file__).resolve().parents[1])
    there = str(Path(args.against).resolve())
    runs: dict[str, list[dict]] = {here: [], there: []}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--device", args.device,
           "--repeat", str(args.repeat)] + (["--only", *args.only] if args.only else [])
    for r in range(args.rounds):
        for root in ((here, there) if r % 2 == 0 else (there, here)):
            env = {**os.environ, "GPUMEM_BENCH_PACKAGE_ROOT": root, "PYTHONPATH": root}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                return 2
            runs[root].append(json.loads(line[-1][len("RESULT "):]))
            print(f"round {r + 1}: {'this checkout' if root == here else there}: "
                  + ", ".join(f"{k} {v:.1f} ms" for k, v in runs[root][-1].items()), flush=True)
    print(f"== %gpumem, median of {args.rounds} rounds: this checkout vs {there}")
    for key in runs[here][0]:
        ours = statistics.median(run[key] for run in runs[here])
        theirs = statistics.median(run[key] for run in runs[there])
        print(f"{key:>16}: {ours:8.1f} ms vs {theirs:8.1f} ms  ratio {ours / theirs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
