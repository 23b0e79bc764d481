"""Many small roots proven to reach nothing together (``Reacher.reach_nothing``: a few
runs of the C walker, or one walk of them all in the Python form), against walking each
root on its own. Both forms.

A long notebook's names are mostly small plain data; the scan proves most of them empty
together and walks the rest one by one. The report must be the one the one-by-one
walks give (holders, bytes, paths, sharing, partial and its reasons), whatever hides
among the small roots: a tensor deep inside, an instance of a class met for the first
time, a model, a structure deeper than the walk's limit, a cycle, a shared object.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402
from jupyter_gpumem.core.scan import reach as scan_reach  # noqa: E402


NAMESPACE = """
import torch
class Fresh:
    pass
class Slotted:
    __slots__ = ('v',)
shared = [1, 2, 3]
for _i in range(3000):
    _k = _i % 9
    if _k == 0:
        _v = [_i, str(_i), shared]
    elif _k == 1:
        _v = {'a': _i, 'b': [_i]}
    elif _k == 2:
        _v = Fresh()
        _v.x = [_i]
    elif _k == 3:
        _v = {'k': (_i, [_i])}
    elif _k == 4:
        _v = Slotted()
        _v.v = {'n': [_i]}
    elif _k == 5:
        _v = [[[[_i]]]]
    elif _k == 6:
        _v = {_i}
    elif _k == 7:
        _v = ([_i], {'s': shared})
    else:
        _v = []
        _v.append(_v)
    globals()[f'small_{_i}'] = _v
small_17 = [[{'deep': [Fresh()]}]]
small_17[0][0]['deep'][0].t = torch.ones(64)
small_1234 = {'t': torch.ones(32)}
small_2500 = [torch.nn.Linear(2, 2)]
small_2999 = (Fresh(),)
small_2999[0].inner = {'x': torch.ones(16)}
import functools
deep_small = functools.reduce(lambda inner, _: [inner], range(6000), [torch.ones(11)])
del _v, _i, _k
"""


def _report(ip):
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    rows = {h.name: (h.unique, h.shared, h.largest_path, tuple(sorted(h.shared_with)))
            for h in snap.holders}
    return rows, snap.partial, sorted(snap.messages)


@pytest.mark.parametrize("flag", ["", " --full"])
def test_small_roots_proven_together_give_the_report_of_walking_each(ip, monkeypatch, flag):
    run(ip, NAMESPACE)
    proven = []
    real = scan_reach.Reacher.reach_nothing

    def spy(self, objs, until, most=None):
        out = real(self, objs, until, most)
        proven.append(sum(out))
        return out

    monkeypatch.setattr(scan_reach.Reacher, "reach_nothing", spy)
    together = _report(ip)
    monkeypatch.setattr(scan_reach.Reacher, "reach_nothing",
                        lambda self, objs, until, most=None: bytearray(len(objs)))
    one_by_one = _report(ip)
    assert together == one_by_one
    rows, partial, messages = together
    assert {"small_17", "small_1234", "small_2500", "small_2999"} <= set(rows)
    assert rows["small_17"][0] == 256 and rows["small_2999"][0] == 64
    assert partial and any("deeper than" in m and "deep_small" in m for m in messages)
    # most of the 3,000 small names were proven empty together, not walked one by one
    assert proven and proven[0] >= 2900, proven


def test_a_change_inside_a_proven_root_is_seen_by_the_next_scan(ip):
    """Nothing of a root proven empty is kept: the next scan proves it again, so a
    tensor put into it since is found (the warm scan keeps nothing stale)."""
    run(ip, NAMESPACE)
    first, _, _ = _report(ip)
    assert "small_45" not in first
    run(ip, "small_45.append({'late': torch.ones(128)})")
    second, _, _ = _report(ip)
    assert second["small_45"][0] == 512
    run(ip, "small_45.pop()")
    third, _, _ = _report(ip)
    assert "small_45" not in third
