"""Bytes come from the storage: every layout torch has is counted by its storages and
purged whole, and what a scan kept of a tensor stands only while its storage is the
same one, with the same size (never by its data pointer alone). In a real shell, warm
and full."""
from __future__ import annotations

import gc
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

from conftest import child_result, holder, purge, run  # noqa: E402

warnings.filterwarnings("ignore", message="Sparse invariant checks")


def components(t) -> tuple[int, list]:
    """The bytes of the storages that hold ``t``'s data (each layout's parts as torch
    names them) and a weak handle on each. (No storage object is kept: calling
    ``untyped_storage()`` again while one is held can keep the storage alive in torch.)"""
    parts = {
        torch.sparse_coo: lambda: [t._indices(), t._values()],
        torch.sparse_csr: lambda: [t.crow_indices(), t.col_indices(), t.values()],
        torch.sparse_bsr: lambda: [t.crow_indices(), t.col_indices(), t.values()],
        torch.sparse_csc: lambda: [t.ccol_indices(), t.row_indices(), t.values()],
        torch.sparse_bsc: lambda: [t.ccol_indices(), t.row_indices(), t.values()],
        torch.jagged: lambda: [t._values, t._offsets],
    }
    if t.layout in parts:
        tensors = parts[t.layout]()
    elif t.is_nested:
        tensors = [t, t._nested_tensor_size(), t._nested_tensor_strides(),
                   t._nested_tensor_storage_offsets()]
    elif t.is_quantized and t.qscheme() == torch.per_channel_affine:
        tensors = [t, t.q_per_channel_scales(), t.q_per_channel_zero_points()]
    else:
        tensors = [t]
    storages = [x.untyped_storage() for x in tensors]
    return sum(s.nbytes() for s in storages), [StorageWeakRef(s) for s in storages]


LAYOUTS = {
    "coo": "dense.to_sparse()",
    "csr": "dense.to_sparse_csr()",
    "csc": "dense.to_sparse_csc()",
    "bsr": "dense.to_sparse_bsr((8, 8))",
    "bsc": "dense.to_sparse_bsc((8, 8))",
    "nested": "torch.nested.nested_tensor([torch.randn(30, 40), torch.randn(50, 40)])",
    "jagged": "torch.nested.nested_tensor([torch.randn(30, 40), torch.randn(50, 40)], "
              "layout=torch.jagged)",
    "quantized": "torch.quantize_per_tensor(torch.randn(4000), 0.1, 0, torch.qint8)",
    "per_channel": "torch.quantize_per_channel(torch.randn(40, 100), torch.rand(40) + 0.1, "
                   "torch.zeros(40, dtype=torch.long), 0, torch.quint8)",
    "float8": "torch.randn(4000).to(torch.float8_e4m3fn)",
}
SETUP = "import torch\ndense = torch.randn(64, 64)\ndense[dense < 1] = 0\n"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_is_counted_by_its_storages_and_purged(ip, layout):
    run(ip, SETUP + f"t = {LAYOUTS[layout]}\ndel dense")
    expected, refs = components(ip.user_ns["t"])
    for args in ("", "", "--full"):
        snap = ip.run_line_magic("gpumem", f"{args} --device cpu -o")
        assert not any("refused" in m for m in snap.messages), snap.messages
        assert holder(snap, "t").unique == expected
    result = purge(ip, "t")
    gc.collect()
    assert "t" not in ip.user_ns
    assert all(r.expired() for r in refs), str(result)


def test_purge_all_takes_every_layout(ip):
    run(ip, SETUP + "\n".join(f"{name} = {code}" for name, code in LAYOUTS.items())
        + "\ndel dense")
    refs = [r for name in LAYOUTS for r in components(ip.user_ns[name])[1]]
    purge(ip, "--all")
    gc.collect()
    assert not set(LAYOUTS) & set(ip.user_ns)
    assert all(r.expired() for r in refs)


def test_meta_tensors_hold_nothing(ip):
    run(ip, "import torch\nm = torch.empty(1 << 20, device='meta')\nreal = torch.ones(256)")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert snap.holder("m") is None and holder(snap, "real").unique == 1024


def test_a_sparse_gradient_is_counted_and_purged(ip):
    run(ip, """
import torch
emb = torch.nn.Embedding(4096, 256, sparse=True)
emb(torch.arange(0, 4096, 8)).sum().backward()
b = emb.weight.grad * 2
""")
    ns = ip.user_ns
    grad, _ = components(ns["emb"].weight.grad)
    b_bytes, refs = components(ns["b"])
    assert ns["b"].layout is torch.sparse_coo
    for args in ("", "", "--full"):
        snap = ip.run_line_magic("gpumem", f"{args} --device cpu -o")
        assert holder(snap, "emb").unique == ns["emb"].weight.nbytes + grad
        assert holder(snap, "b").unique == b_bytes
    purge(ip, "b")
    gc.collect()
    assert all(r.expired() for r in refs) and "emb" in ns


SET_AT_SAME_ADDRESS = """
import torch
big = torch.empty(64 << 20, dtype=torch.uint8)
t = torch.empty(0, dtype=torch.uint8).set_(big.untyped_storage()[0:16])
"""


def test_a_larger_storage_at_the_same_address_is_read_again(ip):
    run(ip, SET_AT_SAME_ADDRESS)
    big = ip.user_ns.pop("big")   # kept here: only t is the notebook's
    t = ip.user_ns["t"]
    for args in ("", "", "--full"):
        assert holder(ip.run_line_magic("gpumem", f"{args} --device cpu -o"), "t").unique == 16
    t.set_(big.untyped_storage())
    assert t.data_ptr() == big.data_ptr() and t.untyped_storage().nbytes() == 64 << 20
    del big
    cold = child_result(
        "import json\nfrom IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\nip.run_cell('%load_ext jupyter_gpumem')\n"
        f"ip.run_cell({SET_AT_SAME_ADDRESS!r})\n"
        "ip.run_cell('t.set_(big.untyped_storage()); del big')\n"
        "snap = ip.run_line_magic('gpumem', '--device cpu -o')\n"
        "print('RESULT', json.dumps(snap.holder('t').unique))\n")
    assert cold == 64 << 20
    for args in ("", "", "--full"):
        assert holder(ip.run_line_magic("gpumem", f"{args} --device cpu -o"), "t").unique == cold
