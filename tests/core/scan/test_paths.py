"""Canonical paths: the path shown for a storage is the one a user would type.

The rules, in order: paths through attributes, items and a module's or
optimizer's registered children come before any path through a closure, a
default argument, an autograd graph or a frame; then the shortest (in the
accessors it shows); then the first in registration order (``model.0`` before
``model.11``, a dict's insertion order). Real torch modules, on the CPU.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402


def rows(ip, name: str) -> dict[str, int]:
    """``path -> bytes`` of the rows of ``%gpumem NAME``."""
    snap = ip.run_line_magic("gpumem", f"{name} --device cpu -o")
    assert snap.details, f"{name} holds nothing"
    return {r.path: r.nbytes for r in snap.details[0].rows}


def largest(ip, name: str) -> str:
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    holder = snap.holder(name)
    assert holder is not None, [h.name for h in snap.holders]
    return holder.largest_path


MIN_GPT = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(8, 32), c_proj=nn.Linear(32, 8),
                                      act=nn.GELU()))
        m = self.mlp
        self.mlpf = lambda x: m.c_proj(m.act(m.c_fc(x)))   # closes over its submodules

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(h=nn.ModuleList([Block() for _ in range(4)])))

model = GPT()
"""


def test_a_module_is_shown_through_its_submodules_not_a_lambda_closing_over_them(ip):
    run(ip, MIN_GPT)
    paths = rows(ip, "model")
    assert "model.transformer.h.2.mlp.c_proj.weight" in paths
    assert not [p for p in paths if "closure" in p], paths
    assert len(paths) == 4 * 6   # per block: the norm's two, two linears' two each
    # ties in registration order: the first block, its first linear
    assert largest(ip, "model") == "model.transformer.h.0.mlp.c_fc.weight"


TRAINER = """
import torch
from torch import nn

class Trainer:
    pass

torch.manual_seed(0)
trainer = Trainer()
trainer.model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
trainer.optimizer = torch.optim.Adam(trainer.model.parameters())
trainer.loss = trainer.model(torch.randn(16, 64)).square().mean()
trainer.loss.backward()          # finished: the graph still points at the weights
trainer.optimizer.step()
"""


def test_an_object_holding_a_finished_loss_is_shown_through_its_model_and_optimizer(ip):
    run(ip, TRAINER)
    paths = rows(ip, "trainer")
    assert not [p for p in paths if "grad_fn" in p], paths
    assert "trainer.model.0.weight" in paths
    assert "trainer.model.0.weight.grad" in paths
    assert "trainer.optimizer.state[...]['exp_avg']" in paths
    assert "trainer.loss" in paths


def test_a_loss_alone_is_still_shown_through_its_graph(ip):
    run(ip, TRAINER + "loss = trainer.loss\n")
    assert any(p.startswith("loss.grad_fn.") for p in rows(ip, "loss"))


def test_ties_go_in_registration_order(ip):
    run(ip, "import torch\n"
            "model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(12)])\n"
            "model[11].weight = model[0].weight   # one storage, two registered places\n"
            "d = {'b': torch.ones(64), 'a': torch.ones(64)}\n"
            "d['a'] = d['b']")
    paths = rows(ip, "model")
    assert "model.0.weight" in paths and "model.11.weight" not in paths
    assert largest(ip, "model") == "model.0.weight"
    assert list(rows(ip, "d")) == ["d['b']"]


def test_the_shortest_path_is_shown(ip):
    run(ip, "import torch\nclass Box: pass\n"
            "t = torch.ones(256)\nb = Box()\nb.inner = Box()\nb.inner.deeper = Box()\n"
            "b.inner.deeper.t = t\nb.short = t\n"
            "lst = [[[t]], t]")
    assert list(rows(ip, "b")) == ["b.short"]
    assert list(rows(ip, "lst")) == ["lst[1]"]


def test_an_attribute_chain_comes_before_a_closure_or_a_default_even_when_longer(ip):
    run(ip, "import torch\nclass Box: pass\n"
            "t = torch.ones(256)\nb = Box()\n"
            "b.f = lambda: t.sum()\n"
            "def g(x, cache=t):\n    return x\n"
            "b.g = g\n"
            "b.x = Box(); b.x.y = Box(); b.x.y.z = Box(); b.x.y.z.w = t")
    assert list(rows(ip, "b")) == ["b.x.y.z.w"]


def test_a_frame_comes_after_attributes(ip):
    run(ip, "import torch\nclass Box: pass\n"
            "t = torch.ones(256)\n"
            "def gen(x):\n    yield 1\n    yield x\n"
            "b = Box()\nb.it = gen(t)\nnext(b.it)\nb.a = Box(); b.a.b = Box(); b.a.b.t = t")
    assert list(rows(ip, "b")) == ["b.a.b.t"]
    run(ip, "del b.a")
    assert list(rows(ip, "b")) == ["b.it→gen(): x"]


def test_a_modules_registered_children_come_before_its_plain_attributes(ip):
    run(ip, "import torch\nm = torch.nn.Module()\nt = torch.ones(256)\n"
            "m.__dict__['alias'] = t            # a plain attribute, set first\n"
            "m.register_buffer('buf', t)")
    assert list(rows(ip, "m")) == ["m.buf"]


def test_an_optimizer_is_shown_through_its_state_and_its_parameters(ip):
    run(ip, "import torch\nlin = torch.nn.Linear(32, 32)\n"
            "opt = torch.optim.Adam(lin.parameters())\n"
            "lin(torch.ones(2, 32)).sum().backward()\nopt.step()\ndel lin")
    paths = rows(ip, "opt")
    assert "opt.param_groups[0]['params'][0]" in paths
    assert "opt.param_groups[0]['params'][0].grad" in paths
    assert "opt.state[...]['exp_avg']" in paths and "opt.state[...]['exp_avg_sq']" in paths
    # the state's path has fewer accessors than a parameter's
    assert largest(ip, "opt") == "opt.state[...]['exp_avg']"


def test_a_storage_next_to_a_long_list_is_found_without_reading_the_list(ip):
    run(ip, "import torch\nclass Box: pass\n"
            "b = Box()\nb.records = [{'id': i, 'tags': [i]} for i in range(200_000)]\n"
            "b.t = torch.ones(256)")
    assert largest(ip, "b") == "b.t"


def test_paths_are_the_same_from_the_report_and_from_the_names_rows(ip):
    run(ip, TRAINER)
    snap = ip.run_line_magic("gpumem", "trainer --device cpu -o")
    holder = snap.holder("trainer")
    assert holder.largest_path in rows(ip, "trainer")


def test_a_model_beside_a_long_list_is_found_in_time(ip):
    """The path search does not read a long container at its own speed: it first asks,
    at C speed, whether the container leads to a storage not met yet. Without the C core
    the same question is asked in Python, some eight times slower (benchmarks/scan_forms.py):
    the limit there is as much longer."""
    from jupyter_gpumem.core.scan import reach as scan_reach

    run(ip, "import torch\nclass Data: pass\n"
            "d = Data()\nd.records = [{'id': i, 'tags': [i]} for i in range(300_000)]\n"
            "d.model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))")
    limit = 1.0 if scan_reach.NATIVE is not None else 8.0
    ip.run_line_magic("config", f"GpuMemMagics.scan_time_limit = {limit}")
    try:
        snap = ip.run_line_magic("gpumem", "d --device cpu -o")
    finally:
        ip.run_line_magic("config", "GpuMemMagics.scan_time_limit = 3.0")
    assert not snap.partial, snap.messages
    assert {r.path for r in snap.details[0].rows} == {
        "d.model.0.weight", "d.model.0.bias", "d.model.1.weight", "d.model.1.bias"}


def test_tensors_far_into_a_long_block_keep_their_paths(ip):
    """The search looks at a long block of children a slice at a time: tensors past the
    first slices (a list's 700th and last item, an optimizer's last state) keep their
    exact paths, and the largest is still the first in order among its size."""
    run(ip, "import torch\nlong = [0] * 2000\nfor _i in (0, 700, 1999):\n"
            "    long[_i] = torch.ones(_i + 1)\n"
            "net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(300)])\n"
            "adam = torch.optim.Adam(net.parameters())\n"
            "net(torch.ones(1, 4)).sum().backward()\nadam.step()")
    assert rows(ip, "long") == {"long[0]": 4, "long[700]": 2804, "long[1999]": 8000}
    got = rows(ip, "adam")
    assert got["adam.param_groups[0]['params'][599]"] == 16       # the last bias
    assert got["adam.param_groups[0]['params'][599].grad"] == 16
    snap = ip.run_line_magic("gpumem", "adam --device cpu -o")
    paths = [r.path for r in snap.details[0].rows]
    assert sorted(set(p for p in paths if p.startswith("adam.state"))) == [
        "adam.state[...]['exp_avg']", "adam.state[...]['exp_avg_sq']", "adam.state[...]['step']"]
    assert len(paths) == 600 * 5 and "→…" not in " ".join(paths)   # each found, none unknown
    assert largest(ip, "adam") == "adam.state[...]['exp_avg']"


def test_the_groups_of_children_by_step_are_the_same_by_runs_and_by_kinds():
    """_split groups a block's children by the cost of their step; runs of one kind (an
    optimizer's children) are grouped as slices, anything else pair by pair: the same
    groups, in the same order, either way."""
    from jupyter_gpumem.core.scan import search as scan_paths

    def reference(pairs):
        costs = [(0, 1) if label is None else scan_paths._cost(label[0]) for label, _ in pairs]
        order = list(dict.fromkeys(costs))
        return [(c, [p for p, pc in zip(pairs, costs) if pc == c]) for c in order]

    def labelled(kinds):
        return [((kind, i), f"v{i}") for i, kind in enumerate(kinds)]

    runs = ["opt_param"] * 50 + ["state_key"] * 3 + ["opt_state"] * 100 + ["attr"] * 4
    mixed = ["attr", "item", "opt_state", "attr", "graph"] * 10      # many short runs
    for kinds in (runs, mixed, ["attr"] * 9, runs + [None]):
        pairs = labelled(k for k in kinds if k is not None)
        if None in kinds:
            pairs.append((None, "cell"))
        assert scan_paths._split(pairs) == reference(pairs), kinds
