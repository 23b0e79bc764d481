"""A tensor's attributes of its own (``t.extra = x``; ``param.main_grad`` as mixed-precision
trainers keep it) are edges of the walk, wherever the tensor is met: alone, in a batch of
a model's parameters (the C core's loop and its Python passes), and in the warm scan's
fingerprint, which must see an attribute set after the scan that kept the root."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import holders_by_name as _holders, run  # noqa: E402

MiB = 1 << 20


def test_a_tensor_is_blamed_for_what_its_attribute_holds(ip):
    run(ip, "import torch\na = torch.ones(8)\na.extra = torch.ones(MiB // 4)".replace("MiB", str(MiB)))
    rows = _holders(ip)
    assert rows["a"].total == MiB + 32
    assert any("extra" in p for p in [rows["a"].largest_path])


@pytest.mark.parametrize("flag", ["", " --full"])
def test_an_attribute_set_on_a_parameter_after_a_scan_is_seen_by_the_next(ip, flag):
    run(ip, "import torch\nmodel = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(6)])")
    before = _holders(ip)["model"].total
    assert before == 6 * (16 + 4) * 4
    _holders(ip)   # a warm scan: the model's parameters proven the same
    run(ip, f"model[3].weight.main_grad = torch.zeros({MiB // 4})")
    after = _holders(ip, flag)["model"]
    assert after.total == before + MiB
    assert "main_grad" in after.largest_path
    run(ip, "del model[3].weight.main_grad")
    assert _holders(ip)["model"].total == before


def test_purge_frees_what_the_attribute_held(ip):
    run(ip, f"import torch, weakref\na = torch.ones(8)\na.extra = torch.ones({MiB // 4})\n"
            "probe = weakref.ref(a.extra)")
    ip.run_line_magic("gpumem", "purge a --device cpu -o")
    run(ip, "import gc; gc.collect()")
    assert ip.user_ns["probe"]() is None
    assert "a" not in ip.user_ns
