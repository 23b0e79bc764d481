"""Cost is linear in what the names hold, and every call honours ``scan_time_limit``.

Real IPython shell, real host tensors (``--device cpu``). Each call (the report, the
warm one after it, ``--full``, ``purge --all --dry-run``, a real purge) under a limit
too small for what the names hold answers near the limit and says it was cut; a real
purge whose plan was cut deletes only what it proved. Run with the C core and with
``JUPYTER_GPUMEM_PURE_SCAN=1``. (The figures, 10,000 against 100,000 names, are
``benchmarks/names.py``'s.)
"""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

from conftest import purge, report, run  # noqa: E402

SLACK = 1.0      # seconds beyond the limit a loaded machine may take (the code before: 5x)
BIG = 1_000_000  # small lists in `big`, the name the limit cuts


def limit(ip, seconds: float) -> None:
    ip.run_line_magic("config", f"GpuMemMagics.scan_time_limit = {seconds}")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


LIMIT = 0.0      # set by ``crowded``: a quarter of what a whole walk of its names takes here


@pytest.fixture
def crowded(ip):
    """A tensor first, then a thousand plain names, then one name too big to walk in the
    limit (a view of the tensor at its end), then a thousand more names; the caches of a
    first report filled with the limit out of the way, and the limit set to a quarter of
    what a whole scan of them takes here at least (so that every scan must be cut, on a
    fast machine too)."""
    global LIMIT
    run(ip, "import torch\nx = torch.ones(1 << 16)")
    for i in range(1000):
        ip.user_ns[f"a{i}"] = [i, str(i)]
    run(ip, f"big = [[i] for i in range({BIG})] + [x[:4]]")
    for i in range(1000):
        ip.user_ns[f"b{i}"] = {"k": i}
    limit(ip, 600)
    assert report(ip).holder("big") is not None
    runs = [timed(lambda: ip.run_line_magic("gpumem", "--device cpu --full -o"))
            for _ in range(2)]
    assert not any(snap.partial for _, snap in runs)
    LIMIT = min(whole for whole, _ in runs) / 4   # (the least: a loaded machine's pauses)
    limit(ip, LIMIT)
    yield ip
    limit(ip, 3.0)


def said_cut(messages: list[str]) -> bool:
    return any("time limit reached" in m for m in messages)


def test_every_report_honours_the_limit_and_says_it_was_cut(crowded):
    ip = crowded

    def cut_report(extra: str = ""):
        elapsed, snap = timed(lambda: ip.run_line_magic("gpumem", f"--device cpu {extra} -o"))
        assert elapsed <= LIMIT + SLACK, (extra, elapsed)
        assert snap.partial and said_cut(snap.messages), (extra, snap.messages)
        # one line for every name cut, however many: the first named, the rest counted
        line = next(m for m in snap.messages if "time limit reached" in m)
        assert line.count("\n") == 0 and len(line) < 400, line
        return snap

    cut_report("--full")   # every name walked: cut
    # the warm report reuses what it proved unchanged: whole within the limit, or cut
    elapsed, warm = timed(lambda: report(ip))
    assert elapsed <= LIMIT + SLACK, elapsed
    if not warm.partial:
        assert warm.holder("big") is not None and warm.holder("x") is not None
    # a new `big` (and new plain names after it): cold for them, cut
    run(ip, f"big = [[i] for i in range({BIG})] + [x[:4]]")
    for i in range(1000):
        ip.user_ns[f"b{i}"] = {"k": -i}
    snap = cut_report()
    assert snap.holder("x") is not None   # walked before the limit came


def test_the_purge_plan_honours_the_limit_and_says_it_was_cut(crowded):
    ip = crowded
    elapsed, result = timed(lambda: purge(ip, "--all --dry-run"))
    assert elapsed <= LIMIT + SLACK, elapsed
    assert result.partial and result.to_json()["partial"] is True
    assert any(m.startswith("partial scan: time limit reached") for m in result.messages), \
        result.messages
    assert "partial" in repr(result)
    assert all(name in ip.user_ns for name in ("x", "big", "a0", "b999"))


def test_a_cut_purge_deletes_only_what_it_proved(crowded):
    """``Out`` holds ``x`` itself (proved: the target's object) and a view of it (which
    the plan would clear as memory only ``x`` holds, had it finished ``big``, which holds
    the same memory): the view's entry stays, and ``big`` is intact."""
    ip = crowded
    run(ip, "x")
    shown_x = ip.execution_count - 1
    run(ip, "x[2:6]")
    shown_view = ip.execution_count - 1
    view = ip.user_ns["Out"][shown_view]
    ref = StorageWeakRef(ip.user_ns["x"].untyped_storage())
    global LIMIT
    for _ in range(3):   # (a loaded machine's pauses can make the first measure too long)
        dry = purge(ip, "x --dry-run")
        if dry.partial:
            break
        LIMIT /= 2
        limit(ip, LIMIT)
    assert dry.partial and f"Out[{shown_view}]" not in dry.removed, dry.removed
    elapsed, result = timed(lambda: purge(ip, "x"))
    assert elapsed <= LIMIT + SLACK + 1.0, elapsed   # (and one collection of the heap)
    assert result.partial and not result.dry_run
    assert "x" not in ip.user_ns
    assert f"Out[{shown_x}]" in result.removed and shown_x not in ip.user_ns["Out"]
    assert ip.user_ns["Out"][shown_view] is view, "a holder the plan did not prove went"
    assert f"Out[{shown_view}]" not in result.removed
    assert len(ip.user_ns["big"]) == BIG + 1 and all(f"a{i}" in ip.user_ns for i in range(1000))
    assert any("only what it proved went" in m for m in result.messages), result.messages
    assert not ref.expired()   # big and the view still hold it: nothing claims it freed
    assert result.freed["cpu"] == 0


def test_with_the_limit_out_of_the_way_the_same_purge_is_whole(crowded):
    ip = crowded
    limit(ip, 600)
    run(ip, "x[2:6]")
    result = purge(ip, "x --dry-run")
    assert not result.partial and result.to_json()["partial"] is False
    assert not any("only what it proved" in m for m in result.messages)
    # big still holds x's memory: the plan, whole, says so
    assert [s.by for s in result.still_held] == ["big"], result.still_held


def test_a_cut_scan_forgets_nothing_for_the_next(crowded):
    """A scan the limit cut leaves the warm scan's record as it was: the next one, with
    time enough, is the full scan's report."""
    ip = crowded
    assert ip.run_line_magic("gpumem", "--device cpu --full -o").partial
    limit(ip, 600)
    warm = report(ip)
    full = ip.run_line_magic("gpumem", "--device cpu --full -o")
    assert not warm.partial and not full.partial
    assert warm.to_json()["holders"] == full.to_json()["holders"]
