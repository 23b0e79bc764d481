"""The scan's C core (jupyter_gpumem/core/_reach.c) against the Python walk.

Every namespace here is scanned twice in the same real IPython shell, once with the
C walker and once all in Python (``scan_reach.NATIVE = None``): each holder's bytes,
largest path, sharing and the partial flag must be the same. The shapes are what
notebooks hold (records, caches, nested containers, instances, cycles, shared
storages, deep nesting) with tensors at every place a walk can meet them.
"""
from __future__ import annotations

import gc
import os
import shutil
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402
from jupyter_gpumem.backends import active_backends  # noqa: E402
from jupyter_gpumem.core import scan as _scan  # noqa: E402
from jupyter_gpumem.core.scan import native as native_switch  # noqa: E402
from jupyter_gpumem.core.scan import reach as scan_reach  # noqa: E402

needs_native = pytest.mark.skipif(scan_reach.NATIVE is None, reason="the C core is not built here")


def core_or_skip():
    """The C core's module as the package loaded it, or a skip where it runs without."""
    if native_switch.CORE is None:
        pytest.skip("the C core is not built here, or JUPYTER_GPUMEM_PURE_SCAN=1")
    return native_switch.CORE

SHAPES = {
    "records": "records = [{'id': i, 'text': str(i), 'tags': [i, i + 1], "
               "'emb': torch.ones(4) if i % 1000 == 0 else None} for i in range(20_000)]",
    "nested": "nested = {'a': ({'b': [set(), frozenset({1}), (torch.ones(8),)]},), "
              "'c': [[[[torch.ones(16)]]]]}",
    "instances": "class Box:\n    pass\nboxes = []\nfor _i in range(500):\n    b = Box()\n"
                 "    b.t = torch.ones(2) if _i % 50 == 0 else _i\n    b.d = {'x': [b]}\n"
                 "    boxes.append(b)",
    "slots": "class S:\n    __slots__ = ('t', 'u')\n    def __init__(self):\n"
             "        self.t = torch.ones(32); self.u = [self]\nslotted = [S() for _ in range(10)]",
    "cycles": "cyc = []\ncyc.append(cyc)\ncyc.append({'me': cyc, 't': torch.ones(64)})",
    "shared": "base = torch.ones(1024)\nholder_a = {'v': base[:512]}\nholder_b = [base, (base,)]",
    "collections": "import collections\nod = collections.OrderedDict(t=torch.ones(3))\n"
                   "dd = collections.defaultdict(list)\ndd['k'].append(torch.ones(5))\n"
                   "dq = collections.deque([torch.ones(7)])",
    "untracked": "atoms = {'a': 1, 'b': 'x'}\ntup_atoms = (1, 2, 'x')\nstrings = ['s%d' % i for i in range(50_000)]\n"
                 "strings.append({'t': torch.ones(2), 'n': (1, 2)})",
    "deep_ok": "deep_ok = []\n_c = deep_ok\nfor _i in range(1500):\n    _n = []\n    _c.append(_n)\n"
               "    _c = _n\n_c.append(torch.ones(9))",
    "deep_cut": "deep_cut = []\n_c = deep_cut\nfor _i in range(6000):\n    _n = []\n    _c.append(_n)\n"
                "    _c = _n\n_c.append(torch.ones(11))",
    "model": "model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
             "opt = torch.optim.Adam(model.parameters())\nmodel(torch.ones(2, 8)).sum().backward()\nopt.step()\n"
             "cache = {'fn': lambda: model, 'layers': list(model)}",
    "big_list": "big_same = [[torch.ones(1)]] * 200_000\nbig_distinct = [[i] for i in range(200_000)]",
}


def _report(ip):
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    rows = {h.name: (h.unique, h.shared, h.largest_path, tuple(sorted(h.shared_with)))
            for h in snap.holders}
    return rows, snap.partial, sorted(m for m in snap.messages if "deeper" in m or "time" in m)


@needs_native
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_c_walk_finds_what_the_python_walk_finds(ip, shape, monkeypatch):
    run(ip, "import torch")
    run(ip, SHAPES[shape])
    native = _report(ip)
    monkeypatch.setattr(scan_reach, "NATIVE", None)
    python = _report(ip)
    assert native == python
    rows, partial, cuts = native
    assert rows, "the shape holds tensors: something is found"
    if shape == "deep_cut":
        assert partial and any("deeper than" in c and "deep_cut" in c for c in cuts), cuts
    else:
        assert not partial, cuts


@needs_native
def test_the_c_walk_is_used_and_does_the_reading(ip):
    """The walk goes through the C core where it is built (what the benchmark measures)."""
    run(ip, "import torch\nrecords = [{'id': i, 'tags': [i]} for i in range(50_000)]\n"
            "records.append(torch.ones(3))")
    roots = [r for r in _scan.collect_roots(None, ip) if r.name == "records"]
    reacher = scan_reach.Reacher(active_backends(), None, set(), None, 4000, False)
    assert reacher.native is not None
    reacher.deadline = time.perf_counter() + 10
    found, count = reacher.walk(roots[0].obj)
    assert count >= 100_000 and len(found) == 1


@needs_native
def test_the_c_walk_lets_go_of_everything_it_held(ip):
    run(ip, "import torch\nshared = torch.ones(2)\ndata = [[shared, {'k': shared}] for _ in range(1000)]")
    obj = ip.user_ns["data"]
    inner = obj[0]
    ip.run_line_magic("gpumem", "--device cpu -o")
    before = sys.getrefcount(obj), sys.getrefcount(inner), sys.getrefcount(ip.user_ns["shared"])
    for _ in range(3):
        ip.run_line_magic("gpumem", "--device cpu -o")
    after = sys.getrefcount(obj), sys.getrefcount(inner), sys.getrefcount(ip.user_ns["shared"])
    assert after == before


@needs_native
def test_the_c_walk_stops_at_its_deadline_inside_one_list():
    walker = scan_reach.NATIVE({list}, set(), set(), False, 4000, time.perf_counter)
    walker.push([[[i] for i in range(2_000_000)]], 0)
    start = time.perf_counter()
    got, done = walker.run(start + 0.01)
    took = time.perf_counter() - start
    assert not done and walker.pending and took < 0.05
    while not done:
        got, done = walker.run(time.perf_counter() + 1)
    assert walker.count == 2_000_000
    walker.clear()
    assert walker.pending == 0


@needs_native
def test_the_c_walker_picks_the_small_roots_to_walk_together_in_one_read_of_each(ip):
    """``pick``: which roots the many small roots' pre-pass walks together (a type it is
    told to; not in the stop set; a builtin container of at most ``most`` items; tracked
    by the collector), which untracked dicts and tuples hold atoms only, and the types
    not classified yet (their roots are left, and named); and a namespace that binds an object of
    the stop set (IPython's ``In``) or a big list gets the report the one-by-one walks
    give, neither tried with the small roots."""
    class Meta(type):
        def __hash__(cls):
            raise AssertionError("a metaclass's __hash__ was asked")

    class Odd(metaclass=Meta):
        pass

    class Fresh:
        pass

    a, b, c, d = [1], {"k": [2]}, (3, [4]), list(range(10))
    atoms, pair = {"x": 1}, (1, "a")
    gc.collect()   # (the dict and the tuple of atoms untracked)
    assert not gc.is_tracked(atoms) and not gc.is_tracked(pair)
    walker = scan_reach.NATIVE({list, dict, tuple}, set(), {id(b)}, False, 4000, time.perf_counter)
    walker.learn(Odd, True, False)
    walker.learn(int, False, False)
    objs = [a, b, c, d, atoms, pair, Odd(), 7]
    def marks(*each):   # one mark per root: 1 picked, 2 atoms only, 3 type not classified
        return bytearray(each)

    assert walker.pick(objs, {list, dict, tuple}, 5, True) == (marks(1, 0, 1, 0, 2, 2, 0, 0), [], [])
    assert walker.pick(objs, {list, dict, tuple}, 100, False) == (marks(1, 0, 1, 1, 0, 0, 0, 0), [], [])
    assert walker.pick(objs, {list}, 100, True) == (marks(1, 0, 0, 1, 0, 0, 0, 0), [], [])
    # the roots of a type not classified yet are left, and their places given
    assert walker.pick(objs + [Fresh(), Fresh()], {list}, 100, True) == \
        (marks(1, 0, 0, 1, 0, 0, 0, 0, 3, 3), [Fresh], [8, 9])
    assert walker.pick([], {list}, 5, True) == (marks(), [], [])
    # with push: the picked roots are the walk's first run, as push() would make it
    assert walker.pick(objs, {list, dict, tuple}, 100, False, True) == \
        (marks(1, 0, 1, 1, 0, 0, 0, 0), [], [])
    assert walker.pending == 3
    with pytest.raises(ValueError):
        walker.pick(objs, {list}, 100, False, True)   # a walk under way
    got, done = walker.run(time.perf_counter() + 5)
    assert done and walker.count > 0
    walker.clear()
    # the roots of known types are pushed even where a type was not classified
    assert walker.pick([Fresh()] + objs, {list}, 100, True, True) == \
        (marks(3, 1, 0, 0, 1, 0, 0, 0, 0), [Fresh], [0])
    assert walker.pending == 2
    walker.clear()
    with pytest.raises(TypeError):
        walker.pick(tuple(objs), {list}, 5, True)
    run(ip, "import torch\nhist = In\nrows = [[i] for i in range(300)]\nt = torch.ones(4)\n"
            "small = [[i, str(i)] for i in range(50)]")
    real = scan_reach.Reacher.reach_nothing
    seen = []

    def spy(self, objs, until, most=None):
        out = real(self, objs, until, most)
        seen.append([id(o) for o, proven in zip(objs, out) if proven])
        return out

    with pytest.MonkeyPatch.context() as m:
        m.setattr(scan_reach.Reacher, "reach_nothing", spy)
        together = ip.run_line_magic("gpumem", "--device cpu -o")
        m.setattr(scan_reach.Reacher, "reach_nothing", lambda self, objs, until, most=None: bytearray(len(objs)))
        alone = ip.run_line_magic("gpumem", "--device cpu -o")
    ns = ip.user_ns
    assert seen and id(ns["In"]) not in seen[0]   # In: never proven together, never entered
    assert id(ns["rows"]) not in seen[0]   # 300 items: a big root, walked on its own
    assert id(ns["small"]) in seen[0]
    assert [(h.name, h.unique) for h in together.holders] == [(h.name, h.unique) for h in alone.holders]


def test_a_checkout_with_a_compiler_builds_the_c_core():
    """An editable install (scripts/setup.sh, CI) builds it where a compiler is found;
    JUPYTER_GPUMEM_PURE_SCAN=1 is the one way to run without it."""
    if os.environ.get("JUPYTER_GPUMEM_PURE_SCAN") or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no compiler here, or the Python walk asked for")
    assert scan_reach.NATIVE is not None, "hatch_build.py did not build jupyter_gpumem/core/_reach.c"


def test_the_c_filter_of_a_namespace_keeps_what_the_python_filter_keeps_and_asks_no_type(monkeypatch):
    """user_roots drops the names bound to atomic values in one C pass: the same pairs
    as the Python fallback, in order, and neither asks a metaclass whose ``__hash__``
    and ``__eq__`` raise (the types are compared by address; ``type(v) in ATOMIC``
    would run the user's ``__hash__``)."""
    from jupyter_gpumem.core.scan import roots
    from jupyter_gpumem.core.scan.types import ATOMIC

    native = core_or_skip()

    class Loud(type):
        def __hash__(cls):
            raise AssertionError("the filter ran the metaclass's __hash__")

        def __eq__(cls, other):
            raise AssertionError("the filter ran the metaclass's __eq__")

    Odd = Loud("Odd", (), {})
    ns = {f"_i{i}": "x = 1" for i in range(300)}
    ns.update(a=1, b=[1], c=2.5, d=None, e=torch.ones(2), f=Odd(), g=b"x", h={"k": 1})
    ns[42] = [2]          # a key that is no name: the filter keeps it for odd_keys' rule
    python = roots._items_except_py(ns, ATOMIC)
    got = native.items_except(ns, ATOMIC)
    assert [k for k, _ in got] == [k for k, _ in python] == ["b", "e", "f", "h", 42]
    assert all(v is w for (_, v), (_, w) in zip(got, python))
    assert roots._items_except is native.items_except
    assert [r.name for r in roots.user_roots(ns)] == ["b", "e", "f", "h"]
    monkeypatch.setattr(roots, "_items_except", roots._items_except_py)
    assert [r.name for r in roots.user_roots(ns)] == ["b", "e", "f", "h"]
    with pytest.raises(TypeError):
        native.items_except(ns, set(ATOMIC))      # a frozenset only
    with pytest.raises(ValueError):
        native.items_except(ns, frozenset(type(f"T{i}", (), {}) for i in range(65)))


def test_the_c_filter_remembers_ipythons_names_and_answers_as_the_python_filter_through_changes(
        ip, monkeypatch):
    """With its memo the C pass does not read again the names it left out last time
    (IPython adds an ``_iN`` every cell): in a real shell after 300 cells, a pass asks
    the judge only about the cell's new names, and at every step of a run of changes
    (names added, deleted, rebound, IPython's names rebound to tensors, a table rebuilt
    by growth, a key that is no name) user_roots gives what the Python filter gives."""
    from jupyter_gpumem.core.scan import roots
    from jupyter_gpumem.core.scan.types import ATOMIC

    native = core_or_skip()
    if sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] <= (3, 13):
        assert native.DICT_TABLE == 1, "the table's known layout did not check out at import"

    judged: list[str] = []

    def judge(name):
        judged.append(name)
        return roots._is_bookkeeping(name)

    shell = ip
    ns = shell.user_ns
    memo = [[], []]
    shell.run_cell("import torch", store_history=True)
    for _ in range(300):
        shell.run_cell("x = 1", store_history=True)
    native.items_except(ns, ATOMIC, memo, judge)
    assert len(judged) > 300
    assert all(type(k) is str for k in memo[0] + memo[1] if k is not None)
    judged.clear()
    shell.run_cell("x = 2", store_history=True)
    native.items_except(ns, ATOMIC, memo, judge)
    assert len(judged) == 1 and judged[0].startswith("_i"), judged   # the new _iN alone

    def python_names():
        kept = roots._items_except_py(ns, ATOMIC)
        return [k for k, v in kept if type(k) is str and not roots._is_bookkeeping(k)]

    steps = ["t = torch.ones(3)", "l = [torch.ones(2)]", "del t", "t = torch.ones(4)",
             "_i5 = torch.ones(2)", "_ = [torch.ones(2)]", "x = [1]", "del x",
             "for i in range(400): globals()[f'v{i}'] = [i]",      # grows the table
             "for i in range(0, 400, 2): del globals()[f'v{i}']",
             "globals()[7] = [1]", "del globals()[7]", "In = [torch.ones(1)]"]
    for step in steps:
        shell.run_cell(step, store_history=True)
        want = python_names()
        got = [k for k, v in native.items_except(ns, ATOMIC, memo, roots._is_bookkeeping)
               if type(k) is str and not roots._is_bookkeeping(k)]
        assert got == want, step
        with_memo = [r.name for r in roots.user_roots(ns, shell.user_ns_hidden)]
        with monkeypatch.context() as m:
            m.setattr(roots, "_items_except", roots._items_except_py)
            assert [r.name for r in roots.user_roots(ns, shell.user_ns_hidden)] == with_memo, step
    assert {"l", "t", "v1", "v399"} <= set(with_memo) and not {"x", "v0", "_i5", "_", "In"} & set(with_memo)
    with pytest.raises(TypeError):
        native.items_except(ns, ATOMIC, [[]], judge)         # two lists
    with pytest.raises(TypeError):
        native.items_except(ns, ATOMIC, [[], []])            # and a judge

    def refuses(name):
        raise LookupError(name)

    with pytest.raises(LookupError):
        native.items_except({"fresh_name": [1]}, ATOMIC, [[], []], refuses)


def test_the_namespaces_odd_keys_come_from_its_tables_kind_where_it_proves_them_all_str(monkeypatch):
    """``odd_keys`` is asked at every scan, over every key: where the C core reads a
    table that holds only str keys it answers without reading one; a table that once
    held another key (kept general after the key went), a str subclass's key, a split
    table and a dict subclass are each answered as the pass over the keys answers."""
    from jupyter_gpumem.core.scan import roots

    native = core_or_skip()

    class Sub(str):
        pass

    class D(dict):
        pass

    class Inst:
        def __init__(self):
            self.a = self.b = 1

    def by_keys(ns):
        return [roots.format_key(k)[1:-1] for k in list(ns) if type(k) is not str]

    plain = {f"v{i}": i for i in range(1000)}
    assert native.str_keys(plain) is (native.DICT_TABLE == 1)
    cases = [plain, {}, D(a=1), Inst().__dict__, {"a": 1, 42: 2}, {Sub("x"): 1, "y": 2},
             {**plain, (1, 2): 3}]
    once = dict(plain)
    once[7] = 1
    del once[7]
    cases.append(once)
    for ns in cases:
        assert roots.odd_keys(ns) == by_keys(ns), ns
        if native.str_keys(ns):
            assert all(type(k) is str for k in ns)
    assert roots.odd_keys({"a": 1, 42: 2}) == ["42"]
    with pytest.raises(TypeError):
        native.str_keys([("a", 1)])
    monkeypatch.setattr(roots, "_str_keys", None)   # the pass over the keys alone
    assert [roots.odd_keys(ns) for ns in cases] == [by_keys(ns) for ns in cases]


def test_the_names_typed_after_the_c_filter_are_the_python_filters(monkeypatch):
    """After the C pass (which asked the bookkeeping rule of each name it kept) a plain
    ASCII name is typed as it is without the memo; every other key as name_text types
    it, and IPython's own names are left out, as the Python filter does."""
    from jupyter_gpumem.core.scan import roots
    from jupyter_gpumem.core.scan.paths import name_text

    core_or_skip()
    keys = ["a", "_x1", "if", "x[0]", "é", "a b", "ß_2", "_i3", "_ii", "In", "Out", "__doc__",
            "_", "__", "_7", "exit", "x\u0301", "Model", "_\u00e9t\u00e9"]
    ns = {k: [i] for i, k in enumerate(keys)}
    ns[42] = [0]
    with_c = [(r.name, r.purge) for r in roots.user_roots(ns)]
    with monkeypatch.context() as m:
        m.setattr(roots, "_items_except", roots._items_except_py)
        with_python = [(r.name, r.purge) for r in roots.user_roots(ns)]
    assert with_c == with_python
    want = [name_text(k) for k in keys if type(k) is str and not roots._is_bookkeeping(k)]
    assert [name for name, _ in with_c] == want
    assert {"a", "if", "é", "globals()['x[0]']", "globals()['a b']"} <= set(want)
    assert not {"_i3", "In", "_", "__doc__", "exit"} & set(want)


def test_the_c_filter_keeps_its_pairs_whole_when_a_collection_inside_it_changes_the_dict():
    """Making the pairs allocates, so a collection may run a finalizer mid-call; one that
    empties the namespace leaves the call its snapshot (it owns what it took before the
    first allocation), with no object freed under it."""
    import gc

    native = core_or_skip()
    from jupyter_gpumem.core.scan.types import ATOMIC

    ns = {f"v{i}": [i] for i in range(200)}
    ns.update(n=1, s="x")

    class Clears:
        def __del__(self):
            ns.clear()

    threshold = gc.get_threshold()
    was = gc.isenabled()
    call = native.items_except
    try:
        gc.enable()
        gc.collect()                # the young generation's count starts at zero
        gc.set_threshold(20)        # the call makes 201 objects: a collection inside it
        garbage = [Clears()]
        garbage.append(garbage)     # a cycle: only the collector frees it
        del garbage
        got = call(ns, ATOMIC)
    finally:
        gc.set_threshold(*threshold)
        if not was:
            gc.disable()
    gc.collect()
    assert not ns, "the finalizer ran during the call"
    assert [k for k, _ in got] == [f"v{i}" for i in range(200)]
    assert [v for _, v in got] == [[i] for i in range(200)]


#: tensors met many at once, where the C core's batch loop takes them: a model and its
#: optimizer (every parameter reached twice, once per root), gradients, views of one
#: base (one storage, many tensors: the first met stands for it), tensors of no bytes,
#: a batch where some tensors carry an autograd graph (the batch goes by halves), and
#: parameters that moved to a new storage between two scans (``.data =``)
BATCH_SHAPES = (
    "net = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(12)])\n"
    "adam = torch.optim.Adam(net.parameters())\n"
    "net(torch.ones(3, 16)).sum().backward()\nadam.step()\n"
    "base = torch.arange(4096.0)\nviews = [base[i * 64:(i + 1) * 64] for i in range(64)]\n"
    "empties = [torch.ones(0) for _ in range(20)] + [torch.ones(3) for _ in range(20)]\n"
    "_w = torch.ones(5, requires_grad=True)\n"
    "mixed = [torch.ones(7) * i for i in range(30)] + [_w * 2] + [torch.ones(9) for _ in range(30)]\n"
    "params = list(net.parameters())"
)


def _rows(ip, names):
    out = {}
    for name in names:
        snap = ip.run_line_magic("gpumem", f"{name} --device cpu -o")
        out[name] = sorted((r.path, r.nbytes, tuple(r.shared_with)) for h in snap.details
                           for r in h.rows)
    return out


@needs_native
def test_the_c_batch_loop_finds_what_the_python_passes_find(ip, monkeypatch):
    """Every holder's bytes, largest path and sharing, and every row of ``%gpumem NAME``
    (each storage's path), the same with the C core's batch loop and without it; again
    after parameters moved to new storages (the backend's cache of storages is then
    asked again, in both)."""
    run(ip, "import torch")
    run(ip, BATCH_SHAPES)
    names = ["net", "adam", "views", "empties", "mixed", "params"]
    calls = []
    real = scan_reach.TAKE_BATCH
    monkeypatch.setattr(scan_reach, "TAKE_BATCH", lambda *a: calls.append(len(a[0])) or real(*a))
    with_c = _report(ip), _rows(ip, names)
    assert calls and max(calls) >= 48, calls       # the loop ran, on the big batches
    monkeypatch.setattr(scan_reach, "TAKE_BATCH", None)
    without = _report(ip), _rows(ip, names)
    assert with_c == without
    (rows, partial, _), _ = with_c
    assert not partial and sum(rows["views"][:2]) == 4096 * 4   # one storage, counted once
    run(ip, "for _p in params[:5]:\n    _p.data = _p.data.clone()")
    monkeypatch.setattr(scan_reach, "TAKE_BATCH", real)
    moved = _report(ip), _rows(ip, names)
    monkeypatch.setattr(scan_reach, "TAKE_BATCH", None)
    assert moved == (_report(ip), _rows(ip, names))
    assert moved != with_c      # the moved parameters are new storages


@needs_native
def test_the_c_batch_loop_writes_nothing_for_a_graph_and_passes_errors_on():
    """take_batch itself: a batch with a tensor that has a graph answers None before
    anything is written (the caller goes by halves); a getter that raises is the
    caller's error; the devices filter and the nodes; bad arguments are a TypeError."""
    from jupyter_gpumem.backends.pytorch import TorchBackend
    from jupyter_gpumem.core.scan.search import LazyNode

    native = core_or_skip()
    backend = TorchBackend()
    spec = backend.batch_spec()
    plain = [torch.ones(4) for _ in range(10)]
    leaf = torch.ones(2, requires_grad=True)
    memo, found = {}, {}
    assert native.take_batch(plain + [leaf * 3], memo, *spec, found, None, None, None) is None
    assert memo == {} and found == {}

    leaf.grad = torch.ones(2)
    held = native.take_batch(plain + [leaf], memo, *spec, found, {"cpu"}, LazyNode, ("f", 7))
    assert held == [leaf.grad] and held[0] is leaf.grad
    assert len(found) == 11 and set(memo) == set(map(id, plain + [leaf]))
    key = backend.storages(plain[0])[0][0]
    info, node, what = found[key]
    assert type(node) is LazyNode and tuple.__getitem__(node, slice(None)) == ("f", 7, key)
    assert info[0] == key and what is None

    elsewhere = {}
    assert native.take_batch(plain, {}, *spec, elsewhere, {"cuda:0"}, None, None) == []
    assert elsewhere == {}

    class Boom(Exception):
        pass

    def refuses(t):
        raise Boom

    with pytest.raises(Boom):
        native.take_batch(plain, {}, *spec[:3], refuses, *spec[4:], {}, None, None, None)
    with pytest.raises(TypeError):
        native.take_batch(plain, {}, *spec, {}, ["cpu"], None, None)
    with pytest.raises(TypeError):
        native.take_batch(plain, {}, *spec, {}, None, list, ())


@needs_native
def test_a_proof_that_fails_after_its_first_pick_lets_go_of_what_it_pushed(monkeypatch):
    """reach_nothing's first pick pushes the roots it picks as it reads them; where what
    follows fails (here the classification of a type met for the first time), the walk
    holds nothing afterwards: a walk left holding them would walk them as part of the
    next root's, and blame that root for what they hold."""
    class Fresh:
        pass

    reacher = scan_reach.Reacher(active_backends(), {"cpu"}, set(), None, 4000, False)

    def fails(kinds):
        raise RuntimeError("classification failed")

    monkeypatch.setattr(reacher, "learn", fails)
    with pytest.raises(RuntimeError):
        reacher.reach_nothing([[1], [torch.ones(2)], Fresh()], time.perf_counter() + 5)
    assert reacher.native.pending == 0
    monkeypatch.undo()
    found, _ = reacher.walk([3])   # the next walk: its own objects only
    assert found == {}


@needs_native
def test_a_users_name_the_proof_left_is_walked_not_tried_again(ip, monkeypatch):
    """The report's scan proves the user's names in one pass; one it could not prove (a
    list holding a tensor) is walked, not handed to the proof a second time with the
    hidden holders (each try of a failing part walks it by halves)."""
    run(ip, "import torch\nsmall = [[i] for i in range(5)]\nt = [torch.ones(2)]")
    calls = []
    real = scan_reach.Reacher.reach_nothing

    def spy(self, objs, until, most=None):
        calls.append({id(o) for o in objs})
        return real(self, objs, until, most)

    monkeypatch.setattr(scan_reach.Reacher, "reach_nothing", spy)
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    ns = ip.user_ns
    assert id(ns["small"]) in calls[0] and id(ns["t"]) in calls[0]
    assert not any(id(ns["t"]) in c for c in calls[1:]), len(calls)
    assert [h.name for h in snap.holders] == ["t"]


def test_a_proof_cut_by_the_depth_limit_proves_nothing(ip):
    """A name holding a function whose default holds a structure deeper than the walk's
    limit, a tensor at its end: the walk of that name is cut there and says so. The
    small roots' proof hands the function to a probe of its own, which was cut at the
    same limit and took the cut for "leads nowhere": the name was proven empty and the
    report said nothing of a cut (the C core; the Python form walked it and said it)."""
    run(ip, "import torch\nx = [torch.ones(4)]\nfor _i in range(4100): x = [x]\n"
            "def f(a=x): return a\nholder = [f]\ndel x, f, _i")
    for line in ("--device cpu -o", "--device cpu --full -o"):
        snap = ip.run_line_magic("gpumem", line)
        assert snap.partial, line
        assert "structure deeper than 4000 levels cut in holder" in str(snap), str(snap)
