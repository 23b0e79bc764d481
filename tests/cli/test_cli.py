"""``jupyter gpumem`` (``python -m jupyter_gpumem.cli``, run as a real subprocess) against a
real ``jupyter server`` with real kernels, NVML's per-process lists faked
(tests/helpers/fake_nvml) as for the server extension's tests.

Checked: the listing (text and ``--json``) gives each kernel's notebook path with the same
bytes as ``GET api/gpumem/kernels``; a kernel stopped with SIGSTOP does not stop it; a
server stopped with SIGSTOP is named as not asked and the listing falls back to NVML and
the process table, as it does with no server at all; ``orphans --dry-run`` leaves the
orphans, ``orphans`` ends them (SIGKILL for one that ignores SIGTERM), ``shutdown`` ends
the kernel of a notebook (and does not without a yes); every bad argument is one line and
exit status 2; ``jupyter gpumem`` finds the command as Jupyter finds its subcommands.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest

import gpu_holders as gh

pytest.importorskip("jupyter_server")

from jupyter_harness import ROOT, Server, run  # noqa: E402

from jupyter_gpumem.server.readings import CACHE_SECONDS  # noqa: E402
from jupyter_gpumem.units import fmt_bytes  # noqa: E402

MiB, GiB = gh.MiB, gh.GiB


def env_of(server: Server, **extra) -> dict:
    """The environment of a terminal next to ``server``: its runtime dir and fake NVML."""
    paths = [gh.FAKE_NVML_DIR, str(ROOT)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
            "JUPYTER_RUNTIME_DIR": str(server.runtime), "FAKE_NVML": str(server.nvml),
            "JUPYTER_GPUMEM_DEVICE_FILES": server.dev, **extra}


def cli(env: dict, *args: str, stdin: str = "", timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "jupyter_gpumem.cli", *args], env=env,
                          input=stdin, capture_output=True, text=True, timeout=timeout)


HOLD = "import os; dev = open({dev!r}, 'rb'); print(os.getpid())"
HOLD_AND_CHILD = ("import os, subprocess, sys\n"
                  "dev = open({dev!r}, 'rb')\n"
                  "child = subprocess.Popen([sys.executable, '-c', {code!r}, {dev!r}, '300'],\n"
                  "                         stdout=subprocess.PIPE, text=True)\n"
                  "print(os.getpid(), child.stdout.readline().strip())")


@pytest.fixture
def scene(server):
    """Two kernels (one with a child), an orphan a kernel left, another user's process."""
    kid_a, a = server.session("a.ipynb")
    kid_b, b = server.session("work/b.ipynb")
    pid_a, child = map(int, run(a, HOLD_AND_CHILD.format(dev=server.dev, code=gh.HOLD)).split())
    pid_b = int(run(b, HOLD.format(dev=server.dev)))
    orphan = gh.orphan(server.dev, env={"JPY_PARENT_PID": "1", "JPY_SESSION_NAME": "old.ipynb"})
    theirs = gh.another_users()
    gh.write_nvml(server.nvml, [(pid_a, GiB), (child, 300 * MiB), (pid_b, 2 * GiB),
                                (orphan, 500 * MiB), (theirs.pid, 400 * MiB)], base=10 * MiB)
    try:
        yield {"a": (kid_a, pid_a), "b": (kid_b, pid_b), "child": child, "orphan": orphan,
               "theirs": theirs.pid}
    finally:
        theirs.kill()
        gh.end(orphan)


def test_the_listing_is_the_kernels_endpoints_and_a_frozen_kernel_does_not_stop_it(server, scene):
    env = env_of(server)
    endpoint = server.get("api/gpumem/kernels")
    done = cli(env, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["schema"] == "jupyter_gpumem.terminal/1" and data["fallback"] is False
    assert [(s["url"], s["asked"], s["pid"]) for s in data["servers"]] == [
        (server.base, True, server.proc.pid)]
    got = [(k["path"], k["id"], k["pid"], k["gpu"], k["gpu_bytes"]) for k in data["kernels"]]
    assert got == [(k["path"], k["id"], k["pid"], k["gpu"], k["gpu_bytes"])
                   for k in endpoint["kernels"]]
    assert got[0][0] == "work/b.ipynb" and got[0][3] == {"cuda:0": 2 * GiB}
    assert got[1][0] == "a.ipynb" and got[1][3] == {"cuda:0": GiB + 300 * MiB}
    assert all(k["host"]["rss"] > 10 * MiB for k in data["kernels"])
    assert {(p["pid"], p["relation"]) for p in data["others"]} == {
        (scene["orphan"], "orphan"), (scene["theirs"], "other_user")}
    assert [p["pid"] for p in data["orphans"]] == [scene["orphan"]]
    assert data["devices"][0]["kernels_bytes"] == 3 * GiB + 300 * MiB

    text = cli(env).stdout
    lines = text.splitlines()
    assert lines[0] == f"Jupyter server {server.base} (pid {server.proc.pid}, root " \
                       f"{server.tmp / 'root'})"
    row_b = next(line for line in lines if line.startswith("  work/b.ipynb"))
    assert row_b.split()[:3] == ["work/b.ipynb", str(scene["b"][1]), "idle"]
    assert fmt_bytes(2 * GiB) in row_b
    row_a = next(line for line in lines if line.startswith("  a.ipynb"))
    assert fmt_bytes(GiB + 300 * MiB) in row_a
    orphan_row = next(line for line in lines if f" {scene['orphan']} " in line)
    assert "orphan: left by a kernel of old.ipynb (parent gone; no live kernel of it " \
           "started before it)" in orphan_row
    assert fmt_bytes(500 * MiB) in orphan_row
    assert "`jupyter gpumem orphans` ends this user's orphans" in text

    os.kill(scene["b"][1], signal.SIGSTOP)
    try:
        time.sleep(CACHE_SECONDS)
        t0 = time.monotonic()
        frozen = cli(env, "--json", "--timeout", "5")
        assert time.monotonic() - t0 < 30 and frozen.returncode == 0, frozen.stderr
    finally:
        os.kill(scene["b"][1], signal.SIGCONT)
    again = json.loads(frozen.stdout)
    assert [(k["path"], k["gpu"]) for k in again["kernels"]] == [
        (k["path"], k["gpu"]) for k in endpoint["kernels"]]


def test_a_server_that_does_not_answer_and_no_server_at_all(server, scene, tmp_path):
    env = env_of(server)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        done = cli(env, "--timeout", "2")
        took = time.monotonic() - t0
        data = json.loads(cli(env, "--json", "--timeout", "1").stdout)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    assert took < 20
    text = done.stdout
    assert f"Jupyter server {server.base} (pid {server.proc.pid}, root {server.tmp / 'root'}): " \
           "not asked: no answer within 2 s" in text
    assert "no server answered: what NVML and the process table say" in text
    assert data["fallback"] is True and data["kernels"] == []
    assert data["servers"][0]["error"] == "no answer within 1 s"
    others = {p["pid"]: p for p in data["others"]}
    assert set(others) == {scene["a"][1], scene["child"], scene["b"][1], scene["orphan"],
                           scene["theirs"]}
    assert others[scene["orphan"]]["relation"] == "orphan" and others[scene["orphan"]]["purgeable"]
    assert others[scene["b"][1]]["label"] == (f"kernel of the Jupyter server pid "
                                              f"{server.proc.pid} (not asked): work/b.ipynb")
    assert others[scene["b"][1]]["bytes"] == 2 * GiB
    assert others[scene["theirs"]]["relation"] == "other_user"

    alone = env_of(server, JUPYTER_RUNTIME_DIR=str(tmp_path / "no-server"))
    none = cli(alone)
    assert none.returncode == 0, none.stderr
    assert none.stdout.splitlines()[0] == ("no Jupyter server of this user is running: what "
                                           "NVML and the process table say")
    assert "orphan: left by a kernel of old.ipynb (parent gone; no live kernel of it " \
           "started before it)" in none.stdout
    assert "(not asked): a.ipynb" in none.stdout


def gone_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie its new parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_orphans_dry_run_then_for_real(tmp_path):
    """No server needed: the orphans of NVML's list, ended with the magic's rules."""
    nvml = tmp_path / "nvml.json"
    dev = gh.device_file(tmp_path)
    # started by a kernel of a server that has ended since (its pid names no process now:
    # a server that is init itself would make every orphan a child of the server)
    kernel_env = {"JPY_PARENT_PID": str(gone_pid()), "JPY_SESSION_NAME": "old.ipynb"}
    soft = gh.orphan(dev, env=kernel_env)
    stubborn = gh.orphan(dev, env=kernel_env, stubborn=True)
    plain = gh.orphan(dev)                       # no kernel started it: left alone
    try:
        gh.write_nvml(nvml, [(soft, GiB), (stubborn, 500 * MiB), (plain, 100 * MiB)])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                   [gh.FAKE_NVML_DIR, str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "FAKE_NVML": str(nvml),
               "JUPYTER_GPUMEM_DEVICE_FILES": dev}
        dry = cli(env, "orphans", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        lines = dry.stdout.splitlines()
        assert lines[0] == f"dry run: would end 2 orphan(s) holding {fmt_bytes(GiB + 500 * MiB)}"
        assert [line.split()[0] for line in lines[2:4]] == [str(soft), str(stubborn)]
        assert f"left alone: pid {plain}: orphan (parent gone; no kernel started it: left " \
               "alone)" in dry.stdout
        assert not any(gone(p) for p in (soft, stubborn, plain))

        done = cli(env, "orphans", "--grace", "1")
        assert done.returncode == 0, done.stderr
        steps = [line.split() for line in done.stdout.splitlines() if " s  pid " in line]
        assert [(int(s[3]), s[4], s[5]) for s in steps] == [
            (soft, "SIGTERM", "sent"), (stubborn, "SIGTERM", "sent"), (soft, "SIGTERM", "ended"),
            (stubborn, "SIGKILL", "sent"), (stubborn, "SIGKILL", "ended")]
        assert f"ended 2 of 2 orphan(s) holding {fmt_bytes(GiB + 500 * MiB)}" in done.stdout
        assert done.stdout.count(f"pid {soft}  SIGTERM  sent") == 1     # each step once
        assert gone(soft) and gone(stubborn) and not gone(plain)

        as_json = json.loads(cli(env, "orphans", "--dry-run", "--json").stdout)
        assert as_json["schema"] == "jupyter_gpumem.orphans/1" and as_json["targets"] == []
        top = json.loads(cli(env, "--json", "orphans", "--dry-run").stdout)   # --json first
        assert (top["schema"], top["targets"], top["dry_run"]) == (
            "jupyter_gpumem.orphans/1", [], True)
    finally:
        for p in (soft, stubborn, plain):
            gh.end(p)


def test_shutdown_asks_first_and_ends_the_kernel_of_that_notebook(server):
    env = env_of(server)
    kid_a, a = server.session("a.ipynb")
    kid_b, b = server.session("work/b.ipynb")
    pid_a = int(run(a, "import os; print(os.getpid())"))
    pid_b = int(run(b, "import os; print(os.getpid())"))

    no = cli(env, "shutdown", "a.ipynb", stdin="n\n")
    assert no.returncode == 1
    assert no.stdout.startswith(f"shut down the kernel of a.ipynb (python3, pid {pid_a}, idle)"
                                f" on {server.base}? [y/N]")
    assert no.stderr == "jupyter gpumem: not shut down (not confirmed)\n"
    assert psutil.pid_exists(pid_a)

    yes = cli(env, "shutdown", "a.ipynb", stdin="y\n")
    assert yes.returncode == 0, yes.stderr
    deadline = time.time() + 30
    while psutil.pid_exists(pid_a) and time.time() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid_a) and psutil.pid_exists(pid_b)
    assert [k["id"] for k in server.get("api/kernels")] == [kid_b]

    # the file's path here (absolute), no question asked
    path = str(server.tmp / "root" / "work" / "b.ipynb")
    done = cli(env, "shutdown", path, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("shut down the kernel of work/b.ipynb")
    deadline = time.time() + 30
    while psutil.pid_exists(pid_b) and time.time() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid_b) and server.get("api/kernels") == []

    missing = cli(env, "shutdown", "a.ipynb", "--yes")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == "jupyter gpumem: no running kernel has the notebook a.ipynb\n"
    other = cli(env, "shutdown", "a.ipynb", "--server", "http://127.0.0.1:1/")
    assert other.returncode == 1 and other.stderr.count("\n") == 1
    assert "no running Jupyter server of this user at http://127.0.0.1:1/" in other.stderr


@pytest.mark.parametrize("args, says", [
    (["--timeout", "x"], "argument --timeout: not a number of seconds: 'x'"),
    (["--timeout", "0"], "argument --timeout: must be more than 0 and at most 600 s"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["frob"], "argument {orphans,shutdown}: invalid choice: 'frob'"),
    (["orphans", "--grace", "61"], "argument --grace: must be between 0 and 60 seconds"),
    (["orphans", "--grace", "soon"], "argument --grace: must be a number of seconds"),
    (["orphans", "extra"], "unrecognized arguments: extra"),
    (["shutdown"], "the following arguments are required: PATH"),
])
def test_a_bad_argument_is_one_line_and_status_2(tmp_path, args, says):
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    done = cli(env, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("jupyter gpumem")
    assert says in done.stderr, done.stderr


def test_help_per_form_and_jupyter_finds_the_subcommand(tmp_path):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["jupyter-gpumem"] == "jupyter_gpumem.cli:main"
    assert any(d.startswith("prometheus_client") for d in project["dependencies"])
    # the entry point, as pip would write it, on the PATH: ``jupyter gpumem`` runs it
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "jupyter-gpumem"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom jupyter_gpumem.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    jupyter = Path(sys.executable).with_name("jupyter")
    for form, first in [([], "usage: jupyter gpumem [-h] [--json]"),
                        (["orphans"], "usage: jupyter gpumem orphans [-h] [--dry-run]"),
                        (["shutdown"], "usage: jupyter gpumem shutdown [-h] [--yes]")]:
        done = subprocess.run([str(jupyter), "gpumem", *form, "--help"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(first), done.stdout
    listing = subprocess.run([str(jupyter), "gpumem"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.startswith("no Jupyter server of this user is running")


def test_a_server_on_a_unix_socket_is_asked_with_its_token(tmp_path):
    """``--ServerApp.sock``: its runtime file names a socket, not a URL (a real HTTP
    server on a real Unix socket stands for it)."""
    import http.server
    import socketserver
    import threading

    from jupyter_gpumem.cli import servers

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            body = json.dumps({"kernels": [], "others": []}).encode()
            self.send_response(200 if self.path.startswith("/base/api/gpumem") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Unix(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        def get_request(self):
            conn, _ = super().get_request()
            return conn, ("local", 0)

    path = str(tmp_path / "jupyter.sock")
    httpd = Unix(path, Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        info = {"url": "http+unix://%2Ftmp%2Fjupyter.sock/base/", "sock": path,
                "base_url": "/base/", "token": "s3cret", "pid": os.getpid()}
        asked = servers.request(info, "GET", servers.KERNELS, timeout=5)
        assert (asked.ok, asked.status, asked.answer) == (True, 200, {"kernels": [],
                                                                      "others": []})
        assert seen == [("/base/api/gpumem/kernels", "token s3cret")]
        missing = servers.request({**info, "sock": str(tmp_path / "none.sock")}, "GET",
                                  servers.KERNELS, timeout=5)
        assert missing.error.startswith("cannot connect")
    finally:
        httpd.shutdown()
        httpd.server_close()
