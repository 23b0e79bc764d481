"""Run in a child process by tests/hostile/test_hostile.py: one namespace holding every odd
object we know of, and every command run over it. Prints one JSON line of what
it measured; a crash of this process is a failure the parent sees.

    python tests/helpers/hostile_child.py LIMIT
"""
from __future__ import annotations

import json
import sys
import time
import weakref
from unittest import mock

import torch
from IPython.core.interactiveshell import InteractiveShell
from torch.multiprocessing.reductions import StorageWeakRef

from recording import records

N = 1 << 20                 # the named tensor: 4 MiB
CALLS: list[str] = []       # every piece of user code that runs appends here


def called(what: str) -> None:
    CALLS.append(what)


class RaisingClass:
    """``__class__`` is a property that raises."""

    def __init__(self, t):
        self.t = t

    @property
    def __class__(self):
        called("__class__")
        raise RuntimeError("__class__ read")


class OwnGetattribute:
    def __init__(self, t):
        object.__setattr__(self, "t", t)

    def __getattribute__(self, name):
        called(f"__getattribute__ {name}")
        return object.__getattribute__(self, name)


class Meta(type):
    def __getattribute__(cls, name):
        called(f"metaclass __getattribute__ {name}")
        return type.__getattribute__(cls, name)


class EqMeta(type):
    """A metaclass with ``__eq__`` alone: Python makes its classes unhashable."""

    def __eq__(cls, other):
        called("metaclass __eq__")
        return cls is other


class HashMeta(EqMeta):
    """A metaclass with ``__hash__`` and ``__eq__`` of its own: user code on every hash."""

    def __hash__(cls):
        called("metaclass __hash__")
        return id(cls) >> 4


class _HoldsT:
    def __init__(self, t):
        self.t = t


class Unhashable(_HoldsT, metaclass=EqMeta):
    pass


class Hashing(_HoldsT, metaclass=HashMeta):
    pass


class WithMeta(metaclass=Meta):
    def __init__(self, t):
        self.t = t


@records("dict", "__len__", "__iter__", "items", "values", "keys", record=called)
class CountingDict(dict):
    pass


@records("list", "__len__", "__iter__", "__getitem__", record=called)
class CountingList(list):
    pass


class SelfGetattr:
    def __getattr__(self, name):
        called(f"__getattr__ {name}")
        return self


class HostileKey:
    def __eq__(self, other):
        called("__eq__")
        return False

    def __hash__(self):
        called("__hash__")
        return 1

    def __repr__(self):
        called("__repr__")
        return "HostileKey()"


class RaisingProperties:
    @property
    def t(self):
        called("property t")
        raise RuntimeError("property read")

    def __init__(self, t):
        self.__dict__["real"] = t


class FunctionTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        called(f"__torch_function__ {getattr(func, '__name__', func)}")
        return super().__torch_function__(func, types, args, kwargs or {})


class PropertyTensor(torch.Tensor):
    @property
    def device(self):
        called("tensor property device")
        return torch.device("cpu")

    @property
    def grad_fn(self):
        called("tensor property grad_fn")
        return None

    @property
    def shape(self):
        called("tensor property shape")
        return ()


class Box:
    pass


def build_namespace(ns: dict) -> None:
    ns["named"] = torch.ones(N)                       # 4 MiB, to be blamed and freed
    ns["raising_class"] = RaisingClass(torch.ones(256))
    ns["own_getattribute"] = OwnGetattribute(torch.ones(256))
    ns["with_meta"] = WithMeta(torch.ones(256))
    ns["with_meta_class"] = WithMeta
    d = CountingDict()
    dict.__setitem__(d, "t", torch.ones(256))
    ns["counting_dict"] = d
    lst = CountingList()
    list.append(lst, torch.ones(256))
    ns["counting_list"] = lst
    ns["self_getattr"] = SelfGetattr()
    ns["hostile_keys"] = {HostileKey(): torch.ones(256)}
    ns["raising_properties"] = RaisingProperties(torch.ones(256))
    ns["function_tensor"] = torch.ones(256).as_subclass(FunctionTensor)
    CALLS.clear()   # as_subclass itself went through __torch_function__
    ns["property_tensor"] = torch.Tensor._make_subclass(PropertyTensor, torch.ones(256))
    ns["mock_tensor"] = mock.MagicMock(spec=torch.Tensor)
    ns["plain_mock"] = mock.MagicMock()
    alive = Box()
    alive.t = torch.ones(256)
    ns["alive_box"] = alive
    ns["alive_proxy"] = weakref.proxy(alive)
    gone = Box()
    ns["dead_proxy"] = weakref.proxy(gone)
    del gone
    ns["cyclic"] = cyc = []
    cyc.append(cyc)
    cyc.append({"self": cyc})
    deep = cur = []
    for _ in range(100_000):
        nxt = []
        cur.append(nxt)
        cur = nxt
    cur.append(torch.ones(16))
    ns["deep"] = deep
    ns[42] = [torch.ones(256)]                        # a key that is no name
    # one list, 20M times, in a list subclass (read in slices, no method of its own
    # called): cut by the time limit
    ns["big_list"] = CountingList([[]] * 20_000_000)
    x = torch.ones(64, requires_grad=True)
    y = x
    for _ in range(1_000_000):
        y = y * 1.0001
    ns["graph_leaf"] = x
    ns["graph"] = y


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    limit = float(sys.argv[1])
    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext jupyter_gpumem", store_history=False)
    ip.run_line_magic("config", f"GpuMemMagics.scan_time_limit = {limit}")
    build_namespace(ip.user_ns)
    ref = StorageWeakRef(ip.user_ns["named"].untyped_storage())
    out: dict = {"limit": limit}
    import gc
    _, out["gc_s"] = timed(gc.collect)   # what one collection of this heap costs
    CALLS.clear()

    _, out["first_report_s"] = timed(lambda: ip.run_line_magic("gpumem", "--device cpu"))
    snap, out["report_s"] = timed(lambda: ip.run_line_magic("gpumem", "--device cpu -o"))
    named = snap.holder("named")
    out["named_unique"] = named.unique if named else None
    out["partial"] = snap.partial
    out["messages"] = snap.messages
    out["hints"] = {h.name: h.hint for h in snap.holders if h.hint}
    out["holders"] = [h.name for h in snap.holders]

    dry, out["dry_run_s"] = timed(
        lambda: ip.run_line_magic("gpumem", "purge --all --dry-run --device cpu -o"))
    out["dry_run_removed"] = list(getattr(dry, "removed", []) or [])

    ip.run_line_magic("gpumem", "watch on --device cpu")
    result, out["footer_cell_s"] = timed(lambda: ip.run_cell("z = 1", store_history=True))
    out["footer_cell_ok"] = bool(result.success)
    ip.run_line_magic("gpumem", "watch off")

    from recording_comm import open_sidebar, send   # the sidebar's own path
    from jupyter_gpumem.views import comm as gpucomm
    gpucomm.register_comm(ip)
    c = open_sidebar()
    send(c, {"type": "set_device", "device": "cpu"})
    replies, out["comm_refresh_s"] = timed(lambda: send(c, {"type": "refresh", "id": 1}))
    out["comm_reply_types"] = [r["type"] for r in replies]
    snap_json = next((r["snapshot"] for r in replies if r["type"] == "snapshot"), None)
    out["comm_named"] = any(h["name"] == "named" for h in (snap_json or {}).get("holders", []))
    gpucomm.unregister_comm(ip)

    from jupyter_gpumem.views import comm as gpucomm_limit
    out["comm_limit"] = getattr(gpucomm_limit, "SCAN_TIME_LIMIT", 3.0)
    out["user_code_calls"] = list(CALLS)
    out["mock_children"] = sorted(object.__getattribute__(ip.user_ns["mock_tensor"],
                                                          "_mock_children"))

    # what one collection costs now, beside the purge (a loaded machine slows both alike)
    _, out["gc_purge_s"] = timed(gc.collect)
    _, out["purge_s"] = timed(lambda: ip.run_line_magic("gpumem", "purge named --device cpu"))
    out["named_freed"] = ref.expired()
    out["survivors"] = sorted(k for k in ("raising_class", "deep", "big_list", "graph", "counting_dict")
                              if k in ip.user_ns)
    _, out["purge_graph_s"] = timed(lambda: ip.run_line_magic("gpumem", "purge graph --device cpu"))
    out["graph_gone"] = "graph" not in ip.user_ns
    ip.user_ns.pop("graph_leaf", None)
    out["alive_marks_after"] = __import__("jupyter_gpumem.backends", fromlist=["_"]) \
        .active_backends()[0].ledger.alive
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
