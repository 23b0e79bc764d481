"""``jupyter_gpumem.trace`` on a real GPU, at both depths.

* With trace on from the first cell (as ``c.GpuMemMagics.trace = True`` does, before
  ``import torch``; ``"lines"`` for line depth), in a fresh IPython shell of a child
  process: a small GPT trains with Adam, defined and run over several cells (200 steps:
  at cell depth the history's ring turns over, so the sites of blocks whose events
  left it come from what trace kept). Then every storage of every holder names its
  cell (at line depth, a cell and a line), and at least 99 % of the unattributed
  bytes do too. The product's own snapshot: the sum of its unattributed sites equals
  its unattributed figure to the byte, and the internals (the cuBLAS workspaces) are
  not listed again among the sites. The saved snapshot names the cells ``In[N]`` and loads with
  ``torch.cuda._memory_viz``. The child also checks torch's format as trace reads it
  (frames innermost first, ``time_us`` in epoch microseconds, the backward's blocks
  without Python frames) and prints the costs of reading it.
* Trace turned on when CUDA is in use already: the blocks allocated before say so,
  the cost is measured and shown, the lines of a cell and its peak, and ``off``
  stops torch's recording.

Figures are printed (run with ``-s``). Skips without torch, CUDA or IPython.
Run on the GPU machine: ``. .whl/prelude.sh && python3 -m pytest -q -s tests/gpu/test_trace_gpu.py``.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("IPython", reason="IPython is not installed (see GPU.md: wheels.sh)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: trace's CUDA path needs one", allow_module_level=True)

from conftest import run  # noqa: E402

from gpu_floor import empty_caches_after_each_test  # noqa: E402,F401
from gpu_setup import GPT_STEP  # noqa: E402

from jupyter_gpumem.core import trace  # noqa: E402

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.tiny_gpt import GPT_SOURCE  # noqa: E402


def figures(test: str, **values) -> None:
    when = datetime.datetime.now().isoformat(timespec="seconds")
    text = ", ".join(f"{k}={v}" for k, v in values.items())
    print(f"\n[figures {when} {torch.cuda.get_device_name(0)}] {test}: {text}")


CELLS = [
    # 1: the user's imports
    "import torch\nimport torch.nn.functional as F",
    # 2: the model, defined in a cell of its own
    GPT_SOURCE,
    # 3: model and optimizer on the GPU
    "torch.manual_seed(0)\nmodel = GPT().cuda()\nopt = torch.optim.Adam(model.parameters(), lr=3e-4)",
    # 4: the data
    "data = torch.randint(0, 512, (64, 129), device='cuda')",
    # 5: the training loop
    "for step in range(STEPS):\n"
    "    batch = data[torch.randint(0, 64, (16,), device='cuda')]\n"
    + textwrap.indent(GPT_STEP, "    ") + "torch.cuda.synchronize()\n",
    # 6: a scalar that keeps its autograd graph (and the activations it saved)
    "kept = F.cross_entropy(model(data[:2, :-1]).reshape(-1, 512), data[:2, 1:].reshape(-1))",
]

CHILD = textwrap.dedent("""
    import json, os, pickle, sys, time, types
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext jupyter_gpumem", store_history=False)
    from jupyter_gpumem.core import trace
    from jupyter_gpumem.magics import trace as trace_magics
    assert "torch" not in sys.modules
    # what the magics do at load with c.GpuMemMagics.trace = True
    depth = os.environ["TRACE_DEPTH"]
    trace_magics.on_load(sh, types.SimpleNamespace(trace=True if depth == "cell" else depth,
                                                   default_device="auto"))
    out = {"status_at_load": trace.status()}
    cells = json.loads(os.environ["TRACE_CELLS"])
    sh.user_ns["STEPS"] = int(os.environ["TRACE_STEPS"])
    counts = []
    t0 = time.perf_counter()
    for code in cells:
        r = sh.run_cell(code, store_history=True)
        assert r.success, (code, r.error_in_exec)
        counts.append(r.execution_count)
    out["cells"] = counts
    out["train_s"] = time.perf_counter() - t0
    out["status"] = trace.status()
    import torch
    torch.cuda.synchronize()
    from jupyter_gpumem.core import scan
    tr = trace.tracer()
    t = time.perf_counter(); raw = tr.feed.snapshot(); out["snapshot_s"] = time.perf_counter() - t
    out["entries"] = len(raw["device_traces"][0])
    # torch's format, as trace reads it
    now = time.time() * 1e6
    out["time_us_lag_s"] = (now - raw["device_traces"][0][-1]["time_us"]) / 1e6
    framed = [b for s in raw["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated" and b["frames"]]
    out["first_frame_files"] = sorted({b["frames"][0]["filename"].rsplit("/", 1)[-1]
                                       for b in framed})[:8]
    out["frameless_active"] = sum(1 for s in raw["segments"] for b in s["blocks"]
                                  if b["state"] == "active_allocated" and not b["frames"])
    out["user_metadata_key"] = "user_metadata" in raw["device_traces"][0][-1]
    out["torch"] = torch.__version__
    out["api"] = {n: hasattr(torch.cuda.memory, n) for n in ("_set_memory_metadata",
                                                            "_allocation_traceback")}
    del raw
    t = time.perf_counter(); tr.index(); out["index_s"] = time.perf_counter() - t
    roots = scan.collect_roots(None, sh)
    result = scan.scan(roots, devices={"cuda:0"}, shell=sh, time_limit=30)
    keys, missing, holders = set(), [], {}
    t = time.perf_counter()
    for root, reach in zip(result.roots, result.reach):
        ks = [k for k in reach.storages if k[0] == "cuda:0"]
        if not ks:
            continue
        keys.update(ks)
        sites = trace.sites_of(ks)
        holders[root.name] = len(ks)
        for k in ks:
            s = sites.get(k)
            if s is None or s.cell is None or (depth == "lines" and not s.in_cell):
                missing.append([root.name, hex(k[1]), s.text if s else None])
    out["sites_s"] = time.perf_counter() - t
    out["holders"] = holders
    out["missing"] = missing[:20]
    out["n_missing"] = len(missing)
    out["example_sites"] = {name: trace.site_of(next(k for k in result.reach[i].storages
                                                     if k[0] == "cuda:0")).text
                            for i, name in enumerate(r.name for r in result.roots)
                            if name in ("model", "opt", "logits", "batch", "data", "kept")
                            and any(k[0] == "cuda:0" for k in result.reach[i].storages)}
    g = trace.sites_of([("cuda:0", p.grad.untyped_storage().data_ptr())
                        for p in sh.user_ns["model"].parameters()][:1])
    out["grad_site"] = next(iter(g.values())).to_json() if g else None
    first = next(iter(sh.user_ns["model"].parameters()))
    state = sh.user_ns["opt"].state[first]["exp_avg"]
    out["adam_state_site"] = trace.site_of(("cuda:0", state.untyped_storage().data_ptr())).text
    # the product's own snapshot: its unattributed figure, its sites, its internals
    from jupyter_gpumem.core import devices, snapshot as snapmod
    t = time.perf_counter()
    snap = snapmod.build(shell=sh, device=devices.select("cuda:0"), time_limit=30)
    out["build_s"] = time.perf_counter() - t
    out["figure"] = snap.unattributed.get("cuda:0")
    rows = snap.unattributed_sites.get("cuda:0", [])
    out["rows"] = [r["text"] for r in rows]
    out["rows_sum"] = sum(r["bytes"] for r in rows)
    internals = [i for i in snap.internals if i.device == "cuda:0" and i.kind == "allocated"]
    out["internals"] = [[i.label, i.nbytes, len(i.blocks)] for i in internals]
    shown = {addr: i.label for i in internals for addr, _ in i.blocks}
    sizes = {k: v[0][1] for reach in result.reach for k, v in reach.storages.items()}
    t = time.perf_counter()
    groups = trace.unattributed_sites(sizes, "cuda:0", shown)
    out["unattributed_s"] = time.perf_counter() - t
    total = sum(g.nbytes for g in groups)
    out["unattributed"] = total
    out["unattributed_sited"] = sum(g.nbytes for g in groups if g.site.cell is not None
                                    and (depth == "cell" or g.site.how == "rounding"
                                         or g.site.in_cell))
    out["groups"] = [g.text for g in groups[:12]]
    # what the internals' blocks would add if they were listed again
    out["with_internals"] = sum(g.nbytes for g in trace.unattributed_sites(sizes, "cuda:0"))
    out["internal_bytes"] = sum(size for i in internals for _, size in i.blocks)
    out["refreshes"] = list(tr.refreshes)
    out["allocated"] = torch.cuda.memory_allocated(0)
    t = time.perf_counter()
    lines = trace.cell_lines(counts[4])
    out["cell_lines_s"] = time.perf_counter() - t
    out["cell_lines"] = lines.to_json()
    out["cell_lines_text"] = lines.text()
    path = "/tmp/trace_snapshot.pickle"
    t = time.perf_counter(); out["save"] = trace.save(path); out["save_s"] = time.perf_counter() - t
    out["save_bytes"] = os.path.getsize(path)
    from torch.cuda import _memory_viz as mv
    data = pickle.load(open(path, "rb"))
    out["viz_segsum"] = "total_allocated" in mv.segsum(data)
    out["viz_trace"] = mv.trace(data)[:40]
    flame = mv.memory(data, format_flamegraph=lambda x: x)
    out["viz_cells"] = sorted({p.split(":")[0] for line in flame.splitlines()
                               for p in line.split(";") if p.startswith("In[")})
    out["viz_html"] = "<html>" in mv.trace_plot(data) and "<html>" in mv.segment_plot(data)
    with open("/proc/self/status") as f:
        out["rss_mib"] = next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
    print(trace.stop())
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.parametrize("depth", ["cell", "lines"])
def test_trace_from_the_first_cell_names_every_storage(depth):
    env = dict(os.environ, TRACE_CELLS=json.dumps(CELLS), TRACE_STEPS="200", TRACE_DEPTH=depth)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=500, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT "):])
    print(json.dumps(got, indent=1))
    c = got["cells"]
    figures(f"trace from the first cell at {depth} depth, GPT 4x256 + Adam, 200 steps",
            train_s=round(got["train_s"], 2), entries=got["entries"],
            snapshot_s=round(got["snapshot_s"], 3), index_s=round(got["index_s"], 3),
            sites_s=round(got["sites_s"], 3), unattributed_s=round(got["unattributed_s"], 3),
            cell_lines_s=round(got["cell_lines_s"], 3), save_s=round(got["save_s"], 3),
            save_mib=round(got["save_bytes"] / MiB, 1), rss_mib=round(got["rss_mib"]),
            allocated_mib=round(got["allocated"] / MiB, 1),
            unattributed_mib=round(got["unattributed"] / MiB, 2),
            sited_share=round(got["unattributed_sited"] / max(got["unattributed"], 1), 4),
            build_s=round(got["build_s"], 3), refreshes=got["refreshes"])
    assert "waiting for `import torch`" in got["status_at_load"]
    assert "CUDA recording" in got["status"] and "cost +" in got["status"], got["status"]
    assert ("cell depth" in got["status"]) == (depth == "cell"), got["status"]
    # torch's format, as trace reads it
    assert abs(got["time_us_lag_s"]) < 600, "time_us is in epoch microseconds"
    if depth == "lines":
        assert got["frameless_active"] > 0, "the backward's blocks (the gradients) have no frame"
    # every storage of every holder names its cell (at line depth, a cell and a line)
    assert got["holders"].keys() >= {"model", "opt", "data", "logits", "batch"}
    assert got["n_missing"] == 0, got["missing"]
    ex = got["example_sites"]
    if depth == "cell":
        assert ex["data"] == f"cell [{c[3]}]" and ex["model"] == f"cell [{c[2]}]", ex
        # Adam's state: made by the training cell's first step, its event long gone
        assert got["adam_state_site"] == f"cell [{c[4]}]", got["adam_state_site"]
        assert got["entries"] >= 100_000, "the ring turned over during the training cell"
    else:
        assert ex["data"] == f"cell [{c[3]}] line 1: data = torch.randint(0, 512, (64, 129), device='cuda')"
        assert ex["model"].startswith(f"cell [{c[2]}] line 2: model = GPT().cuda()")
        assert ex["logits"].startswith(f"cell [{c[1]}] ")    # inside the model: its forward's line
        # a gradient, allocated by autograd's thread: the line that ran the backward
        g = got["grad_site"]
        assert g["cell"] == c[4] and g["how"] == "nearest" and g["source"] == "loss.backward()", g
    # what no name reaches: at least 99 % of its bytes name their cell
    assert got["unattributed"] > 0
    assert got["unattributed_sited"] >= 0.99 * got["unattributed"], got["groups"]
    # the sites add up to the report's unattributed figure, to the byte, and the
    # internals (cuBLAS workspaces) are not among them
    assert got["unattributed"] == got["figure"] == got["rows_sum"], (got["figure"], got["rows"])
    assert got["internals"] and got["internal_bytes"] > 0, got["internals"]
    assert got["with_internals"] - got["unattributed"] == got["internal_bytes"], got["internals"]
    # the lines of the training cell, and the line at its peak
    cl = got["cell_lines"]
    assert cl["lines"] and cl["peak"] is not None, cl
    if depth == "lines":
        assert {la["line"] for la in cl["lines"]} <= set(range(1, 9))
        assert got["cell_lines_text"].startswith(f"cell [{c[4]}] allocated most: ")
    else:
        assert got["cell_lines_text"].startswith(f"cell [{c[4]}] allocated ")
    # the visualizer's file: cells named In[N], readable by torch.cuda._memory_viz
    assert got["viz_segsum"] and got["viz_html"] and "entries" in got["viz_trace"]
    assert {f"In[{c[2]}]", f"In[{c[3]}]"} <= set(got["viz_cells"]), got["viz_cells"]


def test_trace_on_with_cuda_in_use(ip):
    trace.stop()
    run(ip, "import torch, torch.nn.functional as F\n"
            "pre = torch.ones(1 << 20, device='cuda')\n_ = pre @ pre")
    line = trace.start(ip, "cuda:0", depth="lines")
    figures("trace on, cost line", line=line)
    assert line.startswith("trace is on: CUDA recording (lines: python stacks")
    assert "cost +" in line and "per CUDA allocation" in line and "\n" not in line
    try:
        r = run(ip, "post = torch.zeros(1 << 20, device='cuda')\nz = pre + post\n"
                    "p = F.softmax(z, dim=0)\ndel z")
        n = r.execution_count
        ptr = lambda name: ip.ev(f"{name}.untyped_storage().data_ptr()")  # noqa: E731
        s = trace.site_of(("cuda:0", ptr("pre")))
        assert s is not None and s.how == "before" and s.text == "allocated before trace was on"
        s = trace.site_of(("cuda:0", ptr("post")))
        assert s.text == f"cell [{n}] line 1: post = torch.zeros(1 << 20, device='cuda')"
        s = trace.site_of(("cuda:0", ptr("p")))
        assert (s.cell, s.line) == (n, 3)
        assert s.inner and "torch/nn/functional.py" in s.inner   # frames are innermost first
        lines = trace.cell_lines(n)
        print(lines.text())
        assert [la.line for la in lines][:3] == [1, 2, 3] or {la.line for la in lines} == {1, 2, 3}
        assert lines.peak is not None and lines.peak.line == 3 and lines.peak.bytes >= 3 * 4 * MiB
        assert lines.held.get(1) == 4 * MiB and not lines.held.get(2)
        raw = torch.cuda.memory._snapshot()
        assert raw["device_traces"][0], "recording"
    finally:
        trace.stop()
    raw = torch.cuda.memory._snapshot()
    assert not any(raw["device_traces"]), "trace off stops torch's recording (and its history)"
    run(ip, "del pre, post, p")


def test_overhead_benchmark_runs():
    """benchmarks/trace_overhead.py, short: it runs and prints its median ratio (the
    full run, for the figure, is in run.sh / the report's commands)."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "trace_overhead.py"),
                           "--trials", "3", "--steps", "10"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep +
                                   os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    print(proc.stdout[-1500:])
    assert "median ratio" in proc.stdout
