"""The scan's fast paths: a container's tensors taken together, untracked dicts skipped.

A model's parameters and an optimizer's state (eight tensors or more) are taken
in C-level passes over lists, with storages remembered between scans; these
tests show the figures and paths are the ones the one-by-one path gives, and
that what changed between two scans is seen.
"""
from __future__ import annotations

import gc
import importlib

import pytest

torch = pytest.importorskip("torch")

from conftest import holder, report, run, weak  # noqa: E402

_scan = importlib.import_module("jupyter_gpumem.core.scan")

W = 64 * 64 * 4       # bytes of one Linear(64, 64) weight
B = 64 * 4            # and of its bias
LAYERS = 12


@pytest.fixture
def trained(ip):
    """A 12-layer model after one Adam step: 24 parameters, 24 gradients, 72 state tensors."""
    run(ip, "import torch\n"
            f"model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range({LAYERS})])\n"
            "opt = torch.optim.Adam(model.parameters())\n"
            "model(torch.ones(4, 64)).sum().backward()\nopt.step()")


def test_model_and_optimizer_figures_hold_scan_after_scan(ip, trained):
    params = LAYERS * (W + B)
    steps = 2 * LAYERS * 4        # Adam's step counters: one float32 scalar per parameter
    for _ in range(3):            # the first scan asks each tensor, the next ones remember
        snap = report(ip)
        model, opt = holder(snap, "model"), holder(snap, "opt")
        assert (model.unique, model.shared) == (0, 2 * params)          # weights and grads
        assert (opt.unique, opt.shared) == (2 * params + steps, 2 * params)  # two moments
        assert model.tensors == 4 * LAYERS and opt.tensors == 10 * LAYERS
        assert model.shared_with == ["opt"] and opt.shared_with == ["model"]
        assert model.largest_path == "model.0.weight"    # ties in registration order
        assert opt.largest_path == "opt.state[...]['exp_avg']"   # shorter than its params


def test_purging_model_and_optimizer_frees_weights_grads_and_state(ip, trained):
    refs = [weak(ip, e) for e in ("model[3].weight", "model[3].weight.grad",
                                  "opt.state[model[3].weight]['exp_avg']")]
    report(ip)
    ip.run_line_magic("gpumem", "purge model opt --device cpu -o")
    gc.collect()
    assert all(r.expired() for r in refs)


@pytest.mark.parametrize("change, delta", [
    ("model[0].weight.grad = None", -W),
    ("model[1].weight.data = torch.ones(128, 64)", W),
    ("model[2].weight.grad = torch.ones(64, 64)", 0),
])
def test_what_changes_between_scans_is_seen(ip, trained, change, delta):
    before = holder(report(ip), "model").total
    run(ip, change + ";")
    assert holder(report(ip), "model").total == before + delta


def test_tied_weights_are_counted_once(ip):
    run(ip, "import torch\nm = torch.nn.Sequential(torch.nn.Linear(256, 256), "
            "*[torch.nn.Linear(8, 8) for _ in range(8)])\nm[8].weight = m[0].weight")
    h = holder(report(ip), "m")
    assert h.largest_bytes == 256 * 256 * 4 and h.largest_path in ("m.0.weight", "m.8.weight")
    assert h.total == 256 * 256 * 4 + 256 * 4 + 7 * (8 * 8 * 4) + 8 * (8 * 4)


def paths(result) -> list[dict]:
    return [{key: _scan.format_path(entry[1]) for key, entry in reach.storages.items()}
            for reach in result.reach]


def test_batches_find_what_the_one_by_one_walk_finds_under_the_same_paths(ip, trained):
    """``describe`` (``%gpumem NAME``) takes every tensor one by one: the reference."""
    run(ip, "extra = [model[0].weight, opt.state[model[1].bias]]\n"
            "m = torch.nn.Sequential(torch.nn.Linear(256, 256), "
            "*[torch.nn.Linear(8, 8) for _ in range(8)])\nm[8].weight = m[0].weight\n"
            "model[5].act = model[5](torch.ones(2, 64))   # a graph among 48 leaves")
    roots = _scan.collect_roots(shell=ip)
    fast = _scan.scan(roots, devices={"cpu"}, shell=ip)
    slow = _scan.scan(roots, devices={"cpu"}, shell=ip, describe=True)
    assert paths(fast) == paths(slow)
    assert sum(len(p) for p in paths(fast)) > 150


def test_tensors_with_an_autograd_graph_in_a_batch_reach_the_graph(ip):
    run(ip, "import torch\nw = torch.ones(1 << 16, requires_grad=True)\n"
            "class Acts(torch.nn.Module):\n    pass\n"
            "m = Acts()\nfor i in range(10):\n    setattr(m, f'a{i}', w * (i + 1))")
    snap = report(ip)
    h = holder(snap, "m")
    assert 10 * (1 << 18) <= h.unique < 10 * (1 << 18) + 4096   # the ten products (and
    # the scalars their graphs saved)
    assert h.shared == 1 << 18 and h.shared_with == ["w"]   # w, through the graph


def test_device_filter_applies_to_batches(ip, trained):
    roots = _scan.collect_roots(shell=ip)
    on_cpu = _scan.scan(roots, devices={"cpu"}, shell=ip)
    elsewhere = _scan.scan(roots, devices={"cuda:0"}, shell=ip)
    opt = [r.name for r in roots].index("opt")
    assert len(on_cpu.reach[opt].storages) == 10 * LAYERS
    assert elsewhere.reach[opt].storages == {}


def test_a_dict_of_atoms_is_skipped_and_a_tensor_put_in_it_is_found(ip):
    run(ip, "import torch\ncfg = {str(i): i for i in range(100_000)}")
    assert not gc.is_tracked(ip.user_ns["cfg"])     # what lets the scan skip it in O(1)
    assert report(ip).holder("cfg") is None
    run(ip, "cfg['t'] = torch.ones(1024)")
    assert holder(report(ip), "cfg").largest_path == "cfg['t']"
    run(ip, "del cfg['t']\nrow = tuple(range(10)) + (torch.ones(2048),)")
    assert holder(report(ip), "row").total == 2048 * 4
