"""Every byte has a name, on a real GPU: framework internals after a training loop.

A tiny GPT (written here: embeddings, causal self-attention, MLP, layer norms)
trains for 300 Adam steps in a real IPython shell. Then:

* ``%gpumem``'s unattributed bytes (allocated, reached by no name) are under 1 %
  of what torch has allocated: the cuBLAS/cuBLASLt workspaces and the other
  internals are holders of their own, each with a label and a purge flag;
* the reconciliation line's rest is itemised (the CUDA context's thread stacks
  from its limits, and what is left), its parts add up to the rest, and none of
  them is said to be freed by a purge;
* ``--dry-run`` predicts, within 2 MiB, what the purge then frees (NVML's figure
  for this process), for a bare ``%gpumem purge`` (hidden holders and caches:
  the workspaces and the allocator's cache) and for ``%gpumem purge --all``.

Figures are printed (run with ``-s``) for benchmarks/RESULTS.md.
Run on the GPU machine: ``python -m pytest -q -s tests/gpu/test_internals_gpu.py``.
"""
from __future__ import annotations

import os
import textwrap
import time

import pytest

from gpu_setup import GPT_STEP, cuda_torch

torch = cuda_torch()

from conftest import run  # noqa: E402

from gpu_floor import empty_caches_after_each_test, process_bytes  # noqa: E402,F401

from benchmarks.tiny_gpt import GPT_SOURCE  # noqa: E402

MiB = 1 << 20
SLACK = 2 * MiB
STEPS = 300

TRAIN = """
import torch
import torch.nn.functional as F

""" + GPT_SOURCE + f"""
torch.manual_seed(0)
model = GPT().cuda()
opt = torch.optim.Adam(model.parameters(), lr=3e-4)
for step in range({STEPS}):
    batch = torch.randint(0, 512, (16, 129), device="cuda")
""" + textwrap.indent(GPT_STEP, "    ") + """\
torch.cuda.synchronize()
final = loss.item()
"""


@pytest.fixture
def trained(ip):
    start = time.perf_counter()
    if os.environ.get("GPUMEM_DIAG"):   # the allocation stacks, for _unnamed_blocks
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    torch.cuda.synchronize()
    # what the process held before this shell's first cell (an earlier test's leftovers in
    # the same process): no name of this shell can reach it
    ip.user_ns_hidden["_allocated_before"] = ip.user_ns["_allocated_before"] = \
        torch.cuda.memory_allocated(0)
    run(ip, TRAIN)
    print(f"\n{STEPS} Adam steps in {time.perf_counter() - start:.1f} s, loss "
          f"{ip.user_ns['final']:.3f}")
    return ip


def _snapshot(ip):
    snap = ip.run_line_magic("gpumem", "--device cuda:0 -o")
    print(repr(snap))
    return snap


def test_unattributed_under_one_percent_and_internals_labelled(trained):
    snap = _snapshot(trained)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated(0)
    unattributed = snap.unattributed["cuda:0"]
    assert unattributed is not None
    earlier = trained.user_ns["_allocated_before"]
    print(f"allocated {allocated / MiB:.1f} MiB, unattributed {unattributed / MiB:.2f} MiB "
          f"({100 * unattributed / allocated:.2f} %), of which allocated before this shell's "
          f"first cell {earlier / MiB:.2f} MiB")
    if unattributed - earlier >= 0.01 * (allocated - earlier):
        _unnamed_blocks(snap)
    assert unattributed - earlier < 0.01 * (allocated - earlier), repr(snap)
    internals = snap.to_json()["internals"]
    assert internals, "after training there are internals (workspaces, the allocator's cache)"
    for item in internals:
        assert isinstance(item["label"], str) and item["label"], item
        assert isinstance(item["freed_by_purge"], bool), item
        assert item["kind"] in ("allocated", "cached", "outside"), item
    labels = {i["label"] for i in internals if i["device"] == "cuda:0"}
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces") and not hasattr(
            torch._C, "_cuda_getCublasWorkspaceSize"):
        # torch 2.11 keeps its workspaces (one per handle and stream): they are found
        assert any(label.startswith("cuBLAS workspace") for label in labels), labels
    text = repr(snap)
    lines = text.splitlines()
    assert any(line.startswith("framework internal") for line in lines)
    assert lines.index(next(x for x in lines if x.startswith("framework internal"))) > \
        lines.index(next(x for x in lines if x.startswith("holder")))


def _unnamed_blocks(snap) -> None:
    """Print each active block of 1 MiB or more that neither a workspace of the report nor
    a live tensor's storage lies in, with its allocation stack where history was kept
    (``GPUMEM_DIAG=1``): what the unattributed bytes are."""
    import gc  # noqa: PLC0415 - a diagnosis, printed on failure only

    spans = [(b[0], b[0] + b[1]) for i in snap.internals for b in (i.blocks or ())]
    for o in gc.get_objects():
        if type(o) is torch.Tensor or type(o) is torch.nn.Parameter:
            try:
                st = o.untyped_storage()
                if st.device.type == "cuda" and st.nbytes():
                    spans.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
            except Exception:  # noqa: BLE001 - a tensor without a plain storage
                pass
    data = torch.cuda.memory._snapshot()
    for seg in data["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "active_allocated" or b["size"] < MiB:
                continue
            a = b["address"]
            if any(lo <= a < hi for lo, hi in spans):
                continue
            frames = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}"
                      for f in b.get("frames", ())[:14]]
            print(f"UNNAMED block {b['size'] / MiB:.2f} MiB requested "
                  f"{b.get('requested_size', 0) / MiB:.2f} MiB stream {seg.get('stream')} "
                  f"pool {seg.get('segment_pool_id')} segment {seg['total_size'] / MiB:.1f} MiB\n    "
                  + "\n    ".join(frames))


def test_the_rest_is_itemised(trained):
    from jupyter_gpumem.backends.cuda_context import context_limits

    snap = _snapshot(trained)
    device = next(d for d in snap.devices if d.id == "cuda:0")
    rest = device.non_framework
    assert rest is not None and rest > 0
    parts = {i.label: i for i in snap.internals_of("cuda:0", ("outside",))}
    print("rest", rest / MiB, {k: (v.nbytes or 0) / MiB for k, v in parts.items()})
    limits = context_limits(0)
    assert limits is not None, "torch has a context on cuda:0: the driver tells its limits"
    props = torch.cuda.get_device_properties(0)
    stacks = parts["CUDA context: thread stacks"]
    assert stacks.nbytes == limits["stack"] * props.multi_processor_count * \
        props.max_threads_per_multi_processor
    remainder = parts["kernel images, library handles and the driver's own"]
    assert remainder.nbytes > 0
    assert sum(p.nbytes or 0 for p in parts.values()) == rest
    assert not any(p.freed_by_purge for p in parts.values())
    assert any(line.startswith("  rest: ") and "no purge inside the process returns" in line
               for line in repr(snap).splitlines())


def _dry_then_purge(ip, args: str) -> tuple[int, int, object]:
    dry = ip.run_line_magic("gpumem", f"purge {args} --dry-run --device cuda:0 -o")
    print(repr(dry))
    result = ip.run_line_magic("gpumem", f"purge {args} --device cuda:0 -o")
    print(repr(result))
    change = next(c for c in result.changes if c.device == "cuda:0")
    assert change.measure == "process (NVML)", change
    return dry.predicted["cuda:0"], change.freed, result


def test_dry_run_predicts_a_bare_purge(trained):
    # the case: a bare purge frees the workspaces and the cache, and the dry run
    # said 1.3 MiB of the 66 MiB it freed
    _snapshot(trained)
    predicted, freed, _ = _dry_then_purge(trained, "")
    print(f"bare purge: predicted {predicted / MiB:.1f} MiB, freed {freed / MiB:.1f} MiB")
    assert freed > 32 * MiB, "a bare purge gives the workspaces and the cache back"
    assert abs(predicted - freed) <= SLACK
    for name in ("model", "opt", "loss"):
        assert name in trained.user_ns, "a bare purge touches no user name"


def test_dry_run_predicts_purge_all(trained):
    _snapshot(trained)
    before = process_bytes()
    predicted, freed, result = _dry_then_purge(trained, "--all")
    print(f"purge --all: predicted {predicted / MiB:.1f} MiB, freed {freed / MiB:.1f} MiB, "
          f"process {before / MiB:.1f} -> {process_bytes() / MiB:.1f} MiB")
    assert "model" not in trained.user_ns and "opt" not in trained.user_ns
    assert abs(predicted - freed) <= SLACK
    snap = _snapshot(trained)
    assert not [i for i in snap.internals_of("cuda:0") if i.freed_by_purge and (i.nbytes or 0) > SLACK]


def test_dry_run_predicts_purge_of_some_names(trained):
    # the optimizer state goes, the model stays: segments shared with the model stay too
    run(trained, "state = opt.state\ndel opt")
    _snapshot(trained)
    predicted, freed, _ = _dry_then_purge(trained, "state")
    print(f"purge state: predicted {predicted / MiB:.1f} MiB, freed {freed / MiB:.1f} MiB")
    assert "model" in trained.user_ns
    assert abs(predicted - freed) <= SLACK
