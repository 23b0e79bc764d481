"""CuPy and JAX on a real GPU: blame, purge, pools, preallocation, tame.

CuPy runs in this process. JAX runs in child processes: it preallocates 75%
of the card on its first array, and ``%gpumem tame`` must come before
``import jax``. Figures are printed (run with ``-s``) for benchmarks/RESULTS.md.

Run on the GPU machine: ``python -m pytest -q -s tests/gpu/test_frameworks_gpu.py``.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jupyter_gpumem.backends import nvml

from gpu_floor import assert_at_most_floor, empty_caches_after_each_test, floor  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30


def _cuda_devices() -> int:
    if not nvml.available():
        return 0
    return len(nvml.visible_indices())


pytestmark = pytest.mark.skipif(_cuda_devices() == 0,
                                reason="no CUDA device (NVML finds none): runs on the GPU machine")


def process_used(ordinal: int = 0) -> int:
    return nvml.process_used(nvml.visible_indices()[ordinal])


# -- CuPy (in this process) -------------------------------------------------------
@pytest.fixture
def cupy():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"cupy cannot use the GPU: {exc}")
    # the context and the kernels these tests launch belong to the floor
    warm = cp.ones(1024, dtype=cp.float32)
    del warm
    cp.cuda.Device(0).synchronize()
    return cp


def test_cupy_pool_goes_back_to_the_floor(ip, cupy):
    from conftest import run

    base = floor()   # every cache emptied: torch's too, which the purge also empties
    run(ip, "import cupy as cp\nx = cp.ones(1 << 28, dtype=cp.float32)\ndel x")
    gc.collect()
    held = process_used()
    snap = ip.run_line_magic("gpumem", "--device cuda:0 -o")
    fw = next(f for f in snap.devices[0].frameworks if f.name == "cupy")
    print(f"\ncupy pool: floor {base / MiB:.1f} MiB, after del {held / MiB:.1f} MiB, "
          f"pool reserved {fw.reserved / MiB:.1f} MiB, allocated {fw.allocated / MiB:.1f} MiB")
    assert held - base >= GiB - 2 * MiB and fw.reserved - fw.allocated >= GiB
    assert "purge" in (fw.note or "")
    result = ip.run_line_magic("gpumem", "purge --device cuda:0 -o")
    after = process_used()
    print(f"cupy pool: after %gpumem purge {after / MiB:.1f} MiB; {result.messages}")
    assert_at_most_floor(after, base, "cupy pool after %gpumem purge")


def test_cupy_array_is_blamed_and_freed(ip, cupy):
    from conftest import run

    base = floor()
    run(ip, "import cupy as cp\nkeep = cp.ones(1024, dtype=cp.float32)\n"
            "x = cp.ones(1 << 28, dtype=cp.float32)\nv = x[:16]")
    snap = ip.run_line_magic("gpumem", "--device cuda:0 -o")
    h = snap.holder("x")
    print(f"\ncupy array: holder x {h.total / MiB:.1f} MiB shared with {h.shared_with}")
    assert h.total >= GiB and h.devices.keys() == {"cuda:0"} and "v" in h.shared_with
    ip.run_line_magic("gpumem", "purge x v --device cuda:0")
    after = process_used()
    print(f"cupy array: floor {base / MiB:.1f} MiB, after purge {after / MiB:.1f} MiB")
    assert "keep" in ip.user_ns
    assert_at_most_floor(after, base, "cupy array after %gpumem purge x v")


def test_a_cupy_watch_names_the_cupy_allocator_as_its_measure(ip, cupy):
    """A cell that allocates with CuPy alone is measured by CuPy's pool, and says so."""
    from conftest import run

    run(ip, "%%gpuwatch -o r --device cuda:0\nimport cupy as cp\ny = cp.ones(1 << 26, dtype=cp.float32)")
    d = ip.user_ns["r"].devices[0]
    print(f"\ncupy watch: measure {d.allocated_measure!r}, +{d.allocated_delta} bytes")
    assert "cupy" in d.allocated_measure and d.allocated_delta >= 1 << 28
    assert "cupy allocator" in ip.user_ns["r"].verbose_text()
    ip.run_line_magic("gpumem", "purge y --device cuda:0")


def test_cupy_and_torch_sharing_through_dlpack_count_once(ip, cupy):
    from conftest import run

    torch = pytest.importorskip("torch")
    run(ip, "import cupy as cp, torch\nx = cp.ones(1 << 26, dtype=cp.float32)\n"
            "t = torch.from_dlpack(x)")
    snap = ip.run_line_magic("gpumem", "--device cuda:0 -o")
    assert snap.holder("x").shared == snap.holder("t").shared >= 256 * MiB
    assert snap.devices[0].attributed < 300 * MiB  # one buffer, not two
    ip.run_line_magic("gpumem", "purge x t --device cuda:0")
    del torch


# -- JAX (each in a fresh process) ---------------------------------------------------
def jax_child(body: str, *, tame: bool = False, timeout: int = 300) -> dict:
    """Run ``body`` in a fresh interpreter with a shell and the extension; return its JSON."""
    pre = "ip.run_line_magic('gpumem', 'tame')\n" if tame else ""
    code = textwrap.dedent("""
        import gc, json, os, sys
        from IPython.core.interactiveshell import InteractiveShell
        from jupyter_gpumem.backends import nvml
        ip = InteractiveShell.instance()
        ip.run_line_magic('load_ext', 'jupyter_gpumem')
        def used():
            return nvml.process_used(nvml.visible_indices()[0])
        out = {'floor': used()}
        """) + pre + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(out))\n"
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        if "jax" in proc.stderr and "No module named" in proc.stderr:
            pytest.skip("jax is not installed here")
        raise AssertionError(proc.stdout[-4000:] + proc.stderr[-4000:])
    return json.loads(lines[-1][len("RESULT "):])


def _jax_gpu() -> None:
    try:
        import importlib.util

        if importlib.util.find_spec("jax") is None:
            pytest.skip("jax is not installed here")
    except Exception:  # noqa: BLE001
        pytest.skip("jax is not importable")


def test_jax_preallocation_is_reported_with_pool_and_in_use():
    _jax_gpu()
    out = jax_child("""
        import jax, jax.numpy as jnp
        ip.run_cell("import jax.numpy as jnp\\nx = jnp.ones(64)")
        x = ip.user_ns['x']; x.block_until_ready()
        snap = ip.run_line_magic('gpumem', '--device cuda:0 -o')
        fw = [f for f in snap.devices[0].frameworks if f.name == 'jax'][0]
        out.update(pool=fw.pool, allocated=fw.allocated, note=fw.note, used=used(),
                   messages=snap.messages, text=repr(snap))
        """)
    print(f"\njax preallocation: pool {out['pool'] / GiB:.1f} GiB, in use {out['allocated']} B, "
          f"process {out['used'] / GiB:.1f} GiB (floor {out['floor'] / MiB:.0f} MiB)\n{out['text']}")
    assert out["pool"] >= 10 * GiB and out["allocated"] < MiB
    assert "preallocated" in out["note"] and "%gpumem tame" in out["note"]
    assert any("preallocated" in m for m in out["messages"])
    assert "pool" in out["text"]


def test_tame_before_import_keeps_jax_near_its_floor():
    _jax_gpu()
    body = """
        import jax, jax.numpy as jnp
        x = jnp.ones(1 << 20); x.block_until_ready()   # 4 MiB
        out.update(used=used(), pool=jax.devices()[0].memory_stats().get('pool_bytes'))
        """
    tamed = jax_child(body, tame=True)
    print(f"\njax tamed: process {tamed['used'] / MiB:.0f} MiB, pool {tamed['pool']} B "
          f"(floor before import {tamed['floor'] / MiB:.0f} MiB)")
    assert tamed["used"] - tamed["floor"] < 2 * GiB  # a CUDA context and small blocks, not 75%
    assert (tamed["pool"] or 0) < GiB


def test_jax_array_is_blamed_and_freed():
    _jax_gpu()
    out = jax_child("""
        import jax
        ip.run_cell("import jax.numpy as jnp\\nkeep = jnp.ones(1024)\\n"
                    "x = jnp.ones(1 << 28, dtype=jnp.float32)")
        ip.user_ns['x'].block_until_ready()
        snap = ip.run_line_magic('gpumem', '--device cuda:0 -o')
        h = snap.holder('x')
        out.update(total=h.total, devices=h.devices)
        x_id = id(ip.user_ns['x'])
        before = jax.devices()[0].memory_stats()['bytes_in_use']
        result = ip.run_line_magic('gpumem', 'purge x --device cuda:0 -o')
        gc.collect()
        after = jax.devices()[0].memory_stats()['bytes_in_use']
        out.update(before=before, after=after, gone=x_id not in {id(a) for a in jax.live_arrays()},
                   keep='keep' in ip.user_ns, messages=result.messages)
        """, tame=True)
    print(f"\njax array: holder x {out['total'] / MiB:.0f} MiB on {out['devices']}; in use "
          f"{out['before'] / MiB:.0f} -> {out['after'] / MiB:.0f} MiB; {out['messages']}")
    assert out["total"] == GiB and list(out["devices"]) == ["cuda:0"]
    assert out["before"] - out["after"] >= GiB - MiB and out["gone"] and out["keep"]
