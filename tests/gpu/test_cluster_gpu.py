"""The cluster view on real GPUs: one Dask worker per GPU, torch tensors on each.

A ``dask_cuda.LocalCUDACluster`` where dask-cuda is installed, else a
``distributed.SpecCluster`` of two ``Nanny`` workers, each given its own
``CUDA_VISIBLE_DEVICES`` (so each worker's ``cuda:0`` is another physical GPU).
Needs two CUDA devices and distributed; skips with a reason otherwise. Figures are
printed (run with ``-s``) for benchmarks/RESULTS.md.

Run on the two-GPU machine, with the Dask wheels brought along
(``bash ../shared/gpu/wheels.sh dask distributed cloudpickle toolz partd fsspec msgpack
psutil sortedcontainers tblib zict locket pyyaml click packaging``):
``. .whl/prelude.sh && python3 -m pytest -q -s tests/gpu/test_cluster_gpu.py``.
"""
from __future__ import annotations

import gc
import importlib.util
import time

import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("distributed", reason="needs distributed (the [dask] extra)")
if torch.cuda.device_count() < 2:   # counts devices without creating a CUDA context
    pytest.skip("needs two CUDA devices: runs on the two-GPU machine", allow_module_level=True)

from distributed import Client, wait  # noqa: E402

from jupyter_gpumem import cluster as jc  # noqa: E402
from jupyter_gpumem.backends import nvml  # noqa: E402
from jupyter_gpumem.cluster import remote  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
SLACK = 2 * MiB
LIMIT = 10.0   # a first CUDA context on a worker takes a while


def _spec_cluster():
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {i: {"cls": Nanny, "options": {"nthreads": 1, "name": i,
                                             "env": {"CUDA_VISIBLE_DEVICES": str(i)}}}
               for i in range(2)}
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler,
                                                    "options": {"dashboard_address": None}},
                       silence_logs=50)


@pytest.fixture(scope="module")
def cluster():
    if importlib.util.find_spec("dask_cuda") is not None:
        from dask_cuda import LocalCUDACluster

        made = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,1", threads_per_worker=1,
                                dashboard_address=None, silence_logs=50)
        kind = "dask_cuda.LocalCUDACluster"
    else:
        made = _spec_cluster()
        kind = "SpecCluster of Nanny workers with CUDA_VISIBLE_DEVICES"
    print(f"\ncluster: {kind}")
    with made as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as c:
        c.wait_for_workers(2, timeout=120)
        yield c


@pytest.fixture(scope="module")
def by_gpu(client):
    """Physical GPU index -> the address of the worker that sees it as its cuda:0, after a
    warm-up (a CUDA context and the product's worker side on each)."""
    workers = sorted(client.scheduler_info()["workers"])
    ns = {"client": client,
          "warm": [client.submit(torch.ones, 1 << 20, device="cuda", workers=[w], pure=False)
                   for w in workers]}
    wait(ns["warm"])
    jc.purge(["warm"], client=client, namespace=ns, device="cuda", time_limit=LIMIT)
    snap = jc.snapshot(client, namespace={}, device="cuda", time_limit=LIMIT)
    out = {}
    for w in snap.workers:
        du = w.device("cuda:0")
        assert du is not None and du.nvml_index is not None, w
        out[du.nvml_index] = w.address
    assert sorted(out) == [0, 1], out
    return out


def floors(client) -> dict[str, int]:
    """Worker -> its GPU's NVML figure for the worker process, every cache emptied (once
    the workers dropped what earlier steps released)."""
    deadline = time.time() + 10
    while any(client.run(lambda dask_worker: len(dask_worker.data)).values()):
        assert time.time() < deadline, "the workers kept keys nobody holds"
        time.sleep(0.05)
    client.run(remote.worker_release)
    snap = jc.snapshot(client, namespace={}, device="cuda", time_limit=LIMIT)
    return {w.address: w.device("cuda:0").used_process for w in snap.workers}


def test_workers_map_to_their_physical_gpus(client, by_gpu):
    snap = jc.snapshot(client, namespace={}, device="cuda", time_limit=LIMIT)
    for index, address in by_gpu.items():
        du = snap.worker(address).device("cuda:0")
        reading = nvml.read_device(index)
        print(f"worker {address}: cuda:0 = physical GPU {index} ({du.uuid}), "
              f"this process {du.used_process / MiB:.0f} MiB")
        assert du.uuid == reading.uuid
        assert du.used_process and du.used_process > 100 * MiB   # its CUDA context


def test_tensors_on_both_gpus_are_blamed_per_name_and_gpu_and_purged(client, by_gpu):
    w0, w1 = by_gpu[0], by_gpu[1]
    floor = floors(client)
    ns = {"client": client}
    ns["a"] = client.submit(torch.ones, GiB, dtype=torch.uint8, device="cuda", workers=[w0],
                            pure=False)
    ns["b"] = client.submit(torch.ones, GiB // 2, dtype=torch.uint8, device="cuda",
                            workers=[w1], pure=False)
    ns["both"] = [ns["a"], ns["b"]]
    wait([ns["a"], ns["b"]])
    start = time.perf_counter()
    snap = jc.snapshot(client, namespace=ns, device="cuda", time_limit=LIMIT)
    print(f"\n{snap}\nsnapshot in {(time.perf_counter() - start) * 1000:.0f} ms")
    assert not snap.partial
    assert snap.holder("a").workers == {w0: {"cuda:0": GiB}}
    assert snap.holder("b").workers == {w1: {"cuda:0": GiB // 2}}
    both = snap.holder("both")
    assert both.workers == {w0: {"cuda:0": GiB}, w1: {"cuda:0": GiB // 2}}
    assert both.what == "list of 2 Futures" and both.summary().endswith("on 2 workers")
    for address, size in ((w0, GiB), (w1, GiB // 2)):
        du = snap.worker(address).device("cuda:0")
        assert du.attributed == size and du.allocated >= size
        assert du.used_process >= floor[address] + size
    result = jc.purge(["a", "b", "both"], client=client, namespace=ns, device="cuda",
                      time_limit=LIMIT)
    print(f"\n{result}")
    after = {w.address: w.device("cuda:0").used_process for w in
             jc.snapshot(client, namespace=ns, device="cuda", time_limit=LIMIT).workers}
    for address, size in ((w0, GiB), (w1, GiB // 2)):
        change = result.change(address, "cuda:0")
        print(f"worker {address}: floor {floor[address] / MiB:.1f} MiB, before "
              f"{change.before / MiB:.1f} MiB, after {change.after / MiB:.1f} MiB, freed "
              f"{change.freed / MiB:.1f} MiB")
        assert change.measure == "process (NVML)"
        assert change.freed >= size - SLACK
        assert after[address] - floor[address] <= SLACK
    assert result.dropped and not result.still_held
    assert not {"a", "b", "both"} & set(ns)


def test_cupy_arrays_on_a_worker_gpu(client, by_gpu):
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed")
    import cupy

    w1 = by_gpu[1]
    # CuPy's first array compiles and loads its fill kernel: part of the floor, not of the data
    warm = client.submit(cupy.ones, 1 << 20, dtype=cupy.uint8, workers=[w1], pure=False)
    wait(warm)
    del warm
    floor = floors(client)
    ns = {"client": client,
          "c": client.submit(cupy.ones, GiB // 4, dtype=cupy.uint8, workers=[w1], pure=False)}
    wait(ns["c"])
    snap = jc.snapshot(client, namespace=ns, device="cuda", time_limit=LIMIT)
    print(f"\n{snap}")
    assert snap.holder("c").workers == {w1: {"cuda:0": GiB // 4}}
    result = jc.purge(["c"], client=client, namespace=ns, device="cuda", time_limit=LIMIT)
    print(f"\n{result}")
    change = result.change(w1, "cuda:0")
    assert change.freed >= GiB // 4 - SLACK
    assert change.after - floor[w1] <= SLACK
    gc.collect()
