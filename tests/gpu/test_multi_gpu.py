"""Several GPUs: per-device attribution, CUDA_VISIBLE_DEVICES, DataParallel.

Needs two CUDA devices (skips with a reason otherwise). Figures are printed
(run with ``-s``) for benchmarks/RESULTS.md.

Run on a two-GPU machine: ``python -m pytest -q -s tests/gpu/test_multi_gpu.py``.
"""
from __future__ import annotations

import textwrap

import pytest

from jupyter_gpumem.backends import nvml

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA devices: runs on the two-GPU machine", allow_module_level=True)

from conftest import child_result, run  # noqa: E402

from gpu_floor import empty_caches_after_each_test  # noqa: E402,F401

MiB = 1 << 20
GiB = 1 << 30


def test_tensors_on_cuda_1_are_attributed_to_device_1(ip):
    run(ip, "import torch\na = torch.ones(1 << 28, device='cuda:0')\n"
            "b = torch.ones(1 << 27, device='cuda:1')\nboth = [a, b]")
    snap = ip.run_line_magic("gpumem", "--device cuda -o")
    assert [d.id for d in snap.devices][:2] == ["cuda:0", "cuda:1"]
    assert snap.holder("b").devices == {"cuda:1": GiB // 2}
    assert snap.holder("both").devices == {"cuda:0": GiB, "cuda:1": GiB // 2}
    d1 = next(d for d in snap.devices if d.id == "cuda:1")
    print(f"\ncuda:1 nvml index {d1.nvml_index} uuid {d1.uuid}: this process "
          f"{d1.used_process / MiB:.0f} MiB, torch allocated {d1.allocated / MiB:.0f} MiB, "
          f"attributed {d1.attributed / MiB:.0f} MiB")
    assert d1.attributed == GiB // 2 and d1.used_process >= GiB // 2
    result = ip.run_line_magic("gpumem", "purge a b both --device cuda -o")
    print(f"freed per device: {result.freed}")
    assert result.freed["cuda:1"] >= GiB // 2 - 2 * MiB


def test_cuda_visible_devices_reads_the_right_physical_gpu():
    code = textwrap.dedent("""
        import json, torch
        from jupyter_gpumem.backends import nvml
        from jupyter_gpumem.core import devices
        x = torch.ones(1 << 28, device='cuda')            # 1 GiB on cuda:0 = physical 1
        torch.cuda.synchronize()
        du = devices.read_devices_now('cuda')[0]
        print('RESULT ' + json.dumps({
            'id': du.id, 'nvml_index': du.nvml_index, 'uuid': du.uuid,
            'used_process': du.used_process,
            'physical0': nvml.process_used(0), 'physical1': nvml.process_used(1),
            'uuid1': nvml.read_device(1).uuid,
            'torch_uuid': str(torch.cuda.get_device_properties(0).uuid)}))
        """)
    out = child_result(code, set_env={"CUDA_VISIBLE_DEVICES": "1"}, any_exit=True)
    print(f"\nCUDA_VISIBLE_DEVICES=1: {out}")
    assert out["id"] == "cuda:0" and out["nvml_index"] == 1 and out["uuid"] == out["uuid1"]
    assert out["uuid1"].endswith(out["torch_uuid"])  # torch names the same physical GPU
    assert out["used_process"] >= GiB and out["physical1"] == out["used_process"]
    assert not out["physical0"]


def test_dataparallel_model_is_counted_once(ip):
    run(ip, "import torch\nm = torch.nn.Linear(8192, 8192).cuda()\n"
            "dp = torch.nn.DataParallel(m, device_ids=[0, 1])\n"
            "y = dp(torch.randn(64, 8192, device='cuda')).sum().item()")
    weights = (8192 * 8192 + 8192) * 4
    snap = ip.run_line_magic("gpumem", "--device cuda -o")
    for name in ("m", "dp"):
        h = snap.holder(name)
        assert (h.unique, h.shared) == (0, weights) and h.devices == {"cuda:0": weights}
    d0, d1 = snap.devices[0], snap.devices[1]
    print(f"\nDataParallel: attributed cuda:0 {d0.attributed / MiB:.0f} MiB, cuda:1 "
          f"{d1.attributed / MiB:.0f} MiB; unattributed {snap.unattributed}")
    assert d0.attributed == weights and d1.attributed == 0
    result = ip.run_line_magic("gpumem", "purge dp m --device cuda -o")
    print(f"freed per device: {result.freed}")
    assert result.freed["cuda:0"] >= weights - 2 * MiB
