"""The cluster view on a real GPU: Dask workers holding torch tensors (and CuPy arrays).

Two forms:

- one GPU (the H200 machine): two ``Nanny`` worker processes share physical GPU 0
  (each with ``CUDA_VISIBLE_DEVICES=0`` and a CUDA context of its own), as many
  users run Dask on one workstation GPU. Each worker's device line must come from
  NVML's figure for that worker's pid, not the device total both share.
- two GPUs: a ``dask_cuda.LocalCUDACluster`` where dask-cuda is installed, else a
  ``distributed.SpecCluster`` of two ``Nanny`` workers, each given its own
  ``CUDA_VISIBLE_DEVICES`` (so each worker's ``cuda:0`` is another physical GPU);
  skipped with a reason on a machine of one GPU.

Needs distributed; figures are printed (run with ``-s``) for benchmarks/RESULTS.md.
Run on the GPU machine, with the Dask wheels brought along
(``bash ../shared/gpu/wheels.sh dask distributed cloudpickle toolz partd fsspec msgpack
psutil sortedcontainers tblib zict locket pyyaml click packaging``):
``. .whl/prelude.sh && python3 -m pytest -q -s tests/gpu/test_cluster_gpu.py``.
"""
from __future__ import annotations

import functools
import gc
import importlib.util
import time

import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("distributed", reason="needs distributed (the [dask] extra)")
if torch.cuda.device_count() < 1:   # counts devices without creating a CUDA context
    pytest.skip("needs a CUDA device", allow_module_level=True)

from distributed import Client, wait  # noqa: E402

from conftest import run, spawnable_main  # noqa: E402
from jupyter_gpumem import cluster as jc  # noqa: E402
from jupyter_gpumem.backends import nvml  # noqa: E402
from jupyter_gpumem.cluster import remote  # noqa: E402

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason="needs two CUDA devices: runs on the two-GPU machine")

MiB = 1 << 20
GiB = 1 << 30
SLACK = 2 * MiB
LIMIT = 10.0   # a first CUDA context on a worker takes a while


def _spec_cluster(gpus=(0, 1)):
    """A SpecCluster of one Nanny worker per entry of ``gpus``, named 0, 1, ..., each
    seeing that physical GPU as its cuda:0."""
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {i: {"cls": Nanny, "options": {"nthreads": 1, "name": i,
                                             "env": {"CUDA_VISIBLE_DEVICES": str(gpu)}}}
               for i, gpu in enumerate(gpus)}
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler,
                                                    "options": {"dashboard_address": None}},
                       silence_logs=50)


def _by_name(client) -> list[str]:
    info = client.scheduler_info()["workers"]
    return sorted(info, key=lambda a: str(info[a]["name"]))


def _warm(client, workers) -> None:
    """A CUDA context, the allocator and the product's worker side on each worker."""
    ns = {"warm": [client.submit(torch.ones, 1 << 20, device="cuda", workers=[w], pure=False)
                   for w in workers]}
    wait(ns["warm"])
    jc.purge(["warm"], client=client, namespace=ns, device="cuda", time_limit=LIMIT)


# -- one GPU, two worker processes sharing it ------------------------------------------------
@pytest.fixture(scope="module")
def shared():
    """(client, [w0, w1]): two workers on physical GPU 0, warmed up."""
    with spawnable_main():      # an IPython shell made earlier stands in for __main__
        made = _spec_cluster((0, 0))
    with made, Client(made) as client:
        client.wait_for_workers(2, timeout=120)
        workers = _by_name(client)
        _warm(client, workers)
        yield client, workers


on_gpu = functools.partial(torch.ones, dtype=torch.uint8, device="cuda")


def test_two_workers_on_one_gpu_are_blamed_and_purged_each_to_its_own_floor(ip, shared, capsys):
    """x (256 MiB) on w0, emb (4 x 64 MiB persisted) on w1, keep (32 MiB, unrelated) on
    w0: blamed per name and worker; each worker's line is its own process's NVML figure;
    ``%gpumem purge x emb --cluster`` brings each worker back to its floor (w0: plus
    keep) within 2 MiB, and keep survives."""
    import dask.bag as db

    client, (w0, w1) = shared
    floor = floors(client)
    ip.user_ns.update(client=client)
    ip.user_ns["x"] = client.submit(on_gpu, 256 * MiB, workers=[w0], pure=False)
    ip.user_ns["keep"] = client.submit(on_gpu, 32 * MiB, workers=[w0], pure=False)
    ip.user_ns["emb"] = db.from_sequence([64 * MiB] * 4, npartitions=4).map(on_gpu) \
        .persist(workers=[w1])
    wait([ip.user_ns["x"], ip.user_ns["keep"]])
    wait(ip.user_ns["emb"])
    capsys.readouterr()
    run(ip, "%gpumem --cluster --device cuda")
    report = capsys.readouterr().out
    snap = ip.run_line_magic("gpumem", "--cluster --device cuda -o")
    print(f"\n{report}")
    assert not snap.partial
    assert snap.holder("x").workers == {w0: {"cuda:0": 256 * MiB}}
    assert snap.holder("emb").workers == {w1: {"cuda:0": 256 * MiB}}
    assert snap.holder("keep").workers == {w0: {"cuda:0": 32 * MiB}}
    d0, d1 = (snap.worker(w).device("cuda:0") for w in (w0, w1))
    assert d0.nvml_index == d1.nvml_index and d0.uuid == d1.uuid      # one physical GPU
    for du, address, size in ((d0, w0, 288 * MiB), (d1, w1, 256 * MiB)):
        pid = snap.worker(address).pid
        mine = nvml.process_used(du.nvml_index, pid)    # read here, for that pid
        print(f"worker {address} pid {pid}: process {du.used_process / MiB:.1f} MiB "
              f"(NVML for its pid, read here: {mine / MiB:.1f} MiB), device used {du.used_all / MiB:.1f} MiB, "
              f"torch allocated {du.allocated / MiB:.1f} MiB, floor {floor[address] / MiB:.1f} MiB")
        assert du.attributed == size and du.allocated >= size
        assert du.used_process - floor[address] >= size
        assert du.used_process < du.used_all          # its own figure, not the device's
        assert abs(du.used_process - mine) <= SLACK
    assert snap.worker(w0).pid != snap.worker(w1).pid
    assert abs(d0.used_process - d1.used_process) >= 16 * MiB   # 288 vs 256 MiB on each floor

    capsys.readouterr()
    run(ip, "%gpumem purge x emb --cluster --device cuda")
    print(capsys.readouterr().out)
    assert "x" not in ip.user_ns and "emb" not in ip.user_ns and "keep" in ip.user_ns
    after = {w.address: w.device("cuda:0").used_process for w in
             jc.snapshot(client, namespace={"keep": ip.user_ns["keep"]}, device="cuda",
                         time_limit=LIMIT).workers}
    for address, kept in ((w0, 32 * MiB), (w1, 0)):
        print(f"worker {address}: floor {floor[address] / MiB:.1f} MiB + kept {kept / MiB:.0f} MiB,"
              f" after purge {after[address] / MiB:.1f} MiB")
        assert abs(after[address] - (floor[address] + kept)) <= SLACK
    keep = ip.user_ns["keep"]
    assert keep.status == "finished" and keep.key in stored(client)[w0]
    del ip.user_ns["keep"], keep
    ip.user_ns.pop("client")


def test_cupy_arrays_on_a_worker_that_shares_the_gpu(shared):
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed")
    client, (w0, w1) = shared
    _cupy_on(client, w1)


def stored(client) -> dict:
    """Worker -> the keys its data store holds (read by the test, not the product)."""
    return client.run(lambda dask_worker: list(dask_worker.data))


# -- two GPUs, one worker each -----------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    if importlib.util.find_spec("dask_cuda") is not None:
        from dask_cuda import LocalCUDACluster

        with spawnable_main():
            made = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,1", threads_per_worker=1,
                                    dashboard_address=None, silence_logs=50)
        kind = "dask_cuda.LocalCUDACluster"
    else:
        with spawnable_main():
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
    _warm(client, _by_name(client))
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


@two_gpus
def test_workers_map_to_their_physical_gpus(client, by_gpu):
    snap = jc.snapshot(client, namespace={}, device="cuda", time_limit=LIMIT)
    for index, address in by_gpu.items():
        du = snap.worker(address).device("cuda:0")
        reading = nvml.read_device(index)
        print(f"worker {address}: cuda:0 = physical GPU {index} ({du.uuid}), "
              f"this process {du.used_process / MiB:.0f} MiB")
        assert du.uuid == reading.uuid
        assert du.used_process and du.used_process > 100 * MiB   # its CUDA context


@two_gpus
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


@two_gpus
def test_cupy_arrays_on_a_worker_gpu(client, by_gpu):
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed")
    _cupy_on(client, by_gpu[1])


def _cupy_on(client, worker) -> None:
    """A 256 MiB CuPy array on ``worker``: blamed there and purged back to its floor."""
    import cupy

    # CuPy's first array compiles and loads its fill kernel: part of the floor, not of the data
    warm = client.submit(cupy.ones, 1 << 20, dtype=cupy.uint8, workers=[worker], pure=False)
    wait(warm)
    del warm
    floor = floors(client)
    ns = {"client": client,
          "c": client.submit(cupy.ones, GiB // 4, dtype=cupy.uint8, workers=[worker], pure=False)}
    wait(ns["c"])
    snap = jc.snapshot(client, namespace=ns, device="cuda", time_limit=LIMIT)
    print(f"\n{snap}")
    assert snap.holder("c").workers == {worker: {"cuda:0": GiB // 4}}
    result = jc.purge(["c"], client=client, namespace=ns, device="cuda", time_limit=LIMIT)
    print(f"\n{result}")
    change = result.change(worker, "cuda:0")
    assert change.freed >= GiB // 4 - SLACK
    assert change.after - floor[worker] <= SLACK
    gc.collect()
