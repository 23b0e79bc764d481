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

TREE = ("import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[1]],\n"
        "                         stdout=subprocess.PIPE, text=True)\n"
        "        for _ in range(int(sys.argv[2]))]\n"
        "print(' '.join([k.stdout.readline().strip() for k in kids] + [str(__import__('os').getpid())]),\n"
        "      flush=True)\n"
        "time.sleep(120)\n")
LEAF = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(120)"


def _tree():
    """A process with two children, the first of which has a child of its own: the top
    process and every pid of the tree below it."""
    mid = ("import subprocess, sys, time\n"
           f"k = subprocess.Popen([sys.executable, '-c', {LEAF!r}], stdout=subprocess.PIPE, text=True)\n"
           "print(k.stdout.readline().strip(), __import__('os').getpid(), flush=True)\n"
           "time.sleep(120)\n")
    top = subprocess.Popen([sys.executable, "-c", TREE, mid, "1"], stdout=subprocess.PIPE,
                           text=True)
    below = [int(x) for x in top.stdout.readline().split()]
    leaf = subprocess.Popen([sys.executable, "-c", LEAF], stdout=subprocess.PIPE, text=True)
    int(leaf.stdout.readline())
    return top, leaf, below


def test_the_tables_figures_are_psutils():
    top, leaf, below = _tree()
    try:
        t = table.snapshot()
        for pid in [os.getpid(), top.pid, leaf.pid] + below:
            proc = psutil.Process(pid)
            row = t.row(pid)
            assert (row.pid, row.ppid, row.started) == (pid, proc.ppid(), proc.create_time())
            assert row.name == proc.name()[:15]
        assert t.row(2**22 + 12345) is None and t.ppid(2**22 + 12345) is None
        want = sorted(p.pid for p in psutil.Process(top.pid).children(recursive=True))
        assert len(want) == 2 and t.descendants(top.pid) == want     # per-task lists
        assert t.descendants(leaf.pid) == []
        live = processes.context(me=below[0])
        assert t.ancestors(below[0]) == sorted(live.ancestors, key=[
            p.pid for p in psutil.Process(below[0]).parents()].index)
        assert t.ancestors(below[0])[:2] == [below[1], top.pid]

        whole = table.snapshot()
        rows = whole.rows()                                      # the whole table, once
        pids = [r.pid for r in rows]
        assert pids == sorted(pids) and {top.pid, leaf.pid, *below} <= set(pids)
        assert whole.descendants(top.pid) == want               # from the whole table
        assert whole.row(top.pid) is rows[pids.index(top.pid)]
        assert processes.context(me=below[0], table=whole).ancestors == live.ancestors
    finally:
        for p in (top, leaf):
            for c in psutil.Process(p.pid).children(recursive=True):
                gh.end(c.pid)
            p.kill()
            p.wait()


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
