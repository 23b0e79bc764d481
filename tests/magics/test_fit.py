"""``%%gpumem fit``: the largest batch a step takes on the memory free now.

In a real kernel whose address space is limited (RLIMIT_AS, MALLOC_ARENA_MAX=2): a small
MLP and a small transformer block, the answer against an exhaustive search of the same grid,
in fewer trials than a bisection of that grid, the notebook left as it was. In the
test shell: the notebook's state (gradients, buffers, parameters, names) and every bad input.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys

import pytest
import torch
from IPython.core.error import UsageError

from benchmarks.fit_search import bisection, case
from jupyter_gpumem.core.fit import Grid, search
from jupyter_gpumem.core.fit.result import Trial, accumulation

from conftest import run
from jupyter_harness import run as run_in_kernel

STEP = "loss = model(torch.randn(bs, 32)).square().mean()\nloss.backward()\n"


def fit(ip, line: str, cell: str = STEP):
    return ip.run_cell_magic("gpumem", line, cell)


@pytest.fixture
def net(ip):
    run(ip, "import torch\ntorch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64),"
        " torch.nn.ReLU(), torch.nn.Linear(64, 4))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nbs = 'mine'\n")
    return ip.user_ns["model"]


def _state(model):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [None if p.grad is None else (p.grad, p.grad.clone()) for p in model.parameters()])


def _same(model, state) -> None:
    tensors, grads = state
    for k, v in model.state_dict().items():
        assert torch.equal(v, tensors[k]), k
    for p, g in zip(model.parameters(), grads):
        if g is None:
            assert p.grad is None
        else:
            assert p.grad is g[0] and torch.equal(p.grad, g[1])


# -- the notebook as it was ------------------------------------------------------------------
def test_names_buffers_and_gradients_come_back(ip, net):
    run(ip, "model(torch.randn(8, 32)).sum().backward()")   # gradients exist, stats moved
    before = _state(net)
    keys = set(ip.user_ns)
    r = fit(ip, "fit bs --max 64 --step 16 --device cpu -o res")
    assert r is ip.user_ns["res"] and r.largest == 64
    _same(net, before)
    assert ip.user_ns["bs"] == "mine" and "loss" not in ip.user_ns
    assert set(ip.user_ns) == keys | {"res"}
    assert any("set aside" in n and "put back" in n for n in r.notes)
    assert [t.size for t in r.trials] and all(t.ok for t in r.trials)
    got = json.loads(json.dumps(r.to_json()))
    assert got["largest"] == 64 and got["peak"] == r.peak and got["headroom"] == r.free - r.peak
    assert "bs = 64 fits on cpu" in repr(r)


def test_an_optimizer_step_is_refused_and_the_parameters_written_back(ip, net):
    before = _state(net)
    with pytest.raises(UsageError, match="changes the parameters.*written back"):
        fit(ip, "fit bs --max 64 --step 16 --device cpu",
            STEP + "opt.step()\nopt.zero_grad()\n")
    _same(net, before)
    assert ip.user_ns["opt"].state == {} or not any(ip.user_ns["opt"].state.values())


def test_another_exception_stops_the_search_and_shows(ip, net):
    before = _state(net)
    with pytest.raises(ValueError, match=r"too big: \d+"):
        fit(ip, "fit bs --max 128 --step 16 --device cpu",
            "if bs > 40:\n    raise ValueError(f'too big: {bs}')\n" + STEP)
    _same(net, before)
    assert ip.user_ns["bs"] == "mine" and "loss" not in ip.user_ns


@pytest.mark.parametrize("line, why", [
    ("fit n --device cpu", "never reads n"),
    ("fit bs --min 64 --max 8 --device cpu", "--min (64) is above --max (8)"),
    ("fit bs --device cuda:7", "no device cuda:7"),
    ("fit bs --min 3 --max 5 --device cpu", "no multiple of --step"),
    ("fit bs --target 0 --device cpu", "--target"),
    ("fit bs -o 1x --device cpu", "-o needs a variable name"),
    ("bs --device cpu", "the cell form is"),
    ("fit 'a b' --device cpu", "the name of the batch size"),
])
def test_bad_input_is_one_line(ip, net, line, why):
    before = _state(net)
    with pytest.raises(UsageError) as info:
        fit(ip, line)
    assert why in str(info.value) and "\n" not in str(info.value)
    _same(net, before)


def test_target_is_micro_batch_times_steps(ip, net):
    r = fit(ip, "fit bs --max 48 --step 16 --target 100 --device cpu -o res")
    a = r.accumulation
    assert a.micro * a.steps == 100 and a.micro <= r.largest == 48
    assert f"micro-batch {a.micro} x {a.steps}" in repr(r)
    for target, largest in ((96, 40), (97, 40), (7, 64), (1, 1)):
        a = accumulation(target, largest)
        assert a.micro * a.steps == target and a.micro <= largest
        assert all(target % d for d in range(a.micro + 1, min(target, largest) + 1))


# -- the search, on a step whose demand is known ------------------------------------------------


@pytest.mark.parametrize("fixed, per, budget, kink", [
    (50e6, 1e6, 1e9, None), (5e6, 3.3e5, 4e8, None), (1e8, 2e6, 3e9, 600),
    (1e7, 1e5, 5e8, 2000)])
def test_search_finds_the_exhaustive_answer_in_fewer_trials(fixed, per, budget, kink):
    """The search itself, its trials' peaks given by a formula (linear, or steeper past a
    size where a model would switch kernels)."""
    def demand(size):
        extra = 0 if kink is None or size < kink else (size - kink) * per
        return fixed + per * size + extra

    def one(size):
        d = demand(size)
        return Trial(size=size, ok=d <= budget, peak=int(d) if d <= budget else int(budget * 0.9),
                     seconds=0.0, free=int(budget), requested=None if d <= budget else int(d - budget * 0.9))

    grid = Grid(1, 8192, 8)
    r = search(one, grid, lambda: int(budget), variable="bs", device="cpu", measure="formula")
    exhaustive = max(s for s in range(8, 8193, 8) if demand(s) <= budget)
    assert r.largest == exhaustive
    assert len(r.trials) < bisection(lambda s: demand(s) <= budget, grid)
    assert (kink is not None and kink < exhaustive) == any("not linear" in n for n in r.notes)


def test_search_beats_a_bisection_on_every_generated_step():
    """benchmarks/fit_search.py's generated steps (straight or bent demand, failed requests
    that say little or much, the answer anywhere from 15 to 90 % of the grid): every answer
    the exhaustive one, every search in fewer trials than a bisection of its grid."""
    rng = random.Random(7)
    for _ in range(600):
        trial, grid, budget, demand = case(rng)
        r = search(trial, grid, lambda b=budget: int(b), variable="bs", device="cpu",
                   measure="formula")
        sizes = [grid.size(i) for i in range(grid.count)]
        assert r.largest == max(s for s in sizes if demand(s) <= budget)
        tried = [(t.size, t.ok) for t in r.trials]
        assert len(r.trials) < bisection(lambda s: demand(s) <= budget, grid), tried


# -- a real kernel, out of memory for real ------------------------------------------------------------
KERNEL_SETUP = r"""
import resource, torch, gc
torch.manual_seed(0)
torch.set_num_threads(1)
%load_ext jupyter_gpumem
{model}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(make(4)).square().mean().backward()          # gradients exist before the fit
bs = 'mine'
state0 = {{k: v.clone() for k, v in model.state_dict().items()}}
grads0 = [(p.grad, p.grad.clone()) for p in model.parameters()]
def step(n):
    loss = model(make(n)).square().mean()
    loss.backward()
def exhaustive(sizes):
    out = []
    for n in sizes:
        saved = [p.grad for p in model.parameters()]
        for p in model.parameters():
            p.grad = None
        try:
            step(n); ok = True
        except RuntimeError as e:
            assert "can't allocate memory" in str(e), e
            ok = False
        for p, g in zip(model.parameters(), saved):
            p.grad = g
        model.load_state_dict(state0)
        gc.collect()
        out.append(ok)
    return out
vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + {margin}, resource.RLIM_INFINITY))
"""

MODELS = {
    "mlp": ("model = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.BatchNorm1d(4096),"
            " torch.nn.ReLU(), torch.nn.Linear(4096, 8))\n"
            "make = lambda n: torch.randn(n, 256)", 256, 16384),
    "transformer": ("model = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0,"
                    " batch_first=True)\n"
                    "make = lambda n: torch.randn(n, 64, 128)", 16, 1024),
}


@pytest.fixture
def kernel():
    from jupyter_client.manager import start_new_kernel  # noqa: PLC0415 - only these tests

    # two arenas, and a fixed mmap threshold: glibc raises its threshold as big blocks are
    # freed, so without it the heap (and the address space) grows from trial to trial
    env = dict(os.environ, MALLOC_ARENA_MAX="2", MALLOC_MMAP_THRESHOLD_="1048576")
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc, code: str) -> str:
    """A cell of the fit's kernel: ten minutes at most (an exhaustive search runs in one)."""
    return run_in_kernel(kc, code, timeout=600)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and VmHWM: Linux")
@pytest.mark.parametrize("which", sorted(MODELS))
def test_real_out_of_memory_answer_matches_an_exhaustive_search(kernel, which):
    code, step, top = MODELS[which]
    _run(kernel, KERNEL_SETUP.format(model=code, margin=360 << 20))
    _run(kernel, "tracked0 = %gpumem --device cpu -o\n"
                 "rss0 = int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])")
    _run(kernel, f"%%gpumem fit bs --step {step} --max {top} --device cpu -o res\nstep(bs)\n")
    got = json.loads(_run(kernel, r"""
import json
tracked1 = %gpumem --device cpu -o
same_state = all(torch.equal(v, state0[k]) for k, v in model.state_dict().items())
same_grads = all(p.grad is g and torch.equal(p.grad, c) for p, (g, c) in zip(model.parameters(), grads0))
print(json.dumps({"res": res.to_json(), "text": repr(res), "bs": bs,
                  "same_state": same_state, "same_grads": same_grads,
                  "tracked": [tracked0.to_json()["devices"][0].get("tracked"),
                              tracked1.to_json()["devices"][0].get("tracked")],
                  "names": sorted(k for k in ('loss', 'n') if k in globals())}))
"""))
    res = got["res"]
    largest = res["largest"]
    assert largest is not None and largest < top, got["text"]
    assert got["bs"] == "mine" and got["names"] == []
    assert got["same_state"] and got["same_grads"]
    assert got["tracked"][0] == got["tracked"][1]
    # the exhaustive search: the grid from the bottom up to three failures past the answer
    sizes = list(range(step, min(largest + 4 * step, top) + 1, step))
    oks = json.loads(_run(kernel, f"print(json.dumps(exhaustive({sizes})))"))
    best = max((s for s, ok in zip(sizes, oks) if ok), default=None)
    assert abs(best - largest) <= step, (got["text"], list(zip(sizes, oks)))
    # fewer trials than a bisection of the grid (64 sizes: 7)
    n = top // step
    assert len(res["trials"]) < math.ceil(math.log2(n + 1)), got["text"]
    assert any(not t["ok"] for t in res["trials"]), "no trial met the limit"
    print(got["text"])
