"""The generated cases' checks can fail: each meets a case it must refuse (the others
are shown failing by the open breaches in test_found.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from .checks import comparable, fresh, same  # noqa: E402


def test_two_different_reports_are_not_the_same(ip):
    fresh(ip)
    ip.run_cell("a = gen.atom('k1', 8)", store_history=True)
    first = ip.run_line_magic("gpumem", "--device cpu -o")
    ip.run_cell("a = gen.atom('k2', 64)", store_history=True)
    second = ip.run_line_magic("gpumem", "--device cpu --full -o")
    assert comparable(first) != comparable(second)
    with pytest.raises(AssertionError):
        same(first, second)
    fresh(ip)
