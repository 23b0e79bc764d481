"""``%gpumem purge --orphans`` on real processes (NVML's lists faked: no GPU here): only
this user's orphans that a kernel left are ended, SIGTERM then SIGKILL, each step
reported; the device's used bytes come back; children, kernels, other users' processes
and orphans no kernel started are left alone."""
from __future__ import annotations

import os
import time

import psutil
import pytest
from IPython.core.error import UsageError

import gpu_holders as gh
from protocol_keys import check
from jupyter_gpumem.core.processes import orphans
from jupyter_gpumem.core import processes

KERNEL_ENV = {"JPY_PARENT_PID": "999999", "JPY_SESSION_NAME": "old.ipynb"}
MiB = gh.MiB


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def machine(fake_nvml):
    """A GPU shared by: an orphan a kernel left, an orphan no kernel started, this
    process's child, another user's process and this user's other one."""
    path, dev, started = fake_nvml
    left = gh.orphan(dev, env=KERNEL_ENV)
    stray = gh.orphan(dev)
    child = gh.hold(dev)
    theirs = gh.another_users()
    started += [left, stray, child.pid, theirs.pid]
    gh.write_nvml(path, [(left, 1200 * MiB), (stray, 400 * MiB), (child.pid, 300 * MiB),
                         (theirs.pid, 500 * MiB)], base=100 * MiB)
    return path, dev, started, {"left": left, "stray": stray, "child": child.pid,
                                "theirs": theirs.pid}


def test_dry_run_names_the_targets_and_ends_nothing(machine):
    path, dev, started, pids = machine
    result = orphans.purge_orphans(dry_run=True)
    assert [t.pid for t in result.targets] == [pids["left"]]
    assert result.targets[0].devices == {"cuda:0": 1200 * MiB}
    assert result.targets[0].path == "old.ipynb"
    assert result.left_alone == [{"pid": pids["stray"], "why": "orphan (parent gone; no kernel "
                                  "started it: left alone)"}]
    assert result.steps == [] and result.after == {}
    assert all(alive(p) for p in pids.values())
    assert str(result).startswith("dry run: would end 1 orphan(s) holding 1.2 GiB")
    check("OrphanPurge", result.to_json())
    check("OrphanPurge", result.to_json()["targets"][0], ("targets", "[]"))


def test_purge_ends_the_kernels_orphan_only_and_the_device_comes_back(machine):
    path, dev, started, pids = machine
    seen = []
    result = orphans.purge_orphans(on_step=seen.append)
    assert [(s.pid, s.signal, s.result) for s in result.steps] == [
        (pids["left"], "SIGTERM", "sent"), (pids["left"], "SIGTERM", "ended")]
    assert seen == result.steps and result.ended == [pids["left"]]
    assert not alive(pids["left"])
    assert all(alive(pids[k]) for k in ("stray", "child", "theirs"))
    assert result.before == {"cuda:0": (100 + 1200 + 400 + 300 + 500) * MiB}
    assert result.after == {"cuda:0": (100 + 400 + 300 + 500) * MiB}
    assert result.freed == {"cuda:0": 1200 * MiB}
    data = result.to_json()
    check("OrphanPurge", data)
    check("OrphanPurge", data["steps"][0], ("steps", "[]"))
    text = str(result)
    assert text.startswith("ended 1 of 1 orphan(s) holding 1.2 GiB")
    assert "SIGTERM  ended" in text and "left alone: pid" in text
    again = orphans.purge_orphans()
    assert again.targets == [] and str(again).startswith("no orphan of this user")


def test_one_that_ignores_sigterm_gets_sigkill_after_the_grace(fake_nvml):
    path, dev, started = fake_nvml
    stubborn = gh.orphan(dev, env=KERNEL_ENV, stubborn=True)
    started.append(stubborn)
    gh.write_nvml(path, [(stubborn, 1000 * MiB)])
    t0 = time.monotonic()
    result = orphans.purge_orphans(grace=0.5)
    assert [(s.signal, s.result) for s in result.steps] == [
        ("SIGTERM", "sent"), ("SIGKILL", "sent"), ("SIGKILL", "ended")]
    assert result.steps[1].seconds >= 0.5 and time.monotonic() - t0 < 10
    assert not alive(stubborn) and result.freed == {"cuda:0": 1000 * MiB}


def test_checked_again_before_each_signal(fake_nvml):
    """A target whose pid another process took, this process's parent, one adopted again."""
    path, dev, started = fake_nvml
    left = gh.orphan(dev, env=KERNEL_ENV)
    started.append(left)
    ctx = processes.context()
    t = orphans.Target(left, 1, started=psutil.Process(left).create_time())
    assert orphans.refusal(t, ctx)[0] is None
    t.started -= 5
    assert orphans.refusal(t, ctx)[0] == "gone (its pid is another process's now)"
    assert orphans.refusal(orphans.Target(os.getppid(), 1), ctx)[0] == \
        "this process or one of its parents"
    assert orphans.refusal(orphans.Target(os.getpid(), 1), ctx)[0] == \
        "this process or one of its parents"
    child = gh.hold(dev)
    started.append(child.pid)
    why = orphans.refusal(orphans.Target(child.pid, 1, started=psutil.Process(child.pid)
                                          .create_time()), ctx)[0]
    assert why == f"no longer an orphan (parent {os.getpid()})"
    theirs = gh.another_users()
    started.append(theirs.pid)
    assert orphans.refusal(orphans.Target(theirs.pid, 1), ctx)[0] == "another user's"
    assert alive(left) and alive(child.pid) and alive(theirs.pid)


def test_the_magic(ip, machine, capsys):
    path, dev, started, pids = machine
    result = ip.run_line_magic("gpumem", "purge --orphans --dry-run -o")
    assert [t.pid for t in result.targets] == [pids["left"]] and alive(pids["left"])
    for line, why in [("purge --orphans x", "give no names"),
                      ("purge --orphans --all", "give no names"),
                      ("purge --orphans --grace soon", "--grace must be a number"),
                      ("purge --orphans --grace 99", "between 0 and 60"),
                      ("purge x --grace 1", "--grace goes with --orphans"),
                      ("purge --orphans --device cpu", "--device cpu has none"),
                      ("--processes x", "give no names")]:
        with pytest.raises(UsageError, match=why):
            ip.run_line_magic("gpumem", line)
    assert alive(pids["left"])
    capsys.readouterr()
    result = ip.run_line_magic("gpumem", "purge --orphans --grace 2 -o")
    out = capsys.readouterr().out
    assert f"pid {pids['left']}  SIGTERM  sent" in out and "SIGTERM  ended" in out
    assert result.ended == [pids["left"]] and not alive(pids["left"])
    report = ip.run_line_magic("gpumem", "-o")
    line = report.processes[0].summary()
    assert "1 orphan 400.0 MiB · 1 child 300.0 MiB · 1 of another user 500.0 MiB" in line
    assert "purge --orphans" not in line


def test_the_comm_request(machine):
    from recording_comm import open_sidebar, send
    from IPython.core.interactiveshell import InteractiveShell
    from jupyter_gpumem.views import comm as gpucomm

    path, dev, started, pids = machine
    shell = InteractiveShell.instance()
    if "jupyter_gpumem" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "jupyter_gpumem")
    gpucomm.register_comm(shell)
    try:
        c = open_sidebar()
        for bad, why in [({"type": "purge_orphans", "dry_run": "yes"}, '"dry_run"'),
                         ({"type": "purge_orphans", "names": ["x"]}, "unknown field"),
                         ({"type": "purge_orphans", "pids": [pids["stray"]]}, "unknown field")]:
            (reply,) = send(c, bad)
            assert reply["type"] == "error" and why in reply["message"]
        (reply,) = send(c, {"type": "purge_orphans", "dry_run": True, "id": 3})
        assert reply["type"] == "orphans_result" and reply["reply_to"] == 3
        assert [t["pid"] for t in reply["result"]["targets"]] == [pids["left"]]
        assert alive(pids["left"])
        replies = send(c, {"type": "purge_orphans", "id": 4})
        assert replies[0]["type"] == "orphans_result"
        assert replies[0]["result"]["freed"] == {"cuda:0": 1200 * MiB}
        assert replies[1]["type"] == "snapshot"
        assert not alive(pids["left"]) and alive(pids["stray"])
    finally:
        gpucomm.unregister_comm(shell)
