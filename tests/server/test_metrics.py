"""``GET api/gpumem/metrics`` of a real server with real kernels (NVML's per-process lists
faked: tests/helpers/fake_nvml): it parses as Prometheus' text format, each kernel's series
carries its notebook path, its figures are the kernels endpoint's, one reading serves
both within a second, and it needs the server's token."""
from __future__ import annotations

import time
import urllib.error
import urllib.request

import psutil
import pytest

import gpu_holders as gh

pytest.importorskip("jupyter_server")
pytest.importorskip("prometheus_client.parser")

from jupyter_harness import Server, run, samples, scrape  # noqa: E402

from jupyter_gpumem.server.readings import CACHE_SECONDS  # noqa: E402

MiB, GiB = gh.MiB, gh.GiB


def test_metrics_are_the_kernels_endpoints_figures(server):
    with pytest.raises(urllib.error.HTTPError) as no_token:
        scrape(server, token=None)
    assert no_token.value.code in (401, 403)

    kid_a, a = server.session("a.ipynb")
    kid_b, b = server.session("work/b.ipynb")
    hold = f"import os; dev = open({server.dev!r}, 'rb'); print(os.getpid())"
    pid_a, pid_b = int(run(a, hold)), int(run(b, hold))
    orphan = gh.orphan(server.dev, env={"JPY_PARENT_PID": "1", "JPY_SESSION_NAME": "x.ipynb"})
    theirs = gh.another_users()
    try:
        gh.write_nvml(server.nvml, [(pid_a, GiB), (pid_b, 2 * GiB), (orphan, 500 * MiB),
                                    (theirs.pid, 300 * MiB), (0, 60 * MiB)], base=10 * MiB, n=2)
        data = server.get("api/gpumem/kernels")
        kind, text = scrape(server, scheme="Bearer")
        assert kind.startswith("text/plain") and "version=" in kind
        got = samples(text)
        # one reading served both (asked within a second)
        [(_, passes)] = got["jupyter_gpumem_readings_total"]
        assert passes == 1

        me = psutil.Process().username()
        gpu = {(s["path"], s["device"]): (v, s) for s, v in got["jupyter_gpumem_kernel_gpu_bytes"]}
        want = {(k["path"], d["device"]): k["gpu"].get(d["device"], 0)
                for k in data["kernels"] for d in data["devices"]}
        assert {key: v for key, (v, _) in gpu.items()} == want
        assert want[("a.ipynb", "cuda:0")] == GiB and want[("work/b.ipynb", "cuda:0")] == 2 * GiB
        assert {(s["kernel_id"], s["user"], s["kernel_name"]) for v, s in gpu.values()} == {
            (kid_a, me, "python3"), (kid_b, me, "python3")}
        rss = {s["path"]: v for s, v in got["jupyter_gpumem_kernel_host_rss_bytes"]}
        assert rss == {k["path"]: k["host"]["rss"] for k in data["kernels"]}
        assert all(v > 10 * MiB for v in rss.values())

        devs = {d["device"]: d for d in data["devices"]}
        assert {s["device"]: v for s, v in got["jupyter_gpumem_device_total_bytes"]} == {
            d: x["total"] for d, x in devs.items()}
        assert {s["device"]: v for s, v in got["jupyter_gpumem_device_used_bytes"]} == {
            d: x["used"] for d, x in devs.items()}
        assert {s["device"]: v for s, v in got["jupyter_gpumem_device_kernels_bytes"]} == {
            "cuda:0": 3 * GiB, "cuda:1": 0}
        assert {s["device"]: v for s, v in got["jupyter_gpumem_hidden_processes"]} == {
            "cuda:0": 1, "cuda:1": 0}
        assert got["jupyter_gpumem_orphan_processes"] == [({"device": "cuda:0", "user": me}, 1),
                                                          ({"device": "cuda:1", "user": me}, 0)]
        assert got["jupyter_gpumem_orphan_bytes"] == [({"device": "cuda:0", "user": me},
                                                       500 * MiB),
                                                      ({"device": "cuda:1", "user": me}, 0)]
        [(labels, n)] = got["jupyter_gpumem_other_processes"]
        assert labels["relation"] == "other_user" and labels["user"] == \
            psutil.Process(theirs.pid).username() and n == 1
        assert got["jupyter_gpumem_other_bytes"] == [(labels, 300 * MiB)]
        assert got["jupyter_gpumem_kernels"] == [({"user": me}, 2)]
        assert got["jupyter_gpumem_gpu"] == [({}, 1)]

        # a second later: a new reading, with the new figures
        gh.write_nvml(server.nvml, [(pid_a, 3 * GiB), (pid_b, 2 * GiB)], n=2)
        assert samples(scrape(server)[1])["jupyter_gpumem_readings_total"] == [({}, 1)]
        time.sleep(CACHE_SECONDS)
        again = samples(scrape(server)[1])
        assert again["jupyter_gpumem_readings_total"] == [({}, 2)]
        assert {s["path"]: v for s, v in again["jupyter_gpumem_kernel_gpu_bytes"]
                if s["device"] == "cuda:0"} == {"a.ipynb": 3 * GiB, "work/b.ipynb": 2 * GiB}
        assert again["jupyter_gpumem_orphan_processes"] == [
            ({"device": "cuda:0", "user": me}, 0), ({"device": "cuda:1", "user": me}, 0)]
        assert "jupyter_gpumem_other_processes" not in again
    finally:
        theirs.kill()
        gh.end(orphan)


def test_metrics_without_nvml_still_give_the_kernels_host_memory(tmp_path):
    s = Server(tmp_path, fake_nvml=False)
    try:
        kid, a = s.session("a.ipynb")
        run(a, "x = bytearray(150 * 2**20)")
        got = samples(scrape(s)[1])
        assert got["jupyter_gpumem_gpu"] == [({}, 0)]
        [(labels, v)] = got["jupyter_gpumem_kernel_host_rss_bytes"]
        assert (labels["path"], labels["kernel_id"]) == ("a.ipynb", kid) and v > 150 * MiB
        assert "jupyter_gpumem_kernel_gpu_bytes" not in got
        assert "jupyter_gpumem_device_used_bytes" not in got
    finally:
        s.stop()
