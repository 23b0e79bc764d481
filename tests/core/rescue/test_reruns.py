"""Memory that creeps up on reruns, in a real kernel (cells sent with a frontend's cell
id, as JupyterLab does): eight leaking patterns are flagged on their third run, naming
what holds the memory; the command the flag offers gives it back and the fourth run is
not flagged; six clean patterns are never flagged in ten runs."""
from __future__ import annotations

import re

import pytest

from kernel_frontend import Kernel

MiB = 1 << 20
CHUNK = f"torch.ones({16 * MiB}, dtype=torch.uint8)"
FLAG = "keeps more on each rerun"



def kept_in(name: str, then: str) -> str:
    """A cell that makes the list ``name`` on its first run only, then runs ``then``."""
    return f"""
if {name!r} not in globals():
    {name} = []
{then.strip()}"""


LEAKS = {
    "a list appended to": ("acc", kept_in("acc", f"acc.append({CHUNK})")),
    "displayed values in Out": ("Out[", CHUNK),
    "a traceback kept across runs": ("tbs", kept_in("tbs", f"""
def work():
    t = {CHUNK}
    raise ValueError('bad batch')
try:
    work()
except ValueError as e:
    tbs.append(e.__traceback__)""")),
    "a chained exception": ("errs", kept_in("errs", f"""
def shard():
    t = {CHUNK}
    raise KeyError('shard')
try:
    try:
        shard()
    except KeyError as inner:
        raise RuntimeError('load failed') from inner
except RuntimeError as outer:
    errs.append(outer)""")),
    "a closure's cache": ("remember", f"""
if 'remember' not in globals():
    def make():
        cache = {{}}
        def remember(key, value):
            cache[key] = value
            return len(cache)
        return remember
    remember = make()
n_kept = remember(len(In), {CHUNK})"""),
    "a class attribute": ("Registry", f"""
if 'Registry' not in globals():
    class Registry:
        items = []
Registry.items.append({CHUNK})"""),
    "an optimizer recreated while a list keeps the old ones": ("opts", """
if 'model' not in globals():
    model = torch.nn.Linear(1024, 2048)""" + kept_in("opts", """
opt = torch.optim.Adam(model.parameters())
model(torch.ones(4, 1024)).sum().backward()
opt.step()
opts.append(opt)""")),
    "a module-level registry": ("reg", f"""
import sys, types
reg = sys.modules.setdefault('shard_registry', types.ModuleType('shard_registry'))
if not hasattr(reg, 'items'):
    reg.items = []
reg.items.append({CHUNK})"""),
}

CLEAN = {
    "rebinding": f"x = {CHUNK}",
    "an in-place training step": """
if 'w' not in globals():
    w = torch.ones(4 * 1024 * 1024)
w.mul_(0.99).add_(torch.ones_like(w), alpha=0.01)""",
    "a cell that replaces its previous result": f"result = {{'a': {CHUNK}, 'b': {CHUNK}}}",
    "a cell ending in ;": f"{CHUNK};",
    "a cell that frees what its last run made": f"""
if 'buf' in globals():
    del buf
buf = {CHUNK}""",
    "a first-run allocator warm-up": """
import numpy
y = (torch.randn(512, 512) @ torch.randn(512, 512)).sum().item()""",
}


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    k.ok("%load_ext jupyter_gpumem\n%config GpuMemMagics.default_device = 'cpu'\nimport torch")
    yield k
    k.close()


def _holders(k: Kernel) -> str:
    return k.ok("_r = %gpumem --device cpu -o\nprint([h.name for h in _r.holders])\ndel _r")


@pytest.mark.parametrize("pattern", list(LEAKS))
def test_a_leaking_cell_is_flagged_on_its_third_run_and_the_command_frees_it(kernel, pattern):
    holder, code = LEAKS[pattern]
    cell_id = "leak-" + pattern
    first, second = kernel.ok(code, cell_id), kernel.ok(code, cell_id)
    assert FLAG not in first + second
    third = kernel.ok(code, cell_id)
    assert FLAG in third, (pattern, third)
    line = next(l for l in third.splitlines() if FLAG in l)
    assert holder in line.split("):", 1)[1], line
    growth = [float(n) for n in re.findall(r"\+([0-9.]+) MiB", line.split(";")[0])]
    assert len(growth) == 2 and all(n >= 4 for n in growth), line
    command = line.split("free it: ")[1]
    assert holder in _holders(kernel)
    for part in command.split("; "):
        out = kernel.ok(f"_p = {part} --device cpu -o\nprint(_p.removed, _p.freed)\ndel _p")
        assert holder in out.split("]")[0] and "cpu" in out, (part, out)
    assert holder not in _holders(kernel), "the command gave the bytes back"
    assert FLAG not in kernel.ok(code, cell_id), "the fourth run after the purge"
    kernel.ok("%gpumem purge --all --device cpu")  # the next pattern starts clean


@pytest.mark.parametrize("pattern", list(CLEAN))
def test_a_clean_cell_is_never_flagged_in_ten_runs(kernel, pattern):
    code = CLEAN[pattern]
    for run in range(10):
        text = kernel.ok(code, "clean-" + pattern)
        assert FLAG not in text, (pattern, run, text)


def test_history_lists_the_flag_beside_the_cell(kernel):
    holder, code = LEAKS["a list appended to"]
    for _ in range(3):
        kernel.ok(code, "for-history")
    history = kernel.ok("%gpumem history")
    assert re.search(r"\[\d+\] keeps more on each rerun .*acc", history), history
    kernel.ok("%gpumem purge acc --device cpu")


def test_a_cell_without_an_id_is_known_by_its_source(kernel):
    code = f"if 'by_source' not in globals():\n    by_source = []\nby_source.append({CHUNK})"
    texts = [kernel.ok(code, cell_id=f"fresh-{i}") for i in range(3)]   # ids differ: no flag
    assert not any(FLAG in t for t in texts)
    from jupyter_gpumem.watch.reruns import cell_key

    class Info:
        raw_cell, cell_id = code, None
    assert cell_key(Info()) == "src:" + code
    kernel.ok("%gpumem purge by_source --device cpu")
