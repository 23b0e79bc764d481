"""The Jupyter server extension with a real ``jupyter server`` (a subprocess on 127.0.0.1
with a token and a base URL) and two real kernels: one with a child process, one whose
child's parent is killed to leave an orphan; another user's process besides. NVML's
per-process lists are the one thing faked (tests/fake_nvml/pynvml.py, through the
server's PYTHONPATH, which its kernels inherit).

Checked: the endpoint's kernel list, paths, pids (each kernel's own ``os.getpid()``) and
children; the GPU bytes per kernel (children included) and the others; the report of a
kernel of that server (``%gpumem --processes``) naming each process; the orphans' purge
(dry run through the server, for real from the kernel) and the figures after; no GPU.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error

import psutil
import pytest

import gpu_holders as gh
from protocol_keys import check

pytest.importorskip("jupyter_server")

from jupyter_harness import Server, run  # noqa: E402

from jupyter_gpumem.server.readings import CACHE_SECONDS  # noqa: E402

MiB, GiB = gh.MiB, gh.GiB


from gpu_holders import HOLD_AND_CHILD, ORPHANED  # noqa: E402,F401 - a kernel's cells



def test_endpoint_kernel_report_and_orphan_purge(server):
    with pytest.raises(urllib.error.HTTPError) as no_token:
        server.get("api/gpumem/kernels", token=None)
    assert no_token.value.code in (401, 403)

    kid_a, a = server.session("a.ipynb")
    kid_b, b = server.session("work/b.ipynb")
    pid_a, child_a = map(int, run(a, HOLD_AND_CHILD.format(dev=server.dev)).split())
    pid_b, orphan = map(int, run(b, ORPHANED.format(dev=server.dev)).split())
    deadline = time.time() + 10
    while psutil.Process(orphan).ppid() != 1 and time.time() < deadline:
        time.sleep(0.05)
    assert psutil.Process(orphan).ppid() == 1
    theirs = gh.another_users()
    try:
        gh.write_nvml(server.nvml, [(pid_a, 1 * GiB), (child_a, 300 * MiB), (pid_b, 2 * GiB),
                                    (orphan, 500 * MiB), (theirs.pid, 400 * MiB),
                                    (0, 60 * MiB)], base=10 * MiB)
        data = server.get("api/gpumem/kernels")
        assert data["schema"] == "jupyter_gpumem.kernels/1" and data["gpu"] is True
        check("ServerKernels", data)
        check("ServerKernels", data["devices"][0], ("devices", "[]"))
        for k in data["kernels"]:
            check("ServerKernels", k, ("kernels", "[]"))
            check("ServerKernels", k["sessions"][0], ("kernels", "[]", "sessions", "[]"))
            for p in k["processes"]:
                check("ServerKernels", p, ("kernels", "[]", "processes", "[]"))
        assert data["server_pid"] == server.proc.pid
        assert [(k["id"], k["path"], k["pid"]) for k in data["kernels"]] == [
            (kid_b, "work/b.ipynb", pid_b), (kid_a, "a.ipynb", pid_a)]
        ka, kb = data["kernels"][1], data["kernels"][0]
        assert child_a in ka["children"] and orphan not in kb["children"]
        assert ka["gpu"] == {"cuda:0": GiB + 300 * MiB} and kb["gpu"] == {"cuda:0": 2 * GiB}
        assert sorted((p["pid"], p["relation"]) for p in ka["processes"]) == sorted(
            [(pid_a, "kernel"), (child_a, "kernel_child")])
        assert ka["pid_note"] is None and ka["type"] == "notebook"
        # host memory: the kernel's resident set and its child's, read as psutil reads it
        now = sum(psutil.Process(p).memory_info().rss for p in [pid_a] + ka["children"])
        assert abs(ka["host"]["rss"] - now) < 0.1 * now
        assert ka["host"]["rss"] > psutil.Process(pid_a).memory_info().rss
        assert data["user"] == psutil.Process().username()
        others = {p["pid"]: p for p in data["others"]}
        assert set(others) == {orphan, theirs.pid}
        assert others[orphan]["relation"] == "orphan" and others[orphan]["purgeable"]
        assert others[orphan]["path"] == "work/b.ipynb"
        assert others[theirs.pid]["relation"] == "other_user"
        assert [p["pid"] for p in data["orphans"]] == [orphan]
        assert data["devices"][0]["hidden"] == 1
        assert data["devices"][0]["used"] == 10 * MiB + 3 * GiB + 1260 * MiB

        # the report of a kernel of that server names every process
        out = run(a, "%load_ext jupyter_gpumem\n"
                     "import json; r = %gpumem --processes -o\n"
                     "print(json.dumps(r.to_json()))")
        [dev] = json.loads(out)["devices"]
        named = {p["pid"]: (p["relation"], p["path"], p["bytes"]) for p in dev["processes"]}
        assert named == {child_a: ("child", None, 300 * MiB),
                         pid_b: ("kernel", "work/b.ipynb", 2 * GiB),
                         orphan: ("orphan", "work/b.ipynb", 500 * MiB),
                         theirs.pid: ("other_user", None, 400 * MiB)}
        assert dev["this_process"] == GiB and dev["hidden"] == 1
        text = run(a, "r = %gpumem --processes -o\nprint(r)")
        assert "kernel of this server: work/b.ipynb" in text
        assert "orphan: left by a kernel of work/b.ipynb (pid " in text
        assert "), which is gone" in text

        dry = server.request("POST", "api/gpumem/orphans", {"dry_run": True})
        assert [t["pid"] for t in dry["targets"]] == [orphan] and dry["steps"] == []
        with pytest.raises(urllib.error.HTTPError) as bad:
            server.request("POST", "api/gpumem/orphans", {"dry_run": "yes"})
        assert bad.value.code == 400
        with pytest.raises(urllib.error.HTTPError) as bad:
            server.request("POST", "api/gpumem/orphans", {"pids": [theirs.pid]})
        assert bad.value.code == 400
        assert psutil.pid_exists(orphan)

        out = run(a, "r = %gpumem purge --orphans -o\nprint(json.dumps(r.to_json()))")
        result = json.loads(out.strip().splitlines()[-1])
        assert [(s["pid"], s["signal"], s["result"]) for s in result["steps"]] == [
            (orphan, "SIGTERM", "sent"), (orphan, "SIGTERM", "ended")]
        assert result["freed"] == {"cuda:0": 500 * MiB}
        time.sleep(CACHE_SECONDS)            # the server's readings are kept a second
        after = server.get("api/gpumem/kernels")
        assert after["orphans"] == [] and [p["pid"] for p in after["others"]] == [theirs.pid]
        assert [k["gpu_bytes"] for k in after["kernels"]] == [2 * GiB, GiB + 300 * MiB]
        assert theirs.poll() is None and psutil.pid_exists(child_a)
    finally:
        theirs.kill()
        gh.end(orphan)


def test_no_gpu_and_the_pid_of_a_kernel_the_server_does_not_run(server):
    server.nvml.write_text('{"devices": []}')
    data = server.get("api/gpumem/kernels")
    assert data["gpu"] is False and data["kernels"] == []
    # the server read NVML's device count at its start (one device): a fresh report
    from jupyter_gpumem import server as ext
    remote = ext.report([{"id": "k1", "name": "python3", "pid": None,
                          "sessions": [{"path": "r.ipynb", "type": "notebook"}]}])
    assert remote["kernels"][0]["pid"] is None
    assert remote["kernels"][0]["pid_note"].startswith("pid unknown")


def test_kernel_pid_only_from_a_local_provisioner():
    from jupyter_client.provisioning import LocalProvisioner
    from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

    from jupyter_gpumem.server import kernel_pid

    class Remote(KernelProvisionerBase):   # a provisioner that runs kernels elsewhere
        has_process = True
        pid = 4242                          # whatever it says: not a pid of this machine

        async def poll(self): ...
        async def wait(self): ...
        async def send_signal(self, signum): ...
        async def kill(self, restart=False): ...
        async def terminate(self, restart=False): ...
        async def pre_launch(self, **kw): ...
        async def launch_kernel(self, cmd, **kw): ...
        async def cleanup(self, restart=False): ...

    class Kernel:
        def __init__(self, provisioner):
            self.provisioner = provisioner

    local = LocalProvisioner(kernel_id="k", kernel_spec=None, parent=None)
    local.pid = os.getpid()
    assert kernel_pid(Kernel(local)) == os.getpid()
    assert kernel_pid(Kernel(Remote(kernel_id="r", kernel_spec=None, parent=None))) is None
    assert kernel_pid(Kernel(None)) is None


WORKER = '''
import os, sys, time
def hold(dev, ready):
    os.setsid()                  # out of the kernel's process group
    f = open(dev, "rb")
    open(ready, "w").write(str(os.getpid()))
    time.sleep(300)
'''

SPAWN = ('import sys, os, time\n'
         'sys.path.insert(0, {folder!r})\n'
         'import torch.multiprocessing as mp, gpumem_worker\n'
         'ctx = mp.get_context("spawn")\n'
         'procs = [ctx.Process(target=gpumem_worker.hold, args=({dev!r}, f"{folder}/ready{{i}}"))\n'
         '         for i in range(2)]\n'
         'for p in procs: p.start()\n'
         'deadline = time.time() + 120\n'
         'while not all(os.path.exists(f"{folder}/ready{{i}}") for i in range(2)):\n'
         '    assert time.time() < deadline, "the children did not start"\n'
         '    time.sleep(0.1)\n'
         'print(os.getpid(), *[p.pid for p in procs])')


def test_a_restarted_kernels_spawn_children_are_its_orphans(server, tmp_path):
    """The GPU test's scenario (tests/gpu/test_processes_gpu.py) on the CPU: a kernel's two
    torch.multiprocessing (spawn) children outlive the kernel's restart through the
    server's kernel API; the restarted kernel names them orphans of its notebook."""
    pytest.importorskip("torch")
    folder = tmp_path / "spawned"
    folder.mkdir()
    (folder / "gpumem_worker.py").write_text(WORKER)
    kid, c = server.session("c.ipynb")
    pid_c, *children = map(int, run(c, SPAWN.format(folder=str(folder), dev=server.dev)).split())
    try:
        server.request("POST", f"api/kernels/{kid}/restart", {})
        deadline = time.time() + 60
        while psutil.pid_exists(pid_c) and time.time() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(pid_c)
        assert all(psutil.pid_exists(p) for p in children)
        gh.write_nvml(server.nvml, [(p, 256 * MiB) for p in children])
        c = server.connect(kid)
        out = run(c, "%load_ext jupyter_gpumem\nimport json\n"
                     "r = %gpumem --processes -o\nprint(json.dumps(r.to_json()))")
        [dev] = json.loads(out.strip().splitlines()[-1])["devices"]
        assert {p["pid"]: (p["relation"], p["path"], p["purgeable"]) for p in dev["processes"]} \
            == {p: ("orphan", "c.ipynb", True) for p in children}
        data = server.get("api/gpumem/kernels")
        assert sorted(p["pid"] for p in data["orphans"]) == sorted(children)
    finally:
        for p in children:
            gh.end(p)


def raw(server, method: str, path: str, data: bytes) -> tuple[int, dict]:
    """A request with the body ``data`` as it is: the status and the JSON answer."""
    import urllib.request

    from jupyter_harness import TOKEN
    req = urllib.request.Request(server.base + path, method=method, data=data)
    req.add_header("Authorization", f"token {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_bodies_are_bounded_and_a_key_given_twice_is_refused(server):
    """A body nested 2,000 deep, one with ``dry_run`` twice (the last would say: for
    real), one over the size, ``NaN``, not UTF-8: each a 400 with a message, and the
    orphan that a real purge would end is still there."""
    kid, a = server.session("a.ipynb")
    pid_a = int(run(a, "import os; print(os.getpid())"))
    orphan = gh.orphan(server.dev, env={"JPY_PARENT_PID": "1", "JPY_SESSION_NAME": "x.ipynb"})
    try:
        gh.write_nvml(server.nvml, [(pid_a, GiB), (orphan, 500 * MiB)])
        assert [p["pid"] for p in server.get("api/gpumem/kernels")["orphans"]] == [orphan]
        deep = b"[" * 2000 + b"]" * 2000
        assert len(deep) <= 4096
        cases = {b'{"dry_run": true, "dry_run": false}': 'the key "dry_run" is given twice',
                 deep: "nests deeper than 16",
                 b'{"dry_run": true}' + b" " * 5000: "over 4096 bytes",
                 b'{"dry_run": NaN}': "NaN is not a JSON value",
                 b'{"dry_run": "\xff"}': "UTF-8",
                 b'{"dry_run": tru': "must be JSON"}
        for data, why in cases.items():
            code, answer = raw(server, "POST", "api/gpumem/orphans", data)
            assert (code, why in answer.get("message", "")) == (400, True), (data[:40], answer)
        assert psutil.pid_exists(orphan) and psutil.Process(orphan).status() != "zombie"
        code, answer = raw(server, "POST", "api/gpumem/orphans", b'{"dry_run": true}')
        assert code == 200 and [t["pid"] for t in answer["targets"]] == [orphan]
        assert psutil.pid_exists(orphan)
    finally:
        gh.end(orphan)


def test_without_nvml_every_kernel_is_listed_with_its_host_memory(tmp_path):
    """No NVML at all (the real pynvml, no driver): the kernels all the same, each with the
    resident memory of it and its descendants, ``"gpu": false`` and a plain message; a
    kernel stopped with SIGSTOP answers too."""
    import signal

    s = Server(tmp_path, fake_nvml=False)
    try:
        kid_a, a = s.session("a.ipynb")
        kid_b, b = s.session("work/b.ipynb")
        pid_a = int(run(a, "import os; x = bytearray(200 * 2**20); print(os.getpid())"))
        pid_b = int(run(b, "import os, subprocess, sys\n"
                           "c = subprocess.Popen([sys.executable, '-c', 'import time; "
                           "x = bytearray(100 * 2**20); print(1, flush=True); time.sleep(300)'],"
                           " stdout=subprocess.PIPE)\n"
                           "c.stdout.readline(); print(os.getpid())"))
        os.kill(pid_b, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            data = s.get("api/gpumem/kernels")
            assert time.monotonic() - t0 < 10
        finally:
            os.kill(pid_b, signal.SIGCONT)
        assert data["gpu"] is False and data["devices"] == [] and data["others"] == []
        assert data["message"] == "GPU figures need NVML (the NVIDIA driver); none here"
        rows = {k["path"]: k for k in data["kernels"]}
        assert set(rows) == {"a.ipynb", "work/b.ipynb"}
        assert (rows["a.ipynb"]["pid"], rows["work/b.ipynb"]["pid"]) == (pid_a, pid_b)
        for k in data["kernels"]:
            check("ServerKernels", k, ("kernels", "[]"))
            procs = [k["pid"]] + k["children"]
            now = sum(psutil.Process(p).memory_info().rss for p in procs)
            assert abs(k["host"]["rss"] - now) < 0.1 * now, (k["path"], k["host"], now)
            assert k["gpu"] == {} and k["gpu_bytes"] == 0
        assert rows["a.ipynb"]["host"]["rss"] > 200 * MiB
        assert len(rows["work/b.ipynb"]["children"]) == 1
        assert rows["work/b.ipynb"]["host"]["rss"] > 100 * MiB + \
            psutil.Process(pid_b).memory_info().rss
    finally:
        s.stop()
