"""Odd objects one at a time, in a real shell: each costs at most one line, none
runs user code, and the named tensor beside it is still blamed."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import weakref
from pathlib import Path
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

from conftest import run, run_watched  # noqa: E402
import hostile_child as hc  # noqa: E402

N = 1 << 16
ROOT = Path(__file__).resolve().parents[2]


def everything_answers(ip):
    """Report, purge dry run, footer, %%gpuwatch: each works and blames `named`."""
    ip.user_ns["named"] = torch.ones(N)
    ip.user_ns["torch"] = torch
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert snap.holder("named").unique == 4 * N
    dry = ip.run_line_magic("gpumem", "purge named --dry-run --device cpu -o")
    assert "named" in dry.removed
    assert run_watched(ip, "z = 1").success
    ip.run_cell_magic("gpuwatch", "--device cpu -o watched", "w = torch.ones(8)")
    assert ip.user_ns["watched"].to_json()
    return snap


class Box:
    pass


def test_a_dead_weak_proxy_disables_nothing(ip, capsys):
    gone = Box()
    ip.user_ns["dead"] = weakref.proxy(gone)
    del gone
    snap = everything_answers(ip)
    assert snap.holder("dead") is None
    assert "ReferenceError" not in capsys.readouterr().out


def test_a_raising_class_property_disables_nothing(ip, capsys):
    hc.CALLS.clear()
    ip.user_ns["odd"] = hc.RaisingClass(torch.ones(N))
    snap = everything_answers(ip)
    assert snap.holder("odd").unique == 4 * N
    assert hc.CALLS == []
    assert "__class__ read" not in capsys.readouterr().out


def test_a_key_that_is_no_name_is_one_line(ip, capsys):
    ip.user_ns[42] = [torch.ones(N)]
    try:
        snap = everything_answers(ip)
    finally:
        ip.user_ns.pop(42, None)
    assert [m for m in snap.messages if "not names" in m] == [
        "skipped 1 namespace key(s) that are not names: 42"]
    assert "TypeError" not in capsys.readouterr().out


@pytest.mark.parametrize("make", [
    lambda: hc.OwnGetattribute(torch.ones(N)),
    lambda: hc.WithMeta(torch.ones(N)),
    lambda: (lambda d: (dict.__setitem__(d, "t", torch.ones(N)), d)[1])(hc.CountingDict()),
    lambda: (lambda l: (list.append(l, torch.ones(N)), l)[1])(hc.CountingList()),
    lambda: torch.ones(N).as_subclass(hc.FunctionTensor),
    lambda: torch.Tensor._make_subclass(hc.PropertyTensor, torch.ones(N)),
    lambda: {hc.HostileKey(): torch.ones(N)},
], ids=["getattribute", "metaclass", "dict-subclass", "list-subclass", "torch-function",
        "tensor-properties", "hostile-key"])
def test_no_user_code_runs(ip, make):
    ip.user_ns["odd"] = make()
    hc.CALLS.clear()
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert snap.holder("odd").total == 4 * N
    ip.run_line_magic("gpumem", "odd")     # the rows of %gpumem NAME describe each tensor
    ip.run_line_magic("gpumem", "purge --all --dry-run --device cpu")
    assert hc.CALLS == []


def test_a_mock_shaped_like_a_tensor_gets_no_tensor_hint(ip):
    ip.user_ns["m"] = mock.MagicMock(spec=torch.Tensor)
    ip.user_ns["t"] = torch.ones(N)
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert snap.holder("m") is None
    from jupyter_gpumem.backends import active_backends

    torch_backend = next(b for b in active_backends() if b.name == "torch")
    assert torch_backend.hint("m", ip.user_ns["m"], 1 << 20) is None   # no tensor: no hint
    assert not object.__getattribute__(ip.user_ns["m"], "_mock_children")


def test_tensors_in_numpy_object_arrays_are_found(ip):
    np = pytest.importorskip("numpy")
    run(ip, "import numpy as np, torch\n"
            f"arr = np.empty((2, 2), dtype=object)\narr[1, 0] = torch.ones({N})\n"
            "plain = np.zeros(1000)")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    h = snap.holder("arr")
    assert h.unique == 4 * N and h.largest_path == "arr.flat[2]"
    assert snap.holder("plain") is None


def test_tensors_in_pandas_object_columns_are_found(ip):
    pytest.importorskip("pandas")
    run(ip, "import pandas as pd, torch\n"
            f"df = pd.DataFrame({{'t': [torch.ones({N}), None], 'n': [1, 2]}})")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    assert snap.holder("df").unique == 4 * N


TIME_CHILD = """
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
code, limit = sys.argv[1], float(sys.argv[2])
ip = InteractiveShell.instance(); ip.run_cell('%load_ext jupyter_gpumem')
assert ip.run_cell('import torch\\n' + code).success
# the whole walk first (as far as it goes): on a fast machine it may take less than the
# limit given, and the limit must fall inside it
ip.run_line_magic('config', 'GpuMemMagics.scan_time_limit = 60.0')
start = time.perf_counter()
ip.run_line_magic('gpumem', '--device cpu -o')
full = time.perf_counter() - start
limit = min(limit, full / 3)
ip.run_line_magic('config', f'GpuMemMagics.scan_time_limit = {limit}')
start = time.perf_counter()
snap = ip.run_line_magic('gpumem', '--device cpu -o')
print('RESULT', json.dumps({'elapsed': time.perf_counter() - start, 'partial': snap.partial,
                            'messages': snap.messages, 'limit': limit, 'full': full}))
"""


@pytest.mark.parametrize("code, limit", [
    # the C walk reads these in 0.05-0.2 s: a lower limit (at most a third of the whole
    # walk's time, measured first in the child), so that it is cut inside them
    ("class R: pass\nbig = [R() for _ in range(3_000_000)]", 0.05),
    ("big = [[i] for i in range(3_000_000)]", 0.05),
    ("x = torch.ones(4, requires_grad=True)\nbig = x\nfor _ in range(300_000): big = big * 1.0001", 0.3),
], ids=["objects", "one-element-lists", "graph"])
def test_the_time_limit_holds_inside_one_container_or_graph(code, limit):
    # in a child process: the heap these shapes leave behind would change what later
    # tests measure of this process's resident set
    import json

    proc = subprocess.run([sys.executable, "-c", TIME_CHILD, code, str(limit)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-2000:]
    out = json.loads(line[len("RESULT "):])
    assert out["partial"] and any("partial result" in m for m in out["messages"]), out
    assert out["elapsed"] <= 1.2 * out["limit"] + 0.05, out


MEMORY_CHILD = """
import sys, time
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance(); ip.run_cell('%load_ext jupyter_gpumem')
ip.user_ns['big'] = [{'id': i, 'text': str(i), 'tags': [i, i + 1]} for i in range(2_000_000)]
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
before = hwm()
open('/proc/self/clear_refs', 'w').write('5')   # peak resident set := current
ip.run_line_magic('config', 'GpuMemMagics.scan_time_limit = 2.0')
ip.run_line_magic('gpumem', '--device cpu')
print('PEAK', before, hwm())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's clear_refs")
def test_the_scan_allocates_little_against_what_it_walks():
    proc = subprocess.run([sys.executable, "-c", MEMORY_CHILD], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PEAK"))
    before, peak = map(int, line.split()[1:])
    # two million records take ~700 MiB; the scan's growth is a small fraction
    assert peak - before < 0.2 * before, (before, peak)


@pytest.mark.parametrize("walk", ["C core", "Python walk"])
@pytest.mark.parametrize("cls", ["Unhashable", "Hashing"])
def test_a_class_whose_metaclass_defines_eq_or_hash_is_read_and_never_hashed(
        ip, capsys, monkeypatch, cls, walk):
    """A class is a key of the scan's sets and dicts; one whose metaclass defines
    ``__eq__`` alone is unhashable (every view failed: "unhashable type"), one that
    defines ``__hash__`` runs user code at each hash. Its instances are now read through
    their type's traverse and their attributes by C slots: the tensor they hold is
    blamed with its path, the report, the footer, %%gpuwatch and purge work, and the
    metaclass is never asked."""
    from jupyter_gpumem.core.scan import reach as scan_reach

    if walk == "Python walk":
        monkeypatch.setattr(scan_reach, "NATIVE", None)
    elif scan_reach.NATIVE is None:
        pytest.skip("the C core is not built here")
    hc.CALLS.clear()
    odd = getattr(hc, cls)(torch.ones(N))
    ip.user_ns["odd"] = odd
    ip.user_ns["box"] = {"in": odd, "many": [getattr(hc, cls)(torch.ones(8)) for _ in range(3)],
                         odd: "an instance as a key"} if cls == "Hashing" else \
        {"in": odd, "many": [getattr(hc, cls)(torch.ones(8)) for _ in range(3)]}
    snap = everything_answers(ip)
    h = snap.holder("odd")
    assert h.total == 4 * N and h.largest_path == "odd.t" and h.type == cls
    assert snap.holder("box").total == 4 * N + 3 * 32
    rows = ip.run_line_magic("gpumem", "odd --device cpu -o").holder("odd").rows
    assert [r.path for r in rows] == ["odd.t"]
    freed = ip.run_line_magic("gpumem", "purge odd box --device cpu -o")
    assert {"odd", "box"} <= set(freed.removed)
    assert "odd" not in ip.user_ns and "box" not in ip.user_ns
    out = capsys.readouterr().out
    assert "unhashable" not in out and "TypeError" not in out, out
    assert hc.CALLS == [], hc.CALLS


def test_a_name_whose_walk_fails_is_one_line_and_the_rest_stands(ip, capsys, monkeypatch):
    """No real object is known to make the walk raise any more (the last one, a class
    with an ``__eq__`` metaclass, is read now): the failure is injected into the walk of
    one name, whatever a future one may be. That name is counted as skipped, in one
    line; every other name, the footer, %%gpuwatch and purge still answer."""
    from jupyter_gpumem.core.scan import reach as scan_reach

    bad = [torch.ones(8)]
    real = scan_reach.Reacher.walk_steps

    def walk_steps(self, obj, node=None, due=None):
        if obj is bad:
            raise RuntimeError("a walk that fails")
        return (yield from real(self, obj, node, due))

    monkeypatch.setattr(scan_reach.Reacher, "walk_steps", walk_steps)
    ip.user_ns["bad"] = bad
    snap = everything_answers(ip)
    assert snap.holder("bad") is None
    assert "1 object(s) refused introspection and were skipped: list in bad" in snap.messages, \
        snap.messages
    out = capsys.readouterr().out
    assert "could not scan" not in out and "RuntimeError" not in out, out
