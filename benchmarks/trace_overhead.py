"""What `%gpumem trace on` costs a training loop.

A small GPT-like model (embeddings, 4 blocks of causal self-attention and MLP,
d=256, context 128, batch 16: launch-bound on an H200, so what recording adds on
the CPU per allocation shows in full) trains with Adam. Rounds of ``--steps`` steps run
with trace off and on, alternating (the order turns each round), in one process,
in a real IPython shell's cells where IPython is installed (so the recorded stacks
are as deep as a notebook's), else in plain Python. Every round runs the loop in each
mode, in a turning order:

* ``off``: no recording;
* ``cell``: ``%gpumem trace on`` (cell depth: torch's history without stacks, each
  block mapped to its cell by time);
* ``lines``: ``%gpumem trace on --lines`` (Python stacks on every allocation);
* on CUDA, ``torch``: torch's recorder alone with the settings ``--lines`` uses
  (``_record_memory_history(enabled="all", context="alloc", stacks="python")``,
  without this package), and ``torch-nostacks``: torch's history without stacks alone.

Each round's ratios are its times over its "off" time (``lines`` also over its
``torch`` time: what the product adds to the mechanism it reads); the medians over
rounds are printed. Targets on CUDA: ``cell`` at most 1.05x of off, ``lines`` at most
1.03x of torch's recorder with Python stacks alone.

It also prints, after the last "on" round, what reading the record costs: torch's
``_snapshot()`` with the history kept, trace's index of it, ``cell_lines`` of the
training cell, and the process's resident memory with trace on and off.

Run: ``python benchmarks/trace_overhead.py [--device cuda|cpu] [--rounds 9]
[--steps 50] [--stacks python|all] [--context alloc|all] [--max-entries N]``.
``--check`` makes it exit 1 when a CUDA target is missed. The default model is
the harsh case (kernel launches bound it); ``--d 384 --layers 6 --batch 64 --ctx 256``
is nanoGPT's character model, where the GPU is busy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.tiny_gpt import GPT_SOURCE  # noqa: E402

MODEL = """
import time
import torch
import torch.nn.functional as F

""" + GPT_SOURCE + """
torch.manual_seed(0)
model = GPT(d=D, layers=LAYERS, ctx=T).to(DEVICE)
opt = torch.optim.Adam(model.parameters(), lr=3e-4)
data = torch.randint(0, 512, (max(64, B), T + 1), device=DEVICE)

def sync():
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()
"""

LOOP = """
sync()
if DEVICE.startswith("cuda"):
    ALLOCS0 = torch.cuda.memory_stats()["allocation.all.allocated"]
_t0 = time.perf_counter()
for step in range(STEPS):
    batch = data[torch.randint(0, data.shape[0], (B,), device=DEVICE)]
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 512), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
sync()
elapsed = time.perf_counter() - _t0
if DEVICE.startswith("cuda"):
    ALLOCS = torch.cuda.memory_stats()["allocation.all.allocated"] - ALLOCS0
"""


class Runner:
    """Cells in a real IPython shell where there is one, else exec in a namespace."""

    def __init__(self) -> None:
        try:
            from IPython.core.interactiveshell import InteractiveShell
        except ImportError:
            self.shell, self.ns = None, {"__name__": "__main__"}
            return
        self.shell = InteractiveShell.instance(colors="nocolor")
        self.ns = self.shell.user_ns

    def cell(self, code: str):
        if self.shell is None:
            exec(compile(code, "<cell>", "exec"), self.ns)
            return None
        r = self.shell.run_cell(code, store_history=True)
        if not r.success:
            raise RuntimeError(f"cell failed: {r.error_before_exec or r.error_in_exec!r}")
        return r.execution_count


def rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return float("nan")


TORCH_MODES = [("history, no stacks", dict(enabled="all", context=None)),
               ("state, python stacks", dict(enabled="state", context="alloc", stacks="python")),
               ("history + python stacks of allocs (trace's)",
                dict(enabled="all", context="alloc", stacks="python")),
               ("history + python stacks of allocs and frees",
                dict(enabled="all", context="all", stacks="python")),
               ("history + C++ and python stacks of allocs",
                dict(enabled="all", context="alloc", stacks="all"))]


def breakdown(torch, calls: int = 5000) -> None:
    """Bare 512-byte allocations (each freed at once) under each recording mode of
    torch's: what the stacks cost apart from the history, at a shallow stack, under
    40 more Python frames (a notebook's training step is that deep), and on a
    thread of its own (autograd's backward allocates on its own thread)."""
    import threading

    record = torch.cuda.memory._record_memory_history
    dev = torch.device("cuda", 0)

    def loop() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.empty(512, dtype=torch.uint8, device=dev)
        return (time.perf_counter() - t0) / calls * 1e6

    def deep(n: int = 40) -> float:
        return loop() if n == 0 else deep(n - 1)

    def threaded() -> float:
        out: list[float] = []
        t = threading.Thread(target=lambda: out.append(loop()))
        t.start()
        t.join()
        return out[0]

    def backward() -> float:
        """Backward of a chain of 100 small ops: its allocations are on autograd's thread."""
        x = torch.ones(64, device=dev, requires_grad=True)
        t0 = time.perf_counter()
        for _ in range(calls // 100):
            y = x
            for _ in range(100):
                y = y * 1.0001
            y.sum().backward()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / calls * 1e6

    loop()
    for name, kw in [("off", None)] + TORCH_MODES:
        record(enabled=None)
        if kw:
            record(**kw)
        loop()
        figures = {what: min(fn() for _ in range(5)) for what, fn in
                   (("shallow", loop), ("40 frames deeper", deep), ("own thread", threaded),
                    ("chain op + its backward", backward))}
        print(f"  bare allocation, {name}: "
              + ", ".join(f"{what} {v:.2f} µs" for what, v in figures.items()))
    record(enabled=None)


def _quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) >= 4 else [min(values), 0, max(values)]
    return f"{q[0]:.3f}-{q[2]:.3f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (torch's allocator history) or cpu "
                   "(the host recorder)")
    p.add_argument("--rounds", "--trials", type=int, default=9, dest="rounds")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--stacks", default="python", choices=("python", "all"))
    p.add_argument("--context", default="alloc", choices=("alloc", "all"))
    p.add_argument("--max-entries", type=int, default=None, dest="max_entries")
    p.add_argument("--check", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no line per round")
    p.add_argument("--breakdown", action="store_true",
                   help="also time bare allocations under each of torch's recording modes")
    p.add_argument("--torch-modes", action="store_true", dest="torch_modes",
                   help="on CUDA, also run the loop in every round under each of torch's "
                        "recording modes (history without stacks, state only, ...)")
    args = p.parse_args()

    import torch

    from jupyter_gpumem.core import trace

    device = "cuda:0" if args.device.startswith("cuda") else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu")
        return 0
    run = Runner()
    run.ns.update(DEVICE=device, STEPS=args.steps, D=args.d, LAYERS=args.layers, B=args.batch,
                  T=args.ctx)
    run.cell(MODEL)
    run.ns["STEPS"] = args.warmup
    run.cell(LOOP)
    run.ns["STEPS"] = args.steps
    kwargs = dict(stacks=args.stacks, context=args.context)
    if args.max_entries:
        kwargs["max_entries"] = args.max_entries
    where = "IPython cells" if run.shell else "plain Python"
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU"
    print(f"trace overhead on {name} ({device}), torch {torch.__version__}, {where}: "
          f"GPT d={args.d} x{args.layers}, batch {args.batch}x{args.ctx} + Adam, "
          f"{args.steps} steps per round, "
          f"{args.rounds} rounds, stacks={args.stacks} context={args.context}")

    cuda = device.startswith("cuda")
    record = torch.cuda.memory._record_memory_history
    entries = kwargs.get("max_entries", trace.DEFAULT_MAX_ENTRIES)

    def timed(mode: str, first: bool) -> float:
        if mode in ("cell", "lines"):
            line = trace.start(run.shell, device, depth=mode, measure=first, **kwargs)
            if first:
                print(f"  {mode}: {line}")
        elif mode == "torch":   # torch's own recorder, --lines' settings, without the product
            record(enabled="all", context=args.context, stacks=args.stacks, max_entries=entries)
        elif mode == "torch-nostacks":
            record(enabled="all", context=None, max_entries=entries)
        elif mode.startswith("mode "):
            record(**TORCH_MODES[int(mode.split()[1])][1], max_entries=entries)
        try:
            run.cell(LOOP)
        finally:
            if mode in ("cell", "lines"):
                trace.stop()
            elif mode.startswith("torch") or mode.startswith("mode "):
                record(enabled=None)
        return run.ns["elapsed"]

    modes = ("off", "cell", "lines") + (("torch", "torch-nostacks") if cuda else ())
    if cuda and args.torch_modes:
        modes += tuple(f"mode {i}" for i in range(len(TORCH_MODES)))
    times: dict[str, list[float]] = {m: [] for m in modes}
    over_off: dict[str, list[float]] = {m: [] for m in modes if m != "off"}
    lines_over_torch: list[float] = []
    seen: set = set()
    for i in range(args.rounds):
        order = modes[i % len(modes):] + modes[:i % len(modes)]
        order = order if i % 2 == 0 else order[::-1]
        got = {}
        for mode in order:
            got[mode] = timed(mode, mode not in seen and mode in ("cell", "lines"))
            seen.add(mode)
        for m in modes:
            times[m].append(got[m])
            if m != "off":
                over_off[m].append(got[m] / got["off"])
        if cuda:
            lines_over_torch.append(got["lines"] / got["torch"])
        if not args.quiet:
            print(f"  round {i + 1}: off {got['off'] * 1e3 / args.steps:.2f} ms/step; over off: "
                  + ", ".join(f"{m} {got[m] / got['off']:.3f}" for m in modes if m != "off")
                  + (f"; lines over torch {lines_over_torch[-1]:.3f}" if cuda else ""))
    for m, rs in over_off.items():
        name = TORCH_MODES[int(m.split()[1])][0] if m.startswith("mode ") else m
        print(f"{name}: median ratio over off {statistics.median(rs):.3f}x "
              f"(quartiles {_quartiles(rs)}, min {min(rs):.3f}, max {max(rs):.3f}; median step "
              f"{statistics.median(times[m]) * 1e3 / args.steps:.2f} ms)")
    med = statistics.median(over_off["cell"])
    print(f"median ratio {med:.3f}x: trace on (cell depth) over off; median step off "
          f"{statistics.median(times['off']) * 1e3 / args.steps:.2f} ms"
          + (" · target <= 1.05x" if cuda else ""))
    med_lines = None
    if cuda:
        med_lines = statistics.median(lines_over_torch)
        print(f"median ratio {med_lines:.3f}x: trace on --lines over torch's recorder with "
              f"python stacks alone (quartiles {_quartiles(lines_over_torch)}) · target <= 1.03x")
    allocs = run.ns.get("ALLOCS")
    if allocs:
        print(f"  {allocs / args.steps:.0f} allocations per step")
    if args.breakdown and device.startswith("cuda"):
        breakdown(torch)

    # what reading the record costs, after one more round with trace on
    rss_off = rss_mib()
    trace.start(run.shell, device, measure=False, **kwargs)
    cell_of_last_on = run.cell(LOOP)
    run.cell("pass")
    if trace.is_on():
        tr = trace.tracer()
        print("  " + trace.status())
        rss_on = rss_mib()
        if device.startswith("cuda"):
            t = time.perf_counter()
            raw = tr.feed.snapshot()
            snap_s = time.perf_counter() - t
            entries = sum(len(x) for x in raw["device_traces"])
            del raw
            t = time.perf_counter()
            tr._index = None
            tr.index()
            index_s = time.perf_counter() - t
            print(f"  reading it: torch's _snapshot() {snap_s * 1e3:.0f} ms for {entries:,} events, "
                  f"trace's index {index_s * 1e3:.0f} ms (both include the snapshot)")
        if cell_of_last_on is not None:
            t = time.perf_counter()
            lines = trace.cell_lines(cell_of_last_on)
            print(f"  cell_lines {1e3 * (time.perf_counter() - t):.0f} ms: {lines.text()}")
        count, seconds = tr.refreshes
        print(f"  after cells, the history was read {count} time(s) to keep the live blocks' "
              f"sites, {seconds * 1e3:.0f} ms in all")
        trace.stop()
        print(f"  resident memory: {rss_off:.0f} MiB before on, {rss_on:.0f} MiB with trace on "
              f"after a round, {rss_mib():.0f} MiB after off")
    if args.check and cuda and (med > 1.05 or (med_lines is not None and med_lines > 1.03)):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
