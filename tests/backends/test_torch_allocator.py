"""Framework internals as holders of their own, on a machine without a GPU.

A GPU cannot exist here, so torch's allocator is a recorded feed: segments and
blocks in the shape ``torch.cuda.memory_snapshot()`` returns them, recorded on
an H200 (torch 2.11, CUDA 13) after 300 Adam steps of a small transformer
(``tests/gpu/probe_internals.py`` writes the full feed), trimmed to a few
segments, with the allocator's counters. The feed goes through the real code:
``TorchBackend.internals`` (its own view cache, workspace sizes from the GPU's
architecture and the environment), ``purge_estimate``, ``snapshot.build`` (the
rows under the names, "unattributed" without them, the rest's parts), the text,
HTML and JSON, and the panel's footer. Only what needs a GPU is stood in for:
``memory_snapshot()``, the allocator's counters, the device's properties, the
device figures and the driver's context limits. The JAX and TensorFlow pools
get the stats their frameworks reported on the GPU machine.
"""
from __future__ import annotations

import importlib
import json

import pytest

from jupyter_gpumem import backends as _backends
from jupyter_gpumem.backends import (AcceleratorInfo, Backend, FrameworkUsage, Internal,
                                     StorageInfo)
from jupyter_gpumem.backends import cuda_context as _cuda_context
from jupyter_gpumem.backends import torch_allocator as alloc
from jupyter_gpumem.core.devices import DeviceUsage, select

_snapshot = importlib.import_module("jupyter_gpumem.core.snapshot")   # the package's name is a function
MiB = 1 << 20
KiB = 1 << 10
BASE = 0x7F5000000000

# -- the recorded feed ---------------------------------------------------------------------
# (segment offset, total, pool, type, [(block offset, size, requested, state)]) from the H200
# run after training: the two 32 MiB cuBLAS workspaces (main thread, autograd thread), the
# small segment holding the 1 MiB cuBLASLt workspace, segments of parameters and optimizer
# state, whole free segments (cache) and free space inside segments in use.
A, I = "active_allocated", "inactive"
SEGMENTS = [
    (0x0000000, 2 * MiB, "small", [(0, 1 * MiB, 1 * MiB, A), (1 * MiB, 1 * MiB, 1 * MiB, I)]),
    (0x0200000, 2 * MiB, "small", [(0, 512 * KiB, 512 * KiB, A), (512 * KiB, 512 * KiB, 512 * KiB, A),
                                   (1 * MiB, 512 * KiB, 512 * KiB, A), (1536 * KiB, 512 * KiB, 0, I)]),
    (0x0400000, 16 * MiB, "large", [(0, 16 * MiB, 0, I)]),
    (0x2E00000, 32 * MiB, "large", [(0, 32 * MiB, 32 * MiB, A)]),
    (0x5E00000, 2 * MiB, "small", [(0, 1 * MiB, 1048576, A), (1 * MiB, 1 * MiB, 1048576, A)]),
    (0x6000000, 32 * MiB, "large", [(0, 32 * MiB, 32 * MiB, A)]),
    (0x8000000, 20 * MiB, "large", [(0, 20 * MiB, 0, I)]),
    (0x9400000, 2 * MiB, "small", [(0, 2 * MiB, 0, I)]),
    (0x9600000, 2 * MiB, "small", [(0, 4000 * KiB // 4, 1024000, A), (1000 * KiB, 1048 * KiB, 0, I)]),
]
#: the storages the names (model, opt) reach: every active block but the workspaces
WORKSPACE_OFFSETS = {0x2E00000, 0x6000000}
LT_OFFSET = 0x0000000


def feed(segments=SEGMENTS, pool=(0, 0), expandable=False, device=0) -> list[dict]:
    out = []
    for off, total, kind, blocks in segments:
        out.append({
            "device": device, "address": BASE + off, "total_size": total,
            "allocated_size": sum(b[1] for b in blocks if b[3] != I),
            "segment_pool_id": pool, "segment_type": kind, "stream": 0,
            "is_expandable": expandable,
            "blocks": [{"address": BASE + off + b[0], "size": b[1], "requested_size": b[2],
                        "state": b[3]} for b in blocks]})
    return out


def named_pointers(segs) -> set[int]:
    out = set()
    for seg in segs:
        off = seg["address"] - BASE
        for b in seg["blocks"]:
            if b["state"] != I and off not in WORKSPACE_OFFSETS and b["address"] != BASE + LT_OFFSET:
                out.add(b["address"])
    return out


def stats_of(segs, allocs: int = 107560, frees: int = 107353) -> dict:
    allocated = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] != I)
    reserved = sum(s["total_size"] for s in segs)
    return {"allocated_bytes": {"all": {"current": allocated, "peak": allocated}},
            "reserved_bytes": {"all": {"current": reserved}},
            "allocation": {"all": {"allocated": allocs, "freed": frees}},
            "segment": {"all": {"allocated": len(segs), "freed": 0}}}


#: recorded on an H200 (torch 2.11.0+cu130): after 300 Adam steps of a 4-layer transformer;
#: (segment offset, total, small?, blocks as (offset in segment, size, requested,
#: state)), state 'n': active and a named tensor's, 'a': active and unnamed, 'i': free
H200_SEGMENTS = [
    (0x0, 2097152, True, [(0, 1024000, 1024000, 'n'), (1024000, 1048576, 1048576, 'n'), (2072576, 4096, 4096, 'n'), (2076672, 1024, 1024, 'n'), (2077696, 1024, 1024, 'n'), (2078720, 10240, 4096, 'i'), (2088960, 1024, 1024, 'n'), (2089984, 1024, 1024, 'n'), (2091008, 3072, 3072, 'n'), (2094080, 1024, 1024, 'n'), (2095104, 1024, 1024, 'n'), (2096128, 1024, 1024, 'n')]),
    (0x200000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 262144, 262144, 'n'), (1310720, 524288, 524288, 'i'), (1835008, 262144, 262144, 'n')]),
    (0x400000, 16777216, False, [(0, 16777216, 12582912, 'i')]),
    (0x1400000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 786432, 786432, 'n'), (1835008, 253952, 16384, 'i'), (2088960, 4096, 4096, 'n'), (2093056, 1024, 1024, 'n'), (2094080, 3072, 3072, 'n')]),
    (0x8000000, 33554432, False, [(0, 33554432, 33554432, 'a')]),
    (0x4be00000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x50000000, 33554432, False, [(0, 33554432, 33554432, 'a')]),
    (0x52a00000, 2097152, True, [(0, 262144, 262144, 'n'), (262144, 786432, 786432, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x52c00000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1024, 1024, 'n'), (1049600, 1024, 1024, 'n'), (1050624, 262144, 262144, 'n'), (1312768, 1024, 1024, 'n'), (1313792, 3072, 3072, 'n'), (1316864, 262144, 262144, 'n'), (1579008, 518144, 262144, 'i')]),
    (0x52e00000, 2097152, True, [(0, 786432, 786432, 'n'), (786432, 1048576, 1048576, 'n'), (1835008, 4096, 4096, 'n'), (1839104, 1024, 1024, 'n'), (1840128, 1024, 1024, 'n'), (1841152, 1024, 1024, 'n'), (1842176, 1024, 1024, 'n'), (1843200, 1024, 1024, 'n'), (1844224, 1024, 1024, 'n'), (1845248, 3072, 3072, 'n'), (1848320, 4096, 4096, 'n'), (1852416, 1024, 1024, 'n'), (1853440, 1024, 1024, 'n'), (1854464, 1024, 1024, 'n'), (1855488, 1024, 1024, 'n'), (1856512, 1024, 1024, 'n'), (1857536, 4096, 4000, 'n'), (1861632, 4096, 4096, 'n'), (1865728, 1024, 1024, 'n'), (1866752, 1024, 1024, 'n'), (1867776, 3072, 3072, 'n'), (1870848, 4096, 3072, 'i'), (1874944, 1024, 1024, 'n'), (1875968, 1024, 1024, 'n'), (1876992, 1024, 1024, 'n'), (1878016, 1024, 1024, 'n'), (1879040, 212480, 32768, 'i'), (2091520, 1024, 1024, 'n'), (2092544, 4096, 4000, 'n'), (2096640, 512, 24, 'i')]),
    (0x53000000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 786432, 786432, 'n'), (1835008, 262144, 262144, 'n')]),
    (0x53200000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x53400000, 2097152, True, [(0, 1024000, 1024000, 'n'), (1024000, 1048576, 1048576, 'a'), (2072576, 1024, 1024, 'n'), (2073600, 1024, 1024, 'n'), (2074624, 1024, 1024, 'n'), (2075648, 3072, 3072, 'n'), (2078720, 3072, 3072, 'n'), (2081792, 1024, 1024, 'n'), (2082816, 4096, 4096, 'n'), (2086912, 1024, 1024, 'n'), (2087936, 1024, 1024, 'n'), (2088960, 1024, 1024, 'n'), (2089984, 1024, 1024, 'n'), (2091008, 1024, 1024, 'n'), (2092032, 4096, 4096, 'n'), (2096128, 1024, 1024, 'n')]),
    (0x53600000, 20971520, False, [(0, 20971520, 16777216, 'i')]),
    (0x54a00000, 2097152, True, [(0, 786432, 786432, 'n'), (786432, 262144, 262144, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x54e00000, 20971520, False, [(0, 20971520, 12582912, 'i')]),
    (0x56200000, 20971520, False, [(0, 20971520, 16777216, 'i')]),
    (0x57600000, 20971520, False, [(0, 20971520, 6291456, 'i')]),
    (0x58a00000, 20971520, False, [(0, 20971520, 16777216, 'i')]),
    (0x59e00000, 2097152, True, [(0, 1024000, 1024000, 'n'), (1024000, 1073152, 1024000, 'i')]),
    (0x5a000000, 20971520, False, [(0, 20971520, 12582912, 'i')]),
    (0x5b400000, 20971520, False, [(0, 20971520, 2097152, 'i')]),
    (0x5c800000, 20971520, False, [(0, 20971520, 8192000, 'i')]),
    (0x5dc00000, 20971520, False, [(0, 20971520, 8192000, 'i')]),
    (0x5f000000, 20971520, False, [(0, 20971520, 16384000, 'i')]),
    (0x64400000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 786432, 786432, 'n'), (1835008, 244736, 1048576, 'i'), (2079744, 4096, 4096, 'n'), (2083840, 1024, 1024, 'n'), (2084864, 1024, 1024, 'n'), (2085888, 1024, 1024, 'n'), (2086912, 1024, 1024, 'n'), (2087936, 1024, 1024, 'n'), (2088960, 1024, 1024, 'n'), (2089984, 1024, 1024, 'n'), (2091008, 1024, 1024, 'n'), (2092032, 3072, 3072, 'n'), (2095104, 1024, 1024, 'n'), (2096128, 1024, 1024, 'n')]),
    (0x64600000, 2097152, True, [(0, 2097152, 786432, 'i')]),
    (0x64800000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x64a00000, 2097152, True, [(0, 2097152, 1048576, 'i')]),
    (0x64c00000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 786432, 786432, 'n'), (1835008, 237568, 8192, 'i'), (2072576, 3072, 3072, 'n'), (2075648, 4096, 4096, 'n'), (2079744, 4096, 4096, 'n'), (2083840, 1024, 1024, 'n'), (2084864, 1024, 1024, 'n'), (2085888, 1024, 1024, 'n'), (2086912, 1024, 1024, 'n'), (2087936, 1024, 1024, 'n'), (2088960, 1024, 1024, 'n'), (2089984, 1024, 1024, 'n'), (2091008, 1024, 1024, 'n'), (2092032, 1024, 1024, 'n'), (2093056, 1024, 1024, 'n'), (2094080, 3072, 3072, 'n')]),
    (0x64e00000, 2097152, True, [(0, 1024000, 1024000, 'n'), (1024000, 1024000, 1024000, 'n'), (2048000, 3072, 3072, 'n'), (2051072, 1024, 1024, 'n'), (2052096, 1024, 1024, 'n'), (2053120, 4096, 4096, 'n'), (2057216, 4096, 4096, 'n'), (2061312, 1024, 1024, 'n'), (2062336, 1024, 1024, 'n'), (2063360, 1024, 1024, 'n'), (2064384, 1024, 1024, 'n'), (2065408, 1024, 1024, 'n'), (2066432, 1024, 1024, 'n'), (2067456, 1024, 1024, 'n'), (2068480, 1024, 1024, 'n'), (2069504, 1024, 1024, 'n'), (2070528, 1024, 1024, 'n'), (2071552, 3072, 3072, 'n'), (2074624, 3072, 3072, 'n'), (2077696, 1024, 1024, 'n'), (2078720, 1024, 1024, 'n'), (2079744, 4096, 4096, 'n'), (2083840, 4096, 4096, 'n'), (2087936, 1024, 1024, 'n'), (2088960, 1024, 1024, 'n'), (2089984, 1024, 1024, 'n'), (2091008, 1024, 1024, 'n'), (2092032, 1024, 1024, 'n'), (2093056, 1024, 1024, 'n'), (2094080, 1024, 1024, 'n'), (2095104, 1024, 1024, 'n'), (2096128, 1024, 1024, 'n')]),
    (0x65000000, 2097152, True, [(0, 786432, 786432, 'n'), (786432, 786432, 786432, 'n'), (1572864, 262144, 262144, 'n'), (1835008, 262144, 262144, 'n')]),
    (0x65200000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x65400000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x65600000, 2097152, True, [(0, 786432, 786432, 'n'), (786432, 786432, 786432, 'n'), (1572864, 262144, 262144, 'n'), (1835008, 262144, 262144, 'n')]),
    (0x65800000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x65a00000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x65c00000, 2097152, True, [(0, 786432, 786432, 'n'), (786432, 786432, 786432, 'n'), (1572864, 262144, 262144, 'n'), (1835008, 262144, 262144, 'n')]),
    (0x65e00000, 2097152, True, [(0, 1024000, 1024000, 'n'), (1024000, 262144, 262144, 'n'), (1286144, 1024, 1024, 'n'), (1287168, 786432, 786432, 'n'), (2073600, 3072, 3072, 'n'), (2076672, 4096, 4096, 'n'), (2080768, 1024, 1024, 'n'), (2081792, 1024, 1024, 'n'), (2082816, 1024, 1024, 'n'), (2083840, 1024, 1024, 'n'), (2084864, 1024, 1024, 'n'), (2085888, 1024, 1024, 'n'), (2086912, 3072, 3072, 'n'), (2089984, 4096, 4096, 'n'), (2094080, 1024, 1024, 'n'), (2095104, 1024, 1024, 'n'), (2096128, 1024, 1024, 'n')]),
    (0x6aa00000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x6ac00000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x6ae00000, 2097152, True, [(0, 786432, 786432, 'n'), (786432, 786432, 786432, 'n'), (1572864, 262144, 262144, 'n'), (1835008, 262144, 262144, 'n')]),
    (0x6b000000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x6b200000, 2097152, True, [(0, 1048576, 1048576, 'n'), (1048576, 1048576, 1048576, 'n')]),
    (0x6b400000, 2097152, True, [(0, 1024000, 1024000, 'n'), (1024000, 1024000, 1024000, 'n'), (2048000, 4096, 4000, 'n'), (2052096, 4096, 4000, 'n'), (2056192, 3072, 3072, 'n'), (2059264, 1024, 1024, 'n'), (2060288, 1024, 1024, 'n'), (2061312, 1024, 1024, 'n'), (2062336, 33792, 4, 'i'), (2096128, 1024, 1024, 'n')]),
    (0x6b600000, 2097152, True, [(0, 2097152, 1048576, 'i')]),
    (0x6b800000, 2097152, True, [(0, 2097152, 786432, 'i')]),
    (0x6ba00000, 2097152, True, [(0, 2097152, 1048576, 'i')]),
    (0x6bc00000, 2097152, True, [(0, 2097152, 1048576, 'i')]),
    (0x6be00000, 2097152, True, [(0, 2097152, 1024000, 'i')]),
]
H200_STATS = {'allocated': 126910464, 'reserved': 371195904, 'allocs': 107560, 'frees': 107353, 'segments': 50}


def h200_feed() -> tuple[list[dict], set[int], dict]:
    """The recorded H200 allocator: memory_snapshot()'s segments, the named tensors'
    pointers, the allocator's counters."""
    segs, named = [], set()
    for off, total, small, blocks in H200_SEGMENTS:
        addr = BASE + off
        segs.append({"device": 0, "address": addr, "total_size": total,
                     "allocated_size": sum(b[1] for b in blocks if b[3] != "i"),
                     "segment_pool_id": (0, 0), "segment_type": "small" if small else "large",
                     "stream": 0, "is_expandable": False,
                     "blocks": [{"address": addr + b[0], "size": b[1], "requested_size": b[2],
                                 "state": "inactive" if b[3] == "i" else "active_allocated"}
                                for b in blocks]})
        named |= {addr + b[0] for b in blocks if b[3] == "n"}
    st = H200_STATS
    stats = {"allocated_bytes": {"all": {"current": st["allocated"], "peak": st["allocated"]}},
             "reserved_bytes": {"all": {"current": st["reserved"]}},
             "allocation": {"all": {"allocated": st["allocs"], "freed": st["frees"]}},
             "segment": {"all": {"allocated": st["segments"], "freed": 0}}}
    return segs, named, stats


#: cuCtxGetLimit and the device attributes the H200 reported
H200_LIMITS = {"stack": 1024, "printf": 8650752, "heap": 8388608, "sms": 132, "threads_per_sm": 2048}


class Props:
    major, minor, name, total_memory = 9, 0, "NVIDIA H200", 150754820096


@pytest.fixture
def torch_feed(monkeypatch):
    """A TorchBackend whose CUDA allocator is the recorded feed (see the module)."""
    torch = pytest.importorskip("torch")
    from jupyter_gpumem.backends.pytorch import TorchBackend

    state = {"segments": feed(), "calls": 0}
    state["stats"] = stats_of(state["segments"])
    backend = TorchBackend()

    def snapshot():
        state["calls"] += 1
        return state["segments"]

    monkeypatch.setattr(backend, "_cuda_ready", lambda: True)
    monkeypatch.setattr(backend, "_memory_snapshot", snapshot)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda i=0: state["stats"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: Props())
    # a CUDA build has it (a CPU build does not): purge clears the workspaces with it
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None, raising=False)
    for name in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE"):
        monkeypatch.delenv(name, raising=False)
    state["backend"] = backend
    return state


def keys_of(ptrs, dev="cuda:0") -> set:
    return {(dev, p) for p in ptrs}


def by_label(items) -> dict[str, Internal]:
    return {i.label: i for i in items}


# -- workspace sizes ------------------------------------------------------------------------
def test_workspace_config_is_parsed_as_torch_does():
    assert alloc.parse_workspace_config(":4096:8") == 32 * MiB
    assert alloc.parse_workspace_config(":4096:2:16:8") == 4096 * KiB * 2 + 16 * KiB * 8
    assert alloc.parse_workspace_config("garbage") is None
    assert alloc.parse_workspace_config(None) is None


def test_workspace_sizes_by_architecture_and_environment():
    assert alloc.workspace_sizes(9, env={}) == {32 * MiB: "cuBLAS workspace", MiB: "cuBLASLt workspace"}
    small = 4096 * KiB * 2 + 16 * KiB * 8
    assert alloc.workspace_sizes(8, env={}) == {small: "cuBLAS workspace", MiB: "cuBLASLt workspace"}
    assert set(alloc.workspace_sizes(10, env={})) == {32 * MiB, small, MiB}   # torch versions differ
    sizes = alloc.workspace_sizes(9, env={"CUBLAS_WORKSPACE_CONFIG": ":16:8",
                                          "CUBLASLT_WORKSPACE_SIZE": "128"})
    assert sizes == {128 * KiB: "cuBLAS/cuBLASLt workspace"}
    # torch's own readers (newer versions) win over everything
    assert alloc.workspace_sizes(9, env={"CUBLAS_WORKSPACE_CONFIG": ":16:8"},
                                 cublas=4 * MiB, cublaslt=2 * MiB) == {
        4 * MiB: "cuBLAS workspace", 2 * MiB: "cuBLASLt workspace"}


# -- the torch backend on the recorded feed -------------------------------------------------
def test_workspaces_cache_and_free_space_from_the_feed(torch_feed):
    backend, segs = torch_feed["backend"], torch_feed["segments"]
    found = by_label(backend.internals(["cuda:0", "cpu"], keys_of(named_pointers(segs))))
    ws = found["cuBLAS workspaces"]
    assert (ws.nbytes, ws.count, ws.kind, ws.freed_by_purge) == (64 * MiB, 2, "allocated", True)
    assert "32.0 MiB each" in ws.note and "sm 9.x" in ws.note
    lt = found["cuBLASLt workspace"]
    assert (lt.nbytes, lt.count, lt.kind) == (MiB, 1, "allocated")
    cache = found["allocator cache: free segments"]
    assert (cache.nbytes, cache.count, cache.kind, cache.freed_by_purge) == (
        38 * MiB, 3, "cached", True)
    used = found["allocator cache: free space in segments in use"]
    assert used.nbytes == MiB + 512 * KiB + 1048 * KiB and not used.freed_by_purge
    for item in found.values():
        assert item.label and item.device == "cuda:0" and isinstance(item.freed_by_purge, bool)
    # cached + the rest of the reserve adds up to reserved minus allocated
    free = sum(i.nbytes for i in found.values() if i.kind == "cached")
    st = torch_feed["stats"]
    assert free == st["reserved_bytes"]["all"]["current"] - st["allocated_bytes"]["all"]["current"]


def test_the_recorded_h200_allocator(torch_feed):
    """The H200's report after training said 65.0 MiB unattributed: it is two cuBLAS
    workspaces (main thread, autograd engine) and one cuBLASLt workspace; many named
    parameters are 1 MiB blocks too, and stay the names'."""
    segs, named, stats = h200_feed()
    torch_feed["segments"], torch_feed["stats"] = segs, stats
    backend = torch_feed["backend"]
    found = by_label(backend.internals(["cuda:0"], keys_of(named)))
    assert (found["cuBLAS workspaces"].nbytes, found["cuBLAS workspaces"].count) == (64 * MiB, 2)
    assert (found["cuBLASLt workspace"].nbytes, found["cuBLASLt workspace"].count) == (MiB, 1)
    # what the H200 report showed: 233.0 MiB reserved but unallocated, largest free 20 MiB
    cache = found["allocator cache: free segments"]
    used = found["allocator cache: free space in segments in use"]
    assert (cache.nbytes, cache.count) == (241172480, 18) and used.nbytes == 3112960
    assert cache.nbytes + used.nbytes == H200_STATS["reserved"] - H200_STATS["allocated"]
    named_bytes = sum(b["size"] for seg in segs for b in seg["blocks"] if b["address"] in named)
    assert H200_STATS["allocated"] - named_bytes == 65 * MiB   # all of it explained
    assert sum(i.nbytes for i in found.values() if i.kind == "allocated") == 65 * MiB
    # purge --all: every segment goes; a bare purge: the workspaces' and the cache's
    infos = {("cuda:0", p): StorageInfo(("cuda:0", p), 1, "cuda:0", "torch") for p in named}
    assert backend.purge_estimate(["cuda:0"], infos, set(infos)).returned == {
        "cuda:0": H200_STATS["reserved"]}
    bare = backend.purge_estimate(["cuda:0"], {}, set(infos)).returned["cuda:0"]
    assert bare == 241172480 + 64 * MiB + _lt_segment_if_free(segs, named)


def _lt_segment_if_free(segs, named) -> int:
    """The cuBLASLt workspace's segment, if clearing the workspace leaves it free."""
    for seg in segs:
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] not in named and b["size"] == MiB:
                others = [x for x in seg["blocks"] if x is not b and x["state"] != "inactive"]
                return 0 if others else seg["total_size"]
    raise AssertionError("no cuBLASLt workspace in the feed")


def test_a_named_block_of_a_workspace_size_is_not_a_workspace(torch_feed):
    backend, segs = torch_feed["backend"], torch_feed["segments"]
    named = named_pointers(segs) | {BASE + 0x2E00000}   # the user keeps a 32 MiB tensor
    found = by_label(backend.internals(["cuda:0"], keys_of(named)))
    assert "cuBLAS workspaces" not in found
    assert found["cuBLAS workspace"].count == 1
    # a storage that starts inside the block (a foreign view) counts as the block's too
    named = named_pointers(segs) | {BASE + 0x6000000 + 4096}
    found = by_label(backend.internals(["cuda:0"], keys_of(named)))
    assert found["cuBLAS workspace"].nbytes == 32 * MiB


def test_the_view_is_cached_until_the_allocator_moves(torch_feed):
    backend, segs = torch_feed["backend"], torch_feed["segments"]
    keys = keys_of(named_pointers(segs))
    backend.internals(["cuda:0"], keys)
    backend.internals(["cuda:0"], keys)
    backend.usage(["cuda:0"], detail=True)
    assert torch_feed["calls"] == 1
    torch_feed["stats"] = stats_of(segs, allocs=107561)
    backend.internals(["cuda:0"], keys)
    assert torch_feed["calls"] == 2
    assert backend.usage(["cuda:0"], detail=True)["cuda:0"].largest_free_block == 20 * MiB


class FakeGraphBase:
    """Stands for torch._C._CUDAGraph: its ``pool()`` is the capture's pool id."""

    def __init__(self, pool):
        self._pool = pool

    def pool(self):
        return self._pool


class FakeGraph(FakeGraphBase):
    def pool(self):   # a subclass's own method: never run by the product
        raise AssertionError("the product must call the base class's pool()")


@pytest.fixture
def graphs(torch_feed, monkeypatch):
    """CUDA graphs as torch.cuda.CUDAGraph objects the garbage collector tracks."""
    import torch

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch._C, "_CUDAGraph", FakeGraphBase, raising=False)
    graph = feed([(0xA000000, 34 * MiB, "large", [(0, 32 * MiB, 32 * MiB, A),
                                                  (32 * MiB, 256 * KiB, 256 * KiB, A),
                                                  (32 * MiB + 256 * KiB, 1792 * KiB, 0, I)])],
                 pool=(1, 0))
    pending = feed([(0xC000000, 2 * MiB, "small", [(0, 2 * MiB, 2 * MiB, "active_pending_free")])])
    segs = torch_feed["segments"] + graph + pending
    torch_feed["segments"] = segs
    torch_feed["stats"] = stats_of(segs, allocs=1)
    return {"static_out": BASE + 0xA000000 + 32 * MiB}


def test_cuda_graph_pool_and_pending_blocks(torch_feed, graphs):
    backend = torch_feed["backend"]
    live = FakeGraph((1, 0))   # the graph that owns pool (1, 0)
    named = keys_of(named_pointers(feed()) | {graphs["static_out"]})
    found = by_label(backend.internals(["cuda:0"], named))
    kept = found["CUDA graph private pool (1, 0): kept blocks"]
    assert (kept.nbytes, kept.kind, kept.freed_by_purge) == (32 * MiB, "allocated", False)
    assert "graph" in kept.note and "deleted" in kept.note
    assert found["CUDA graph private pool (1, 0): cached free blocks"].nbytes == 1792 * KiB
    wait = found["freed blocks waiting for their streams"]
    assert (wait.nbytes, wait.freed_by_purge) == (2 * MiB, True)
    # the graph's workspace is not listed with the default pool's
    assert found["cuBLAS workspaces"].count == 2
    # a purge frees neither the live graph's pool nor what the names keep; the pending
    # block and the cuBLASLt workspace's segment go
    est = backend.purge_estimate(["cuda:0"], {}, named)
    assert est.returned["cuda:0"] == 38 * MiB + 64 * MiB + 2 * MiB + 2 * MiB
    del live


def test_a_deleted_graphs_pool_is_given_back(torch_feed, graphs):
    import gc

    backend = torch_feed["backend"]
    live = FakeGraph((1, 0))
    named = keys_of(named_pointers(feed()) | {graphs["static_out"]})
    backend.internals(["cuda:0"], named)          # the graph is found, and watched
    assert (1, 0) not in backend.dead_graph_pools(backend.allocator_view(0))
    del live
    gc.collect()
    found = by_label(backend.internals(["cuda:0"], named))
    assert not any("private pool" in label for label in found)
    # its workspace is a workspace like the others now, and its free block is cache
    assert found["cuBLAS workspaces"].count == 3
    assert "deleted CUDA graphs (1, 0)" in found["allocator cache: free space in segments in use"].note
    # with static_out purged too, the whole segment comes back
    out = ("cuda:0", graphs["static_out"])
    info = StorageInfo(out, 256 * KiB, "cuda:0", "torch")
    est = backend.purge_estimate(["cuda:0"], {out: info}, named)
    assert est.returned["cuda:0"] == 38 * MiB + 64 * MiB + 2 * MiB + 2 * MiB + 34 * MiB
    # a pool seen dead stays dead, without asking the collector again
    backend._find_graphs = lambda: pytest.fail("dead pools are not looked for again")
    assert backend.dead_graph_pools(backend.allocator_view(0)) == {(1, 0)}


def test_a_graph_deleted_before_it_was_seen(torch_feed, graphs):
    backend = torch_feed["backend"]
    named = keys_of(named_pointers(feed()) | {graphs["static_out"]})
    assert backend.dead_graph_pools(backend.allocator_view(0)) == {(1, 0)}
    assert by_label(backend.internals(["cuda:0"], named))["cuBLAS workspaces"].count == 3


def test_purge_estimate_counts_whole_segments(torch_feed):
    backend, segs = torch_feed["backend"], torch_feed["segments"]
    named = named_pointers(segs)
    infos = {("cuda:0", p): StorageInfo(("cuda:0", p), MiB, "cuda:0", "torch") for p in named}
    reserved = sum(s["total_size"] for s in segs)
    # everything named goes: every segment is then free, workspaces cleared
    est = backend.purge_estimate(["cuda:0"], infos, set(infos))
    assert est.returned == {"cuda:0": reserved} and est.covered == set(infos)
    # nothing named goes: the workspaces' segments and the free segments
    # (and the segment of the cuBLASLt workspace, whose other block is free)
    est = backend.purge_estimate(["cuda:0"], {}, set(infos))
    assert est.returned["cuda:0"] == 38 * MiB + 64 * MiB + 2 * MiB
    # one of three tensors of a small segment goes: that segment stays
    one = ("cuda:0", BASE + 0x0200000)
    est = backend.purge_estimate(["cuda:0"], {one: infos[one]}, set(infos))
    assert est.returned["cuda:0"] == 38 * MiB + 64 * MiB + 2 * MiB
    # all three go: it is given back too
    three = {k: infos[k] for k in keys_of([BASE + 0x0200000 + i * 512 * KiB for i in range(3)])}
    est = backend.purge_estimate(["cuda:0"], three, set(infos))
    assert est.returned["cuda:0"] == 38 * MiB + 64 * MiB + 4 * MiB


def test_expandable_segments_give_back_whole_pages(torch_feed):
    backend = torch_feed["backend"]
    # one expandable large segment of 60 MiB: a named tensor, a free run, a workspace
    segs = feed([(0x0, 60 * MiB, "large", [(0, 10 * MiB, 10 * MiB, A), (10 * MiB, 18 * MiB, 0, I),
                                           (28 * MiB, 32 * MiB, 32 * MiB, A)])], expandable=True)
    torch_feed["segments"], torch_feed["stats"] = segs, stats_of(segs, allocs=5)
    named = keys_of({BASE})
    found = by_label(backend.internals(["cuda:0"], named))
    assert found["cuBLAS workspace"].nbytes == 32 * MiB
    # free 10..28 MiB holds no whole 20 MiB page: kept; with the workspace cleared the run
    # 10..60 MiB holds the page 20..40 and 40..60
    assert "allocator cache: free segments" not in found
    assert backend.purge_estimate(["cuda:0"], {}, named).returned["cuda:0"] == 40 * MiB
    # the named tensor goes too: all three pages
    info = StorageInfo(("cuda:0", BASE), 10 * MiB, "cuda:0", "torch")
    assert backend.purge_estimate(["cuda:0"], {("cuda:0", BASE): info}, named).returned["cuda:0"] == 60 * MiB


def test_nothing_without_cuda(monkeypatch):
    pytest.importorskip("torch")
    from jupyter_gpumem.backends.pytorch import TorchBackend

    backend = TorchBackend()
    monkeypatch.setattr(backend, "_cuda_ready", lambda: False)
    monkeypatch.setattr(backend, "_memory_snapshot", lambda: pytest.fail("must not be read"))
    assert backend.internals(["cuda:0", "cpu"], set()) == []
    assert backend.purge_estimate(["cuda:0"], {}, set()) is None


# -- the CUDA context -----------------------------------------------------------------------
def test_context_parts_from_the_limits():
    items = by_label(_cuda_context.context_internals("cuda:0", H200_LIMITS))
    stacks = items["CUDA context: thread stacks"]
    assert stacks.nbytes == 1024 * 2048 * 132 == 264 * MiB
    assert stacks.kind == "outside" and not stacks.freed_by_purge and "2,048 threads" in stacks.note
    # the heap and printf buffer are taken only when a kernel first uses them (measured
    # on the H200: limits of 512 MiB cost nothing before): not counted as the context's
    assert set(items) == {"CUDA context: thread stacks"}
    assert _cuda_context.context_internals("cuda:0", None) == []


def test_context_limits_never_load_the_driver(monkeypatch):
    import ctypes

    modes = []
    real = ctypes.CDLL

    def cdll(name, mode=0, *a, **k):
        modes.append(mode)
        return real(name, mode, *a, **k)

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    # here no framework loaded libcuda: nothing to ask, nothing loaded
    assert _cuda_context.context_limits(0) is None
    import os
    assert all(m & getattr(os, "RTLD_NOLOAD", 0) for m in modes)


# -- the snapshot: rows under the names ---------------------------------------------------------
class FakeCudaTensor:
    """Stands for a CUDA tensor the scan finds in a name: its storage is a feed block."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes = ptr, nbytes


class FakeTensors(Backend):
    name = "fake"
    module = "jupyter_gpumem"

    def is_active(self):   # the product itself stands for the framework: no distribution
        return True

    def tensor_types(self):
        return (FakeCudaTensor,)

    def storages(self, obj):
        return [StorageInfo(("cuda:0", obj.ptr), obj.nbytes, "cuda:0", "torch")]


@pytest.fixture
def fake_gpu(torch_feed, monkeypatch):
    """snapshot.build sees one H200 whose torch allocator is the feed, and a namespace
    whose names reach every block but the workspaces."""
    from jupyter_gpumem.core import devices

    segs = torch_feed["segments"]
    backend = torch_feed["backend"]
    st = torch_feed["stats"]
    allocated = st["allocated_bytes"]["all"]["current"]
    reserved = st["reserved_bytes"]["all"]["current"]

    def read_devices(device="auto", detail=False):
        du = DeviceUsage("cuda:0", "cuda", "NVIDIA H200", total=150754820096,
                         used_all=1800 * MiB, used_process=742 * MiB + reserved, free=140 << 30)
        du.frameworks = [FrameworkUsage("torch", allocated=allocated, reserved=reserved,
                                        free_in_reserved=reserved - allocated)]
        return [du]

    monkeypatch.setattr(devices, "read_devices", read_devices)
    monkeypatch.setattr(devices, "accelerators",
                        lambda: [AcceleratorInfo("cuda:0", "cuda", "NVIDIA H200", None, 150754820096)])
    monkeypatch.setattr(_backends.REGISTRY, "backends", [backend, FakeTensors()])
    monkeypatch.setattr(_cuda_context, "context_limits", lambda i: dict(H200_LIMITS))
    sizes = {}
    for seg in segs:
        for b in seg["blocks"]:
            sizes[b["address"]] = b["size"]
    ptrs = sorted(named_pointers(segs))
    ns = {"model": [FakeCudaTensor(p, sizes[p]) for p in ptrs[:3]],
          "opt": [FakeCudaTensor(p, sizes[p]) for p in ptrs[3:]]}
    return {"ns": ns, "allocated": allocated, "reserved": reserved,
            "named": sum(sizes[p] for p in ptrs)}


def test_snapshot_lists_internals_under_the_names(fake_gpu):
    snap = _snapshot.build(namespace=fake_gpu["ns"], device=select("cuda:0"))
    assert {h.name for h in snap.holders} == {"opt", "model"}
    listed = by_label(snap.internals_of("cuda:0"))
    assert listed["cuBLAS workspaces"].nbytes == 64 * MiB
    # every allocated byte is a name's or an internal's
    assert fake_gpu["allocated"] == fake_gpu["named"] + 65 * MiB
    assert snap.unattributed == {"cuda:0": 0}
    text = repr(snap)
    lines = text.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("framework internal"))
    holders = next(i for i, line in enumerate(lines) if line.startswith("holder"))
    assert holders < table, "internals are listed under the user's names"
    row = next(line for line in lines if "torch: cuBLAS workspaces" in line)
    assert "64.0 MiB" in row and " 2 " in row and "yes" in row
    assert "unattributed" not in text
    html = snap._repr_html_()
    assert "torch: cuBLAS workspaces" in html and "framework internal" in html


def test_the_rest_is_itemised_and_says_what_no_purge_returns(fake_gpu):
    snap = _snapshot.build(namespace=fake_gpu["ns"], device=select("cuda:0"))
    parts = by_label(snap.internals_of("cuda:0", ("outside",)))
    assert parts["CUDA context: thread stacks"].nbytes == 264 * MiB
    remainder = parts["kernel images, library handles and the driver's own"]
    assert remainder.nbytes == 742 * MiB - 264 * MiB
    assert "8.0 MiB" in remainder.note   # the heap limit, said where it may sit
    assert sum(p.nbytes for p in parts.values()) == snap.devices[0].non_framework
    assert not any(p.freed_by_purge for p in parts.values())
    line = next(x for x in repr(snap).splitlines() if x.startswith("  rest: "))
    assert "thread stacks 264.0 MiB" in line and "no purge inside the process returns" in line


def test_json_schema_and_panel(fake_gpu):
    from jupyter_gpumem.views import panel_render

    snap = _snapshot.build(namespace=fake_gpu["ns"], device=select("cuda:0"))
    data = json.loads(json.dumps(snap.to_json()))
    assert data["internals"], data
    for item in data["internals"]:
        assert set(item) == {"label", "device", "bytes", "framework", "count", "freed_by_purge",
                             "kind", "note"}
        assert item["kind"] in ("allocated", "cached", "outside")
        assert isinstance(item["freed_by_purge"], bool) and item["label"]
    footer = panel_render.footer_html(data)
    assert "data-internal='cuBLAS workspaces'" in footer and "purge frees it" in footer


def test_unattributed_is_what_is_left(fake_gpu):
    ns = dict(fake_gpu["ns"])
    ns["opt"] = ns["opt"][:-1]   # one tensor only C++ holds now
    snap = _snapshot.build(namespace=ns, device=select("cuda:0"))
    assert snap.unattributed["cuda:0"] == fake_gpu["ns"]["opt"][-1].nbytes
    assert "unattributed (allocated, reached by no name)" in repr(snap)


def test_a_failing_backend_costs_one_line(fake_gpu, monkeypatch):
    backend = _backends.REGISTRY.backends[0]
    monkeypatch.setattr(backend, "internals", lambda ids, keys: 1 / 0)
    snap = _snapshot.build(namespace=fake_gpu["ns"], device=select("cuda:0"))
    assert any("torch: its internals could not be read" in m for m in snap.messages)
    assert snap.holders


def test_purge_estimate_across_frameworks(fake_gpu):
    ns = fake_gpu["ns"]
    infos = {("cuda:0", t.ptr): StorageInfo(("cuda:0", t.ptr), t.nbytes, "cuda:0", "torch")
             for t in ns["model"] + ns["opt"]}
    stray = StorageInfo(("cuda:0", 12345), 4096, "cuda:0", "other")   # in no pool we know
    infos[stray.key] = stray
    est = _backends.purge_estimate(["cuda:0", "cpu"], infos, set(infos))
    assert est == {"cuda:0": fake_gpu["reserved"] + 4096, "cpu": 0}


# -- JAX and TensorFlow pools, from the stats their frameworks gave -------------------------------
def test_jax_pool_is_an_internal_purge_cannot_free(monkeypatch):
    from jupyter_gpumem.backends.jax import JaxBackend

    backend = JaxBackend()
    # memory_stats() on an H200 right after the first array
    stats = {"cuda:0": {"bytes_in_use": 256, "pool_bytes": 106 << 30, "peak_bytes_in_use": 256}}
    monkeypatch.setattr(backend, "_pool_stats", lambda ids: stats)
    (pool,) = backend.internals(["cuda:0"], set())
    assert (pool.nbytes, pool.kind, pool.freed_by_purge) == ((106 << 30) - 256, "cached", False)
    info = StorageInfo(("cuda:0", 1), 1024, "cuda:0", "jax")
    est = backend.purge_estimate(["cuda:0"], {info.key: info})
    assert est.returned == {"cuda:0": 0} and est.covered == {info.key}


def test_tensorflow_pool_is_an_internal_purge_cannot_free(monkeypatch):
    from jupyter_gpumem.backends.tensorflow import TensorFlowBackend

    backend = TensorFlowBackend()
    monkeypatch.setattr(backend, "_gpu_info", lambda ids: {"cuda:0": (0, 10 * MiB, 300 * MiB)})
    monkeypatch.setattr(backend, "_growth", lambda k: (True, None))
    (pool,) = backend.internals(["cuda:0"], set())
    assert (pool.nbytes, pool.freed_by_purge, pool.kind) == (290 * MiB, False, "cached")
    monkeypatch.setattr(backend, "_growth", lambda k: (False, None))
    (pool,) = backend.internals(["cuda:0"], set())
    assert pool.nbytes is None and "does not say" in pool.note
    info = StorageInfo(("cuda:0", 1), 1024, "cuda:0", "tensorflow")
    assert backend.purge_estimate(["cuda:0"], {info.key: info}).returned == {"cuda:0": 0}



# -- the dry run predicts what the purge gives back -------------------------------------------
def test_dry_run_includes_the_internals_purge_frees(fake_gpu):
    import jupyter_gpumem

    ns = fake_gpu["ns"]
    # a bare purge: no name goes, the workspaces and the cache do (the case: the
    # dry run said 1.3 MiB of the 66 MiB the purge freed)
    dry = jupyter_gpumem.purge(namespace=ns, dry_run=True, device=select("cuda:0"))
    lt_segment = 2 * MiB   # the cuBLASLt workspace's segment is free once it is cleared
    assert dry.predicted == {"cuda:0": 38 * MiB + 64 * MiB + lt_segment}
    note = next(m for m in dry.messages if m.startswith("cuda:0: the purge also gives back"))
    assert "cuBLAS workspaces 64.0 MiB" in note and "allocator cache: free segments 38.0 MiB" in note
    # every name goes: every segment is given back
    dry = jupyter_gpumem.purge(namespace=ns, all=True, dry_run=True, device=select("cuda:0"))
    assert dry.predicted == {"cuda:0": fake_gpu["reserved"]}
    assert set(ns) == {"model", "opt"}, "a dry run changes nothing"
    # one name goes: only the segments it alone fills come back, with the internals
    dry = jupyter_gpumem.purge(["model"], namespace=ns, dry_run=True, device=select("cuda:0"))
    assert dry.predicted["cuda:0"] == 38 * MiB + 64 * MiB + lt_segment + _whole_segments(
        fake_gpu, [t.ptr for t in ns["model"]])


def _whole_segments(fake_gpu, ptrs) -> int:
    """Bytes of the feed's segments whose every active block is one of ``ptrs``."""
    total = 0
    for seg in feed():
        active = [b["address"] for b in seg["blocks"] if b["state"] != I]
        if active and all(a in ptrs for a in active):
            total += seg["total_size"]
    return total
