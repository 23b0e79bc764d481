"""The cluster view in the product: ``%gpumem --cluster``, ``%gpumem purge ... --cluster``,
``jupyter_gpumem.snapshot(cluster=...)`` / ``purge(cluster=...)``, and the ``cluster``
part of the snapshot that the sidebar's comm and the live panel get after each cell.

A real ``distributed.LocalCluster`` of two worker processes (one thread each, shared
by the module) holding host torch tensors (``--device cpu``); a real IPython shell
with the extension loaded; the sidebar's comm driven as tests/views/test_comm.py drives it.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("distributed")

from distributed import wait  # noqa: E402
from IPython.core.error import UsageError  # noqa: E402

import jupyter_gpumem  # noqa: E402
from conftest import run  # noqa: E402
from jupyter_gpumem import cluster as jc  # noqa: E402
from conftest import stored  # noqa: E402 - and conftest's cluster, client, workers
from recording_comm import open_sidebar, send  # noqa: E402 - the recording comm (tests/helpers)

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@pytest.fixture
def sh(ip, client):
    """conftest's shell (extension loaded) with the client in its namespace; whatever
    the test left on the cluster is released after it."""
    ip.user_ns.update(client=client, torch=torch, wait=wait)
    run(ip, "import dask.bag as db")
    yield ip
    from jupyter_gpumem.views import panel as panel_mod

    panel_mod.close(ip)
    ip.reset(new_session=False)
    gc.collect()
    deadline = time.time() + 5
    while client.futures and time.time() < deadline:
        time.sleep(0.05)


def hold(sh, workers, size=16 * MiB):
    """``x``: a Future of one tensor on the first worker; ``emb``: a bag of four
    persisted partitions (1 MiB each) on the second."""
    w0, w1 = workers
    run(sh, f"x = client.submit(torch.ones, {size}, dtype=torch.uint8, workers=[{w0!r}], "
            f"pure=False)\n"
            f"emb = db.from_sequence([1 << 18] * 4, npartitions=4).map(torch.ones)"
            f".persist(workers=[{w1!r}])\n"
            "wait([x, emb]);")
    return sh.user_ns["x"].key, {f.key for f in distributed.futures_of(sh.user_ns["emb"])}


def line_of(text: str, name: str) -> str:
    found = [ln for ln in text.splitlines() if ln.split(" ")[0] == name]
    assert found, f"no line for {name!r} in:\n{text}"
    return found[0]


# -- %gpumem --cluster ------------------------------------------------------------------------
def test_report_names_the_future_and_the_persisted_collection_per_worker(sh, workers, capsys):
    w0, w1 = workers
    hold(sh, workers)
    capsys.readouterr()
    run(sh, "%gpumem --cluster --device cpu")
    out = capsys.readouterr().out
    print(out)
    assert out.startswith("cluster tcp://") and "2 of 2 workers answered" in out
    assert f"worker {w0} " in out and f"worker {w1} " in out
    assert re.search(r"^x +Future +16\.0 MiB +worker " + re.escape(w0) + r" cpu +1 of 1$",
                     line_of(out, "x"))
    assert re.search(r"persisted dask\.bag, 4 chunks +4\.0 MiB +worker " + re.escape(w1)
                     + r" cpu +4 of 4$", line_of(out, "emb"))
    snap = sh.run_line_magic("gpumem", "--cluster --device cpu -o")
    assert isinstance(snap, jc.ClusterSnapshot) and not snap.partial
    assert snap.holder("x").workers == {w0: {"cpu": 16 * MiB}}
    assert snap.holder("emb").workers == {w1: {"cpu": 4 * MiB}}
    assert snap.holder("emb").what == "persisted dask.bag, 4 chunks"


def test_report_honours_the_scan_time_limit_setting(sh, workers):
    hold(sh, workers)
    run(sh, "%config GpuMemMagics.scan_time_limit = 1.0")
    try:
        w0, _ = workers
        pid = sh.user_ns["client"].run(os.getpid, workers=[w0])[w0]
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.perf_counter()
            snap = sh.run_line_magic("gpumem", "--cluster --device cpu -o")
            took = time.perf_counter() - start
        finally:
            os.kill(pid, signal.SIGCONT)
        print(f"\n{snap}\nanswered in {took:.2f} s")
        assert took < 2.0 and snap.partial and list(snap.missing) == [w0]
    finally:
        run(sh, "%config GpuMemMagics.scan_time_limit = 3.0")


# -- %gpumem purge ... --cluster --------------------------------------------------------------
def test_purge_cluster_frees_the_names_on_the_workers_and_keeps_the_rest(sh, workers, capsys):
    w0, w1 = workers
    x_key, emb_keys = hold(sh, workers, size=64 * MiB)
    run(sh, f"keep = client.submit(torch.arange, 1000, workers=[{w0!r}], pure=False)\n"
            "wait(keep);")
    keep = sh.user_ns["keep"]
    capsys.readouterr()
    run(sh, "%gpumem purge x emb --cluster --dry-run --device cpu")
    dry = capsys.readouterr().out
    assert dry.startswith("dry run: would remove x, emb") and "would free" in dry
    assert "x" in sh.user_ns and x_key in stored(sh.user_ns["client"])[w0]
    result = sh.run_line_magic("gpumem", "purge x emb --cluster --device cpu -o")
    print(f"\n{result}")
    assert isinstance(result, jc.ClusterPurgeResult)
    assert result.removed[:2] == ["x", "emb"] and result.keys == 5 and result.dropped
    assert "x" not in sh.user_ns and "emb" not in sh.user_ns
    everywhere = {k for keys in stored(sh.user_ns["client"]).values() for k in keys}
    assert x_key not in everywhere and not emb_keys & everywhere
    assert result.change(w0, "cpu").freed >= 60 * MiB
    # the future no name was asked for is intact
    assert sh.user_ns["keep"] is keep and keep.key in everywhere
    assert keep.result().sum().item() == sum(range(1000))


def test_purge_cluster_all_takes_every_name_with_keys_and_no_other(sh, workers):
    hold(sh, workers)
    run(sh, "plain = torch.ones(3)\nfuts = client.map(torch.ones, [5, 6], pure=False)\n"
            "wait(futs);")
    result = sh.run_line_magic("gpumem", "purge --cluster --all --device cpu -o")
    assert sorted(result.removed) == ["emb", "futs", "x"] and result.keys == 7
    assert "plain" in sh.user_ns and "client" in sh.user_ns and "db" in sh.user_ns
    assert not sh.run_line_magic("gpumem", "--cluster --device cpu -o").holders



def test_purge_cluster_all_that_takes_no_name_leaves_the_hidden_holders(sh, workers):
    """A future shown as a cell's value (Out) and no name holding a key: ``--all`` took
    no name and cleared every hidden holder, as ``purge`` with no names does. It clears
    none now; ``purge --cluster`` with no names does."""
    run(sh, "client.submit(torch.ones, 7, pure=False)")
    shown = max(sh.user_ns["Out"])
    result = sh.run_line_magic("gpumem", "purge --cluster --all --device cpu -o")
    assert result.removed == [] and shown in sh.user_ns["Out"], result.removed
    assert any("no name of this notebook holds a key" in m for m in result.messages)
    result = sh.run_line_magic("gpumem", "purge --cluster --device cpu -o")
    assert f"Out[{shown}]" in result.removed and shown not in sh.user_ns["Out"]


BAD = [
    ("purge x nope --cluster --device cpu", "'nope'"),
    ("purge x plain --cluster --device cpu", "'plain' holds no key on the cluster"),
    ("purge x --all --cluster --device cpu", "not both"),
    ("purge x --cluster --device tpu:0", "device"),
    ("purge 'x; import os' --cluster --device cpu", "x; import os"),
    ("--cluster x", "give no names"),
    ("--cluster --device tpu:0", "device"),
]


def test_bad_input_is_a_usage_error_and_deletes_nothing(sh, workers):
    x_key, emb_keys = hold(sh, workers)
    run(sh, "plain = torch.ones(3)")
    for line, why in BAD:
        with pytest.raises(UsageError, match=re.escape(why)):
            sh.run_line_magic("gpumem", line)
        assert {"x", "emb", "plain"} <= set(sh.user_ns), line
    everywhere = {k for keys in stored(sh.user_ns["client"]).values() for k in keys}
    assert x_key in everywhere and emb_keys <= everywhere
    # a failed line in a cell is one UsageError, and the cell's other names stand
    result = sh.run_cell("%gpumem purge x nope --cluster --device cpu", store_history=True)
    assert type(result.error_in_exec) is UsageError and "x" in sh.user_ns


def test_python_api_takes_a_cluster(sh, workers):
    w0, _ = workers
    x_key, _ = hold(sh, workers)
    client = sh.user_ns["client"]
    import jupyter_gpumem.core.purge  # noqa: F401 - the submodules shadow the package's functions
    import jupyter_gpumem.core.snapshot  # noqa: F401

    snap = jupyter_gpumem.snapshot(shell=sh, cluster=client, device="cpu")
    assert isinstance(snap, jc.ClusterSnapshot) and snap.holder("x").workers == {
        w0: {"cpu": 16 * MiB}}
    found = jupyter_gpumem.snapshot(sh.user_ns, cluster=True, device="cpu")  # the namespace's
    assert found.client_id == client.id and found.holder("emb") is not None
    local = jupyter_gpumem.snapshot(shell=sh, device="cpu")   # no cluster: as before
    assert type(local).__name__ == "Snapshot"
    with pytest.raises(jupyter_gpumem.PurgeError, match="nothing was deleted"):
        jupyter_gpumem.purge(["x", "nope"], shell=sh, cluster=client, device="cpu")
    assert "x" in sh.user_ns
    dry = jupyter_gpumem.purge(["x"], shell=sh, cluster=client, device="cpu", dry_run=True)
    assert dry.dry_run and dry.predicted[w0]["cpu"] == 16 * MiB and "x" in sh.user_ns
    result = jupyter_gpumem.purge(["x"], shell=sh, cluster=client, device="cpu")
    assert isinstance(result, jc.ClusterPurgeResult) and "x" in result.removed
    assert "x" not in sh.user_ns and x_key not in stored(client)[w0]
    assert json.loads(json.dumps(result.to_json()))["schema"] == "jupyter_gpumem.cluster_purge/1"


# -- the views: the snapshot after each cell -------------------------------------------------
def close_sidebar(c) -> None:
    c.handle_close({"content": {"comm_id": c.comm_id, "data": {}}})


def test_comm_snapshot_after_each_cell_carries_the_cluster_part(sh, workers, tmp_path):
    w0, w1 = workers
    c = open_sidebar()
    try:
        send(c, {"type": "set_device", "device": "cpu"})
        c.clear()
        hold(sh, workers)
        (pushed,) = c.messages("snapshot")
        assert "reply_to" not in pushed
        part = pushed["snapshot"]["cluster"]
        assert part["schema"] == "jupyter_gpumem.cluster/1" and not part["partial"]
        assert [w["address"] for w in part["workers"]] == [w0, w1]
        assert all([d["id"] for d in w["devices"]] == ["cpu"] for w in part["workers"])
        holders = {h["name"]: h for h in part["holders"]}
        assert holders["x"]["what"] == "Future"
        assert holders["x"]["workers"] == {w0: {"cpu": 16 * MiB}}
        assert holders["emb"]["workers"] == {w1: {"cpu": 4 * MiB}}
        worker0 = part["workers"][0]["devices"][0]
        assert worker0["attributed"] == 16 * MiB and worker0["used_process"] > 16 * MiB
        # the local part is as before: the client and the futures are not tensors here
        assert pushed["snapshot"]["schema"] == "jupyter_gpumem.snapshot/1"
        assert not {"x", "emb", "client"} & {h["name"] for h in pushed["snapshot"]["holders"]}
        # the names are walked on the main thread; the push is made there too
        assert all(t == threading.main_thread().name for kind, d, t in c.sent
                   if d.get("type") == "snapshot")
        (reply,) = send(c, {"type": "refresh", "id": 5})
        assert reply["reply_to"] == 5 and {h["name"] for h in reply["snapshot"]["cluster"][
            "holders"]} == {"x", "emb"}
        messages = [m for m in c.messages("snapshot")]
        run(sh, "%gpumem purge x emb --cluster --device cpu")
        after = c.messages("snapshot")[-1]["snapshot"]["cluster"]
        assert after["holders"] == [] and after["held_bytes"] == 0
        messages.append(c.messages("snapshot")[-1])
        workers_shown = [f"worker {w.split('://')[1]} cpu" for w in (w0, w1)]
        cases = [{"messages": messages[:1], "holders": ["x", "emb"], "workers": workers_shown},
                 {"messages": messages, "holders": [], "workers": workers_shown}]
        (tmp_path / "cluster_messages.json").write_text(json.dumps(cases))
    finally:
        close_sidebar(c)
    # the sidebar's own checks and rendering, on these very messages
    jlpm = shutil.which("jlpm") or shutil.which("jlpm", path=str(Path(sys.executable).parent))
    if jlpm is None or shutil.which("node") is None:
        pytest.skip("Node.js is not installed: the frontend half is not run")
    out = subprocess.run([jlpm, "vitest", "run", "test/cluster_contract.test.ts"],
                         cwd=ROOT / "labextension", capture_output=True, text=True, timeout=300,
                         env={**os.environ,
                              "GPUMEM_CLUSTER_MESSAGES": str(tmp_path / "cluster_messages.json")})
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout[-3000:]


def test_panel_shows_worker_bars_and_the_cluster_holders(sh, workers):
    pytest.importorskip("ipywidgets")
    from jupyter_gpumem.views import panel as panel_mod

    w0, w1 = workers
    run(sh, "%gpumem panel --device cpu")
    panel = panel_mod.current(sh)
    assert panel.cluster_bars.layout.display is None   # a client is connected: shown
    hold(sh, workers)
    part = panel.snapshot["cluster"]
    assert {h["name"] for h in part["holders"]} == {"x", "emb"}
    bars = panel.cluster_bars.value
    for w in (w0, w1):
        assert f"<b>worker {w.split('://')[1]} cpu</b>" in bars and f"data-worker='{w}'" in bars
    assert "2 of 2 workers answered" in bars
    table = panel.cluster_table.value
    assert "data-cluster-holder='x'" in table and "data-cluster-holder='emb'" in table
    assert "persisted dask.bag, 4 chunks" in table and f"worker {w0.split('://')[1]} cpu" in table
    assert "worker" not in panel.bars.value            # the local bars stay the local ones
    panel._tick()                                      # a device reading leaves the workers' bars
    assert panel.cluster_bars.value == bars
    run(sh, "%gpumem purge x emb --cluster --device cpu")
    assert "data-cluster-holder='" not in panel.cluster_table.value
    assert "no name of this notebook holds a key on the cluster" in panel.cluster_table.value


def test_a_stopped_worker_costs_a_cell_at_most_the_time_limit(sh, workers):
    w0, w1 = workers
    hold(sh, workers)
    run(sh, "%config GpuMemMagics.scan_time_limit = 1.0")
    c = open_sidebar()
    try:
        send(c, {"type": "set_device", "device": "cpu"})
        c.clear()
        pid = sh.user_ns["client"].run(os.getpid, workers=[w0])[w0]
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.perf_counter()
            run(sh, "y = 1")          # no kernel: the refresh runs in post_run_cell
            took = time.perf_counter() - start
        finally:
            os.kill(pid, signal.SIGCONT)
        part = c.messages("snapshot")[-1]["snapshot"]["cluster"]
        print(f"\ncell and refresh with a stopped worker: {took:.2f} s; missing {part['missing']}")
        assert took < 2.0
        assert part["partial"] and list(part["missing"]) == [w0]
        assert [w["address"] for w in part["workers"]] == [w1]
        assert {h["name"]: h["in_memory"] for h in part["holders"]} == {"x": 0, "emb": 4}
    finally:
        close_sidebar(c)
        run(sh, "%config GpuMemMagics.scan_time_limit = 3.0")


def test_in_a_kernel_the_cluster_is_asked_off_the_event_loop(sh, workers, monkeypatch):
    """As in ipykernel: the refresh waits for the cell's task, runs on the loop in
    steps, and the question to the cluster (a stopped worker: a full time limit)
    goes to a thread of its own while the loop keeps running."""
    w0, w1 = workers
    hold(sh, workers)
    run(sh, "%config GpuMemMagics.scan_time_limit = 1.0")
    monkeypatch.setattr(sh, "kernel", types.SimpleNamespace(), raising=False)
    c = open_sidebar()
    asked_from = []
    real = jc.snapshot

    def spy(*args, **kwargs):
        asked_from.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(jc, "snapshot", spy)

    async def main():
        async def cell():
            sh.run_cell("z = 3", store_history=True)
        ticks = []

        async def ticker():
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)
        tick_task = asyncio.create_task(ticker())
        pid = sh.user_ns["client"].run(os.getpid, workers=[w0])[w0]
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.perf_counter()
            await asyncio.create_task(cell())
            cell_done = time.perf_counter() - start
            while not c.messages("snapshot") and time.perf_counter() - start < 5:
                await asyncio.sleep(0.01)
            pushed = time.perf_counter() - start
        finally:
            os.kill(pid, signal.SIGCONT)
            tick_task.cancel()
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        return cell_done, pushed, max(gaps)

    try:
        send(c, {"type": "set_device", "device": "cpu"})
        c.clear()
        asked_from.clear()
        cell_done, pushed, gap = asyncio.run(main())
        print(f"\ncell {cell_done * 1000:.0f} ms; snapshot pushed after {pushed:.2f} s; "
              f"longest stall of the loop {gap * 1000:.0f} ms; asked from {asked_from}")
        assert cell_done < 0.5              # the cell did not wait for the cluster
        assert pushed < 2.0                 # the stopped worker cost about the time limit
        assert gap < 0.5                    # the loop ran while the cluster was asked
        assert asked_from == ["jupyter_gpumem-cluster_0"]
        (snap,) = c.messages("snapshot")
        part = snap["snapshot"]["cluster"]
        assert part["partial"] and list(part["missing"]) == [w0]
        assert all(t == threading.main_thread().name for kind, d, t in c.sent
                   if d.get("type") == "snapshot")
    finally:
        close_sidebar(c)
        monkeypatch.undo()
        run(sh, "%config GpuMemMagics.scan_time_limit = 3.0")
    # unloading the extension ends the thread that asked the cluster
    assert any(t.name.startswith("jupyter_gpumem-cluster") for t in threading.enumerate())
    run(sh, "%unload_ext jupyter_gpumem")
    assert not any(t.name.startswith("jupyter_gpumem-cluster") for t in threading.enumerate())
    run(sh, "%load_ext jupyter_gpumem")


# -- Dask stays out unless the user brought it in ------------------------------------------------
def test_nothing_of_dask_is_imported_unless_the_user_did():
    code = r"""
import sys
sys.path.insert(0, sys.argv[1])
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.error import UsageError
from recording_comm import open_sidebar, send
ip = InteractiveShell.instance()
ip.run_cell("%load_ext jupyter_gpumem")
c = open_sidebar()
send(c, {"type": "set_device", "device": "cpu"})
ip.run_cell("%gpumem panel --device cpu")
ip.run_cell("import torch; t = torch.ones(10)")
ip.run_cell("%gpumem --device cpu")
import jupyter_gpumem
try:
    ip.run_line_magic("gpumem", "--cluster")
except UsageError as e:
    print("NO DASK:", e)
try:
    ip.run_line_magic("gpumem", "purge t --cluster")
except UsageError as e:
    print("NO DASK PURGE:", e)
snap = c.messages("snapshot")[-1]["snapshot"]
print("CLUSTER PART:", "cluster" in snap, [m for m in snap["messages"] if "cluster" in m])
print("IMPORTED:", sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))
import distributed
ip.run_cell("u = 1")
snap = c.messages("snapshot")[-1]["snapshot"]
print("NO CLIENT PART:", "cluster" in snap, [m for m in snap["messages"] if "cluster" in m])
try:
    ip.run_line_magic("gpumem", "--cluster")
except UsageError as e:
    print("NO CLIENT:", e)
ip.run_cell("%unload_ext jupyter_gpumem")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "helpers")], capture_output=True,
                         text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout)
    assert "NO DASK: --cluster: Dask is not in use: import distributed and connect a Client " \
        "first" in out.stdout
    assert "NO DASK PURGE: --cluster: Dask is not in use" in out.stdout
    assert "CLUSTER PART: False []" in out.stdout
    assert "IMPORTED: []" in out.stdout
    assert "NO CLIENT PART: False []" in out.stdout
    assert "NO CLIENT: --cluster: no Dask client: connect one first" in out.stdout
