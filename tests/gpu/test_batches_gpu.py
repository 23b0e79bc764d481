"""A deep model and its Adam state on a real GPU: the scan's batches count each byte.

Its 48 parameters, their gradients and the Adam moments are taken in batches
(see ``Walker._take_batch``); Adam's step counters live on the CPU, so
``--device cuda:0`` must leave them out and ``--device cpu`` must show them.
Then the purge gives everything back: at most 2 MiB above the floor (measured
with every cache emptied, see gpu_floor.py).

Run on a GPU machine: ``python -m pytest -q -s tests/gpu/test_batches_gpu.py``.
"""
from __future__ import annotations

import gc
import time

from gpu_setup import MIB, cuda_torch

torch = cuda_torch()

from conftest import run  # noqa: E402

from gpu_floor import (  # noqa: E402,F401
    assert_at_most_floor, empty_caches_after_each_test, floor, process_bytes)

LAYERS, WIDTH = 24, 2048
PARAMS = LAYERS * (WIDTH * WIDTH + WIDTH) * 4     # bytes of the weights and biases


TRAIN = (f"model = torch.nn.Sequential(*[torch.nn.Linear({WIDTH}, {WIDTH}) "
         f"for _ in range({LAYERS})]).cuda()\n"
         "opt = torch.optim.Adam(model.parameters())\n"
         f"model(torch.ones(8, {WIDTH}, device='cuda')).sum().backward()\nopt.step()")


def test_deep_model_and_adam_state_counted_per_device_and_purged(ip):
    run(ip, "import torch\nkeep = torch.full((1024,), 7.0, device='cuda')")
    # a first round loads the kernels (CUDA keeps module code with the context): the
    # floor is measured after it, as GPU.md asks
    run(ip, TRAIN)
    ip.run_line_magic("gpumem", "purge model opt --device cuda:0")
    base = floor()
    run(ip, TRAIN)
    for _ in range(2):   # the second scan takes the remembered storages
        t0 = time.perf_counter()
        snap = ip.run_line_magic("gpumem", "--device cuda:0 -o")
        took = time.perf_counter() - t0
        model, opt = snap.holder("model"), snap.holder("opt")
        print(f"\ncuda:0: model {model.total / MIB:.1f} MiB ({model.tensors} storages), "
              f"opt {opt.total / MIB:.1f} MiB ({opt.tensors}), shared {opt.shared / MIB:.1f} MiB, "
              f"%gpumem {took * 1000:.1f} ms")
        assert (model.unique, model.shared) == (0, 2 * PARAMS)
        assert (opt.unique, opt.shared) == (2 * PARAMS, 2 * PARAMS)
        assert model.tensors == 4 * LAYERS and opt.tensors == 8 * LAYERS
    on_cpu = ip.run_line_magic("gpumem", "--device cpu -o").holder("opt")
    print(f"cpu: opt {on_cpu.total} bytes in {on_cpu.tensors} storages (Adam's steps)")
    assert on_cpu.tensors == 2 * LAYERS and on_cpu.total == 2 * LAYERS * 4
    leaked = process_bytes()
    ip.run_line_magic("gpumem", "purge model opt --device cuda:0")
    gc.collect()
    after = process_bytes()
    print(f"floor {base / MIB:.1f} MiB, with the model {(leaked - base) / MIB:.1f} MiB more, "
          f"after the purge {(after - base) / MIB:+.1f} MiB")
    assert leaked - base >= 4 * PARAMS
    assert_at_most_floor(after, base, "deep model and Adam after %gpumem purge")
    assert float(ip.user_ns["keep"][0]) == 7.0


def _largest_free_now(index: int = 0) -> int:
    """The largest inactive block, read from the allocator the long way."""
    return max((int(b["size"]) for seg in torch.cuda.memory_snapshot() if seg["device"] == index
                for b in seg["blocks"] if b["state"] == "inactive"), default=0)


def test_allocator_figures_are_torchs_and_follow_every_change(ip, monkeypatch):
    """One read of the allocator's counters gives torch's figures; the largest free
    block is walked for again only after the allocator changed."""
    from jupyter_gpumem.backends import active_backends

    run(ip, "import torch")
    backend = next(b for b in active_backends() if b.name == "torch")
    counts = lambda: (torch.cuda.memory_stats_as_nested_dict(0)["allocation"]["all"],  # noqa: E731
                      torch.cuda.memory_stats_as_nested_dict(0)["segment"]["all"])
    before = counts()
    torch.cuda.memory_snapshot()
    print("\nallocator counts before and after a memory_snapshot():", before, counts())
    walks = []
    real = torch.cuda.memory_snapshot
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: walks.append(1) or real())

    def check(what):
        walks.clear()
        u = backend.usage(["cuda:0"], detail=True)["cuda:0"]
        first = len(walks)
        again = backend.usage(["cuda:0"], detail=True)["cuda:0"]
        second = len(walks) - first
        assert (u.allocated, u.reserved, u.peak) == (
            torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0),
            torch.cuda.max_memory_allocated(0)), what
        assert u.largest_free_block == again.largest_free_block == _largest_free_now(), what
        assert second == 0, f"{what}: walked again with nothing changed"
        return first

    small = [torch.ones(1024, device="cuda") for _ in range(20000)]
    check("20,000 small tensors")
    del small[::2]                      # holes: the largest free block is one of them
    assert check("every other one freed") == 1
    big = torch.ones(1 << 28, device="cuda")
    assert check("a 1 GiB tensor") == 1
    del big
    assert check("the 1 GiB tensor freed") == 1
    torch.cuda.empty_cache()
    assert check("cache emptied") == 1
    times = {}
    for name, fn in (("counters + remembered block", lambda: backend.usage(["cuda:0"], detail=True)),
                     ("memory_allocated/reserved/max + memory_snapshot walk",
                      lambda: (torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0),
                               torch.cuda.max_memory_allocated(0), _largest_free_now()))):
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        times[name] = (time.perf_counter() - t0) / 20 * 1000
    print("per read with 10,000 small tensors alive:",
          ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()))
    del small
