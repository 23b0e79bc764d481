"""Real processes that stand for GPU holders on a machine without a GPU, and the fake
NVML's file that lists them (tests/fake_nvml/pynvml.py reads it).

A holder is a real Python process that opens the "device file" (a file of the test's
folder whose path prefix the tests add to ``processes.GPU_DEVICE_FILES`` through
``JUPYTER_GPUMEM_DEVICE_FILES``) and sleeps: what the process code reads of it (its
user, parent, age, command line, environment, open files) is real.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

FAKE_NVML_DIR = str(Path(__file__).resolve().parent / "fake_nvml")
GiB = 2**30
MiB = 2**20

HOLD = ("import os, sys, time\n"
        "f = open(sys.argv[1], 'rb')\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n")

#: a holder that ignores SIGTERM
STUBBORN = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + HOLD

ORPHAN = ("import os, subprocess, sys\n"
          "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3]],\n"
          "                     stdout=subprocess.PIPE, text=True, start_new_session=True)\n"
          "print(p.stdout.readline().strip(), flush=True)\n")


def environ(env: dict | None = None) -> dict:
    """This process's environment with ``env`` over it, and without the kernel mark the
    extension puts there when it loads (unless ``env`` gives one): a holder stands for a
    process that no live kernel started, whichever test loaded the extension before."""
    out = {**os.environ, **(env or {})}
    if "JUPYTER_GPUMEM_KERNEL" not in (env or {}):
        out.pop("JUPYTER_GPUMEM_KERNEL", None)
    return out


def device_file(folder: Path) -> str:
    """The stand-in device file (``<folder>/nvidia-fake0``) and its prefix."""
    path = folder / "nvidia-fake0"
    path.write_bytes(b"")
    return str(path)


def hold(dev_file: str, seconds: float = 120, env: dict | None = None) -> subprocess.Popen:
    """A child process that holds the device file."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, dev_file, str(seconds)],
                         stdout=subprocess.PIPE, text=True, env=environ(env))
    assert int(p.stdout.readline()) == p.pid
    return p


def another_users(uid: int = 65534, seconds: float = 120) -> subprocess.Popen:
    """A process of user ``uid`` (``sleep``: that user may not reach this Python)."""
    return subprocess.Popen(["sleep", str(seconds)], user=uid)


def orphan(dev_file: str, seconds: float = 120, env: dict | None = None,
           stubborn: bool = False) -> int:
    """A holder whose parent has exited: its pid (the caller ends it). ``stubborn``: it
    ignores SIGTERM."""
    code = STUBBORN if stubborn else HOLD
    out = subprocess.run([sys.executable, "-c", ORPHAN, code, dev_file, str(seconds)],
                         stdout=subprocess.PIPE, text=True, env=environ(env),
                         check=True, timeout=30)
    pid = int(out.stdout.strip())
    deadline = time.time() + 10
    while psutil.Process(pid).ppid() not in (0, 1) and time.time() < deadline:
        time.sleep(0.05)
    return pid


def write_nvml(path: Path, compute: list[tuple[int, int]], graphics=(), base: int = 0,
               n: int = 1) -> None:
    """The fake NVML's file: device 0 lists ``compute`` and ``graphics``; ``n`` devices."""
    devices = [{"name": "NVIDIA H200", "total": 141 * GiB, "base": base,
                "compute": [list(x) for x in compute], "graphics": [list(x) for x in graphics]}]
    devices += [{"name": "NVIDIA H200", "total": 141 * GiB, "base": 0, "compute": []}
                for _ in range(n - 1)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    tmp.rename(path)


def end(pid: int) -> None:
    try:
        psutil.Process(pid).kill()
    except psutil.Error:
        pass


PARENT = ("import subprocess, sys, time\n"
          "f = open(sys.argv[2], 'rb')\n"
          "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3]],\n"
          "                     stdout=subprocess.PIPE, text=True)\n"
          "print(p.stdout.readline().strip(), flush=True)\n"
          "time.sleep(float(sys.argv[3]))\n")


def parent_of_holder(dev_file: str, seconds: float = 120, env: dict | None = None,
                     ) -> tuple[subprocess.Popen, int]:
    """A process (standing for a kernel) with a child, both holding the device file: the
    process and its child's pid."""
    p = subprocess.Popen([sys.executable, "-c", PARENT, HOLD, dev_file, str(seconds)],
                         stdout=subprocess.PIPE, text=True, env=environ(env))
    return p, int(p.stdout.readline())


#: a kernel's cell: open the device file and start a child that holds it too
HOLD_AND_CHILD = f"""
import os, subprocess, sys
dev = open({{dev!r}}, 'rb')
child = subprocess.Popen([sys.executable, '-c', {HOLD!r}, {{dev!r}}, '300'],
                         stdout=subprocess.PIPE, text=True)
print(os.getpid(), child.stdout.readline().strip())
"""

#: the left-over of this notebook's kernel before a restart: the job carries the mark of
#: the kernel that started it (pid and start time, as the extension puts it), and that
#: kernel is gone (a job a live kernel detached is never an orphan: tests/core/processes/test_orphans_proof.py)
ORPHANED = f"""
import os, signal, subprocess, sys, time
import psutil
dev = open({{dev!r}}, 'rb')
before = subprocess.Popen(['sleep', '60'])
mark = (f"{{{{before.pid}}}}:{{{{psutil.Process(before.pid).create_time() - psutil.boot_time()!r}}}}b:"
        f"{{{{os.environ['JPY_PARENT_PID']}}}}")
parent = subprocess.Popen([sys.executable, '-c', {PARENT!r}, {HOLD!r}, {{dev!r}}, '300'],
                          stdout=subprocess.PIPE, text=True, start_new_session=True,
                          env={{{{**os.environ, 'JUPYTER_GPUMEM_KERNEL': mark}}}})
held = int(parent.stdout.readline())
os.kill(parent.pid, signal.SIGKILL); parent.wait()
before.kill(); before.wait()
print(os.getpid(), held)
"""
