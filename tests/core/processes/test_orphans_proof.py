"""Ending a process takes a proof: a job a live kernel detached (a double fork, or under
a detached ``sh``, as ``tmux new -d`` leaves it) is listed as what it is and never ended;
once its kernel is really gone, the one that init adopted is a purgeable orphan. Real
kernels (jupyter_client), real processes; only NVML's process list is faked."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

import gpu_holders as gh
from jupyter_harness import run
from jupyter_gpumem.core.processes import orphans
from jupyter_gpumem.core import processes

pytest.importorskip("ipykernel")
ROOT = Path(__file__).resolve().parents[3]
MiB = gh.MiB

#: in the kernel: a job handed to init at once (the middle process exits), and a job
#: under a ``sh`` that init adopted (``; true`` keeps the sh as the job's parent)
DETACH = f"""
import subprocess, sys
dev = open({{dev!r}}, 'rb')
ORPHAN, HOLD = {gh.ORPHAN!r}, {gh.HOLD!r}
SH = ("import subprocess, sys\\n"
      "p = subprocess.Popen(['sh', '-c', sys.executable + ' -c \\"$0\\" \\"$1\\" 300; true',"
      " sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True, start_new_session=True)\\n"
      "print(p.stdout.readline().strip(), flush=True)\\n")
a = subprocess.run([sys.executable, '-c', ORPHAN, HOLD, {{dev!r}}, '300'],
                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
b = subprocess.run([sys.executable, '-c', SH, HOLD, {{dev!r}}],
                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
import os
print(os.getpid(), a, b)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait(cond, seconds: float = 15.0) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture
def kernel_env(monkeypatch, fake_nvml):
    """A kernel of "train.ipynb" started by this process (standing for its server, alive):
    the kernel sees this worktree and the fake NVML, and carries no kernel mark of this
    test process."""
    path, dev, started = fake_nvml
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), gh.FAKE_NVML_DIR, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("JUPYTER_GPUMEM_DEVICE_FILES", dev)
    monkeypatch.setenv("JPY_SESSION_NAME", "train.ipynb")
    monkeypatch.delenv(processes.KERNEL_MARK, raising=False)


def _start(load_extension: bool):
    """The kernel's manager, client and pid."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    if load_extension:
        run(kc, "%load_ext jupyter_gpumem", timeout=60)
    return km, kc, int(run(kc, "import os; print(os.getpid())", timeout=60))


def _detach(kc, fake_nvml) -> tuple[int, int]:
    """The two jobs the kernel ``kc`` detaches (:data:`DETACH`), each holding the device
    file and listed by NVML (700 and 300 MiB): their pids."""
    path, dev, started = fake_nvml
    _, a, b = map(int, run(kc, DETACH.format(dev=dev), timeout=60).split())
    assert a and b
    started += [a, b]
    assert _wait(lambda: psutil.Process(a).ppid() in (0, 1))      # handed to init
    sh = psutil.Process(b).ppid()
    started.append(sh)
    assert _wait(lambda: psutil.Process(sh).ppid() in (0, 1))     # the sh too
    assert psutil.Process(sh).name() == "sh"
    gh.write_nvml(path, [(a, 700 * MiB), (b, 300 * MiB)])
    return a, b


def _kill(km, kc, kpid) -> None:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    assert _wait(lambda: not alive(kpid))


def _relations(ctx=None) -> dict:
    [dp] = processes.read([("cuda:0", 0)], ctx or processes.context())
    return {p.pid: p for p in dp.processes}


def test_a_job_a_live_kernel_detached_is_never_ended(fake_nvml, kernel_env):
    km, kc, kpid = _start(load_extension=True)
    try:
        a, b = _detach(kc, fake_nvml)
        got = _relations()
        for pid in (a, b):
            assert got[pid].relation == "kernel_child" and not got[pid].purgeable
            assert got[pid].label == (f"detached by a kernel of train.ipynb (pid {kpid}), "
                                      "which is alive")
            assert got[pid].path == "train.ipynb"
        assert not processes.is_orphan(a) and not processes.is_orphan(b)
        # the kernel's own report says so too
        text = run(kc, "r = %gpumem --processes -o\nprint(r)", timeout=60)
        assert "detached by this kernel, which is alive" in text, text
        dry = orphans.purge_orphans(dry_run=True)
        assert dry.targets == []
        result = orphans.purge_orphans(grace=0.5)
        assert result.targets == [] and result.steps == []
        assert alive(a) and alive(b)
    finally:
        _kill(km, kc, kpid)

    # its kernel is gone: the job init adopted is an orphan; the one under a live sh is not
    got = _relations()
    assert (got[a].relation, got[a].purgeable) == ("orphan", True)
    assert got[a].label == f"orphan: left by a kernel of train.ipynb (pid {kpid}), which is gone"
    assert (got[b].relation, got[b].purgeable) == ("own", False)
    assert "now gone; its parent" in got[b].label and "sh is alive: left alone" in got[b].label
    result = orphans.purge_orphans(grace=1)
    assert [t.pid for t in result.targets] == [a] and result.ended == [a]
    assert not alive(a) and alive(b)


def test_without_the_mark_the_start_time_against_the_live_kernels_decides(fake_nvml,
                                                                           kernel_env):
    """A job detached before the extension was loaded carries no mark: while a kernel of
    its notebook that started before it is alive, it is left alone; once none is, it is an
    orphan that may be ended."""
    km, kc, kpid = _start(load_extension=False)
    try:
        a, b = _detach(kc, fake_nvml)
        got = _relations()
        assert (got[a].relation, got[a].purgeable) == ("own", False)
        assert got[a].label == (f"parent gone; a kernel of train.ipynb (pid {kpid}), which "
                                "may have started it, is alive: left alone")
        assert not got[b].purgeable
        result = orphans.purge_orphans(grace=0.5)
        assert result.targets == [] and alive(a) and alive(b)
    finally:
        _kill(km, kc, kpid)
    got = _relations()
    assert (got[a].relation, got[a].purgeable) == ("orphan", True)
    assert not got[b].purgeable                     # its parent sh is alive
    result = orphans.purge_orphans(grace=1)
    assert result.ended == [a] and alive(b)


def test_the_proof_is_asked_again_just_before_the_signal(fake_nvml, kernel_env):
    """A target planned while its kernel looked gone is refused once a live kernel with
    that pid and start time is what its mark names (here: the mark rewritten to name
    this live process)."""
    path, dev, started = fake_nvml
    mark = processes.mark(os.getpid(), processes.since_boot(psutil.Process()), "999999")
    left = gh.orphan(dev, env={processes.KERNEL_MARK: mark, "JPY_PARENT_PID": "999999"})
    started.append(left)
    ctx = processes.context()
    assert not processes.is_orphan(left, ctx)
    t = orphans.Target(left, 1, started=psutil.Process(left).create_time())
    why, _ = orphans.refusal(t, ctx)
    assert why is not None and why.startswith("no longer an orphan")
    # a mark whose start time is not the live process's: that kernel is gone
    gone = gh.orphan(dev, env={processes.KERNEL_MARK: processes.mark(os.getpid(), 12345.0,
                                                                      "999999"),
                               "JPY_PARENT_PID": "999999"})
    started.append(gone)
    assert processes.is_orphan(gone, ctx)
    assert alive(left) and alive(gone)


def test_a_mark_passed_on_through_another_server_names_no_kernel(fake_nvml):
    """A Jupyter server started from a kernel that loaded the extension passes that
    kernel's mark on; a process of that server's kernels carries it, but that kernel
    did not start it: the mark is not its proof (here the marked kernel is this live
    process: with the mark taken as proof, the orphan would be kept as detached)."""
    path, dev, started = fake_nvml
    mark = processes.mark(os.getpid(), processes.since_boot(psutil.Process()), "")
    left = gh.orphan(dev, env={processes.KERNEL_MARK: mark, "JPY_PARENT_PID": "999999",
                               "JPY_SESSION_NAME": "other.ipynb"})
    started.append(left)
    assert processes.marked_kernel(psutil.Process(left).environ()) is None
    gh.write_nvml(path, [(left, MiB)])
    [p] = _relations().values()
    assert (p.relation, p.purgeable) == ("orphan", True)    # the fallback proved it
    assert "no live kernel of it started before it" in p.label


def test_the_mark_is_put_at_load(ip):
    mark = processes.marked_kernel(dict(os.environ))
    assert mark is not None and mark[0] == os.getpid() and mark[2] is True
    assert abs(mark[1] - processes.since_boot(psutil.Process())) <= processes.SAME_START
    assert sys.modules["jupyter_gpumem.core.processes"].alive_as(*mark) is True


def test_a_step_of_the_wall_clock_leaves_a_live_kernel_alive(ip, monkeypatch):
    """The mark counts the kernel's start from boot: a step of the wall clock (NTP moved
    this machine's by 22 s during a test run, and psutil's start times and boot time with
    it) leaves the marked kernel alive. A wall-clock mark (an earlier version's) is still
    read as one; the new form is one such a reader cannot read (then no mark: never
    ended on a mark's word)."""
    import psutil._pslinux as linux

    mark = processes.marked_kernel(dict(os.environ))
    real = linux.boot_time
    monkeypatch.setattr(linux, "boot_time", lambda: real() + 22.0)   # the clock stepped
    assert psutil.boot_time() == real() + 22.0
    assert processes.alive_as(*mark) is True
    assert processes.alive_as(mark[0], mark[1] + 1.0) is False   # another start: gone
    # an earlier version's mark: pid, wall-clock start, server
    wall = psutil.Process().create_time()
    old = {processes.KERNEL_MARK: f"{os.getpid()}:{wall!r}:", processes.KERNEL_ENV: ""}
    assert processes.marked_kernel(old) == (os.getpid(), wall, False)
    assert processes.alive_as(os.getpid(), wall, False) is True
    text = processes.mark(os.getpid(), mark[1], "")
    with pytest.raises(ValueError):
        float(text.split(":", 2)[1])   # (how an earlier version reads the start)
