"""How long the cluster snapshot (``%gpumem --cluster``) takes, beside Dask's own round trip.

A ``distributed.LocalCluster`` of 4 worker processes (one thread each) holds
1,000 futures of small torch tensors (host memory with ``--device cpu``, the
default; on the workers' GPU with ``--device cuda``, where the 4 workers share the
machine's GPU, each with a CUDA context of its own), held by the notebook's names:
a list of 996 futures, three single futures and a persisted bag.
Printed, measured side by side in one run (the two alternate, after a warm-up):

- the median time of :func:`jupyter_gpumem.cluster.snapshot` (target: under 300 ms);
- the median time of a plain ``Client.run(lambda: 0)`` round trip to all workers.

Run: ``python benchmarks/cluster.py [--workers 4] [--futures 1000] [--repeat 15] [--device cpu|cuda]``.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

TARGET_MS = 300.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--futures", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import dask.bag as db
    import torch
    from distributed import Client, LocalCluster, wait

    from jupyter_gpumem import cluster as jc

    # the futures' tensors live where the snapshot looks: the workers' GPU for cuda (all
    # workers of a LocalCluster share the machine's GPUs), host memory for cpu
    tensor_device = "cpu" if args.device in ("cpu", "auto") else args.device.replace("all", "cuda")
    started = time.perf_counter()
    with LocalCluster(n_workers=args.workers, processes=True, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        print(f"{args.workers}-worker LocalCluster up in {time.perf_counter() - started:.1f} s")
        n_list = args.futures - 4
        ns = {"client": client}
        make = functools.partial(torch.ones, device=tensor_device)
        ns["futs"] = client.map(make, [1024] * n_list, pure=False)
        for i in range(3):
            ns[f"f{i}"] = client.submit(make, 1 << 16, pure=False)
        ns["bag"] = db.from_sequence([1 << 16] * 4, npartitions=1).map(make).persist()
        wait(ns["futs"] + [ns["f0"], ns["f1"], ns["f2"]])
        wait(ns["bag"])

        snap = jc.snapshot(client, namespace=ns, device=args.device)   # warm-up
        client.run(lambda: 0)
        snap_times, run_times = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            snap = jc.snapshot(client, namespace=ns, device=args.device)
            snap_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            client.run(lambda: 0)
            run_times.append(time.perf_counter() - t)
        futs = snap.holder("futs")
        print(f"snapshot: {len(snap.workers)} workers answered, partial={snap.partial}, "
              f"{sum(len(w.keys) for w in snap.workers)} keys stored, "
              f"{sum(h.in_memory for h in snap.holders)} of them held by "
              f"{len(snap.holders)} names, {len(snap.unclaimed)} by no name; "
              f"{futs.summary() if futs else 'futs: not found'}")
        med_snap = statistics.median(snap_times) * 1000
        med_run = statistics.median(run_times) * 1000
        print(f"cluster snapshot, {args.futures} futures on {args.workers} workers: "
              f"median {med_snap:.1f} ms (min {min(snap_times) * 1000:.1f}, "
              f"max {max(snap_times) * 1000:.1f}; target < {TARGET_MS:.0f} ms)")
        print(f"Client.run(lambda: 0) round trip: median {med_run:.1f} ms "
              f"(min {min(run_times) * 1000:.1f}, max {max(run_times) * 1000:.1f})")
        print(f"ratio snapshot / round trip: {med_snap / med_run:.1f}x")
        ok = med_snap < TARGET_MS and not snap.partial and futs is not None \
            and futs.in_memory == n_list
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
