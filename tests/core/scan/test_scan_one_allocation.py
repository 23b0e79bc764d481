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
