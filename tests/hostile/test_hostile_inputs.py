"""Hostile inputs, round three: names that are not identifiers, keys of the user's own
types in ``Out``, streams whose ``write`` raises, odd device strings, and what
``%gpumem purge --all`` takes and keeps. Real shells, real kernels, real tensors."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import kernel_messages, run  # noqa: E402

N = 1 << 16
ROOT = Path(__file__).resolve().parents[2]


# -- streams whose write raises, in a real kernel ------------------------------------------
class _Kernel:
    """A kernel driven as a frontend does: cells, their replies, one comm."""

    def __init__(self, kc):
        self.kc = kc

    def reply(self, code: str, timeout: float = 30) -> dict | None:
        """The execute reply's content, or None when none came within ``timeout``."""
        msg_id = self.kc.execute(code)
        for msg in kernel_messages(self.kc.get_shell_msg, timeout):
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]
        return None

    def comm_open(self, target: str) -> str:
        comm_id = uuid.uuid4().hex
        msg = self.kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": target,
                                                "data": {}})
        self.kc.shell_channel.send(msg)
        return comm_id

    def comm_messages(self, comm_id: str, seconds: float) -> list[dict]:
        out = []
        for msg in kernel_messages(self.kc.get_iopub_msg, seconds, poll=0.2):
            if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == comm_id:
                out.append(msg["content"]["data"])
        return out


RAISING_STREAMS = """
import sys
class Broken:
    def write(self, text):
        raise RuntimeError('this stream refuses text')
    def flush(self):
        pass
kept_out, kept_err = sys.stdout, sys.stderr
sys.stdout, sys.stderr = Broken(), Broken()
t = torch.ones(1000)
"""


def test_a_cell_that_breaks_both_streams_still_gets_its_reply_and_so_does_the_next(monkeypatch):
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    from jupyter_client.manager import start_new_kernel

    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        k = _Kernel(kc)
        assert k.reply("%load_ext jupyter_gpumem\nimport torch")["status"] == "ok"
        assert k.reply("%gpumem watch on --device cpu")["status"] == "ok"
        assert k.reply("%gpumem panel --device cpu --interval 0.2")["status"] == "ok"
        comm = k.comm_open("jupyter_gpumem")
        assert [m["type"] for m in k.comm_messages(comm, 2.0)][:1] == ["hello"]
        reply = k.reply(RAISING_STREAMS)
        assert reply is not None and reply["status"] == "ok", reply
        reply = k.reply("u = torch.ones(10)")
        assert reply is not None and reply["status"] == "ok", reply
        reply = k.reply("sys.stdout, sys.stderr = kept_out, kept_err\nprint(u.sum().item())")
        assert reply is not None and reply["status"] == "ok", reply
        assert k.reply("%gpumem watch status")["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_products_own_complaints_never_raise(ip, capsys):
    """The footer's error path, in a shell: a raising sys.stdout and sys.stderr cost the
    product its line (it goes to sys.__stderr__) and never the cell."""
    ip.run_line_magic("gpumem", "watch on --device cpu")
    try:
        r = run(ip, RAISING_STREAMS.replace("import sys", "import sys, torch"))
        assert r.success, r.error_in_exec
        r = run(ip, "z = 1")
        assert r.success, r.error_in_exec
    finally:
        run(ip, "sys.stdout, sys.stderr = kept_out, kept_err")
        ip.run_line_magic("gpumem", "watch off")


# -- a purge hits exactly the holder its row names ------------------------------------------
def _odd_globals(ip):
    class Box:
        pass

    keeper, inner = torch.ones(4), torch.ones(8)
    ip.user_ns["x"] = [keeper]
    ip.user_ns["x[0]"] = torch.ones(N)
    box = Box()
    box.b = inner
    ip.user_ns["a"] = box
    ip.user_ns["a.b"] = torch.ones(N // 2)
    ip.user_ns["my tensor"] = torch.ones(N // 4)
    return keeper, inner


ODD = {"x[0]": "globals()['x[0]']", "a.b": "globals()['a.b']",
       "my tensor": "globals()['my tensor']"}


def test_a_key_that_is_no_identifier_is_named_and_purged_as_itself(ip):
    keeper, inner = _odd_globals(ip)
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    for key, text in ODD.items():
        h = snap.holder(text)
        assert h is not None and h.purge == text, [(h.name, h.purge) for h in snap.holders]
        assert h.largest_path == text
    assert snap.holder("x").largest_path == "x[0]" and snap.holder("a").largest_path == "a.b"
    for text in ODD.values():
        ip.run_line_magic("gpumem", f"purge {text} --device cpu")
    for key in ODD:
        assert key not in ip.user_ns
    assert ip.user_ns["x"][0] is keeper and ip.user_ns["a"].b is inner


def test_the_sidebars_purge_of_a_row_removes_that_row_only(ip):
    from recording_comm import close_sidebar, open_sidebar, send

    keeper, inner = _odd_globals(ip)
    c = open_sidebar()
    (reply,) = send(c, {"type": "set_device", "id": 1, "device": "cpu"})
    rows = {h["name"]: h["purge"] for h in reply["snapshot"]["holders"]}
    assert {rows[text] for text in ODD.values()} == set(ODD.values()), rows
    replies = send(c, {"type": "purge", "id": 2, "names": [rows[t] for t in ODD.values()]})
    assert replies[0]["type"] == "purge_result", replies
    assert sorted(replies[0]["result"]["removed"]) == sorted(ODD.values())
    assert not set(ODD) & set(ip.user_ns)
    assert ip.user_ns["x"][0] is keeper and ip.user_ns["a"].b is inner
    close_sidebar(c)


def test_an_attribute_that_is_no_identifier_reads_as_its_dict_key(ip):
    class Box:
        pass

    box = Box()
    box.inner = torch.ones(4)
    vars(box)["inner[0]"] = torch.ones(N)
    ip.user_ns["box"] = box
    snap = ip.run_line_magic("gpumem", "box --device cpu -o")
    paths = {r.path for r in snap.details[0].rows}
    assert paths == {"box.inner", "box.__dict__['inner[0]']"}, paths
    ip.run_line_magic("gpumem", "purge box.__dict__['inner[0]'] --device cpu")
    assert set(vars(box)) == {"inner"}


def test_quoted_and_bracketed_arguments_keep_their_spaces(ip):
    ip.user_ns["cfg"] = {"a b": torch.ones(N), "c": torch.ones(4)}
    ip.user_ns["my tensor"] = torch.ones(N)
    dry = ip.run_line_magic("gpumem", "purge cfg['a b'] \"globals()['my tensor']\" "
                                      "--dry-run --device cpu -o")
    assert dry.removed == ["cfg['a b']", "globals()['my tensor']"]
    with pytest.raises(Exception, match="globals\\(\\)\\['my tensor'\\]"):
        ip.run_line_magic("gpumem", "purge 'my tensor' --device cpu")
    assert "my tensor" in ip.user_ns


# -- keys of Out that are not cell numbers ---------------------------------------------------
class LoudKey:
    """A key whose order, format, repr and hash are its own code: none may run."""

    calls: list[str] = []

    def __lt__(self, other):
        LoudKey.calls.append("__lt__")
        return True

    def __gt__(self, other):
        LoudKey.calls.append("__gt__")
        return True

    def __format__(self, spec):
        LoudKey.calls.append("__format__")
        return "loud"

    def __repr__(self):
        LoudKey.calls.append("__repr__")
        return "LoudKey()"


def test_a_key_of_the_users_type_in_out_runs_none_of_its_code(ip):
    run(ip, "import torch\ntorch.ones(8)")        # an Out[N] of the shell's own
    key = LoudKey()
    ip.user_ns["Out"][key] = torch.ones(N)
    LoudKey.calls.clear()
    try:
        snap = ip.run_line_magic("gpumem", "--device cpu -o")
        odd = snap.holder("Out[...]")
        assert odd is not None and odd.unique == 4 * N and odd.purge is None
        ip.run_line_magic("gpumem", "watch on --device cpu")
        run(ip, "y = 1")
        ip.run_line_magic("gpumem", "watch off")
        result = ip.run_line_magic("gpumem", "purge --device cpu -o")
        assert LoudKey.calls == []
        # the numbered entry went, the user's key stayed, and the result says why
        assert [k for k in ip.user_ns["Out"] if type(k) is int and
                torch.is_tensor(ip.user_ns["Out"][k])] == []
        assert dict.get(ip.user_ns["Out"], key) is not None
        assert any("Out[...]" in m and "left in place" in m for m in result.messages), \
            result.messages
    finally:
        dict.pop(ip.user_ns["Out"], key, None)


def test_a_string_key_in_out_breaks_no_command_and_is_purged_by_its_name(ip):
    ip.user_ns["Out"]["x"] = torch.ones(N)
    run(ip, "import torch\ntorch.ones(16)")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert snap.holder("Out['x']").purge == "Out['x']"
    assert ip.run_line_magic("gpumem", "purge Out['x'] --dry-run --device cpu -o").removed == [
        "Out['x']"]
    ip.run_line_magic("gpumem", "watch on --device cpu")
    run(ip, "y = 1")
    ip.run_line_magic("gpumem", "watch off")
    result = ip.run_line_magic("gpumem", "purge --device cpu -o")
    assert "Out['x']" in result.removed
    assert "x" not in ip.user_ns["Out"]
    assert not [v for v in ip.user_ns["Out"].values() if torch.is_tensor(v)]


def test_purge_out_names_the_entries_that_hold_and_purges_them(ip):
    run(ip, "import torch\nkept = 1\ntorch.ones(65536)")
    n = ip.execution_count - 1
    run(ip, "2 + 2")
    dry = ip.run_line_magic("gpumem", "purge Out --dry-run --device cpu -o")
    assert dry.removed == [f"Out[{n}]", f"_{n}", "__"] and dry.predicted["cpu"] == 4 * N
    result = ip.run_line_magic("gpumem", "purge Out --device cpu -o")
    assert f"Out[{n}]" in result.removed and n not in ip.user_ns["Out"]
    assert ip.user_ns["Out"].get(n + 1) == 4 and ip.user_ns["kept"] == 1


def test_purge_out_with_nothing_in_it_says_so(ip):
    run(ip, "2 + 2")
    with pytest.raises(Exception, match="no entry of Out holds host memory"):
        ip.run_line_magic("gpumem", "purge Out --device cpu")


def test_one_alias_of_many_groups_the_still_holds_lines(ip):
    t = torch.ones(N)
    for i in range(1000):
        ip.user_ns[f"a{i}"] = t
    dry = ip.run_line_magic("gpumem", "purge a0 --dry-run --device cpu -o")
    still = [m for m in dry.messages if "still hold" in m]
    assert len(still) == 1, still[:5]
    assert still[0].startswith("a1, a2, a3 and 996 other name(s) still hold 256.0 KiB"), still
    assert len(dry.still_held) == 999 and dry.predicted["cpu"] == 0   # the JSON: every name
    done = ip.run_line_magic("gpumem", "purge a1 --device cpu -o")
    still = [m for m in done.messages if "still hold" in m]
    assert still == [still[0]] and still[0].startswith("a0, a2, a3 and 996 other"), still[:5]
    assert "a1" not in ip.user_ns and ip.user_ns["a2"] is t


def test_a_name_the_cut_scan_never_reached_says_the_scan_was_cut(ip):
    ip.user_ns["deep"] = [[i] for i in range(300_000)] + [torch.ones(N)]
    ip.run_line_magic("config", "GpuMemMagics.scan_time_limit = 0.001")
    try:
        with pytest.raises(Exception, match="cut short") as info:
            ip.run_line_magic("gpumem", "purge deep --device cpu")
    finally:
        ip.run_line_magic("config", "GpuMemMagics.scan_time_limit = 3.0")
    assert "nothing was deleted" in str(info.value) and "deep" in ip.user_ns


# -- device strings from the sidebar ---------------------------------------------------------
def test_the_comm_refuses_a_fullwidth_digit_and_normalises_case_and_spaces_exactly(ip):
    from recording_comm import close_sidebar, open_sidebar, send

    c = open_sidebar()
    try:
        for bad in ("cuda:１", "ｃｐｕ", "cpu\u3000", "cuda:"):
            (reply,) = send(c, {"type": "set_device", "id": 1, "device": bad})
            assert reply["type"] == "error" and "unknown device" in reply["message"], reply
        for given in ("CPU", " cpu", "cpu "):
            (reply,) = send(c, {"type": "set_device", "id": 2, "device": given})
            assert reply["type"] == "snapshot" and reply["snapshot"]["device"] == "cpu", reply
            assert [d["id"] for d in reply["snapshot"]["devices"]] == ["cpu"]
        with pytest.raises(Exception, match="unknown device"):
            ip.run_line_magic("gpumem", "--device cuda:１")
    finally:
        close_sidebar(c)


# -- a low recursion limit ------------------------------------------------------------------
def test_a_holder_that_a_low_recursion_limit_cuts_is_named():
    """At each recursion limit low enough to make the walk skip objects, the report says
    inside which holders they were (``nested``), beside the count of them."""
    import inspect
    import sys

    from jupyter_gpumem.core import devices as _devices, snapshot as _snapshot

    class Node:
        pass

    node = Node()
    node.t = torch.ones(N)
    ns = {"nested": {"a": [node, {"b": (node,)}]}}
    seen = 0
    old = sys.getrecursionlimit()
    for extra in range(8, 80):
        depth = len(inspect.stack(0))
        try:
            # under a test runner's own frames the stack's depth counts more than its
            # Python frames: a limit under it is refused, and a higher one is tried
            sys.setrecursionlimit(depth + extra)
        except RecursionError:
            continue
        try:
            snap = _snapshot.build(namespace=ns, device=_devices.select("cpu"))
        except RecursionError:
            continue
        finally:
            sys.setrecursionlimit(old)
        counted = [m for m in snap.messages if "refused introspection" in m]
        held = {h.name: h.total for h in snap.holders}
        if counted:      # something was skipped: the note says inside which holder
            assert any(" in nested" in m for m in counted), (extra, snap.messages)
        else:            # nothing skipped: then nothing is missing either
            assert held.get("nested") == N * 4, (extra, held, snap.messages)
        seen += 1
    # the limits tried reach both sides: too low to build at all, and high enough to build
    assert 0 < seen < len(range(8, 80)), seen


# -- what --all takes and what it keeps -----------------------------------------------------
NOTEBOOK = """
import functools, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
sys.path.insert(0, {where!r})
import gpumem_user_helpers as helpers

def scale(x, factor=torch.ones(256)):
    return x * factor

class Buffers:
    table = torch.ones(512)

cfg = {{"lr": 1e-3, "name": "run-7", "layers": [64, 64], "mask": torch.ones(4, dtype=torch.bool)}}
ds = TensorDataset(torch.ones(2048, 8))
loader = DataLoader(ds, batch_size=64)
scaled = functools.partial(scale, factor=torch.ones(128))
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
opt = torch.optim.Adam(model.parameters())
model(torch.ones(4, 64)).sum().backward()
opt.step()
x = torch.ones(4096)
y = torch.zeros(1024)
batch = [torch.ones(1000), torch.ones(1000)]
"""
TAKEN = {"model", "opt", "x", "y", "batch"}
KEPT = {"helpers", "scale", "Buffers", "cfg", "ds", "loader", "scaled"}


def test_purge_all_takes_what_memory_is_the_point_of_and_lists_what_it_keeps(ip, tmp_path):
    (tmp_path / "gpumem_user_helpers.py").write_text(
        "import torch\nlookup = torch.ones(1024)\n")
    try:
        run(ip, NOTEBOOK.format(where=str(tmp_path)))
        before = {name: ip.user_ns[name] for name in KEPT}
        dry = ip.run_line_magic("gpumem", "purge --all --dry-run --device cpu -o")
        assert TAKEN <= set(dry.removed), dry.removed
        assert not KEPT & set(dry.removed), dry.removed
        (line,) = [m for m in dry.messages if m.startswith("--all would keep")]
        for name in KEPT:
            assert f"{name} " in line, (name, line)
        assert "cfg 4 B (dict)" in line and "Buffers 2.0 KiB (class)" in line, line
        done = ip.run_line_magic("gpumem", "purge --all --device cpu -o")
        assert TAKEN <= set(done.removed) and not KEPT & set(done.removed), done.removed
        assert any(m.startswith("--all kept") for m in done.messages), done.messages
        assert not TAKEN & set(ip.user_ns)
        assert all(ip.user_ns[name] is obj for name, obj in before.items())
        assert sys_modules_has("gpumem_user_helpers")
    finally:
        import sys
        sys.modules.pop("gpumem_user_helpers", None)
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


def sys_modules_has(name: str) -> bool:
    import sys
    return name in sys.modules
