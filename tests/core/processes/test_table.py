"""One reading's view of the process table (jupyter_gpumem/core/processes/table.py), on
real processes: its figures are psutil's to the bit, a kernel's descendants are the same
from Linux's per-task lists and from the whole table, and a reading that answers from one
table names every process on the GPU as a live reading does (NVML's lists faked:
tests/helpers/fake_nvml)."""
from __future__ import annotations

import os
import subprocess
import sys

import psutil

import gpu_holders as gh
from jupyter_gpumem.core import processes
from jupyter_gpumem.core.processes import table

NODE = ("import os, subprocess, sys, time\n"
        "code, depth, below = sys.argv[1], int(sys.argv[2]), ''\n"
        "if depth:\n"
        "    k = subprocess.Popen([sys.executable, '-c', code, code, str(depth - 1)],\n"
        "                         stdout=subprocess.PIPE, text=True)\n"
        "    below = k.stdout.readline().strip()\n"
        "print(os.getpid(), below, flush=True)\n"
        "time.sleep(120)\n")
LEAF = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(120)"


def _chain(depth: int):
    """A process, its child, that one's child, ... (``depth`` below it): the process and
    every pid of the chain from the top down."""
    top = subprocess.Popen([sys.executable, "-c", NODE, NODE, str(depth)],
                           stdout=subprocess.PIPE, text=True)
    return top, [int(x) for x in top.stdout.readline().split()]


def _end(top) -> None:
    for c in psutil.Process(top.pid).children(recursive=True):
        gh.end(c.pid)
    top.kill()
    top.wait()


def test_the_tables_figures_are_psutils(monkeypatch):
    top, chain = _chain(2)
    lone, _ = _chain(0)
    try:
        t = table.snapshot()
        for pid in [os.getpid(), lone.pid] + chain:
            proc = psutil.Process(pid)
            row = t.row(pid)
            assert (row.pid, row.ppid, row.started) == (pid, proc.ppid(), proc.create_time())
            assert row.name == proc.name()[:15]
        assert t.row(2**22 + 12345) is None and t.ppid(2**22 + 12345) is None
        want = sorted(p.pid for p in psutil.Process(top.pid).children(recursive=True))
        assert want == sorted(chain[1:]) and t.descendants(top.pid) == want  # per-task lists
        assert t.descendants(lone.pid) == []
        up = t.ancestors(chain[2])
        assert up[:3] == [chain[1], top.pid, os.getpid()]
        assert frozenset(up) == processes.context(me=chain[2]).ancestors     # read live
        assert processes.context(me=chain[2], table=t).ancestors == frozenset(up)

        whole = table.snapshot()
        rows = whole.rows()                                      # the whole table
        pids = [r.pid for r in rows]
        assert pids == sorted(pids) and set(pids) <= set(whole.pids())
        assert {top.pid, lone.pid, *chain} <= set(pids)
        assert whole.row(top.pid) is rows[pids.index(top.pid)]              # read once
        # a Linux built without the per-task children lists: the whole table's parents
        monkeypatch.setattr(table, "_children_files", lambda pid: None)
        assert whole.descendants(top.pid) == want and whole.descendants(lone.pid) == []
        assert whole.by_parent is not None
    finally:
        _end(top)
        _end(lone)


def test_environ_has_reads_the_raw_block():
    p = subprocess.Popen([sys.executable, "-c", LEAF], stdout=subprocess.PIPE, text=True,
                         env=gh.environ({"JPY_PARENT_PID": "4242", "ODD": "a=b c"}))
    int(p.stdout.readline())
    t = table.snapshot()
    try:
        assert t.environ_has(p.pid, "JPY_PARENT_PID", "4242") is True
        assert t.environ_has(p.pid, "ODD", "a=b c") is True
        assert t.environ_has(p.pid, "JPY_PARENT_PID", "424") is False
        assert t.environ_has(p.pid, "JPY_PARENT_PID", "42421") is False
        assert t.environ_has(p.pid, "PARENT_PID", "4242") is False
    finally:
        p.kill()
        p.wait()
    assert t.environ_has(p.pid, "JPY_PARENT_PID", "4242") is True     # once per table
    assert table.snapshot().environ_has(p.pid, "JPY_PARENT_PID", "4242") is False  # gone


def test_a_reading_from_one_table_names_every_process_as_a_live_reading(fake_nvml):
    path, dev, started = fake_nvml
    server = os.getpid()                       # this test stands for the Jupyter server
    kernel, kernel_child = gh.parent_of_holder(
        dev, env={"JPY_PARENT_PID": str(server), "JPY_SESSION_NAME": "a.ipynb"})
    listed, listed_child = gh.parent_of_holder(
        dev, env={"JPY_PARENT_PID": str(server), "JPY_SESSION_NAME": "work/b.ipynb"})
    # an orphan of a.ipynb's server with that kernel alive (it may have started it), one
    # with none behind it, one no kernel started, another user's, a child of the server
    maybe = gh.orphan(dev, env={"JPY_PARENT_PID": str(server), "JPY_SESSION_NAME": "a.ipynb"})
    left = gh.orphan(dev, env={"JPY_PARENT_PID": "999999", "JPY_SESSION_NAME": "old.ipynb"})
    stray = gh.orphan(dev)
    theirs = gh.another_users()
    mine = gh.hold(dev)
    no_file = gh.hold("/dev/null")
    started += [kernel.pid, kernel_child, listed.pid, listed_child, maybe, left, stray,
                theirs.pid, mine.pid, no_file.pid]
    MiB = gh.MiB
    gh.write_nvml(path, [(kernel.pid, 700 * MiB), (kernel_child, 900 * MiB),
                         (listed.pid, 100 * MiB), (listed_child, 200 * MiB),
                         (maybe, 300 * MiB), (left, 1200 * MiB), (stray, 400 * MiB),
                         (theirs.pid, 500 * MiB), (mine.pid, 250 * MiB),
                         (no_file.pid, 50 * MiB), (0, 60 * MiB)])
    kernels = {listed.pid: processes.KernelRef(listed.pid, "work/b.ipynb", "kid-b")}
    live = processes.context(me=server, kernels=kernels, server_pid=server)
    one = processes.context(me=server, kernels=kernels, server_pid=server,
                            table=table.snapshot())
    one.now = live.now
    [a] = processes.read([("cuda:0", 0)], live)
    [b] = processes.read([("cuda:0", 0)], one)
    assert b.to_json() == a.to_json()
    rel = {p.pid: (p.relation, p.purgeable) for p in b.processes}
    assert rel == {kernel.pid: ("kernel", False), kernel_child: ("kernel_child", False),
                   listed.pid: ("kernel", False), listed_child: ("kernel_child", False),
                   maybe: ("own", False), left: ("orphan", True), stray: ("orphan", False),
                   theirs.pid: ("other_user", False), mine.pid: ("child", False)}
    label = {p.pid: p.label for p in b.processes}
    assert label[maybe] == (f"parent gone; a kernel of a.ipynb (pid {kernel.pid}), which may "
                            "have started it, is alive: left alone")
    assert (b.hidden, b.hidden_bytes) == (2, 110 * MiB)             # pid 0, no GPU file
    # the two unmarked orphans with a server asked every process's environment about it
    asked = {(key, value) for _, key, value in one.table.environs}
    assert asked == {("JPY_PARENT_PID", str(server)), ("JPY_PARENT_PID", "999999")}
    assert {pid for pid, _, _ in one.table.environs} >= set(one.table.pids()) - {
        1, maybe, left}
