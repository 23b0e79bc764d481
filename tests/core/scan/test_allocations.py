"""Rule: one allocation, one key (core/scan/allocations.py one_allocation). A tensor made
from another's numpy view borrows the other's bytes in a storage of its own (at the same
address, or inside) and keeps them alive: it is blamed for the allocation it keeps, the
two names share it, and a purge of the owner alone predicts (and frees) nothing."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402

N = 16_000   # floats: 64,000 B


def _rows(ip):
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    return {h.name: h for h in snap.holders}


@pytest.mark.parametrize("start", [0, 1, 100])
def test_a_tensor_on_a_numpy_view_shares_the_allocation_it_keeps_alive(ip, start):
    run(ip, f"import torch\na = torch.ones({N})\n"
            f"b = torch.from_numpy(a.numpy()[{start}:{start + 2}])")
    rows = _rows(ip)
    assert rows["a"].total == rows["b"].total == 4 * N
    assert rows["a"].unique == rows["b"].unique == 0 and "b" in rows["a"].shared_with
    plan = ip.run_line_magic("gpumem", "purge a --dry-run --device cpu -o")
    assert sum(v or 0 for v in plan.predicted.values()) == 0
    plan = ip.run_line_magic("gpumem", "purge a b --dry-run --device cpu -o")
    assert sum(v or 0 for v in plan.predicted.values()) == 4 * N
    result = ip.run_line_magic("gpumem", "purge a --device cpu -o")
    assert "a" not in ip.user_ns and "b" in ip.user_ns and result.removed == ["a"]


def test_two_separate_tensors_keep_their_own_keys(ip):
    """Storages that only sit near each other are never merged (live allocations do not
    overlap): two names, two allocations, each its own."""
    run(ip, "import torch\nxs = [torch.ones(4) for _ in range(200)]\ny = torch.ones(8)")
    rows = _rows(ip)
    assert rows["xs"].total == rows["xs"].unique == 200 * 16
    assert rows["y"].unique == 32


@pytest.mark.parametrize("walk", ["C core", "Python walk"])
@pytest.mark.parametrize("order", range(6))
def test_one_container_met_the_small_storage_first_is_blamed_for_the_allocation(
        ip, monkeypatch, order, walk):
    """Found by the generator (a set, in whatever order its hashes give): a container
    holding a view of ``k1`` (its 32 B storage) and a tensor on a numpy view of ``k1``'s
    first 8 B (a storage of its own at the same address: the same key). The walk kept the
    first met under the key, so where the small one came first the name was blamed for 8 B
    of the 32 it keeps alive. The larger stands for the key whichever comes first, in the
    batches of the C core and of Python, warm and ``--full``."""
    import itertools

    from jupyter_gpumem.core.scan import reach as scan_reach

    if walk == "Python walk":
        monkeypatch.setattr(scan_reach, "NATIVE", None)
    elif scan_reach.NATIVE is None:
        pytest.skip("the C core is not built here")
    run(ip, "import torch\nk1 = torch.ones(8)\nk2 = torch.ones(8)\nv = k1[:]\n"
            "n = torch.from_numpy(k1.numpy()[0:2])")
    ns = ip.user_ns
    ns["a"] = list(list(itertools.permutations([ns["k2"], ns["v"], ns["n"]]))[order])
    run(ip, "del k1, k2, v, n")
    for line in ("--device cpu -o", "--device cpu -o", "--device cpu --full -o"):
        assert ip.run_line_magic("gpumem", line).holder("a").total == 64


# -- the proof kept from scan to scan (allocations.Apart) -------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402

from jupyter_gpumem.core.scan import Reach as _Reach, allocations as _alloc  # noqa: E402


class _Record:
    """A warm scan's kept record, as far as Apart reads it."""

    def __init__(self) -> None:
        self.apart = -1


def _storage(draw_key):
    device, ptr, n = draw_key
    key = (device, ptr) if device != "meta" else (device, ptr, "meta")
    return key, ((None, n), None, None)


_KEYS = st.tuples(st.sampled_from(["cpu", "cpu", "cuda:0", "meta"]),
                  st.integers(0, 40).map(lambda p: p * 16), st.integers(0, 48))
_ROOT = st.lists(_KEYS, max_size=6).map(lambda keys: dict(map(_storage, keys)))
#: a scan: some roots kept as they were (their record reused), some walked anew
_SCANS = st.lists(st.tuples(st.lists(st.booleans(), max_size=8), st.lists(_ROOT, max_size=4)),
                  min_size=1, max_size=8)


class _Watched(_alloc.Apart):
    """Apart, its answers noted (and, ``small``, its lists short)."""

    __slots__ = ("answers",)

    def check(self, reach, records):
        self.answers.append(super().check(reach, records))
        return self.answers[-1]


class _Small(_Watched):
    __slots__ = ()
    NEW = 3   # (most scans then go the long way: a rebuild)


def _apart_exactly(reach) -> bool:
    """One size per key, and no two spans of a device overlapping: the rule, plainly."""
    sizes: dict = {}
    for r in reach:
        for key, (info, _, _) in r.storages.items():
            if sizes.setdefault(key, info[1]) != info[1]:
                return False
    spans = sorted((k[0], k[1], k[1] + n) for k, n in sizes.items() if len(k) == 2)
    return all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(spans, spans[1:]))


@settings(max_examples=300, deadline=None)
@given(scans=_SCANS, small=st.booleans())
def test_what_is_proven_from_scan_to_scan_is_what_a_full_check_says(scans, small):
    """Scan after scan, roots kept (their record and storages as they were) or walked
    anew (spans meeting or not, at the same address with another size, other devices,
    keys that are no span): where Apart proves the storages apart they are, and the
    scan's reach is what one_allocation makes of it, whatever Apart kept from the scans
    before and however short its lists."""
    proof = _Small() if small else _Watched()
    proof.answers = []
    warm = type("Warm", (), {"apart": proof})()
    roots: list = []   # (storages, record) kept from the last scan
    for keep, walked in scans:
        kept = [r for r, k in zip(roots, keep) if k]
        now = kept + [(s, None) for s in walked]
        reach = [_Reach(s) for s, _ in now]
        got = _alloc.by_allocation(reach, [rec for _, rec in now], warm)
        want = _alloc.one_allocation(reach)
        assert [r.storages for r in got] == [r.storages for r in want]
        if proof.answers[-1]:
            assert _apart_exactly(reach)
        # what the warm scan keeps for the next: every root, a record each
        roots = [(s, rec if rec is not None else _Record()) for s, rec in now]
    # (and where every root was kept and proven, nothing is read again: below)


def test_a_replaced_name_is_checked_alone(monkeypatch):
    """The full check runs once; a scan that meets one root walked anew checks its
    storages only, against the spans kept; a span that meets one kept (the address
    reused by another size) costs a full check, never a wrong answer."""
    full, added = [], []
    real, real_add = _alloc.apart, _alloc.Apart._add
    monkeypatch.setattr(_alloc, "apart", lambda found: full.append(len(found)) or real(found))
    monkeypatch.setattr(_alloc.Apart, "_add",
                        lambda self, found: added.append(sum(map(len, found))) or
                        real_add(self, found))
    model = [{("cpu", 4096 * i + 64 * j): ((None, 64), None, None) for j in range(100)}
             for i in range(100)]   # 10,000 storages: more than a scan adds to what is kept
    records = [_Record() for _ in model]
    proof = _alloc.Apart()
    assert proof.check([_Reach(s) for s in model], records) and full == [100]
    assert proof.check([_Reach(s) for s in model], records) and added == [0]
    for k in range(5):
        batch = {("cpu", 10**7 + 10**5 * k + 64 * j): ((None, 64), None, None)
                 for j in range(100)}
        assert proof.check([_Reach(s) for s in model] + [_Reach(batch)], records + [None])
    assert full == [100] and added == [0, 100, 100, 100, 100, 100]   # the new root's only
    # the last batch's first address again, larger (that batch is gone): it meets the
    # spans kept of the next storage, so every storage is checked, and found apart
    moved = {("cpu", 10**7 + 10**5 * 4): ((None, 128), None, None)}
    assert proof.check([_Reach(s) for s in model] + [_Reach(moved)], records + [None])
    assert full == [100, 101]
    # where it meets a storage of this scan, it is no proof
    both = {("cpu", 10**7 + 10**5 * 4 + 64): ((None, 64), None, None)}
    assert not proof.check([_Reach(s) for s in model] + [_Reach(moved), _Reach(both)],
                           records + [None, None])
    assert full == [100, 101, 102]
    assert proof.check([_Reach(s) for s in model], records) and full == [100, 101, 102, 100]
