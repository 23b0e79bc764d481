"""Rule: one allocation, one key (core/scan/__init__.py one_allocation). A tensor made
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
