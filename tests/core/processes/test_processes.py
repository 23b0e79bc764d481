"""The other processes on a GPU, named: real processes (children, a kernel of the same
server and its child, orphans with and without a kernel behind them, another user's, this
user's other ones), and NVML's per-process lists faked (no GPU here:
tests/fake_nvml/pynvml.py, listing the real pids)."""
from __future__ import annotations

import os
import sys

import psutil

import gpu_holders as gh
from conftest import run
from protocol_keys import check
from jupyter_gpumem.backends import nvml
from jupyter_gpumem.core import processes


def test_every_relation_is_named_for_real_processes(fake_nvml):
    path, dev, started = fake_nvml
    server = os.getpid()                       # this test stands for the Jupyter server
    kernel, kernel_child = gh.parent_of_holder(dev)        # the kernel asking, with a child
    other_kernel, other_child = gh.parent_of_holder(
        dev, env={"JPY_PARENT_PID": str(server), "JPY_SESSION_NAME": "work/b.ipynb"})
    left = gh.orphan(dev, env={"JPY_PARENT_PID": "999999", "JPY_SESSION_NAME": "old.ipynb"})
    stray = gh.orphan(dev)                     # no kernel started it
    theirs = gh.another_users()
    mine = gh.hold(dev)                        # this user's, parent alive: the "server"
    no_file = gh.hold("/dev/null")             # this user's, holds no GPU file here
    started += [kernel.pid, kernel_child, other_kernel.pid, other_child, left, stray,
                theirs.pid, mine.pid, no_file.pid]
    MiB = gh.MiB
    gh.write_nvml(path, [(kernel.pid, 700 * MiB), (kernel_child, 900 * MiB),
                         (other_kernel.pid, 1000 * MiB), (other_child, 300 * MiB),
                         (left, 1200 * MiB), (stray, 400 * MiB), (theirs.pid, 500 * MiB),
                         (mine.pid, 200 * MiB), (no_file.pid, 50 * MiB), (0, 60 * MiB),
                         (4194000, 70 * MiB, "foreign")],
                  graphics=[(left, 1200 * MiB)])
    ctx = processes.context(me=kernel.pid, server_pid=server)
    [dp] = processes.read([("cuda:0", 0)], ctx)
    got = {p.pid: p for p in dp.processes}
    assert dp.this_process == 700 * MiB and kernel.pid not in got
    assert [p.pid for p in dp.processes] == [left, other_kernel.pid, kernel_child, theirs.pid,
                                             stray, other_child, mine.pid]
    rel = {pid: got[pid].relation for pid in got}
    assert rel == {kernel_child: "child", other_kernel.pid: "kernel",
                   other_child: "kernel_child", left: "orphan", stray: "orphan",
                   theirs.pid: "other_user", mine.pid: "own"}
    assert got[other_kernel.pid].path == "work/b.ipynb"
    assert got[other_child].path == "work/b.ipynb"
    assert got[left].path == "old.ipynb" and got[left].lists == ["compute", "graphics"]
    assert got[left].nbytes == 1200 * MiB                # in both lists: counted once
    assert [pid for pid in got if got[pid].purgeable] == [left]
    assert got[theirs.pid].user == "nobody" and got[kernel_child].user == "root"
    assert got[kernel_child].label == "this process's child (subprocess)"
    assert got[kernel_child].ppid == kernel.pid
    assert 0 <= got[left].seconds < 60 and "python" in got[left].command
    assert (dp.hidden, dp.hidden_bytes) == (3, 180 * MiB)   # pid 0, no such pid, no file
    line = dp.summary()
    assert line.startswith("  other processes on cuda:0: 2 orphans 1.6 GiB · 1 child 900.0 MiB"
                           " · 1 kernel work/b.ipynb 1000.0 MiB")
    assert "3 without a pid here 180.0 MiB" in line and "%gpumem purge --orphans" in line
    data = processes.ProcessReport([dp]).to_json()
    check("ProcessReport", data)
    check("ProcessReport", data["devices"][0], ("devices", "[]"))
    for p in data["devices"][0]["processes"]:
        check("ProcessReport", p, ("devices", "[]", "processes", "[]"))
    text = str(processes.ProcessReport([dp]))
    assert ("orphan: left by a kernel of old.ipynb (parent gone; no live kernel of it "
            "started before it)") in text
    assert "another user's (nobody)" in text and "3 process(es) NVML lists without a pid" in text


def test_this_kernels_children_multiprocessing_and_fork(fake_nvml, monkeypatch):
    """A multiprocessing child (spawn) and a forked one, of this very process."""
    import multiprocessing as mp
    path, dev, started = fake_nvml
    # an IPython shell of an earlier test put a __main__ without a spec in place
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    spawned = mp.get_context("spawn").Process(target=_hold_file, args=(dev,), daemon=True)
    spawned.start()
    forked = mp.get_context("fork").Process(target=_hold_file, args=(dev,), daemon=True)
    forked.start()
    started += [spawned.pid, forked.pid]
    _wait_open(spawned.pid, dev)
    _wait_open(forked.pid, dev)
    gh.write_nvml(path, [(spawned.pid, gh.GiB), (forked.pid, 2 * gh.GiB)])
    [dp] = processes.read([("cuda:0", 0)])
    labels = {p.pid: p.label for p in dp.processes}
    assert labels == {spawned.pid: "this process's child (multiprocessing)",
                      forked.pid: "this process's child (fork: DataLoader worker or "
                                  "multiprocessing)"}


def _hold_file(dev):
    import time
    f = open(dev, "rb")  # noqa: F841 - held until the process ends
    time.sleep(120)


def _wait_open(pid, dev):
    import time
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            if any(f.path == dev for f in psutil.Process(pid).open_files()):
                return
        except psutil.Error:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{pid} did not open {dev}")


def test_snapshot_carries_the_others_and_the_report_sums_them_up(ip, fake_nvml):
    path, dev, started = fake_nvml
    left = gh.orphan(dev, env={"JPY_PARENT_PID": "999999"})
    started.append(left)
    gh.write_nvml(path, [(left, gh.GiB), (0, 5 * gh.MiB)])
    snap = run(ip, "_s = %gpumem -o").result
    snap = ip.user_ns["_s"]
    check("Snapshot", snap.to_json())
    [dp] = snap.to_json()["processes"]
    check("ProcessReport", dp, ("devices", "[]"))
    assert dp["device"] == "cuda:0" and dp["hidden"] == 1 and dp["hidden_bytes"] == 5 * gh.MiB
    [p] = dp["processes"]
    assert (p["pid"], p["bytes"], p["relation"], p["purgeable"]) == (left, gh.GiB, "orphan", True)
    text = repr(snap).splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("cuda:0"))
    assert text[at + 1].startswith("  other processes on cuda:0: 1 orphan 1.0 GiB")
    assert "1 orphan 1.0 GiB" in snap._repr_html_()
    table = ip.run_line_magic("gpumem", "--processes -o")
    assert [(d.device, [p.pid for p in d.processes]) for d in table.devices] == [("cuda:0", [left])]
    assert table.to_json()["schema"] == "jupyter_gpumem.processes/1"


def test_no_other_process_no_line_no_key(ip, fake_nvml):
    snap = ip.run_line_magic("gpumem", "-o")
    assert "processes" not in snap.to_json()
    assert "other processes" not in repr(snap)


def test_no_gpu_and_no_nvml_say_so(ip, fake_nvml, monkeypatch, tmp_path):
    path, dev, started = fake_nvml
    path.write_text('{"devices": []}')
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    report = ip.run_line_magic("gpumem", "--processes -o")
    assert report.devices == [] and report.messages == ["no GPU: NVML sees no device"]
    monkeypatch.delenv("FAKE_NVML")
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    report = ip.run_line_magic("gpumem", "--processes -o")
    assert report.devices == []
    assert report.messages[0].startswith("NVML unavailable (NVMLError")
    assert "NVML unavailable" in repr(report)


SUBREAPER = """
import ctypes, os, subprocess, sys, time
libc = ctypes.CDLL(None)
libc.prctl(36, 1, 0, 0, 0)          # PR_SET_CHILD_SUBREAPER
if os.environ.get("REAPER_NAME"):
    libc.prctl(15, os.environ["REAPER_NAME"].encode(), 0, 0, 0)   # PR_SET_NAME
out = subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]],
                     stdout=subprocess.PIPE, text=True, check=True)
print(out.stdout.strip(), flush=True)
time.sleep(120)
"""


def _adopted(dev, started, name: str) -> int:
    """A process a kernel of a gone server started, adopted by a subreaper called
    ``name``: its pid."""
    import subprocess
    env = gh.environ({"JPY_PARENT_PID": "999999", "JPY_SESSION_NAME": "old.ipynb",
                      "REAPER_NAME": name})
    reaper = subprocess.Popen([sys.executable, "-c", SUBREAPER, gh.ORPHAN, gh.HOLD, dev, "120"],
                              stdout=subprocess.PIPE, text=True, env=env)
    started.append(reaper.pid)
    left = int(reaper.stdout.readline())
    started.append(left)
    assert psutil.Process(left).ppid() == reaper.pid      # adopted by the subreaper
    return left


def _read_adopted(fake_nvml, reaper: str):
    """A process :func:`_adopted` by ``reaper`` holding the device, as a kernel that is not
    the reaper's ancestor reads it: its pid and the one process NVML lists."""
    path, dev, started = fake_nvml
    left = _adopted(dev, started, reaper)
    gh.write_nvml(path, [(left, gh.GiB)])
    kernel = gh.hold(dev)                 # the kernel asking: not the subreaper's ancestor
    started.append(kernel.pid)
    [dp] = processes.read([("cuda:0", 0)], processes.context(me=kernel.pid, server_pid=4242))
    [p] = dp.processes
    return left, p


def test_an_orphan_a_known_subreaper_adopted_is_known_by_its_kernel_gone(fake_nvml):
    """Adopted by a subreaper known by its name (tini, here), a process a kernel of a gone
    server started is an orphan all the same."""
    left, p = _read_adopted(fake_nvml, "tini")
    assert (p.relation, p.purgeable, p.path) == ("orphan", True, "old.ipynb")
    assert processes.is_orphan(left)


def test_a_process_under_a_live_parent_of_unknown_name_is_no_orphan(fake_nvml):
    """A live parent that is no known reaper (a Python process here, which may have
    detached it or adopted it): in doubt, listed as what it is and never ended."""
    left, p = _read_adopted(fake_nvml, "")
    assert (p.relation, p.purgeable) == ("own", False), p.label
    assert not processes.is_orphan(left)
