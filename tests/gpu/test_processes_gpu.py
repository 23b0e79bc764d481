"""Every process on the GPU named, and the orphans of a restarted kernel purged, on a
real GPU with a real Jupyter server (tests/helpers/jupyter_harness.py) and real NVML.

Two kernels of one server hold 1 GiB and 2 GiB of CUDA tensors; a third kernel starts
two ``torch.multiprocessing`` children (spawn; each holds a CUDA tensor, 256 and 512
MiB, and leaves the kernel's process group as a worker pool's processes may do, so that
the restart's kill of that group spares them) and is restarted through the server's
kernel API: the children live on as orphans. The restarted kernel's report
(``%gpumem --processes -o``) must name each process rightly (the two kernels by their
notebooks, the orphans as orphans of the third notebook) with bytes matching NVML's
per-process figures, read here, within 2 MiB; the server's endpoint must show the same
figures; ``%gpumem purge --orphans`` must end both and bring the device's used bytes
back to what they were with only the two kernels on it, within 2 MiB. A second test
does the same through the live panel's Orphans section (its button, its question,
Cancel, then Yes) for one orphan a kernel left. Prints its figures (run with ``-s``). Skips, with the reason, without CUDA or the Jupyter server.
"""
from __future__ import annotations

import json
import time

from real_nvml import (
    SLACK, SPAWN_HEAD, WORKER, MiB, gpu_server_mark, nvml_figures, nvml_index,
    two_kernels_holding, wait_listed,
)

pytestmark = gpu_server_mark()

SPAWN = SPAWN_HEAD + (
    'ctx = mp.get_context("spawn")\n'
    'procs = [ctx.Process(target=gpumem_worker.hold, args=(n, f"{folder}/ready{{i}}"))\n'
    '         for i, n in enumerate(({a}, {b}))]\n'
    'for p in procs: p.start()\n'
    'deadline = time.time() + 120\n'
    'while not all(os.path.exists(f"{folder}/ready{{i}}") for i in range(2)):\n'
    '    assert time.time() < deadline, "the children did not allocate"\n'
    '    time.sleep(0.1)\n'
    'print(os.getpid(), *[p.pid for p in procs])')


def alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_restarted_kernels_orphans_named_and_purged(tmp_path):
    import psutil
    from jupyter_harness import Server, run

    t0 = time.time()
    (tmp_path / "gpumem_worker.py").write_text(WORKER)
    before_all, _ = nvml_figures()
    server = Server(tmp_path, fake_nvml=False)
    try:
        ((kid_a, a), (kid_b, b), (kid_c, c)), (pid_a, pid_b) = two_kernels_holding(server)
        wait_listed([pid_a, pid_b])
        time.sleep(1)
        used_live, procs = nvml_figures()
        print(f"\nbefore any kernel: used {before_all / MiB:.1f} MiB; with the two kernels: "
              f"used {used_live / MiB:.1f} MiB (a {procs[pid_a] / MiB:.1f} MiB, "
              f"b {procs[pid_b] / MiB:.1f} MiB)")

        pid_c, *children = map(int, run(c, SPAWN.format(folder=str(tmp_path), a=256 * MiB,
                                                        b=512 * MiB)).split())
        wait_listed(children)
        server.request("POST", f"api/kernels/{kid_c}/restart", {})
        deadline = time.time() + 60
        while psutil.pid_exists(pid_c) and time.time() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(pid_c), "the old kernel did not end"
        assert all(psutil.pid_exists(p) for p in children), "the children did not survive"
        print("after the restart: children", children, "parents",
              [psutil.Process(p).ppid() for p in children])
        c = server.connect(kid_c)
        used_full, procs = nvml_figures()

        out = run(c, "%load_ext jupyter_gpumem\nimport json, os\n"
                     "r = %gpumem --processes -o\nprint(r)\nprint(json.dumps(r.to_json()))")
        text, data = out.rsplit("\n", 2)[0], json.loads(out.strip().splitlines()[-1])
        print("the restarted kernel's report:\n" + text)
        dev = next(d for d in data["devices"] if d["nvml_index"] == nvml_index())
        named = {p["pid"]: p for p in dev["processes"]}
        want = {pid_a: ("kernel", "a.ipynb"), pid_b: ("kernel", "work/b.ipynb")}
        want.update({p: ("orphan", "c.ipynb") for p in children})
        for pid, (relation, path) in want.items():
            p = named[pid]
            assert (p["relation"], p["path"]) == (relation, path), p
            assert abs(p["bytes"] - procs[pid]) <= SLACK, (pid, p["bytes"], procs[pid])
            print(f"  pid {pid}: {p['label']}: report {p['bytes'] / MiB:.1f} MiB, "
                  f"NVML {procs[pid] / MiB:.1f} MiB")
        assert all(named[p]["purgeable"] for p in children)
        assert not named[pid_a]["purgeable"] and not named[pid_b]["purgeable"]

        ep = server.get("api/gpumem/kernels")
        by_id = {k["id"]: k for k in ep["kernels"]}
        for kid, pid in ((kid_a, pid_a), (kid_b, pid_b)):
            assert by_id[kid]["pid"] == pid
            assert abs(by_id[kid]["gpu_bytes"] - procs[pid]) <= SLACK
        assert not {p["pid"] for p in by_id[kid_c]["processes"]} & set(children)
        assert [k["id"] for k in ep["kernels"]][:2] == [kid_b, kid_a]
        orphans = {p["pid"]: p["bytes"] for p in ep["orphans"]}
        assert set(orphans) == set(children)
        assert all(abs(orphans[p] - procs[p]) <= SLACK for p in children)
        print("endpoint:", [(k["path"], k["pid"], k["gpu_bytes"]) for k in ep["kernels"]],
              "orphans", orphans)

        out = run(c, "r = %gpumem purge --orphans -o\nprint(r)")
        print("purge --orphans:\n" + out)
        assert not any(alive(p) for p in children)
        wait_listed(children, present=False)
        time.sleep(1)
        used_after, procs_after = nvml_figures()
        print(f"used: with the two kernels {used_live / MiB:.1f} MiB, with the orphans "
              f"{used_full / MiB:.1f} MiB, after the purge {used_after / MiB:.1f} MiB "
              f"(difference {(used_after - used_live) / MiB:+.1f} MiB); "
              f"{time.time() - t0:.1f} s in all")
        assert abs(used_after - used_live) <= SLACK
        assert pid_a in procs_after and pid_b in procs_after
        after = server.get("api/gpumem/kernels")
        assert after["orphans"] == []
    finally:
        for p in locals().get("children", []):
            try:
                psutil.Process(p).kill()
            except psutil.Error:
                pass
        server.stop()


CUDA_HOLD = ("import os, sys, time, torch\n"
             "x = torch.ones(int(sys.argv[1]), dtype=torch.uint8, device='cuda')\n"
             "torch.cuda.synchronize()\n"
             "print(os.getpid(), flush=True)\n"
             "time.sleep(float(sys.argv[2]))\n")


def test_the_panels_button_ends_a_kernels_orphan_after_its_question(ip):
    """The panel's Orphans section on the real GPU: an orphan a kernel left (its parent
    gone, a kernel's environment) holding 256 MiB is listed with NVML's bytes within
    2 MiB; Cancel ends nothing; the button and its Yes end it, and the device's used bytes
    come back to what they were before it, within 2 MiB."""
    import os
    import subprocess
    import sys

    import psutil
    from gpu_holders import ORPHAN
    from jupyter_gpumem.views import panel as panel_mod

    before, _ = nvml_figures()
    env = {**os.environ, "JPY_PARENT_PID": "999999", "JPY_SESSION_NAME": "old.ipynb"}
    out = subprocess.run([sys.executable, "-c", ORPHAN, CUDA_HOLD, str(256 * MiB), "300"],
                         stdout=subprocess.PIPE, text=True, env=env, check=True, timeout=120)
    pid = int(out.stdout.strip())
    try:
        deadline = time.time() + 10
        while psutil.Process(pid).ppid() not in (0, 1) and time.time() < deadline:
            time.sleep(0.05)
        wait_listed([pid])
        time.sleep(1)
        with_orphan, procs = nvml_figures()
        ip.run_cell("%gpumem panel", store_history=True)
        panel = panel_mod.current(ip)
        section = panel.orphan_section
        rows = {o["pid"]: o for o in section.rows()}
        print(f"\norphan {pid}: NVML {procs[pid] / MiB:.1f} MiB, panel "
              f"{rows.get(pid, {}).get('bytes', 0) / MiB:.1f} MiB; used before it "
              f"{before / MiB:.1f} MiB, with it {with_orphan / MiB:.1f} MiB")
        assert rows[pid]["purgeable"] and rows[pid]["path"] == "old.ipynb"
        assert abs(rows[pid]["bytes"] - procs[pid]) <= SLACK
        assert os.getpid() not in rows
        section.button.click()
        assert f"data-confirm-orphan='{pid}'" in section.question.text.value
        section.question.cancel.click()
        time.sleep(0.5)
        assert alive(pid), "Cancel ended the orphan"
        section.button.click()
        section.question.yes.click()
        assert not alive(pid)
        wait_listed([pid], present=False)
        time.sleep(1)
        after, _ = nvml_figures()
        print("the panel's result:", section.status.value)
        print(f"used after the panel's purge {after / MiB:.1f} MiB "
              f"(difference to before the orphan {(after - before) / MiB:+.1f} MiB)")
        assert f"data-step='{pid}'" in section.result.value
        assert abs(after - before) <= SLACK
    finally:
        panel_mod.close(ip)
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
