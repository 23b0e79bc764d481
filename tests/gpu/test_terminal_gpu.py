"""``jupyter gpumem`` and ``GET api/gpumem/metrics`` on a real GPU, with a real Jupyter
server (tests/helpers/jupyter_harness.py) and real NVML.

Two kernels hold 1 GiB and 2 GiB of CUDA tensors; a third starts a
``torch.multiprocessing`` child (spawn; it holds 256 MiB and leaves the kernel's process
group) and is restarted through the server's kernel API: the child lives on as an
orphan. The terminal listing (``--json`` and text), the metrics and NVML's per-process
figures read here must agree to the MiB for each kernel and for the orphan; then
``jupyter gpumem orphans`` ends the orphan (NVML no longer lists it) and ``jupyter gpumem
shutdown work/b.ipynb --yes`` ends that kernel (NVML no longer lists it, the device's used
bytes drop by its bytes, within 2 MiB). Prints its figures (run with ``-s``). Skips, with
the reason, without CUDA, the Jupyter server or prometheus_client.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from real_nvml import (
    SLACK, SPAWN_HEAD, WORKER, MiB, gpu_server_mark, nvml_figures, nvml_index,
    two_kernels_holding, wait_listed,
)

pytestmark = gpu_server_mark()
pytest.importorskip("prometheus_client.parser", reason="prometheus_client is not installed (wheels.sh)")

SPAWN = SPAWN_HEAD + (
    'p = mp.get_context("spawn").Process(target=gpumem_worker.hold,\n'
    '                                    args=({n}, f"{folder}/ready"))\n'
    'p.start()\n'
    'deadline = time.time() + 120\n'
    'while not os.path.exists(f"{folder}/ready"):\n'
    '    assert time.time() < deadline, "the child did not allocate"\n'
    '    time.sleep(0.1)\n'
    'print(os.getpid(), p.pid)')


def cli(server, *args: str, timeout: float = 120):
    from jupyter_harness import ROOT
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(server.runtime),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "jupyter_gpumem.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_terminal_metrics_and_nvml_agree_to_the_mib(tmp_path):
    import psutil
    from jupyter_harness import Server, run, samples, scrape

    (tmp_path / "gpumem_worker.py").write_text(WORKER)
    server = Server(tmp_path, fake_nvml=False)
    child = None
    try:
        ((kid_a, a), (kid_b, b), (kid_c, c)), (pid_a, pid_b) = two_kernels_holding(server)
        pid_c, child = map(int, run(c, SPAWN.format(folder=str(tmp_path), n=256 * MiB)).split())
        wait_listed([pid_a, pid_b, child])
        server.request("POST", f"api/kernels/{kid_c}/restart", {})
        deadline = time.time() + 60
        while psutil.pid_exists(pid_c) and time.time() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(pid_c) and psutil.pid_exists(child)
        server.connect(kid_c)
        time.sleep(1)

        used, procs = nvml_figures()
        listing = json.loads(cli(server, "--json"))
        text = cli(server)
        got = samples(scrape(server)[1])
        print(f"\nNVML: used {used / MiB:.1f} MiB; a {procs[pid_a] / MiB:.1f} MiB, "
              f"b {procs[pid_b] / MiB:.1f} MiB, orphan {procs[child] / MiB:.1f} MiB")
        print(text)
        dev = next(d["device"] for d in listing["devices"] if d["nvml_index"] == nvml_index())
        by_path = {k["path"]: k for k in listing["kernels"]}
        gauge = {s["path"]: v for s, v in got["jupyter_gpumem_kernel_gpu_bytes"]
                 if s["device"] == dev}
        for path, pid in (("a.ipynb", pid_a), ("work/b.ipynb", pid_b)):
            k = by_path[path]
            assert k["pid"] == pid
            assert abs(k["gpu"][dev] - procs[pid]) < MiB, (path, k["gpu"], procs[pid])
            assert abs(gauge[path] - procs[pid]) < MiB, (path, gauge[path], procs[pid])
            print(f"  {path}: listing {k['gpu'][dev] / MiB:.1f} MiB, metrics "
                  f"{gauge[path] / MiB:.1f} MiB, NVML {procs[pid] / MiB:.1f} MiB")
        assert by_path["c.ipynb"]["gpu"].get(dev, 0) < procs[pid_a]   # the fresh kernel
        [orphan] = [p for p in listing["orphans"] if p["pid"] == child]
        assert orphan["path"] == "c.ipynb" and orphan["purgeable"]
        assert abs(orphan["bytes"] - procs[child]) < MiB
        [(labels, n)] = [x for x in got["jupyter_gpumem_orphan_bytes"] if x[0]["device"] == dev]
        assert abs(n - procs[child]) < MiB
        [(_, dev_used)] = [x for x in got["jupyter_gpumem_device_used_bytes"]
                           if x[0]["device"] == dev]
        assert abs(dev_used - used) < 64 * MiB       # read a moment apart
        assert "orphan: left by a kernel of c.ipynb (parent gone" in text     # and why

        dry = cli(server, "orphans", "--dry-run")
        assert str(child) in dry and psutil.pid_exists(child)
        done = cli(server, "orphans", "--grace", "5")
        print(done)
        assert f"pid {child}  SIGTERM  ended" in done or f"pid {child}  SIGKILL  ended" in done
        wait_listed([child], present=False)

        time.sleep(1)
        before, procs = nvml_figures()
        held = procs[pid_b]
        out = cli(server, "shutdown", "work/b.ipynb", "--yes")
        print(out)
        wait_listed([pid_b], present=False)
        time.sleep(1)
        after, procs_after = nvml_figures()
        # the other processes on the card (this machine may have a tenant's) move meanwhile:
        # what they gave back or took is counted out of the device's drop
        others = sum(n - procs_after.get(p, 0) for p, n in procs.items() if p != pid_b) \
            - sum(n for p, n in procs_after.items() if p not in procs)
        print(f"shutdown of work/b.ipynb: used {before / MiB:.1f} -> {after / MiB:.1f} MiB "
              f"(it held {held / MiB:.1f} MiB; the other processes {-others / MiB:+.1f} MiB)")
        assert pid_b not in procs_after
        # the card gets back a little more than NVML's figure for the process: the driver's
        # own for that context (5.6 MiB on an H100 with driver 580, twice), counted in no
        # process's figure
        assert 0 <= (before - after) - held - others <= SLACK + 6 * MiB
        child = None
    finally:
        if child is not None:
            try:
                psutil.Process(child).kill()
            except psutil.Error:
                pass
        server.stop()
