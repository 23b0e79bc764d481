"""Print what the framework-internals report rests on, on a real GPU, in one run.

Run on the GPU machine from the project root:

    . .whl/prelude.sh && python3 tests/gpu/probe_internals.py 2>&1 | tee $OUT/probe_internals.log

It prints, in order: versions and the settings that decide the cuBLAS/cuBLASLt
workspace sizes (environment, ``torch.backends.cuda``, the device's
architecture) and what the product makes of them; the CUDA context's limits
(thread stacks, device heap, printf FIFO) and what NVML says they cost; NVML's
figure for this process at each step; then, after a few hundred Adam steps of a
small transformer, every segment and block of ``torch.cuda.memory_snapshot()``
(address, size, requested size, state, pool, stream) with the blocks no tensor
of the model or optimizer lies in; a CUDA graph's private pool; the report
(internals and the rest's parts), the purge estimate against what a purge then
frees, also with expandable segments (in a child process). Where ``$OUT`` is
set, the allocator's segments and counters after training go to
``$OUT/allocator_feed.json`` (frames left out), the shape the CPU tests record.

Nothing here changes the card's settings. It allocates what the training loop
and the CUDA graph need, and, to check what the context reserves, raises this
process's own stack limit at the end and starts three short child processes
that set their own heap and printf limits.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def mib(n) -> str:
    return "n/a" if n is None else f"{n / MiB:.2f} MiB"


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def nvml_process() -> int | None:
    try:
        from jupyter_gpumem.backends import nvml
        return nvml.process_used(nvml.visible_indices()[0])
    except Exception as exc:  # noqa: BLE001
        print("nvml:", exc)
        return None


def settle() -> int | None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    time.sleep(0.3)
    return nvml_process()


def step(label: str) -> None:
    torch = sys.modules.get("torch")
    used = settle()
    if torch is not None and torch.cuda.is_initialized():
        alloc, res = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
    else:
        alloc = res = None
    print(f"[{label}] nvml process {mib(used)} · torch allocated {mib(alloc)} · reserved {mib(res)}",
          flush=True)


def settings() -> None:
    import torch

    section("versions and settings")
    print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
    for name in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "TORCH_CUBLAS_WORKSPACE_CACHE",
                 "TORCH_CUBLASLT_UNIFIED_WORKSPACE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                 "CUDA_MODULE_LOADING", "NCCL_BUFFSIZE", "CUDA_VISIBLE_DEVICES"):
        print(f"  env {name}={os.environ.get(name)!r}")
    print("  torch._C names:", sorted(n for n in dir(torch._C)
                                     if "ublas" in n.lower() or "orkspace" in n.lower()))
    bc = torch.backends.cuda
    for name in ("cublas_workspace_size", "cublaslt_workspace_size", "blas_workspace_size"):
        print(f"  backends.cuda.{name}:", "present" if hasattr(bc, name) else "absent")
    print("  matmul.allow_tf32", bc.matmul.allow_tf32, "preferred_blas_library",
          getattr(bc, "preferred_blas_library", lambda: None)())


def after_init() -> None:
    import torch

    section("device, workspace sizes and context limits")
    props = torch.cuda.get_device_properties(0)
    print("  ", props.name, f"sm {props.major}.{props.minor}", "SMs", props.multi_processor_count,
          "max threads/SM", getattr(props, "max_threads_per_multi_processor", None),
          "total", mib(props.total_memory))
    print("  cudnn", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
          "allocator backend", torch.cuda.get_allocator_backend())
    from jupyter_gpumem.backends import REGISTRY
    from jupyter_gpumem.backends.cuda_context import context_internals, context_limits
    tb = next(b for b in REGISTRY.backends if b.name == "torch")
    print("  product: workspace sizes", tb.workspace_sizes(0))
    limits = context_limits(0)
    print("  product: context limits", limits)
    for item in context_internals("cuda:0", limits):
        print("  product:", item.label, mib(item.nbytes))


def feed(path: str | None, known: set[int]) -> None:
    """The allocator's segments and counters, frames left out (the CPU tests' shape)."""
    import torch

    if not path:
        return
    segs = []
    for seg in torch.cuda.memory_snapshot():
        seg = {k: v for k, v in seg.items() if k != "frames"}
        seg["blocks"] = [{k: v for k, v in b.items() if k != "frames"} for b in seg["blocks"]]
        segs.append(seg)
    stats = torch.cuda.memory_stats(0)
    keep = {k: v for k, v in stats.items() if k.split(".")[0] in (
        "allocated_bytes", "reserved_bytes", "allocation", "segment") and ".all." in k}
    props = torch.cuda.get_device_properties(0)
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "gpu": props.name, "major": props.major,
                   "segments": segs, "stats": keep, "named_pointers": sorted(known)}, f)
    print("  wrote", path)


def dump_snapshot(known: set[int], title: str) -> None:
    import torch

    section(title)
    segs = torch.cuda.memory_snapshot()
    stats = torch.cuda.memory_stats(0)
    for k in ("allocated_bytes.all.current", "reserved_bytes.all.current",
              "inactive_split_bytes.all.current", "allocation.all.allocated", "allocation.all.freed",
              "segment.all.allocated", "segment.all.freed"):
        print(f"  stats {k} = {stats.get(k)}")
    unnamed = []
    for seg in segs:
        base = seg["address"]
        states = [b["state"] for b in seg["blocks"]]
        print(f"  segment +{base & 0xffffffff:#010x} total {mib(seg['total_size'])} allocated "
              f"{mib(seg.get('allocated_size'))} pool {seg.get('segment_pool_id')} "
              f"type {seg.get('segment_type')} stream {seg.get('stream')} "
              f"expandable {seg.get('is_expandable')} blocks {len(states)} "
              f"active {states.count('active_allocated')} pending {states.count('active_pending_free')}")
        for b in seg["blocks"]:
            a = b["address"]
            if b["state"] != "inactive" and not any(a <= p < a + b["size"] for p in known):
                unnamed.append((b["size"], b.get("requested_size"), b["state"], seg.get("segment_pool_id")))
    print("  unnamed active blocks (size, requested, state, pool):")
    for u in sorted(unnamed, reverse=True):
        print("     ", u, mib(u[0]))
    print("  sum", mib(sum(u[0] for u in unnamed)))


def train(steps: int = 300):
    import torch

    torch.manual_seed(0)
    d, n_layers, vocab, seq, batch = 256, 4, 1000, 64, 32
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.1, batch_first=True)
    model = torch.nn.Sequential()
    model.emb = torch.nn.Embedding(vocab, d)
    model.enc = torch.nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
    model.head = torch.nn.Linear(d, vocab)
    model = model.cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randint(0, vocab, (batch, seq), device="cuda")
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), x.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return model, opt, loss.item()


def pointers(*objs) -> set[int]:
    import torch

    out = set()
    for obj in objs:
        if isinstance(obj, torch.nn.Module):
            for t in list(obj.parameters()) + list(obj.buffers()):
                out.add(t.untyped_storage().data_ptr())
                if t.grad is not None:
                    out.add(t.grad.untyped_storage().data_ptr())
        elif isinstance(obj, torch.optim.Optimizer):
            for st in obj.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor) and v.is_cuda:
                        out.add(v.untyped_storage().data_ptr())
        elif isinstance(obj, torch.Tensor):
            out.add(obj.untyped_storage().data_ptr())
    return out


def report(ns: dict, title: str):
    section(title)
    import jupyter_gpumem

    snap = jupyter_gpumem.snapshot(ns, device="cuda:0")
    print(repr(snap))
    for item in snap.to_json()["internals"]:
        print("  internal:", item)
    return snap


def estimate_then_purge(ns: dict, title: str) -> None:
    """The product's estimate for ``purge --all``, then the purge and NVML around it."""
    section(title)
    import jupyter_gpumem
    from jupyter_gpumem import backends
    from jupyter_gpumem.core import scan

    roots = scan.collect_roots(ns, None)
    res = scan.scan(roots, devices={"cuda:0"}, namespace=ns)
    infos = {k: v[0] for r in res.reach for k, v in r.storages.items()}
    est = backends.purge_estimate(["cuda:0"], infos, set(infos))
    dry = jupyter_gpumem.purge(namespace=ns, all=True, dry_run=True, device="cuda:0")
    print(repr(dry))
    del roots, res, infos
    before = settle()
    try:
        result = jupyter_gpumem.purge(namespace=ns, all=True, device="cuda:0")
    except Exception as exc:  # noqa: BLE001
        print("  purge raised", repr(exc))
        return
    after = settle()
    print(repr(result))
    freed = result.freed.get("cuda:0")
    print(f"  ESTIMATE {mib(est.get('cuda:0'))} · dry run predicted {mib(dry.predicted.get('cuda:0'))}"
          f" · freed (report) {mib(freed)} · NVML {mib(before)} -> {mib(after)}"
          f" · estimate - freed = {mib((est.get('cuda:0') or 0) - (freed or 0))}", flush=True)


def context_checks() -> None:
    """What the context's limits cost: this process's stack limit raised to 2 KiB, and
    three children that set their own heap / printf limits before their first kernel."""
    section("context checks")
    import torch
    from jupyter_gpumem.backends.cuda_context import context_limits

    lib = ctypes.CDLL("libcuda.so.1")
    limits = context_limits(0)
    before = settle()
    rc = lib.cuCtxSetLimit(0, ctypes.c_size_t(2048))
    torch.zeros(1, device="cuda").add_(1)
    after = settle()
    expect = 1024 * limits["sms"] * limits["threads_per_sm"]
    print(f"  stack 1024 -> 2048 B (rc {rc}): NVML {mib(before)} -> {mib(after)}, "
          f"delta {mib((after or 0) - (before or 0))}, formula says {mib(expect)}")
    print("  limits now", context_limits(0))
    child = (
        "import ctypes, sys, time\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "lib = ctypes.CDLL('libcuda.so.1'); lib.cuInit(0)\n"
        "dev = ctypes.c_int(); lib.cuDeviceGet(ctypes.byref(dev), 0)\n"
        "ctx = ctypes.c_void_p(); lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)\n"
        "lib.cuCtxSetCurrent(ctx)\n"
        "mode = sys.argv[1]\n"
        "code = {'heap': 2, 'printf': 1}.get(mode)\n"
        "rc = lib.cuCtxSetLimit(code, ctypes.c_size_t(512 << 20)) if code is not None else None\n"
        "import torch\n"
        "torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize(); time.sleep(0.3)\n"
        "from jupyter_gpumem.backends import nvml\n"
        "from jupyter_gpumem.backends.cuda_context import context_limits\n"
        "print(mode, 'rc', rc, 'NVML', nvml.process_used(nvml.visible_indices()[0]) / 2**20, 'MiB',"
        " context_limits(0))\n")
    for mode in ("base", "heap", "printf"):
        out = subprocess.run([sys.executable, "-c", child, mode], capture_output=True, text=True,
                             timeout=120)
        print("  child", (out.stdout + out.stderr).strip()[-600:])


def expandable_child() -> int:
    """In a child started with expandable segments: train, report, estimate, purge."""
    import torch

    print("allocator settings:", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    model, opt, _ = train(200)
    ns = {"torch": torch, "model": model, "opt": opt}
    del model, opt
    report(ns, "expandable segments: report after training")
    dump_snapshot(pointers(*[v for v in ns.values() if not isinstance(v, type(torch))]),
                  "expandable segments: blocks")
    estimate_then_purge(ns, "expandable segments: estimate, then purge --all")
    return 0


def main() -> int:
    try:
        import torch
    except ImportError:
        print("no torch")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to probe")
        return 0
    if "--expandable-child" in sys.argv:
        return expandable_child()
    settings()
    step("before CUDA")
    torch.zeros(1, device="cuda")
    step("context only")
    after_init()
    a = torch.ones(64, 64, device="cuda")
    (a @ a).sum().item()
    step("after one matmul")
    del a
    model, opt, last = train()
    step(f"after 300 Adam steps (loss {last:.3f})")
    ns = {"torch": torch, "model": model, "opt": opt}
    del model, opt
    known = pointers(ns["model"], ns["opt"])
    dump_snapshot(known, "after training: blocks (named = a parameter, grad or state)")
    out = os.environ.get("OUT")
    feed(os.path.join(out, "allocator_feed.json") if out else None, known)
    report(ns, "report after training")
    # a CUDA graph's private pool
    static_in = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            (static_in @ static_in).relu()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = (static_in @ static_in).relu() * 2
    graph.replay()
    ns.update(graph=graph, static_in=static_in, static_out=static_out)
    del graph, static_in, static_out
    dump_snapshot(pointers(ns["model"], ns["opt"], ns["static_in"], ns["static_out"]),
                  "with a CUDA graph: blocks")
    report(ns, "report with a CUDA graph")
    estimate_then_purge(ns, "with the graph alive: estimate, then purge --all")
    report(ns, "report after the purge (the graph is still alive)")
    ns.clear()
    ns["torch"] = torch
    estimate_then_purge(ns, "graph deleted: estimate, then a bare purge")
    section("after clearing workspaces and the cache by hand")
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    step("floor")
    context_checks()
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--expandable-child"],
                         capture_output=True, text=True, timeout=300, env=env)
    section("child with expandable segments")
    print(out.stdout[-12000:], out.stderr[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
