"""Bad input and hostile objects: clear errors, nothing deleted, no hang."""
from __future__ import annotations

import sys
import time

import pytest
from IPython.core.error import UsageError

torch = pytest.importorskip("torch")
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

from conftest import run  # noqa: E402

N = 1 << 18


@pytest.fixture
def ns(ip):
    run(ip, f"import torch\nt = torch.ones({N})\nu = torch.ones({N})\nx = 3\n"
            "class M: pass\nm = M()\nm.cache = torch.ones(8)")
    refs = [StorageWeakRef(ip.user_ns[n].untyped_storage()) for n in ("t", "u")]
    names = set(ip.user_ns)
    yield ip
    assert set(ip.user_ns) >= names, "a name was deleted"
    assert not any(r.expired() for r in refs), "memory was freed"


@pytest.mark.parametrize("line, message", [
    ("purge t nosuch --device cpu", "name 'nosuch' is not defined"),
    ("purge t x --device cpu", "'x' holds no host memory"),
    ("purge t m..cache --device cpu", "malformed path"),
    ("purge t t() --device cpu", "malformed path"),
    ("purge t t[1:2] --device cpu", "must be a number or a string"),
    ("purge t m.nothing --device cpu", "no attribute 'nothing'"),
    ("purge t --bogus --device cpu", "unrecognized arguments: --bogus"),
    ("purge t --device gpu7", "unknown device"),
    ("purge t --all --device cpu", "names or --all"),
    ("nosuch --device cpu", "name 'nosuch' is not defined"),
    ("x --device cpu", "'x' holds no host memory"),
    ("--frobnicate", "unrecognized arguments"),
    ("purge 'unclosed", "cannot parse"),
])
def test_bad_input_is_one_line_and_deletes_nothing(ns, line, message):
    with pytest.raises(UsageError) as info:
        ns.run_line_magic("gpumem", line)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_usage_error_in_a_cell_leaves_no_traceback_holding_memory(ns):
    res = ns.run_cell("%gpumem purge nosuch --device cpu")
    assert not res.success and type(res.error_in_exec).__name__ == "UsageError"
    assert getattr(sys, "last_traceback", None) is not None   # IPython keeps its traceback...
    snap = ns.run_line_magic("gpumem", "--device cpu -o")
    # ...and it holds no memory: a holder is listed only where it reaches a tensor's
    # storage, so no "last traceback" row at all (a row of 0 bytes does not exist)
    assert snap.holder("last traceback") is None, snap.holder("last traceback")


def _refusing(message: str):
    """A method of :class:`Hostile` that counts its call, then raises."""
    def method(self, *args):
        Hostile.calls += 1
        raise RuntimeError(message)
    return method


class Hostile:
    """Every way an object can fight introspection; each of them counts its calls
    (an exception the scan swallowed would hide that user code ran)."""

    calls = 0

    def __init__(self):
        self.t = torch.ones(N)

    boom = property(_refusing("property evaluated"))
    __getattr__ = _refusing("__getattr__ called")

    def __getattribute__(self, name):
        # every name: `o.__dict__` and `o.__class__` run this too (the scan reads
        # through C-level slots instead: type(o), the instance dict)
        Hostile.calls += 1
        return object.__getattribute__(self, name)

    __len__ = _refusing("len called")
    __iter__ = _refusing("iter called")
    __eq__ = _refusing("eq called")
    __hash__ = object.__hash__


def test_no_user_code_runs_during_scan(ip):
    run(ip, "import torch")
    ip.user_ns["hostile"] = Hostile()
    Hostile.calls = 0
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert Hostile.calls == 0
    assert snap.holder("hostile").unique == 4 * N


def test_mocks_weakproxies_cycles_and_deep_nesting(ip):
    run(ip, "import torch, weakref\nfrom unittest import mock\n"
            f"class Box: pass\nb = Box()\nb.t = torch.ones({N})\n"
            "proxy = weakref.proxy(b)\nmagic = mock.MagicMock()\nmagic.attr.t = 1\n"
            "cyc = []\ncyc.append(cyc)\ncyc.append(b)\n"
            "deep = []\ncur = deep\nfor _i in range(100000):\n    nxt = []\n    cur.append(nxt)\n    cur = nxt\n"
            "cur.append(torch.ones(4))\n"
            "hugelist = list(range(2_000_000))\nhugedict = {i: str(i) for i in range(200_000)}")
    start = time.perf_counter()
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    elapsed = time.perf_counter() - start
    assert elapsed < 5
    assert snap.holder("proxy") is None, "a weak proxy keeps nothing alive"
    assert snap.holder("b").unique == 0 and snap.holder("b").shared == 4 * N  # shared with cyc
    assert snap.holder("cyc").shared == 4 * N
    assert snap.partial and any("deeper than" in m and "in deep" in m for m in snap.messages), snap.messages


def test_time_limit_gives_a_partial_result(ip):
    run(ip, "import torch\nbig = [[torch.ones(1)] for _ in range(200000)]")
    ip.run_line_magic("config", "GpuMemMagics.scan_time_limit = 0.001")
    try:
        snap = ip.run_line_magic("gpumem", "--device cpu -o")
    finally:
        ip.run_line_magic("config", "GpuMemMagics.scan_time_limit = 3.0")
    assert snap.partial
    assert any("partial result" in m for m in snap.messages)


def test_objects_that_raise_on_introspection_are_skipped(ip):
    run(ip, "import torch")

    class Broken:
        __slots__ = ("t", "bad")

    obj = Broken()
    obj.t = torch.ones(N)
    ip.user_ns["broken"] = obj
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert snap.holder("broken").unique == 4 * N


def test_internal_failure_is_one_line_and_never_raises_into_the_cell(ip, capsys, monkeypatch):
    import jupyter_gpumem.core.snapshot as snapshot

    def explode(**kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(snapshot, "build", explode)
    result = ip.run_cell("y = 1\n%gpumem --device cpu\nz = 2", store_history=True)
    assert result.success and ip.user_ns["z"] == 2
    err = capsys.readouterr().err
    assert "jupyter_gpumem: RuntimeError: simulated failure" in err
