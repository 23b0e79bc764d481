"""The cost of a Prometheus scrape of ``GET api/gpumem/metrics`` on a real server with 20
kernels (target: at most 50 ms), side by side with the server's own cheapest API call.

A real ``jupyter server`` (tests/helpers/jupyter_harness.py: 127.0.0.1, a token) with N real
kernels, each holding the stand-in device file and listed in the fake NVML's
per-process list (tests/helpers/fake_nvml: one H200) with 1 GiB, plus an orphan and another
user's process: what a scrape reads (NVML's list, psutil for each process, each
kernel's descendants and resident memory) is real but for NVML itself. Timed over HTTP
from this process, medians of ``--scrapes``:

- ``status``: ``GET api/status`` (authenticated, reads nothing): the floor of a request;
- ``metrics, fresh reading``: a scrape more than a second after the last ask (a new
  pass over NVML and the process table);
- ``metrics, shared reading``: a scrape within the second (the sidebar polled, or
  another scrape: the reading is shared);
- ``kernels endpoint, fresh reading``: ``GET api/gpumem/kernels`` the same way;
- the pass itself, as the server times it (``jupyter_gpumem_reading_seconds``).

Each also with the server process's CPU time per request (user + system, from psutil):
the cost where other work shares the CPUs and the wall time waits for them.

Run: ``python benchmarks/metrics.py [--kernels 20] [--scrapes 15] [--idle 0]``; ``--check``
exits 1 when a fresh scrape's median is over 50 ms. ``--idle N`` starts N idle processes
besides (a shared machine's): judging the orphan, which no kernel's mark names, reads
every process of the machine, so a fresh reading grows with their number.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

import psutil  # noqa: E402

import gpu_holders as gh  # noqa: E402
from jupyter_harness import TOKEN, Server, run  # noqa: E402

from jupyter_gpumem.server.readings import CACHE_SECONDS  # noqa: E402

TARGET = 0.050


def timed(server: Server, path: str) -> tuple[float, bytes]:
    req = urllib.request.Request(server.base + path)
    req.add_header("Authorization", f"token {TOKEN}")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def median_ms(server: Server, path: str, n: int, fresh: bool) -> tuple[float, float]:
    """The median wall time of a request and the server's mean CPU time per request (ms)."""
    out, cpu = [], 0.0
    proc = psutil.Process(server.proc.pid)
    for _ in range(n):
        if fresh:
            time.sleep(CACHE_SECONDS + 0.05)
        else:
            timed(server, path)          # the reading made just now
        before = sum(proc.cpu_times()[:2])
        out.append(timed(server, path)[0])
        cpu += sum(proc.cpu_times()[:2]) - before
    return statistics.median(out) * 1000, cpu / n * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=20)
    ap.add_argument("--scrapes", type=int, default=15)
    ap.add_argument("--idle", type=int, default=0)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), fake_nvml=True)
        orphan = theirs = None
        idle = []
        try:
            idle = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.idle)]
            t0 = time.time()
            pids = []
            for i in range(args.kernels):
                (server.tmp / "root" / f"n{i}.ipynb").write_text(
                    (server.tmp / "root" / "a.ipynb").read_text())
                _, client = server.session(f"n{i}.ipynb")
                pids.append(int(run(client, f"import os; dev = open({server.dev!r}, 'rb'); "
                                            "print(os.getpid())")))
            orphan = gh.orphan(server.dev, env={"JPY_PARENT_PID": "1"})
            theirs = gh.another_users()
            gh.write_nvml(server.nvml, [(p, gh.GiB) for p in pids]
                          + [(orphan, 500 * gh.MiB), (theirs.pid, 300 * gh.MiB)])
            print(f"{args.kernels} kernels started in {time.time() - t0:.0f} s; "
                  f"{len(psutil.pids())} processes on the machine; "
                  f"medians of {args.scrapes} requests")
            _, text = timed(server, "api/gpumem/metrics")
            assert text.count(b"jupyter_gpumem_kernel_host_rss_bytes{") == args.kernels
            status = median_ms(server, "api/status", args.scrapes, fresh=False)
            fresh = median_ms(server, "api/gpumem/metrics", args.scrapes, fresh=True)
            shared = median_ms(server, "api/gpumem/metrics", args.scrapes, fresh=False)
            kernels = median_ms(server, "api/gpumem/kernels", args.scrapes, fresh=True)
            _, text = timed(server, "api/gpumem/metrics")
            line = next(x for x in text.decode().splitlines()
                        if x.startswith("jupyter_gpumem_reading_seconds "))
            reading = float(line.split()[1]) * 1000
            rows = [("status (the floor)", status), ("metrics, fresh reading", fresh),
                    ("metrics, shared reading", shared),
                    ("kernels endpoint, fresh reading", kernels)]
            print(f"  {'':<34} {'wall':>9} {'x status':>9} {'server CPU':>11}")
            for name, (ms, cpu) in rows:
                print(f"  {name:<34} {ms:6.1f} ms {ms / status[0]:8.1f}x {cpu:8.1f} ms")
            print(f"  {'the last pass, server-timed':<34} {reading:6.1f} ms")
            print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            fresh = min(fresh)
            print(f"target: a fresh scrape at most {TARGET * 1000:.0f} ms (wall, or the "
                  f"server's CPU where the machine is shared): "
                  f"{'met' if fresh <= TARGET * 1000 else 'NOT met'}")
        finally:
            for p in idle:
                p.kill()
                p.wait()
            if theirs is not None:
                theirs.kill()
            if orphan is not None:
                gh.end(orphan)
            server.stop()
    return 1 if args.check and fresh > TARGET * 1000 else 0


if __name__ == "__main__":
    sys.exit(main())
