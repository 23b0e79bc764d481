"""Reading never runs Python that is not the product's: a saved tensor of an autograd
graph is never unpacked (checkpoint would replay the forward, a user's hooks would
run), and a module in ``sys.modules`` under a framework's name that is not that
framework never wakes its backend. Each in a real shell, the scans warm and full."""
from __future__ import annotations

import sys
import types

import pytest
from IPython.core.error import UsageError

torch = pytest.importorskip("torch")

from conftest import holder, run, run_watched  # noqa: E402

MiB = 1 << 20


def rss() -> int:
    """This process's resident set, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def scans(ip, extra: str = ""):
    """Two warm reports and a full one (the path search too), each as its snapshot."""
    return [ip.run_line_magic("gpumem", f"{extra} {args} --device cpu -o")
            for args in ("", "", "--full")]


CHECKPOINTED = """
import torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint
forward_calls = [0]
net = nn.Sequential(nn.Linear(1024, 1024), nn.BatchNorm1d(1024), nn.ReLU(), nn.Linear(1024, 1024))
net[0].register_forward_hook(lambda *a: forward_calls.__setitem__(0, forward_calls[0] + 1))
xin = torch.randn(2048, 1024)
out_ck = checkpoint(net, xin, use_reentrant=False)
"""


def test_a_checkpointed_output_is_read_without_replaying_its_forward(ip):
    run(ip, CHECKPOINTED)
    ns = ip.user_ns
    net, bn = ns["net"], ns["net"][1]
    mean, batches = bn.running_mean.clone(), int(bn.num_batches_tracked)
    assert ns["forward_calls"] == [1] and batches == 1
    before = rss()
    for snap in scans(ip):
        assert not snap.partial, snap.messages
        assert any("behind saved-tensor hooks" in m for m in snap.messages), snap.messages
        params = sum(p.nbytes for p in net.parameters())
        buffers = sum(b.nbytes for b in net.buffers())
        # the graph holds net's parameters (its leaves) and the input checkpoint keeps
        got = holder(snap, "net")
        assert (got.unique, got.shared) == (buffers, params)
        got = holder(snap, "xin")
        assert (got.unique, got.shared) == (0, ns["xin"].nbytes)
        got = holder(snap, "out_ck")
        assert got.unique == ns["out_ck"].nbytes
        assert got.shared == params + ns["xin"].nbytes
    dry = ip.run_line_magic("gpumem", "purge out_ck --dry-run --device cpu -o")
    assert "out_ck" in dry.removed
    assert ns["forward_calls"] == [1]
    assert int(bn.num_batches_tracked) == batches and torch.equal(bn.running_mean, mean)
    # a replay makes the forward's activations again (about 40 MiB here, each time)
    assert rss() - before < 16 * MiB
    # the graph still works: backward replays the forward once, as checkpoint does
    run(ip, "out_ck.sum().backward()")
    assert ns["forward_calls"] == [2]


HOOKED = """
import torch
packed, unpacked = [0], [0]
def pack(t):
    packed[0] += 1
    return t.clone()
def unpack(t):
    unpacked[0] += 1
    return t
w = torch.randn(512, 512, requires_grad=True)
x = torch.randn(256, 512)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    loss = (x @ w).tanh().sum()
"""


def test_a_graph_under_user_hooks_runs_none_of_them(ip):
    run(ip, HOOKED)
    ns = ip.user_ns
    packs = ns["packed"][0]
    for snap in scans(ip):
        assert not snap.partial, snap.messages
        assert any("behind saved-tensor hooks" in m for m in snap.messages), snap.messages
        # what the pack hook returned (the clones of x and of tanh's result) is counted
        got = holder(snap, "loss")
        assert got.unique >= ns["x"].nbytes + 256 * 512 * 4
    ip.run_line_magic("gpumem", "purge loss --dry-run --device cpu")
    ip.run_line_magic("gpumem", "loss --device cpu")
    run_watched(ip, "y = 1")
    assert ns["unpacked"] == [0] and ns["packed"][0] == packs
    run(ip, "loss.backward()")
    assert ns["unpacked"][0] > 0   # the hooks were there to run


def test_save_on_cpu_copies_are_counted_not_unpacked(ip):
    run(ip, """
import torch
w = torch.randn(512, 512, requires_grad=True)
x = torch.randn(256, 512)
with torch.autograd.graph.save_on_cpu():
    y = (x @ w).tanh().sum()
""")
    for snap in scans(ip):
        assert not snap.partial, snap.messages
        assert any("behind saved-tensor hooks" in m for m in snap.messages), snap.messages
        # what the pack hook kept: on the host, x and w themselves (shared with their
        # names) and tanh's result (y's alone, with y's own 4 bytes)
        got = holder(snap, "y")
        ns = ip.user_ns
        assert (got.unique, got.shared) == (256 * 512 * 4 + 4, ns["x"].nbytes + ns["w"].nbytes)


def test_a_plain_graph_says_nothing_of_hooks(ip):
    run(ip, "import torch\nw = torch.randn(64, 64, requires_grad=True)\nloss = (w * 2).sum()")
    for snap in scans(ip):
        assert not any("hooks" in m for m in snap.messages), snap.messages
        assert holder(snap, "loss").shared == 64 * 64 * 4


# -- a module under a framework's name that is not the framework --------------------
class Counting(types.ModuleType):
    """A stand-in whose class counts every attribute look-up that reaches it."""

    looked: list = []

    def __getattribute__(self, name):
        Counting.looked.append(name)
        return super().__getattribute__(name)


def stand_ins(name: str, tmp_path) -> list:
    """Three stand-ins for ``name`` that count each ``__getattr__`` call: one made at run
    time, one from a file of the user's named like the framework, one of a module
    subclass."""
    calls: list = []

    def counting(attr):
        calls.append(attr)
        raise AttributeError(attr)

    made = types.ModuleType(name)
    made.__getattr__ = counting
    path = tmp_path / f"{name}.py"
    path.write_text("calls = []\ndef __getattr__(attr):\n    calls.append(attr)\n"
                    "    raise AttributeError(attr)\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    from_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(from_file)
    sub = Counting(name)
    sub.__getattr__ = counting
    return [(made, calls), (from_file, from_file.calls), (sub, calls)]


@pytest.mark.parametrize("name", ["cupy", "jax", "tensorflow", "torch"])
def test_a_stand_in_under_a_frameworks_name_is_never_read(ip, name, tmp_path):
    for stand_in, calls in stand_ins(name, tmp_path):
        Counting.looked.clear()
        was = sys.modules.get(name)
        sys.modules[name] = stand_in
        try:
            ip.run_line_magic("unload_ext", "jupyter_gpumem")
            ip.run_line_magic("load_ext", "jupyter_gpumem")
            ip.user_ns.update(named=bytearray(8), mod=stand_in)
            for _ in scans(ip):
                pass
            with pytest.raises(UsageError):   # it holds no tensor: nothing to purge
                ip.run_line_magic("gpumem", "purge mod --dry-run --device cpu")
            run_watched(ip, "y = 1")
            ip.run_line_magic("gpumem", "purge --device cpu")
        finally:
            if was is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = was
        assert calls == [], f"{name}: {calls[:5]}"
        assert not [a for a in Counting.looked if not a.startswith("__")], Counting.looked[:5]


def test_the_real_frameworks_are_known(ip):
    from jupyter_gpumem.backends.base import framework_module

    assert framework_module("torch") is torch
    assert framework_module("torch.distributed") is sys.modules.get("torch.distributed")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    run(ip, "import torch\nt = torch.ones(1024)")
    assert holder(ip.run_line_magic("gpumem", "--device cpu -o"), "t").unique == 4096
    assert snap is not None
