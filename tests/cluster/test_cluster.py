"""The cluster view on a real ``distributed.LocalCluster``: two worker processes of one
thread each, holding host torch tensors (``--device cpu``: host tensors count as the
device "cpu", so all of it runs without an accelerator).

Figures are printed (``-s``). The cluster is shared by the module (it takes seconds
to start); each test makes its own keys and leaves the workers as it found them.
"""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("distributed")

import dask.array as da  # noqa: E402
import dask.bag as db  # noqa: E402
from distributed import Client, wait  # noqa: E402

from conftest import run  # noqa: E402
from jupyter_gpumem import cluster as jc  # noqa: E402
from jupyter_gpumem.cluster import remote  # noqa: E402
from conftest import stored  # noqa: E402 - and conftest's cluster, client, workers

MiB = 1 << 20
LIMIT = 3.0


@pytest.fixture
def ns(client):
    """A notebook namespace with the client; whatever the test left is released after."""
    ns = {"client": client}
    yield ns
    ns.clear()
    gc.collect()
    deadline = time.time() + 5
    while client.futures and time.time() < deadline:
        time.sleep(0.05)


def host_rss(client, address) -> int:
    """The worker process's resident set, after collecting garbage and trimming the heap."""
    def measure():
        gc.collect()
        remote.trim_host_memory()
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return client.run(measure, workers=[address])[address]


def test_future_and_persisted_collections_are_blamed_on_their_names(cluster, client, workers,
                                                                   ns):
    w0, w1 = workers
    ns["x"] = client.submit(torch.ones, 256 * MiB, dtype=torch.uint8, workers=[w0], pure=False)
    ns["emb"] = db.from_sequence([4 * MiB] * 4, npartitions=4).map(torch.ones).persist(
        workers=[w1])
    ns["arr"] = da.random.random((4, 1 << 18), chunks=(1, 1 << 18)).persist()
    ns["cfg"] = {"runs": [ns["x"]]}
    ns["later"] = (lambda fut: (lambda: fut))(ns["x"])
    ns["cluster"] = cluster      # its scheduler lives in this process: Dask's, not a holder
    wait([ns["x"], ns["emb"], ns["arr"]])
    snap = jc.snapshot(client, namespace=ns, device="cpu", time_limit=LIMIT)
    print(f"\n{snap}\nsnapshot in {snap.seconds * 1000:.0f} ms")
    assert not snap.partial and {w.address for w in snap.workers} == {w0, w1}
    x = snap.holder("x")
    assert x.what == "Future" and x.workers == {w0: {"cpu": 256 * MiB}}
    assert x.summary() == f"x (Future) 256.0 MiB on worker {w0} cpu"
    assert x.shared == 256 * MiB and sorted(x.shared_with) == ["cfg", "later"]
    assert snap.holder("later").what == "closure of 1 Future"
    assert snap.holder("cluster") is None and snap.holder("client") is None
    cfg = snap.holder("cfg")
    assert cfg.largest_path == "cfg['runs'][0]" and cfg.total == 256 * MiB
    emb = snap.holder("emb")
    # a bag partition of float32 ones: 4 Mi elements, 16 MiB each, all on w1
    assert emb.what == "persisted dask.bag, 4 chunks"
    assert emb.workers == {w1: {"cpu": 4 * 16 * MiB}} and emb.unique == 64 * MiB
    arr = snap.holder("arr")
    placed = client.who_has(ns["arr"])
    per_worker = {}
    for key, where in placed.items():
        per_worker[where[0]] = per_worker.get(where[0], 0) + 2 * MiB   # 1 x 2^18 float64
    assert arr.what == "persisted dask.array, 4 chunks" and arr.keys == arr.in_memory == 4
    assert {w: d["cpu"] for w, d in arr.workers.items()} == per_worker
    assert arr.summary().endswith("on 2 workers") == (len(per_worker) == 2)
    assert snap.held_bytes == 256 * MiB + 64 * MiB + 8 * MiB   # x, cfg and later share one
    w0_report = snap.worker(w0)
    assert w0_report.device("cpu").attributed >= 256 * MiB
    assert w0_report.device("cpu").used_process >= 256 * MiB   # the worker's own RSS
    data = json.loads(json.dumps(snap.to_json()))
    assert data["schema"] == "jupyter_gpumem.cluster/1"
    assert {h["name"] for h in data["holders"]} == {"x", "emb", "arr", "cfg", "later"}
    html = snap._repr_html_()
    assert "persisted dask.bag, 4 chunks" in html and w0 in html


def test_purge_frees_on_the_workers_and_leaves_the_rest(client, workers, ns):
    w0, _ = workers
    floor = host_rss(client, w0)
    ns["x"] = client.submit(torch.ones, 256 * MiB, dtype=torch.uint8, workers=[w0], pure=False)
    ns["emb"] = db.from_sequence([2 * MiB] * 2, npartitions=2).map(torch.ones).persist()
    ns["keep"] = client.submit(torch.arange, 1000, workers=[w0], pure=False)
    wait([ns["x"], ns["emb"], ns["keep"]])
    x_key, keep = ns["x"].key, ns["keep"]
    emb_keys = {f.key for f in distributed.futures_of(ns["emb"])}
    held = host_rss(client, w0)
    dry = jc.purge(["x", "emb"], client=client, namespace=ns, device="cpu", dry_run=True)
    assert dry.dry_run and "x" in ns and x_key in stored(client)[w0]
    assert dry.predicted[w0]["cpu"] >= 256 * MiB
    result = jc.purge(["x", "emb"], client=client, namespace=ns, device="cpu", time_limit=LIMIT)
    after = host_rss(client, w0)
    print(f"\n{result}\nw0 RSS floor {floor / MiB:.1f} MiB, holding {held / MiB:.1f} MiB, "
          f"after purge {after / MiB:.1f} MiB; purge took {result.seconds * 1000:.0f} ms, "
          f"waited {result.waited * 1000:.0f} ms for the workers")
    assert result.removed == ["x", "emb"] and "x" not in ns and "emb" not in ns
    assert result.dropped and result.keys == 3
    everywhere = {k for keys in stored(client).values() for k in keys}
    assert x_key not in everywhere and not emb_keys & everywhere
    change = result.change(w0, "cpu")
    assert change.measure == "process RSS" and change.freed >= 250 * MiB
    assert after - floor <= 10 * MiB
    # the future no name was asked for is intact
    assert keep.key in stored(client)[w0] and ns["keep"] is keep
    assert keep.result().sum().item() == sum(range(1000))
    data = json.loads(json.dumps(result.to_json()))
    assert data["schema"] == "jupyter_gpumem.cluster_purge/1" and data["removed"] == ["x", "emb"]
    assert "process RSS" in result._repr_html_()


def test_a_key_another_client_wants_is_listed_and_not_freed(cluster, client, workers, ns):
    w0, _ = workers
    ns["x"] = client.submit(torch.ones, 16 * MiB, dtype=torch.uint8, workers=[w0], pure=False)
    wait(ns["x"])
    key = ns["x"].key
    with Client(cluster.scheduler_address, set_as_default=False) as other:
        # another notebook picks the data up, then it is unpublished: that client keeps it
        client.publish_dataset(handover=ns["x"])
        theirs = other.get_dataset("handover")
        client.unpublish_dataset("handover")
        deadline = time.time() + 2
        while other.id not in client.run_on_scheduler(
                remote.scheduler_records, client_id=client.id)["tasks"][key]["wants"]:
            assert time.time() < deadline, "the scheduler never heard of the second client"
            time.sleep(0.02)
        result = jc.purge(["x"], client=client, namespace=ns, device="cpu", time_limit=LIMIT)
        print(f"\n{result}")
        assert "x" not in ns and key in stored(client)[w0]
        assert result.predicted == {}
        assert [s.by for s in result.still_held] == [f"another client {other.id}"]
        assert result.still_held[0].nbytes == 16 * MiB and result.still_held[0].worker == w0
        assert any(other.id in m and "not freed" in m for m in result.messages)
        snap = jc.snapshot(client, namespace=ns, device="cpu")
        listed = [u for u in snap.unclaimed if u.key == key]
        assert listed and listed[0].held_by == [f"another client {other.id}"]
        assert listed[0].devices == {"cpu": 16 * MiB} and listed[0].worker == w0
        del theirs


def test_published_dataset_and_another_name_keep_their_keys(client, workers, ns):
    w0, _ = workers
    ns["x"] = client.submit(torch.ones, 4 * MiB, dtype=torch.uint8, workers=[w0], pure=False)
    ns["y"] = ns["x"]
    ns["p"] = client.submit(torch.ones, 2 * MiB, dtype=torch.uint8, workers=[w0], pure=False)
    wait([ns["x"], ns["p"]])
    client.publish_dataset(shared_p=ns["p"])
    try:
        result = jc.purge(["x", "p"], client=client, namespace=ns, device="cpu")
        print(f"\n{result}")
        by = {s.by for s in result.still_held}
        assert by == {"y", "published dataset 'shared_p'"}
        assert any(m.startswith("y still holds 4.0 MiB") and "purge y too" in m
                   for m in result.messages)
        assert ns["y"].key in stored(client)[w0]
    finally:
        client.unpublish_dataset("shared_p")


def test_no_such_name_deletes_nothing(client, ns):
    ns["x"] = client.submit(torch.ones, 10, pure=False)
    ns["plain"] = torch.ones(3)
    with pytest.raises(jc.ClusterPurgeError, match="nothing was deleted"):
        jc.purge(["x", "nope"], client=client, namespace=ns, device="cpu")
    with pytest.raises(jc.ClusterPurgeError, match="'plain' holds no key"):
        jc.purge(["plain"], client=client, namespace=ns, device="cpu")
    assert "x" in ns and "plain" in ns


def test_purge_all_takes_every_name_with_keys(client, ns):
    ns["a"] = client.submit(torch.ones, 10, pure=False)
    ns["futs"] = client.map(torch.ones, [5, 6, 7], pure=False)
    ns["plain"] = torch.ones(3)
    wait([ns["a"]] + ns["futs"])
    result = jc.purge(all=True, client=client, namespace=ns, device="cpu")
    assert sorted(result.removed) == ["a", "futs"] and result.keys == 4
    assert "plain" in ns and "client" in ns
    assert not jc.snapshot(client, namespace=ns, device="cpu").holders


def test_output_history_is_a_holder_and_goes_with_its_name(ip, client, workers):
    w0, _ = workers
    ip.user_ns["client"] = client
    ip.user_ns["torch"] = torch
    run(ip, f"f = client.submit(torch.ones, 1 << 20, workers=[{w0!r}], pure=False)")
    out = run(ip, "f").execution_count
    wait(ip.user_ns["f"])
    key = ip.user_ns["f"].key
    snap = jc.snapshot(client, shell=ip, device="cpu")
    hidden = snap.holder(f"Out[{out}]")
    assert hidden is not None and hidden.hidden and hidden.shared_with == ["f"]
    result = jc.purge(["f"], client=client, shell=ip, device="cpu")
    print(f"\n{result}")
    assert "f" in result.removed and f"Out[{out}]" in result.removed
    assert out not in ip.user_ns["Out"] and result.dropped
    assert key not in stored(client)[w0]


def test_names_walked_on_the_main_thread_cluster_asked_from_another(client, workers, ns):
    w0, _ = workers
    ns["x"] = client.submit(torch.ones, 1000, workers=[w0], pure=False)
    wait(ns["x"])
    names = jc.held_names(client, namespace=ns)
    assert [(n.name, n.what) for n in names.names] == [("x", "Future")]
    out = {}
    thread = threading.Thread(target=lambda: out.update(
        snap=jc.snapshot(client, names=names, device="cpu")))
    thread.start()
    thread.join(10)
    assert out["snap"].holder("x").workers == {w0: {"cpu": 4000}}


def test_stopped_worker_gives_a_partial_answer_in_time(client, workers, ns):
    w0, w1 = workers
    ns["x"] = client.submit(torch.ones, 1000, workers=[w1], pure=False)
    wait(ns["x"])
    pid = client.run(os.getpid, workers=[w0])[w0]
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.perf_counter()
        snap = jc.snapshot(client, namespace=ns, device="cpu", time_limit=1.0)
        took = time.perf_counter() - start
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"\n{snap}\nanswered in {took:.2f} s")
    assert took < 2.5
    assert snap.partial and list(snap.missing) == [w0] and "did not answer" in snap.missing[w0]
    assert [w.address for w in snap.workers] == [w1]
    assert snap.holder("x").workers == {w1: {"cpu": 4000}}
    assert any(w0 in m for m in snap.messages)


def test_protocol_objects_are_counted_by_buffer():
    """A library the product has no backend for, read through the array protocols."""
    class DeviceBuffer:
        def __init__(self, ptr, n, offset=0):
            self.ptr, self.n, self.offset = ptr, n, offset

        @property
        def __cuda_array_interface__(self):
            return {"data": (self.ptr + self.offset, False), "shape": (self.n,),
                    "typestr": "<f4", "strides": None, "version": 3}

        def __dlpack_device__(self):
            return (2, 1)

    class HostBuffer:
        def __dlpack_device__(self):
            return (1, 0)

    values = {"a": DeviceBuffer(1 << 40, 1024), "alias": DeviceBuffer(1 << 40, 1024),
              "pair": [DeviceBuffer(1 << 41, 256), 3], "host": HostBuffer(), "n": 5}
    sizes = {"a": 1, "alias": 1, "pair": 1, "host": 999, "n": 28}
    out = remote.report_values(values, sizes, device="cuda:1")
    keys = out["keys"]
    assert keys["a"]["devices"] == {"cuda:1": 4096} == keys["alias"]["devices"]
    assert keys["a"]["shared"] == keys["alias"]["shared"] and len(out["storages"]) == 1
    assert keys["pair"]["devices"] == {"cuda:1": 1024}
    assert out["tracked"] == {"cuda:1": 4096 + 1024}
    out = remote.report_values(values, sizes, device="cpu")
    assert out["keys"]["n"]["devices"] == {"cpu": 28}    # Dask's sizeof where nothing else
    assert out["keys"]["a"]["devices"] == {}


def test_nothing_of_dask_is_imported_unless_the_user_did():
    code = ("import sys, jupyter_gpumem, jupyter_gpumem.cluster as c\n"
            "assert c.find_client({}) is None and not c.dask_imported()\n"
            "try:\n    c.snapshot(namespace={})\nexcept c.ClusterError as e:\n    print(e)\n"
            "assert not any(m.split('.')[0] in ('dask', 'distributed') for m in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Dask is not in use" in out.stdout


def test_killed_worker_gives_an_answer_not_a_hang(client, workers, ns):
    """Last: the nanny restarts the killed worker, at a new address."""
    w0, w1 = workers
    ns["lost"] = client.submit(torch.ones, 1000, workers=[w0], pure=False)
    ns["x"] = client.submit(torch.ones, 1000, workers=[w1], pure=False)
    wait([ns["lost"], ns["x"]])
    pid = client.run(os.getpid, workers=[w0])[w0]
    os.kill(pid, signal.SIGKILL)
    start = time.perf_counter()
    snap = jc.snapshot(client, namespace=ns, device="cpu", time_limit=1.0)
    took = time.perf_counter() - start
    print(f"\n{snap}\nanswered in {took:.2f} s")
    assert took < 2.5
    assert w0 not in {w.address for w in snap.workers} and w1 in {w.address for w in snap.workers}
    if w0 in snap.missing:            # the scheduler had not yet noticed the death
        assert snap.partial and "did not answer" in snap.missing[w0]
    assert snap.holder("x").workers == {w1: {"cpu": 4000}}
    lost = snap.holder("lost")         # restricted to the dead worker: not recomputed
    assert lost.in_memory == 0 and sum(lost.not_in_memory.values()) == 1
    assert "0 of 1 (1 " in repr(snap)


def test_without_dask_installed_the_line_names_the_package_and_extra():
    """Where distributed cannot be imported (hidden here as an uninstalled package is),
    --cluster's one line says which package to install and which extra brings it."""
    code = ("import sys\nsys.modules['distributed'] = None\n"
            "import jupyter_gpumem.cluster as c\n"
            "try:\n    c.snapshot(namespace={})\nexcept c.ClusterError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install distributed, the package's [dask] extra" in out.stdout, out.stdout
