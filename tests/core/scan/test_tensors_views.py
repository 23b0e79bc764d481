"""A view holds its base (``t[:2]._base is t``): the base stays alive while the view does,
with whatever it holds later (``t.set_(...)``, ``t.data = ...``), its gradient and its
graph. ``_base`` is an edge of the walk wherever the view is met: alone, in a batch of a
model's tensors (the C core's loop and its Python passes), and in the warm scan's
fingerprint, which must see the base move after the scan that kept the root."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import holders_by_name as _holders, run  # noqa: E402

MiB = 1 << 20


@pytest.mark.parametrize("move", ["set_", "data"])
@pytest.mark.parametrize("flag", ["", " --full"])
def test_a_view_is_blamed_for_what_its_base_holds_after_a_warm_scan(ip, move, flag):
    run(ip, "import torch\nx = torch.ones(8)\nkeep = [x[:2] for _ in range(40)]\ndel x")
    assert _holders(ip)["keep"].total == 32
    _holders(ip)   # a warm scan: the views proven the same
    base = "keep[0]._base"
    run(ip, f"{base}.set_(torch.zeros({MiB // 4}))" if move == "set_" else
            f"{base}.data = torch.zeros({MiB // 4})")
    after = _holders(ip, flag)["keep"]
    assert after.total == 32 + MiB, after
    assert "_base" in after.largest_path
    # the purge frees both: the views' storage and their base's new one
    result = ip.run_line_magic("gpumem", "purge keep --device cpu -o")
    assert sum(result.predicted.values()) == 32 + MiB, result


def test_a_view_of_a_parameter_keeps_its_gradient(ip):
    """Cut under no_grad (no graph leads back to the parameter): only ``_base`` does."""
    run(ip, f"import torch\np = torch.nn.Parameter(torch.ones({MiB // 4}))\n"
            "p.sum().backward()\nwith torch.no_grad():\n    w = p[:2]\ndel p")
    assert _holders(ip)["w"].total == 2 * MiB    # the parameter's storage and its .grad
