"""SPEC's table and every holder kind, on host tensors (``--device cpu``).

Each case builds a real leak in a real IPython shell, checks that
``%gpumem`` blames the right holder, then purges what it blamed and checks
through ``StorageWeakRef`` that the storage is really gone, while an
unrelated tensor survives.
"""
from __future__ import annotations

import gc
import sys

import pytest

torch = pytest.importorskip("torch")
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

from conftest import holder, purge, report, run, weak  # noqa: E402
from jupyter_gpumem.views.panel_render import holder_row_html  # noqa: E402

N = 1 << 18          # elements: 1 MiB of float32
MIB = 1 << 20


def storage_bytes(ip, expr: str) -> int:
    """The size of the storage under the tensor ``expr`` names."""
    tensor = eval(expr, ip.user_ns)  # test code, not user input
    return tensor.untyped_storage().nbytes()


def assert_freed(ref: StorageWeakRef):
    gc.collect()
    assert ref.expired(), "the storage is still alive after purge"


@pytest.fixture(autouse=True)
def _torch(ip):
    run(ip, "import torch")


# -- SPEC's table ---------------------------------------------------------------
def case(setup: str, blamed: str, weak_expr: str | None = None, purge_args: str | None = None):
    """A row of the table: the cell that leaks, the holder it blames, the tensor whose
    storage the purge must free (by default the blamed name's), what to purge (by
    default the blamed name) and the name the purge removes (the blamed one)."""
    return setup, blamed, weak_expr or blamed, purge_args or blamed, blamed


CASES = {
    "plain variable": case(f"t = torch.ones({N})", "t"),
    "exception in a variable": case(
        f"def f():\n    t = torch.ones({N})\n    1/0\ntry:\n    f()\nexcept ZeroDivisionError as e:\n    err = e",
        "err", "err.__traceback__.tb_next.tb_frame.f_locals['t']"),
    "autograd graph of a scalar loss": case(
        "model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))\n"
        "x = torch.randn(512, 256)\nloss = model(x).square().mean()",
        "loss", "loss.grad_fn.next_functions[0][0].next_functions[0][0]._saved_mat1"),
    "closure": case(f"def make():\n    t = torch.ones({N})\n    return lambda: t.sum()\nfn = make()",
                    "fn", "fn.__closure__[0].cell_contents"),
    "lru_cache": case(
        f"import functools\n@functools.lru_cache\ndef cached(n):\n    return torch.ones(n)\ncached({N});",
        "cached", f"cached({N})"),
    "suspended generator": case(
        f"def gen():\n    t = torch.ones({N})\n    yield 1\n    yield 2\nit = gen()\nnext(it);",
        "it", "it.gi_frame.f_locals['t']"),
    "class attribute": case(f"class Holder:\n    cache = torch.ones({N})\ninst = Holder()",
                            "Holder", "Holder.cache", purge_args="Holder inst"),
    "view of a big tensor": case(f"base = torch.ones({4 * N})\nv = base[:16]\ndel base", "v"),
    "module object in sys.modules": case(
        f"import sys, types\nmymod = types.ModuleType('mymod')\nmymod.t = torch.ones({N})\nsys.modules['mymod'] = mymod",
        "mymod", "mymod.t"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_table_case_is_blamed_and_purged(ip, unrelated, case):
    setup, blamed, weak_expr, purge_args, gone = CASES[case]
    run(ip, setup)
    ref = weak(ip, weak_expr)
    leak = storage_bytes(ip, weak_expr)
    assert leak >= N * 4
    snap = report(ip)
    h = holder(snap, blamed)
    # the leak's storage is counted in the blamed holder: as its own, unless the other
    # names the purge needs hold it too (a class and its instance): then shared with them
    others = set(purge_args.split()) - {blamed}
    if others:
        assert h.shared >= leak and set(h.shared_with) == others, (h.shared, h.shared_with)
    else:
        assert h.unique >= leak, (h.unique, h.shared, h.shared_with)
    result = purge(ip, purge_args)
    assert gone not in ip.user_ns
    assert_freed(ref)
    assert result.changes and result.changes[0].freed >= 4 * N - 64
    if case == "module object in sys.modules":
        assert "mymod" not in sys.modules


def test_view_counts_its_whole_storage_and_hints(ip):
    run(ip, f"base = torch.ones({4 * N})\nv = base[:16]\ndel base")
    h = holder(report(ip), "v")
    assert h.unique == 16 * N
    assert "view" in h.hint and "clone" in h.hint


def test_loss_graph_is_blamed_with_hint(ip):
    run(ip, CASES["autograd graph of a scalar loss"][0])
    snap = report(ip)
    h = holder(snap, "loss")
    assert h.unique >= 512 * 1024 * 4, "the saved activations belong to loss alone"
    assert "grad_fn" in h.largest_path
    assert "loss.item()" in h.hint
    # the parameters are shared with the model, not counted as loss's own
    assert "model" in h.shared_with


def test_output_history_is_a_hidden_holder(ip, unrelated):
    run(ip, f"torch.ones({N})")
    n = ip.execution_count - 1
    ref = weak(ip, f"Out[{n}]")
    snap = report(ip)
    h = holder(snap, f"Out[{n}]")
    assert h.hidden and f"_{n}" in h.aliases and "_" in h.aliases
    assert "`;`" in h.hint
    # in HTML (the report, the panel's row) the hint's backticked parts are code
    for html in (snap._repr_html_(), holder_row_html(h.to_json())):
        assert "<code>;</code>" in html and "`" not in html, html
    purge(ip, "")  # no names: only hidden holders
    assert_freed(ref)
    assert n not in ip.user_ns["Out"] and f"_{n}" not in ip.user_ns


def test_a_name_shown_as_a_cell_value_owns_its_bytes_and_lists_its_out_entry(ip, unrelated):
    """``big`` shown as a cell's value: ``Out[n]`` is ``big`` itself, so it is folded
    into big's row (``big (Out[n], _n, ...)``, all its bytes its own), not a second
    holder that makes big look shared; purging big frees it, Out[n] included."""
    run(ip, f"big = torch.ones({N})")
    run(ip, "big")
    n = ip.execution_count - 1
    ref = weak(ip, "big")
    snap = report(ip)
    h = holder(snap, "big")
    assert h.unique == 4 * N and h.shared == 0
    assert f"Out[{n}]" in h.aliases and f"_{n}" in h.aliases
    assert not any(x.name == f"Out[{n}]" for x in snap.holders)
    assert snap.holder(f"Out[{n}]") is h   # found by its alias
    assert f"big (Out[{n}], _{n}" in repr(snap)
    purge(ip, "big")
    assert_freed(ref)
    assert n not in ip.user_ns["Out"]


def test_purge_output_entry_by_name(ip, unrelated):
    run(ip, f"torch.ones({N})")
    n = ip.execution_count - 1
    ref = weak(ip, f"_{n}")
    purge(ip, f"Out[{n}]")
    assert_freed(ref)


def test_last_traceback_is_named_and_cleared(ip, unrelated):
    run(ip, f"def f():\n    t = torch.ones({N})\n    1/0")
    run(ip, "f()", expect_error=True)
    tb = sys.last_traceback
    while tb.tb_next is not None:
        tb = tb.tb_next
    ref = StorageWeakRef(tb.tb_frame.f_locals["t"].untyped_storage())
    del tb
    gc.collect()
    snap = report(ip)
    h = holder(snap, "last traceback")
    assert h.label == "last traceback (f(): t)"
    result = purge(ip, "")
    assert "last traceback" in result.removed
    assert_freed(ref)
    assert "f" in ip.user_ns


def test_optimizer_state_after_del_model(ip, unrelated):
    run(ip, "model = torch.nn.Linear(512, 512)\nopt = torch.optim.Adam(model.parameters())\n"
            "model(torch.randn(8, 512)).sum().backward()\nopt.step()\ndel model")
    ref_w = weak(ip, "opt.param_groups[0]['params'][0]")
    ref_state = weak(ip, "opt.state[opt.param_groups[0]['params'][0]]['exp_avg']")
    h = holder(report(ip), "opt")
    assert h.unique >= 3 * 512 * 512 * 4  # weight, its grad... and the two moments
    purge(ip, "opt")
    assert_freed(ref_w)
    assert_freed(ref_state)


def test_purging_model_names_the_optimizer_that_still_holds_it(ip):
    run(ip, "model = torch.nn.Linear(512, 512)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)")
    ref = weak(ip, "model.weight")
    result = purge(ip, "model")
    assert not ref.expired()
    assert [s.by for s in result.still_held] == ["opt"]
    assert any("opt still holds" in m for m in result.messages)
    purge(ip, "opt")
    assert_freed(ref)


# -- holder kinds of the scan ----------------------------------------------------------
KINDS = {
    "list": (f"c = [1, 'a', torch.ones({N})]", "c", "c[2]", "c[2]"),
    "tuple": (f"c = (torch.ones({N}),)", "c", "c[0]", "c[0]"),
    "dict": (f"c = {{'runs': torch.ones({N}), 'name': 'x'}}", "c", "c['runs']", "c['runs']"),
    "set": (f"c = {{torch.ones({N})}}", "c", "next(iter(c))", "c{...}"),
    "instance dict": (f"class H: pass\nc = H()\nc.cache = torch.ones({N})", "c", "c.cache", "c.cache"),
    "slots": (f"class S:\n    __slots__ = ('t',)\nc = S()\nc.t = torch.ones({N})", "c", "c.t", "c.t"),
    "default argument": (f"def c(x, cache=torch.ones({N})):\n    return x", "c", "c.__defaults__[0]",
                         "c→default:0"),
    "keyword default": (f"def c(*, cache=torch.ones({N})):\n    return 1", "c",
                        "c.__kwdefaults__['cache']", "c→default:cache"),
    "bound method": (f"class K:\n    def __init__(self):\n        self.t = torch.ones({N})\n"
                     "    def run(self):\n        return self.t\nc = K().run", "c", "c.__self__.t",
                     "c.__self__.t"),
    "partial": (f"import functools\nc = functools.partial(torch.add, torch.ones({N}))", "c",
                "c.args[0]", "c.args[0]"),
    "nn.Module parameter": ("c = torch.nn.Linear(512, 512)", "c", "c.weight", "c.weight"),
    "nn.Module buffer": (f"c = torch.nn.Module()\nc.register_buffer('buf', torch.ones({N}))", "c", "c.buf",
                         "c.buf"),
    "nn.Module hook": (f"c = torch.nn.Linear(2, 2)\ndef mk(t):\n    return lambda m, i, o: t\n"
                       f"hook = c.register_forward_hook(mk(torch.ones({N})))",
                       "c", "next(iter(c._forward_hooks.values())).__closure__[0].cell_contents",
                       "c._forward_hooks"),
    "nested module": ("c = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(512, 512)))",
                      "c", "c[1][0].weight", "c.1.0.weight"),
    "tensor gradient": (f"c = torch.ones({N}, requires_grad=True)\nc.sum().backward()", "c", "c.grad",
                        "c.grad"),
    "user module": (f"import types\nc = types.ModuleType('usermod')\nc.t = torch.ones({N})", "c", "c.t", "c.t"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_holder_kind_is_reached_with_its_path(ip, unrelated, kind):
    setup, name, weak_expr, path_part = KINDS[kind]
    run(ip, setup)
    ref = weak(ip, weak_expr)
    nbytes = ref.cdata and eval(weak_expr, ip.user_ns).untyped_storage().nbytes()
    snap = ip.run_line_magic("gpumem", f"{name} --device cpu -o")
    h = holder(snap, name)
    assert h.total >= nbytes
    paths = [r.path for r in snap.details[0].rows]
    assert any(path_part in p for p in paths), paths
    purge(ip, name)
    assert_freed(ref)


@pytest.mark.parametrize("path, survivor", [
    ("cfg['runs']", "cfg['name'] == 'keep me'"),
    ("m.cache", "m.other == 3"),
    ("lst[1]", "lst[0] == 'first'"),
    ("net.big", "hasattr(net, 'small')"),
])
def test_purge_a_path_keeps_the_rest(ip, unrelated, path, survivor):
    run(ip, f"cfg = {{'runs': torch.ones({N}), 'name': 'keep me'}}\n"
            f"class M: pass\nm = M()\nm.cache = torch.ones({N})\nm.other = 3\n"
            f"lst = ['first', torch.ones({N})]\n"
            f"net = torch.nn.Module()\nnet.big = torch.nn.Linear(512, 512)\nnet.small = torch.nn.Linear(2, 2)")
    ref = weak(ip, path if path != "net.big" else "net.big.weight")
    purge(ip, path)
    assert_freed(ref)
    assert eval(survivor, ip.user_ns)


def test_two_names_sharing_a_storage_are_not_counted_twice(ip):
    run(ip, f"a = torch.ones({N})\nb = a\nc = a[10:20]")
    snap = report(ip)
    for name in "abc":
        h = holder(snap, name)
        assert h.unique == 0 and h.shared == 4 * N
    assert set(holder(snap, "a").shared_with) == {"b", "c"}
    assert snap.devices[0].attributed == 4 * N
    result = purge(ip, "a b c")
    assert result.changes[0].freed == 4 * N


def test_dry_run_changes_nothing(ip):
    run(ip, f"t = torch.ones({N})\nu = torch.ones({N})")
    ref = weak(ip, "t")
    result = purge(ip, "t u --dry-run")
    assert result.dry_run and result.predicted["cpu"] == 8 * N
    assert "t" in ip.user_ns and "u" in ip.user_ns and not ref.expired()


def test_purge_all_takes_every_name_that_holds_memory(ip):
    run(ip, f"t = torch.ones({N})\nu = [torch.ones({N})]\nx = 5\ns = 'text'")
    result = ip.run_line_magic("gpumem", "purge --all --device cpu -o")
    assert {"t", "u"} <= set(result.removed)
    assert ip.user_ns["x"] == 5 and ip.user_ns["s"] == "text"


def test_purge_without_names_never_touches_user_names(ip):
    run(ip, f"t = torch.ones({N})")
    run(ip, "t")  # shown: Out and _ hold it too
    ref = weak(ip, "t")
    result = purge(ip, "")
    assert "t" in ip.user_ns and not ref.expired()
    assert all(name.startswith(("Out[", "_", "last")) for name in result.removed)
    purge(ip, "t")
    assert_freed(ref)


def test_purging_a_name_also_clears_its_hidden_references(ip):
    run(ip, f"t = torch.ones({N})")
    run(ip, "t")
    run(ip, "t")
    ref = weak(ip, "t")
    result = purge(ip, "t")
    assert_freed(ref)
    assert "_" in result.removed and any(n.startswith("Out[") for n in result.removed)


def test_purging_loss_frees_its_activations_and_leaves_the_model_alone(ip):
    run(ip, CASES["autograd graph of a scalar loss"][0])
    run(ip, "x[:2]")  # Out[] holds a view of the input, which x holds anyway
    n = ip.execution_count - 1
    act = weak(ip, CASES["autograd graph of a scalar loss"][2])
    weight = weak(ip, "model[0].weight")
    dry = purge(ip, "loss --dry-run")
    assert dry.predicted["cpu"] >= 512 * 1024 * 4
    assert dry.still_held == [], "the model's parameters are not the loss's to free"
    result = purge(ip, "loss")
    assert_freed(act)
    assert not weight.expired()
    assert n in ip.user_ns["Out"], "an output that only shares x's memory stays"
    assert result.removed == ["loss"]


def test_purging_hidden_holders_names_the_user_name_that_also_holds_it(ip):
    run(ip, f"t = torch.ones({N})")
    run(ip, "t")
    result = purge(ip, "--dry-run")
    assert result.predicted["cpu"] == 0
    assert [s.by for s in result.still_held] == ["t"]


@pytest.mark.parametrize("setup, names", [
    (f"t = torch.ones({N})", "t"),
    (f"class C:\n    cache = torch.ones({N})", "C"),
    ("model = torch.nn.Linear(512, 512)\nopt = torch.optim.Adam(model.parameters())\n"
     "model(torch.ones(2, 512)).sum().backward()\nopt.step()\ndel model", "opt"),
])
def test_memory_is_dead_when_caches_are_released(ip, monkeypatch, setup, names):
    """The caches are emptied only after purge dropped its own references (else nothing is given back)."""
    import jupyter_gpumem.core.purge as purge_module

    run(ip, setup)
    first = names if names != "C" else "C.cache"
    ref = weak(ip, {"opt": "opt.param_groups[0]['params'][0]"}.get(names, first))
    seen = []
    original = purge_module.release_caches

    def spy():
        notes = original()
        seen.append(ref.expired())
        return notes

    monkeypatch.setattr(purge_module, "release_caches", spy)
    purge(ip, names)
    assert seen == [True]


@pytest.mark.parametrize("change", [
    "t.set_(torch.ones(2 * N).untyped_storage())",
    "t.data = torch.ones(2 * N)",
    "t.resize_(2 * N)",
])
def test_a_tensor_whose_storage_changes_is_counted_anew(ip, change):
    """Storages are remembered between scans; a swapped or regrown storage is seen at once."""
    run(ip, f"t = torch.ones({N})")
    assert holder(report(ip), "t").unique == 4 * N
    run(ip, change.replace("N", str(N)) + ";")
    assert holder(report(ip), "t").unique == 8 * N


def test_two_losses_of_one_graph_both_reach_its_activations(ip):
    """A graph expanded from one root is expanded again from the next (nothing carried over)."""
    run(ip, "model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))\n"
            "out = model(torch.randn(512, 256))\nloss_a = out.square().mean()\nloss_b = out.abs().mean()")
    snap = report(ip)
    for name in ("loss_a", "loss_b", "out"):
        assert holder(snap, name).shared >= 512 * 1024 * 4, name


def test_a_report_keeps_nothing_alive(ip):
    """After %gpumem, `del` frees at once: the scan leaves no reference behind, not even
    one a garbage collection would clear."""
    import gc as gc_module

    run(ip, f"model = torch.nn.Linear(512, 512)\nopt = torch.optim.Adam(model.parameters())\n"
            f"model(torch.ones(2, 512)).sum().backward()\nopt.step()\nt = torch.ones({N})")
    ref_t, ref_w = weak(ip, "t"), weak(ip, "model.weight")
    gc_module.disable()
    try:
        report(ip)
        run(ip, "del t, model, opt")
        assert ref_t.expired() and ref_w.expired()
    finally:
        gc_module.enable()


def test_the_torch_backends_children_of_a_tensor_lead_through_its_graph():
    """``Backend.children`` of a tensor with a ``grad_fn``: the graph's saved tensors and
    its leaf, labelled by the route to their node and the step inside it (the graph walk
    lives in torch_graph.py)."""
    from jupyter_gpumem.backends.pytorch import BACKENDS

    x = torch.ones(3, requires_grad=True)
    w = torch.full((3,), 2.0)
    y = (x * w).sum()
    kids = list(BACKENDS[0].children(y))
    found = {label: value for label, value in kids}
    # .grad_fn.next_functions[0][0].next_functions[0][0].variable
    assert found[("graph", (("grad_fn", 0), 0), (("attr", "variable"),))] is x
    assert any(v is w for v in found.values())
