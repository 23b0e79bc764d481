"""A deep model and its Adam state on a real GPU: the scan's batches count each byte.

Its 48 parameters, their gradients and the Adam moments are taken in batches
(see ``Walker._take_batch``); Adam's step counters live on the CPU, so
``--device cuda:0`` must leave them out and ``--device cpu`` must show them.
Then the purge gives everything back: within 2 MiB of the floor.

Run on a GPU machine: ``python -m pytest -q -s tests/gpu/test_batches_gpu.py``.
"""
from __future__ import annotations

import gc
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: these tests run on the GPU machine", allow_module_level=True)

from conftest import run  # noqa: E402

from test_table_gpu import _process_bytes  # noqa: E402

MIB = 1 << 20
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
    gc.collect()
    floor = _process_bytes()
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
    leaked = _process_bytes()
    ip.run_line_magic("gpumem", "purge model opt --device cuda:0")
    gc.collect()
    after = _process_bytes()
    print(f"floor {floor / MIB:.1f} MiB, with the model {(leaked - floor) / MIB:.1f} MiB more, "
          f"after the purge {(after - floor) / MIB:+.1f} MiB")
    assert leaked - floor >= 4 * PARAMS
    assert abs(after - floor) <= 2 * MIB
    assert float(ip.user_ns["keep"][0]) == 7.0
