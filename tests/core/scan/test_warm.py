"""The warm scan (core/scan/warm.py): a name proved unchanged is not walked again, and
the report is the one a full scan gives, byte for byte, after every kind of change a
notebook makes between two ``%gpumem``.

Each step runs a cell in a real IPython shell, then ``%gpumem`` (warm: it reuses what
the last scan walked wherever the fingerprint proves it unchanged) and
``%gpumem --full`` (every name walked again); the two reports' text, HTML and JSON must
be the same, the devices' own readings (host memory, this process) aside, which are
read anew by each. Every step also says whether the change is one the report shows, so
a step that changes nothing shown cannot pass for a check.
"""
from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from conftest import run, weak  # noqa: E402
from conftest import same_report  # noqa: E402
from jupyter_gpumem.core.scan import warm as scan_warm  # noqa: E402
from jupyter_gpumem.session import session_of  # noqa: E402

warm_here = pytest.mark.skipif(not scan_warm.WarmScan.available(),
                               reason="no fingerprint here (no C core, or the full-scan switch)")

SETUP = """
import collections, torch
class Box:
    pass
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
opt = torch.optim.Adam(model.parameters())
model(torch.ones(2, 8)).sum().backward()
opt.step()
items = [torch.ones(16) for _ in range(5)]
cfg = {'a': torch.ones(32), 'b': [torch.ones(8), torch.ones(9)], 'n': 3}
box = Box()
box.t = torch.ones(64)
box.inner = {'x': torch.ones(4)}
def make():
    held = torch.ones(128)
    def f():
        return held
    return f
fn = make()
tup = (torch.ones(3), [torch.ones(5)])
od = collections.OrderedDict(a=torch.ones(100), b=torch.ones(100))
table = {i: (i, str(i), [i]) for i in range(2000)}
"""

#: (what the cell does, the cell, whether the report shows the change)
STEPS = [
    ("nothing", "pass", False),
    ("append to a list", "items.append(torch.ones(1000))", True),
    ("replace a dict's value", "cfg['a'] = torch.ones(64)", True),
    ("an in-place op", "items[0].add_(1);", False),
    ("an optimizer step in place", "opt.step()", False),
    ("param.data = new", "model[0].weight.data = torch.ones(8, 8, dtype=torch.float64)", True),
    ("a new entry in the optimizer's state",
     "opt.state[model[0].weight]['extra'] = torch.ones(300)", True),
    ("del of an inner item", "del cfg['b'][0]", True),
    ("a mutation through a closure's cell", "fn.__closure__[0].cell_contents = torch.ones(4096)",
     True),
    ("an instance's attribute replaced", "box.t = torch.ones(8)", True),
    ("a dict inside an instance", "box.inner['x'] = torch.ones(1024)", True),
    ("a list inside a tuple", "tup[1].append(torch.ones(700))", True),
    ("an OrderedDict's order", "od.move_to_end('a')", False),
    ("a hook registered", "h = model[1].register_forward_hook(lambda *a: None)", False),
    ("a resize that moves the storage", "items[1].resize_(100_000);", True),
    ("a gradient replaced (the same size)", "model[0].bias.grad = torch.full((8,), 3.0)", False),
    ("gradients dropped", "opt.zero_grad()", True),
    ("a class attribute of the user's", "Box.shared = torch.ones(2048)", True),
    ("a tensor with an autograd graph", "y = torch.ones(3000, requires_grad=True) * 2", True),
    ("a tensor into plain data", "table[5][2].append(torch.ones(50))", True),
    ("a name rebound", "cfg = {'a': torch.ones(32)}", True),
    ("a name deleted", "del items", True),
    ("a value shown (Out)", "torch.ones(77)", True),
]


def _reports(ip):
    warm = ip.run_line_magic("gpumem", "--device cpu -o")
    state = session_of(ip).warm
    counts = (state.reused, state.walked)
    full = ip.run_line_magic("gpumem", "--device cpu --full -o")
    assert state.reused == 0, "--full reused a walk"
    return warm, full, counts


def _each_as_full(ip, steps):
    """Run each ``(what, cell, shown)`` of ``steps``: the warm report is the full scan's
    after it, and differs from the one before exactly where ``shown``; yields ``what`` and
    the warm scan's (reused, walked) counts."""
    before = None
    for what, cell, shown in steps:
        run(ip, cell)
        warm, full, counts = _reports(ip)
        same_report(warm, full)
        text = repr(full).split("\n", 2)[2]   # below the devices' line and its note
        if before is not None:
            assert (text != before) == shown, f"{what}: shown {text != before}, expected {shown}"
        before = text
        yield what, counts


def test_every_change_gives_the_full_scans_report(ip):
    run(ip, SETUP)
    _reports(ip)   # the first scan: every name walked, and kept
    for what, (reused, walked) in _each_as_full(ip, STEPS):
        if scan_warm.WarmScan.available() and what in ("nothing", "an in-place op",
                                                       "an optimizer step in place"):
            assert reused >= 8 and walked <= 3, f"{what}: reused {reused}, walked {walked}"


@warm_here
def test_an_unchanged_namespace_is_not_walked_again(ip):
    run(ip, SETUP)
    ip.run_line_magic("gpumem", "--device cpu -o")
    state = session_of(ip).warm
    ip.run_line_magic("gpumem", "--device cpu -o")
    # every name is reused, the plain table too (its plan checks its lists, not its atoms)
    assert state.reused >= 9
    roots = {key[0] for key in state._kept}
    assert {"model", "opt", "fn", "box", "od", "items", "cfg", "tup", "table"} <= roots
    assert state._kept[("table", "user", False, frozenset({"cpu"}))].storages == {}
    # another selection of devices keeps its own walks beside these
    ip.run_line_magic("gpumem", "--device all -o")
    ip.run_line_magic("gpumem", "--device cpu -o")
    assert state.reused >= 8


@warm_here
def test_the_switch_and_full_walk_every_name(ip, monkeypatch):
    run(ip, SETUP)
    ip.run_line_magic("gpumem", "--device cpu -o")
    state = session_of(ip).warm
    ip.run_line_magic("gpumem", "--device cpu --full -o")
    assert state.reused == 0 and state.walked > 8
    monkeypatch.setenv(scan_warm.FULL_ENV, "1")
    assert not scan_warm.WarmScan.available()
    ip.run_line_magic("gpumem", "--device cpu -o")
    assert state.reused == 0


def test_what_is_kept_pins_nothing(ip):
    """Nothing a scan keeps, nor anything it made, holds a tensor once the scan is over:
    after warm scans, a purge frees every parameter, gradient and state tensor of a
    model and its optimizer (taken in batches, with the gradients held beside them), and
    a ``del`` frees a tensor held in a dict."""
    from torch.multiprocessing.reductions import StorageWeakRef

    run(ip, SETUP + "\nbig = torch.ones(1 << 20)\nholder = {'big': big}\n"
        "deep = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(40)])\n"
        "deep_opt = torch.optim.Adam(deep.parameters())\n"
        "deep(torch.ones(2, 16)).sum().backward()\ndeep_opt.step()")
    for _ in range(3):
        ip.run_line_magic("gpumem", "--device cpu -o")
    deep, deep_opt = ip.user_ns["deep"], ip.user_ns["deep_opt"]
    refs = [StorageWeakRef(t.untyped_storage()) for p in deep.parameters()
            for t in (p, p.grad)]
    refs += [StorageWeakRef(t.untyped_storage()) for state in deep_opt.state.values()
             for t in state.values()]
    del deep, deep_opt
    assert len(refs) == 2 * 80 + 3 * 80   # 40 weights and 40 biases, with grads; 3 states each
    ref = weak(ip, "big")
    ip.run_line_magic("gpumem", "purge deep deep_opt --device cpu -o")
    run(ip, "del big, holder")
    gc.collect()
    assert ref.expired(), "a kept walk holds the tensor"
    assert sum(not r.expired() for r in refs) == 0, "a scan left a tensor held"


def test_a_walked_path_is_never_read_from_a_kept_walk(ip):
    """Only each holder's largest path is kept: ``%gpumem NAME`` (every row's path) walks
    its names again, and a kept walk's other nodes refuse to be read."""
    run(ip, SETUP)
    ip.run_line_magic("gpumem", "--device cpu -o")
    detail = ip.run_line_magic("gpumem", "items --device cpu -o")
    paths = sorted(r.path for r in detail.holder("items").rows)
    assert paths == [f"items[{i}]" for i in range(5)]
    with pytest.raises(LookupError):
        parent, label = scan_warm.UNREAD


def test_the_views_refresh_in_steps_with_the_same_report(ip):
    """The session's refresh (the panel's, the sidebar's) scans in steps on the kernel's
    loop, where other code may run between two: a root walked across a step is kept
    only with the fingerprint taken before its walk, so it is reused from the scan after
    next; every refresh's JSON is the full scan's."""
    from jupyter_gpumem.core.devices import select
    from jupyter_gpumem.core.snapshot import build_many_steps
    from jupyter_gpumem.cluster.live import drive_now

    run(ip, SETUP)
    state = session_of(ip).warm

    def refresh() -> dict:
        return drive_now(build_many_steps(shell=ip, devices=[select("cpu")], warm=state))["cpu"]

    for step in range(3):
        warm = refresh()
        full = ip.run_line_magic("gpumem", "--device cpu --full -o")
        same_report(warm, full)
    if scan_warm.WarmScan.available():
        refresh()
        assert state.reused >= 8


def test_a_tensor_in_the_place_of_one_gone_is_read_anew(ip):
    """The fingerprint keeps the backend's record of each tensor from scan to scan, by the
    tensor's address: a tensor made where one freed lay (CPython's allocator often gives
    the freed block back at once), of another size and so another storage, gives the
    full scan's report, in a list (whose items are compared by address) as in a dict."""
    run(ip, "import torch\nrow = [torch.ones(10) for _ in range(40)]\n"
            "bag = {'t': torch.ones(10)}")
    for _ in range(2):
        ip.run_line_magic("gpumem", "--device cpu -o")
    reused_address = 0
    for i in range(40):
        before = id(ip.user_ns["row"][i])
        run(ip, f"row[{i}] = None; row[{i}] = torch.empty({100 * (i + 2)})\n"
                f"bag['t'] = None; bag['t'] = torch.empty({50 * (i + 2)})")
        reused_address += id(ip.user_ns["row"][i]) == before
        warm, full, _ = _reports(ip)
        same_report(warm, full)
        assert warm.holder("row").total == 4 * (10 * (40 - i - 1) + sum(
            100 * (j + 2) for j in range(i + 1)))
        assert warm.holder("bag").total == 4 * 50 * (i + 2)
    # the case this test is for happened (an address of a tensor gone, taken by another)
    assert reused_address >= 1, reused_address


def test_a_class_redefined_is_not_held_by_the_fingerprint(ip):
    """The fingerprint, kept from scan to scan, lets go of the types it judged when each
    scan ends: a class of the user's, defined again, frees what its old version held."""
    from torch.multiprocessing.reductions import StorageWeakRef

    run(ip, "import torch\nclass Cache:\n    big = torch.ones(1 << 18)\nc = Cache()")
    for _ in range(3):
        ip.run_line_magic("gpumem", "--device cpu -o")
    ref = StorageWeakRef(ip.user_ns["Cache"].big.untyped_storage())
    run(ip, "class Cache:\n    pass\nc = Cache()")
    ip.run_line_magic("gpumem", "--device cpu -o")
    gc.collect()
    assert ref.expired(), "the old class's tensor is still held"


@warm_here
def test_plain_data_changed_each_cell_rests_from_its_fingerprint(ip):
    """A plain root (reaching no storage) changed at every cell is walked without a
    fingerprint for a while (one scan, then two, four...), as the walk costs no more
    than a fingerprint that is never reused; once it stays the same, it is reused again.
    Every report is the full scan's."""
    run(ip, SETUP + "\nlosses = [float(i) for i in range(3000)]")
    ip.run_line_magic("gpumem", "--device cpu -o")
    state = session_of(ip).warm
    key = ("losses", "user", False, frozenset({"cpu"}))
    rests = []
    for step in range(8):
        run(ip, f"losses.append({step}.5)")
        warm, full, _ = _reports(ip)
        same_report(warm, full)
        rests.append(tuple(state._resting.get(key, (0, 0))))
    assert max(span for _, span in rests) >= 2, rests   # the rests grew
    for _ in range(2 * scan_warm.REST_MAX):   # left alone: checked again, and reused
        ip.run_line_magic("gpumem", "--device cpu -o")
    assert key in state._kept and key not in state._resting
    warm, full, _ = _reports(ip)
    same_report(warm, full)


PLAN_SETUP = """
import collections, torch
class Holder:
    def __init__(self):
        self.t = torch.ones(10)
class Other:
    def __init__(self):
        self.t = torch.ones(20)
h = Holder()
def f(x=torch.ones(30)):
    return x
dq = collections.deque([torch.ones(40)])
s = {1, 2}
dd = collections.defaultdict(list, a=[torch.ones(50)])
pairs = [(1, 'a'), (2, 'b')]
nested = ({'k': [1, 2]}, frozenset({3}))
swap = torch.ones(60)
plain = {i: [i, str(i)] for i in range(500)}
"""

#: changes that only a plan's own checks can miss (each kind of check): what it is ->
#: (the cell, whether the report shows it)
PLAN_STEPS = {
    "nothing": ("pass", False),
    "an instance's class": ("h.__class__ = Other", True),
    "an instance's dict replaced": ("h.__dict__ = {'t': torch.ones(70)}", True),
    "a function's defaults": ("f.__defaults__ = (torch.ones(80),)", True),
    "a function's code": ("f.__code__ = (lambda x=None: 1).__code__", False),
    "a deque grown": ("dq.append(torch.ones(90))", True),
    "a set given a tensor": ("s.add(torch.ones(100))", True),
    "a defaultdict's factory": ("dd.default_factory = lambda: [torch.ones(110)]", False),
    "a defaultdict's new key": ("dd['b'].append(torch.ones(120))", True),
    "a tuple in a list replaced": ("pairs[0] = None; pairs[0] = (1, torch.ones(130))", True),
    "a list in a dict in a tuple": ("nested[0]['k'].append(torch.ones(140))", True),
    "a tensor's data replaced": ("swap.data = torch.ones(150)", True),
    "a name rebound where it lay": ("swap = None; swap = torch.ones(160)", True),
    "plain data given a tensor": ("plain[7].append(torch.ones(170))", True),
    "plain data rebound": ("plain = {i: [i] for i in range(500)}", True),
    "plain data given a tensor again": ("plain[9].append(torch.ones(180))", True),
}


def test_every_kind_of_check_gives_the_full_scans_report(ip):
    """The plan's checks, one kind of change each (a class, an instance dict, a function's
    parts, a deque, a set, a defaultdict's factory and keys, a tuple where another lay,
    a tensor's data, a name rebound at the same address, plain data): the warm report
    is the full scan's after each."""
    run(ip, PLAN_SETUP)
    for _ in range(3):   # plain data is kept from its second walk
        _reports(ip)
    state = session_of(ip).warm
    if scan_warm.WarmScan.available():   # each name is checked by its plan
        planned = {key[0] for key, kept in state._kept.items() if kept.plan is not None}
        assert {"h", "f", "dq", "s", "dd", "pairs", "nested", "swap", "plain"} <= planned
    for _ in _each_as_full(ip, [(what, *step) for what, step in PLAN_STEPS.items()]):
        pass


@warm_here
def test_plain_data_too_large_for_a_plan_is_walked_each_time(ip):
    """A list of 300,000 strings would need a check per string (their addresses can be
    other strings' since): more than a plan keeps. Its fingerprint gives up as soon as
    the plan does, and the list is walked each time, at C speed, as before plans."""
    run(ip, "words = [str(i) for i in range(300_000)]")
    for _ in range(3):
        warm, full, _ = _reports(ip)
        same_report(warm, full)
    state = session_of(ip).warm
    key = ("words", "user", False, frozenset({"cpu"}))
    assert key not in state._kept and key in state._doubted


def test_no_code_of_the_users_runs_in_a_warm_scan(ip):
    """Reading an OrderedDict's order hashes its keys: a key whose ``__hash__`` is the
    user's would run in the middle of a fingerprint or a plan's checks (where it could
    change what was already checked). Such an OrderedDict is walked each time instead,
    and its keys are never hashed by a scan; a class given another metaclass is seen."""
    run(ip, """
import collections, torch
CALLS = []
class Key:
    def __hash__(self):
        CALLS.append(1)
        return 7
od = collections.OrderedDict()
od[Key()] = torch.ones(10)
od[Key()] = torch.ones(20)
class Meta(type):
    pass
class Meta2(Meta):
    pass
class Box(metaclass=Meta):
    t = torch.ones(30)
holder = {'box': Box}
""")
    calls = ip.user_ns["CALLS"]
    made = len(calls)   # (hashed once each when put in)
    for _ in range(3):
        warm, full, _ = _reports(ip)
        same_report(warm, full)
    assert len(calls) == made, "a scan ran a key's __hash__"
    state = session_of(ip).warm
    run(ip, "Box.__class__ = Meta2")
    warm, full, (reused, walked) = _reports(ip)
    same_report(warm, full)
    if scan_warm.WarmScan.available():
        kept = state._kept.get(("holder", "user", False, frozenset({"cpu"})))
        assert kept is not None and walked >= 1   # holder's class check failed: hashed again
