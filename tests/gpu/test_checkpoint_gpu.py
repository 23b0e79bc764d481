"""Reading never runs the notebook's code, on a real GPU: a checkpointed model's output
(gradient checkpointing, as Hugging Face uses it) and a graph built under a user's
saved-tensor hooks are scanned warm and full, and purged dry, without replaying the
forward or calling a hook; the BatchNorm inside keeps its state; the device memory
does not grow; the holders share what the graph holds.

Run on a GPU machine: ``python -m pytest -q -s tests/gpu/test_checkpoint_gpu.py``.
"""
from __future__ import annotations

from gpu_setup import MIB, cuda_torch

torch = cuda_torch()

from conftest import holder, run  # noqa: E402
from gpu_floor import empty_caches_after_each_test  # noqa: E402,F401

DEVICE = "--device cuda:0"

CHECKPOINTED = """
import torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint
forward_calls = [0]
net = nn.Sequential(nn.Linear(4096, 4096), nn.BatchNorm1d(4096), nn.ReLU(),
                    nn.Linear(4096, 4096)).cuda()
net[0].register_forward_hook(lambda *a: forward_calls.__setitem__(0, forward_calls[0] + 1))
xin = torch.randn(8192, 4096, device='cuda')
out_ck = checkpoint(net, xin, use_reentrant=False)
torch.cuda.synchronize()
"""


def _scans(ip):
    return [ip.run_line_magic("gpumem", f"{args} {DEVICE} -o") for args in ("", "", "--full")]


def test_a_checkpointed_output_on_the_gpu_replays_nothing(ip):
    run(ip, CHECKPOINTED)
    ns = ip.user_ns
    net, bn = ns["net"], ns["net"][1]
    mean, batches = bn.running_mean.clone(), int(bn.num_batches_tracked)
    params = sum(p.nbytes for p in net.parameters())
    buffers = sum(b.nbytes for b in net.buffers())
    before = torch.cuda.memory_allocated()
    peak_before = torch.cuda.max_memory_allocated()
    for snap in _scans(ip):
        assert not snap.partial, snap.messages
        assert any("behind saved-tensor hooks" in m for m in snap.messages), snap.messages
        got = holder(snap, "net")
        assert (got.unique, got.shared) == (buffers, params)
        got = holder(snap, "xin")
        assert (got.unique, got.shared) == (0, ns["xin"].nbytes)
        got = holder(snap, "out_ck")
        assert (got.unique, got.shared) == (ns["out_ck"].nbytes, params + ns["xin"].nbytes)
    ip.run_line_magic("gpumem", f"purge out_ck --dry-run {DEVICE}")
    torch.cuda.synchronize()
    assert ns["forward_calls"] == [1]
    assert int(bn.num_batches_tracked) == batches and torch.equal(bn.running_mean, mean)
    # a replay of the forward would allocate its activations (128 MiB each) again
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.max_memory_allocated() - peak_before < 16 * MIB
    print(f"\ncheckpoint on {torch.cuda.get_device_name(0)}: 0 replays in 3 scans and a "
          f"dry purge; net {params:,} B shared with out_ck, xin {ns['xin'].nbytes:,} B")


def test_user_saved_tensor_hooks_on_the_gpu_are_not_called(ip):
    run(ip, """
import torch
packed, unpacked = [0], [0]
def pack(t):
    packed[0] += 1
    return t
def unpack(t):
    unpacked[0] += 1
    return t
w = torch.randn(2048, 2048, device='cuda', requires_grad=True)
x = torch.randn(1024, 2048, device='cuda')
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    loss = (x @ w).tanh().sum()
""")
    ns = ip.user_ns
    for snap in _scans(ip):
        assert not snap.partial, snap.messages
        assert any("behind saved-tensor hooks" in m for m in snap.messages), snap.messages
        # the pack hook kept x, w and tanh's result themselves
        got = holder(snap, "loss")
        assert got.shared == ns["x"].nbytes + ns["w"].nbytes
    ip.run_line_magic("gpumem", f"purge loss --dry-run {DEVICE}")
    assert ns["unpacked"] == [0]
