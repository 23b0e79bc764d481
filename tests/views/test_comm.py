"""The sidebar's comm target, driven as the sidebar drives it.

A real IPython shell, real torch tensors on the CPU and the real ``comm``
package; only the transport is replaced by a recording comm (the model is
ipywidgets' DummyComm): it keeps every message the kernel would send.
"""
from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")
comm_pkg = pytest.importorskip("comm")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

from jupyter_gpumem.views import comm as gpucomm  # noqa: E402
from recording_comm import open_sidebar, send  # noqa: E402

MiB = 1 << 20


@pytest.fixture
def shell():
    ip = InteractiveShell.instance()
    if "jupyter_gpumem" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "jupyter_gpumem")
    before = set(ip.user_ns)
    gpucomm.register_comm(ip)
    yield ip
    gpucomm.unregister_comm(ip)
    for name in set(ip.user_ns) - before:
        ip.user_ns.pop(name, None)
    ip.history_manager.reset()
    ip.displayhook.flush()


def holder(snapshot: dict, name: str):
    return next((h for h in snapshot["holders"] if h["name"] == name), None)


def test_open_says_hello_and_starts_sampling(shell):
    c = open_sidebar()
    hello = c.messages("hello")
    assert len(hello) == 1
    assert hello[0]["device"] == "auto"
    assert hello[0]["version"] == __import__("jupyter_gpumem").__version__
    hub = gpucomm.hub_of(shell)
    assert hub.thread is not None and hub.thread.is_alive()


def test_refresh_replies_with_a_snapshot_that_lists_a_host_tensor(shell):
    shell.run_cell("import torch; big = torch.ones(1024, 1024)")
    c = open_sidebar()
    (reply,) = send(c, {"type": "set_device", "id": 1, "device": "cpu"})
    assert reply["type"] == "snapshot" and reply["reply_to"] == 1
    snap = reply["snapshot"]
    assert snap["schema"] == "jupyter_gpumem.snapshot/1"
    assert snap["device"] == "cpu"
    big = holder(snap, "big")
    assert big is not None and big["unique"] == 4 * MiB and big["purge"] == "big"
    assert [d["id"] for d in snap["devices"]] == ["cpu"]

    (reply,) = send(c, {"type": "refresh", "id": "r-2"})
    assert reply["type"] == "snapshot" and reply["reply_to"] == "r-2"
    assert holder(reply["snapshot"], "big")["unique"] == 4 * MiB


def test_snapshot_after_each_cell(shell):
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    c.clear()
    shell.run_cell("import torch; grown = torch.zeros(512, 1024)")
    pushed = c.messages("snapshot")
    assert len(pushed) == 1
    assert "reply_to" not in pushed[0]
    assert holder(pushed[0]["snapshot"], "grown")["unique"] == 2 * MiB
    # the push is made on the main thread, by the post_run_cell event
    assert all(t == threading.main_thread().name for kind, d, t in c.sent if d["type"] == "snapshot")


def test_without_a_dask_client_the_snapshot_has_no_cluster_part(shell):
    shell.run_cell("import torch; t = torch.ones(10)")
    c = open_sidebar()
    (reply,) = send(c, {"type": "set_device", "id": 1, "device": "cpu"})
    shell.run_cell("u = 1")
    for snap in [reply["snapshot"]] + [m["snapshot"] for m in c.messages("snapshot")]:
        assert "cluster" not in snap
        assert not [m for m in snap["messages"] if m.startswith("cluster")]


def test_purge_deletes_the_name_and_frees_its_storage(shell):
    shell.run_cell("import torch; big = torch.ones(1024, 1024); keep = torch.ones(10)")
    ref = StorageWeakRef(shell.user_ns["big"].untyped_storage())
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    replies = send(c, {"type": "purge", "id": 7, "names": ["big"]})
    assert [r["type"] for r in replies] == ["purge_result", "snapshot"]
    result = replies[0]["result"]
    assert replies[0]["reply_to"] == 7
    assert result["schema"] == "jupyter_gpumem.purge/1"
    assert result["dry_run"] is False
    assert "big" in result["removed"]
    assert "big" not in shell.user_ns
    assert "keep" in shell.user_ns
    assert ref.expired()
    assert holder(replies[1]["snapshot"], "big") is None


def test_dry_run_purge_changes_nothing(shell):
    shell.run_cell("import torch; big = torch.ones(1024, 1024)")
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    replies = send(c, {"type": "purge", "names": ["big"], "dry_run": True})
    assert [r["type"] for r in replies] == ["purge_result"]
    assert replies[0]["result"]["dry_run"] is True
    assert replies[0]["result"]["predicted"]["cpu"] == 4 * MiB
    assert "big" in shell.user_ns


def test_a_bad_name_is_an_error_and_deletes_nothing(shell):
    shell.run_cell("import torch; big = torch.ones(1024, 1024)")
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    (reply,) = send(c, {"type": "purge", "id": 3, "names": ["big", "no_such_name"]})
    assert reply["type"] == "error" and reply["reply_to"] == 3
    assert "no_such_name" in reply["message"]
    assert "\n" not in reply["message"]
    assert "big" in shell.user_ns


def test_names_are_never_evaluated(shell, tmp_path):
    shell.run_cell("import torch; big = torch.ones(1024, 1024)")
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    for name in (code, f"big; {code}", f"big[{code}]", f"{code}.x"):
        (reply,) = send(c, {"type": "purge", "names": [name]})
        assert reply["type"] == "error", name
    assert not marker.exists()
    assert "big" in shell.user_ns


MALFORMED = [
    pytest.param(None, "JSON object", id="null"),
    pytest.param([1, 2], "JSON object", id="list"),
    pytest.param("refresh", "JSON object", id="string"),
    pytest.param({}, '"type"', id="no-type"),
    pytest.param({"type": 5}, '"type"', id="type-not-string"),
    pytest.param({"type": "refresh", "id": {"a": 1}}, '"id"', id="id-object"),
    pytest.param({"type": "refresh", "id": True}, '"id"', id="id-bool"),
    pytest.param({"type": "refresh", "code": "1"}, "unknown field", id="extra-field"),
    pytest.param({"type": "purge"}, "'names'", id="purge-no-names"),
    pytest.param({"type": "purge", "names": "big"}, '"names"', id="names-string"),
    pytest.param({"type": "purge", "names": []}, '"names"', id="names-empty"),
    pytest.param({"type": "purge", "names": ["big", 3]}, '"names"', id="names-int"),
    pytest.param({"type": "purge", "names": [""]}, '"names"', id="names-blank"),
    pytest.param({"type": "purge", "names": ["big\nkeep"]}, "not a name", id="name-newline"),
    pytest.param({"type": "purge", "names": ["x" * 600]}, "not a name", id="name-too-long"),
    pytest.param({"type": "purge", "names": ["big"] * 4097}, "at most 4096", id="too-many-names"),
    pytest.param({"type": "purge", "names": ["big"], "dry_run": "yes"}, '"dry_run"', id="dry-run-string"),
    pytest.param({"type": "purge", "names": ["big"], "all": True}, "unknown field", id="purge-all"),
    pytest.param({"type": "set_device"}, "'device'", id="device-missing"),
    pytest.param({"type": "set_device", "device": 0}, '"device"', id="device-int"),
    pytest.param({"type": "set_device", "device": "x" * 100}, '"device"', id="device-long"),
    pytest.param({"type": "set_device", "device": "tpu:0"}, "unknown device", id="device-unknown"),
    pytest.param({"type": "cancel"}, "'request'", id="cancel-no-request"),
    pytest.param({"type": "cancel", "request": [1]}, '"request"', id="cancel-request-list"),
    pytest.param({"type": "cancel", "request": "p1"}, "no queued request", id="cancel-unknown"),
    pytest.param({"type": "hello", "code": "1"}, "unknown field", id="hello-extra-field"),
]


@pytest.mark.parametrize("data, why", MALFORMED)
def test_malformed_requests_get_an_error_and_change_nothing(shell, data, why):
    shell.run_cell("import torch; big = torch.ones(1024, 1024)")
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    channel = gpucomm.hub_of(shell).channels[0]
    replies = send(c, data)
    assert len(replies) == 1
    assert replies[0]["type"] == "error"
    assert why in replies[0]["message"]
    assert "\n" not in replies[0]["message"]
    assert "big" in shell.user_ns
    assert channel.device == "cpu"


@pytest.mark.parametrize("kind", ["execute", "eval", "exec", "purge_all", "", "REFRESH"])
def test_unknown_types_get_an_error(shell, kind):
    c = open_sidebar()
    (reply,) = send(c, {"type": kind, "id": 9, "code": "print(1)"})
    assert reply == {"type": "error", "message": f"unknown request type {kind!r}", "reply_to": 9}


def test_error_reply_echoes_a_valid_id_only(shell):
    c = open_sidebar()
    (reply,) = send(c, {"type": "purge", "id": "p1", "names": 3})
    assert reply["reply_to"] == "p1"
    (reply,) = send(c, {"type": "purge", "id": [1], "names": 3})
    assert "reply_to" not in reply


def test_devices_are_sent_from_a_thread_while_a_cell_runs(shell):
    hub = gpucomm.hub_of(shell)
    hub.interval = 0.2
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    c.clear()
    shell.run_cell("import time; time.sleep(1.5)")
    during = [(d, t) for kind, d, t in c.sent if d.get("type") == "devices"]
    assert len(during) >= 4
    assert {t for _, t in during} == {"jupyter_gpumem-sampler"}   # the session's
    first = during[0][0]
    assert [d["id"] for d in first["devices"]] == ["cpu"]
    assert first["devices"][0]["total"] > 0
    # a reading between scans does not claim that no tensor is tracked
    assert first["devices"][0]["attributed"] is None
    assert isinstance(first["time"], float)


def test_sampling_stops_when_the_last_comm_closes(shell):
    hub = gpucomm.hub_of(shell)
    hub.interval = 0.05
    c = open_sidebar()
    thread = hub.thread
    assert thread.is_alive()
    c.handle_close({"content": {"comm_id": c.comm_id, "data": {}}})
    thread.join(2)
    assert not thread.is_alive()
    assert hub.thread is None
    assert hub.channels == []
    # a new sidebar starts a new thread
    open_sidebar()
    assert hub.thread is not None and hub.thread.is_alive()


def test_unregister_removes_target_hook_thread_and_comms(shell):
    manager = comm_pkg.get_comm_manager()
    hub = gpucomm.hub_of(shell)
    c = open_sidebar()
    thread = hub.thread
    assert manager.targets[gpucomm.TARGET] == hub.on_open
    # the after-cell hook is the shell's session's (made by the comm, which owns it here)
    hook = hub.session.dispatch.post_run_cell
    assert hub.owns_session and hook in shell.events.callbacks["post_run_cell"]
    gpucomm.unregister_comm(shell)
    assert gpucomm.TARGET not in manager.targets
    assert hook not in shell.events.callbacks["post_run_cell"]
    assert not thread.is_alive()
    assert ("comm_close", {}, threading.main_thread().name) in [
        (k, d or {}, t) for k, d, t in c.sent if k == "comm_close"
    ]
    # a cell after unloading pushes nothing
    c.clear()
    shell.run_cell("x = 1")
    assert c.sent == []
    gpucomm.register_comm(shell)  # for the fixture's teardown


def test_load_ext_registers_the_target_and_unload_removes_it():
    ip = InteractiveShell.instance()
    manager = comm_pkg.get_comm_manager()
    if "jupyter_gpumem" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "jupyter_gpumem")
    assert gpucomm.TARGET not in manager.targets
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    try:
        assert gpucomm.TARGET in manager.targets
        c = open_sidebar()
        assert c.messages("hello")
    finally:
        ip.run_line_magic("unload_ext", "jupyter_gpumem")
    assert gpucomm.TARGET not in manager.targets
    assert gpucomm.hub_of(ip) is None


def test_unload_is_quick_and_leaves_no_thread(shell):
    hub = gpucomm.hub_of(shell)
    open_sidebar()
    start = time.perf_counter()
    gpucomm.unregister_comm(shell)
    assert time.perf_counter() - start < 1.0
    assert not any(t.name == "jupyter_gpumem-sampler" for t in threading.enumerate())
    assert hub.thread is None or not hub.thread.is_alive()
    gpucomm.register_comm(shell)


def test_the_sidebar_and_a_panel_on_selections_alike_share_one_scan_after_a_cell(monkeypatch):
    """The sidebar shows ``auto``, the panel ``cpu``: on a machine without accelerators
    both cover the host alone, so the refresh after a cell scans once and each view gets
    its own snapshot, under its own selection (with that selection's message)."""
    from jupyter_gpumem.core import devices as _devices
    from jupyter_gpumem.core import scan as _scan
    from jupyter_gpumem.views import panel as panel_mod

    if _devices.accelerators():
        pytest.skip("here auto covers accelerators, not the host")
    ip = InteractiveShell.instance()
    if "jupyter_gpumem" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "jupyter_gpumem")
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    try:
        c = open_sidebar()
        ip.run_line_magic("gpumem", "panel --device cpu")
        panel = panel_mod.current(ip)
        scanned: list[set] = []
        real = _scan.iter_scan

        def counting(*args, **kwargs):
            scanned.append(kwargs.get("devices"))
            return (yield from real(*args, **kwargs))

        monkeypatch.setattr(_scan, "iter_scan", counting)
        c.clear()
        ip.run_cell("import torch; shared_t = torch.ones(256, 1024)", store_history=True)
        assert scanned == [{"cpu"}]
        (pushed,) = c.messages("snapshot")
        side, own = pushed["snapshot"], panel.snapshot
        assert (side["device"], own["device"]) == ("auto", "cpu")
        assert holder(side, "shared_t")["unique"] == MiB == holder(own, "shared_t")["unique"]
        assert [h["name"] for h in side["holders"]] == [h["name"] for h in own["holders"]]
        assert "no accelerator: showing host tensors (device cpu)" in side["messages"]
        assert "no accelerator: showing host tensors (device cpu)" in own["messages"]

        # a selection whose reading fails (the sidebar moved to cuda) costs the other
        # view nothing: the panel's snapshot still comes, the sidebar is told
        send(c, {"type": "set_device", "device": "cuda"})
        real_read = _devices.read_devices

        def read(selection, **kwargs):
            if selection.device == "cuda":
                raise OSError("the driver went away")
            return real_read(selection, **kwargs)

        monkeypatch.setattr(_devices, "read_devices", read)
        c.clear()
        before = panel.snapshot
        ip.run_cell("other_t = torch.ones(256, 1024)", store_history=True)
        assert panel.snapshot is not before and holder(panel.snapshot, "other_t") is not None
        assert any("scan failed: OSError: the driver went away" in m["message"]
                   for m in c.messages("error"))
        assert not c.messages("snapshot")
    finally:
        panel_mod.close(ip)
        ip.run_line_magic("unload_ext", "jupyter_gpumem")
        ip.user_ns.pop("shared_t", None)
        ip.user_ns.pop("other_t", None)


def test_hello_as_a_request_answers_hello_with_the_kernels_state_and_timeline(shell):
    hub = gpucomm.hub_of(shell)
    hub.interval = 0.05
    c = open_sidebar()
    (first,) = c.messages("hello")
    assert first["busy"] is False and isinstance(first["timeline"], list)
    send(c, {"type": "set_device", "device": "cpu"})
    deadline = time.monotonic() + 10
    while len(hub.timeline()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    (reply,) = send(c, {"type": "hello", "id": "ping-1"})
    assert reply["type"] == "hello" and reply["reply_to"] == "ping-1"
    assert reply["busy"] is False and reply["device"] == "cpu"
    points = reply["timeline"]
    assert len(points) >= 3
    assert [p["time"] for p in points] == sorted(p["time"] for p in points)
    cpu = points[-1]["devices"]["cpu"]
    assert set(cpu) == {"allocated", "reserved", "used_process"}
    assert cpu["used_process"] > 0, "the host's figure is the process's resident memory"
    # a view opened later starts with that history
    later = open_sidebar()
    assert len(later.messages("hello")[0]["timeline"]) >= len(points)


def test_devices_and_snapshots_say_whether_a_cell_runs(shell):
    hub = gpucomm.hub_of(shell)
    hub.interval = 0.1
    c = open_sidebar()
    (reply,) = send(c, {"type": "set_device", "device": "cpu"})
    assert reply["snapshot"]["cell_running"] is False
    c.clear()
    shell.run_cell("import time; time.sleep(0.6)")
    during = [d for d in c.messages("devices")]
    assert during and any(d["cell_running"] is True for d in during)
    assert c.messages("snapshot")[-1]["snapshot"]["cell_running"] is False
    c.clear()
    time.sleep(0.3)
    assert c.messages("devices") and all(d["cell_running"] is False
                                         for d in c.messages("devices"))
    assert c.messages("devices")[-1]["devices"][0]["used_process"] > 0


def test_a_purge_of_300_names_is_one_request(shell):
    shell.run_cell("import torch\n" + "\n".join(f"v{i} = torch.ones(64)" for i in range(300)))
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    replies = send(c, {"type": "purge", "id": "all", "names": [f"v{i}" for i in range(300)]})
    (result,) = [r for r in replies if r["type"] == "purge_result"]
    assert result["reply_to"] == "all"
    assert len(result["result"]["removed"]) >= 300
    assert not any(f"v{i}" in shell.user_ns for i in range(300))
