"""Paths into an autograd graph: each names one object, and types back.

A row reached through a tensor's graph reads the way the graph links
(``loss.grad_fn.next_functions[0][0]._saved_mat1``), so two nodes of one type never
print the same path; ``%gpumem PATH`` resolves it by reading the graph as the scan
does (no saved tensor unpacked, no hook run); a purge of such a path, which no
namespace binding stands for, is refused in one line naming what to purge instead.
Real torch on the CPU, a real IPython shell.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from IPython.core.error import UsageError  # noqa: E402

from conftest import run  # noqa: E402
from jupyter_gpumem.core.scan import paths  # noqa: E402

MLP = """
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                          torch.nn.ReLU(), torch.nn.Linear(128, 4))
x = torch.randn(32, 64)
"""

HOOKED = MLP + """
unpacked = []
def pack(t):
    return t
def unpack(t):
    unpacked.append(1)
    return t
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    loss = net(x).sum()
"""


def rows(ip, text: str) -> dict[str, int]:
    """``path -> bytes`` of the rows of ``%gpumem TEXT`` on the host; paths must not repeat."""
    snap = ip.run_line_magic("gpumem", f"{text} --device cpu -o")
    assert snap.details, f"{text} holds nothing"
    got = [(r.path, r.nbytes) for r in snap.details[0].rows]
    assert len({p for p, _ in got}) == len(got), [p for p, _ in got]
    return dict(got)


def typed_back(ip, path: str) -> int:
    """The bytes of ``path``'s own row when ``%gpumem 'PATH'`` reports it as a holder."""
    own = rows(ip, repr(path))
    assert path in own, (path, own)
    return own[path]


def test_two_nodes_of_one_type_print_two_paths(ip):
    run(ip, MLP + "loss = net(x).sum()\n")
    got = rows(ip, "loss")
    mat1 = [p for p in got if p.endswith("._saved_mat1")]
    # three Linear layers: three addmm nodes, each keeping its own input
    assert len(mat1) == 3, list(got)
    assert all(p.startswith("loss.grad_fn") and "→" not in p for p in mat1), mat1
    leaves = [p for p in got if p.endswith(".variable")]
    assert len(leaves) == 4, list(got)   # the leaves not saved elsewhere: weight and biases


def test_each_path_types_back_to_its_rows_tensor(ip):
    run(ip, MLP + "loss = net(x).sum()\n")
    got = rows(ip, "loss")
    graph_rows = {p: n for p, n in got.items() if p.startswith("loss.grad_fn")}
    assert len(graph_rows) >= 7, list(got)
    for path, nbytes in graph_rows.items():
        assert typed_back(ip, path) == nbytes, path
        # the path means what Python means by it (no hook is set here: evaluating it
        # unpacks nothing of the user's)
        found = paths.resolve(path, shell=ip).obj
        assert found.data_ptr() == eval(path, ip.user_ns).data_ptr(), path


def test_purging_a_graph_path_names_the_holder_and_deletes_nothing(ip):
    run(ip, MLP + "loss = net(x).sum()\n")
    path = next(p for p in rows(ip, "loss") if p.endswith("._saved_mat1"))
    before = dict(ip.user_ns)
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("gpumem", f"purge {path!r} --device cpu")
    text = str(err.value)
    assert "\n" not in text and "purge loss instead" in text, text
    assert dict(ip.user_ns).keys() == before.keys()
    assert all(ip.user_ns[k] is v for k, v in before.items())
    assert ip.user_ns["loss"].grad_fn is not None   # the graph is whole


def test_a_custom_functions_attribute_types_back_and_is_not_purged(ip):
    run(ip, "import torch\n"
            "class Keeps(torch.autograd.Function):\n"
            "    @staticmethod\n"
            "    def forward(ctx, x):\n"
            "        ctx.extra = torch.ones(4096)\n"
            "        return x * 2\n"
            "    @staticmethod\n"
            "    def backward(ctx, grad):\n"
            "        return grad * 2\n"
            "out = Keeps.apply(torch.ones(8, requires_grad=True))\n")
    got = rows(ip, "out")
    assert got.get("out.grad_fn.extra") == 4096 * 4, got
    assert typed_back(ip, "out.grad_fn.extra") == 4096 * 4
    with pytest.raises(UsageError, match="purge out instead"):
        ip.run_line_magic("gpumem", "purge out.grad_fn.extra --device cpu")
    assert "out" in ip.user_ns


def test_a_graph_under_saved_tensor_hooks_is_scanned_and_resolved_without_unpacking(ip):
    run(ip, HOOKED)
    calls = ip.user_ns["unpacked"]
    got = rows(ip, "loss")
    packed = [p for p in got if p.endswith(".data") and "._raw_saved_" in p]
    assert len(packed) >= 3, list(got)   # what the pack hook kept, named as it is read
    for path in packed:
        assert typed_back(ip, path) == got[path], path
    # the unpacking name of the same tensor is refused, and says what to type
    plain = packed[0].replace("._raw_saved_", "._saved_")[:-len(".data")]
    with pytest.raises(UsageError, match="_raw_saved_"):
        ip.run_line_magic("gpumem", f"{plain!r} --device cpu -o")
    assert calls == [], f"the unpack hook ran {len(calls)} time(s)"


def test_a_deep_graphs_paths_stay_short_and_say_which_cannot_be_typed(ip):
    """A recurrent net's graph is thousands of nodes deep: a path that long shows its
    ends around ``…(N steps)…`` (still one path per row) and, typed, says so."""
    run(ip, "import torch\n"
            "W = torch.randn(16, 16, requires_grad=True)\n"
            "h = torch.zeros(4, 16)\n"
            "for _ in range(200):\n"
            "    h = torch.tanh(h @ W + 1.0)\n"
            "loss = h.sum()\n")
    got = rows(ip, "loss")
    assert len(got) > 200, len(got)
    assert max(map(len, got)) < 800, max(got, key=len)
    deep = [p for p in got if "steps)\u2026" in p]
    near = [p for p in got if p.startswith("loss.grad_fn.") and "\u2026" not in p]
    assert deep and near, list(got)
    with pytest.raises(UsageError, match="cannot be typed back") as err:
        ip.run_line_magic("gpumem", f"{deep[0]!r} --device cpu -o")
    assert "\n" not in str(err.value)
    for path in near:
        assert typed_back(ip, path) == got[path], path


def test_graph_steps_of_the_users_own_classes_run_none_of_their_code(ip):
    """A class of the user's that names its properties like the graph's links: the path
    reads the tensor's own graph, never the property."""
    run(ip, "import torch\n"
            "called = []\n"
            "class Sneaky(torch.Tensor):\n"
            "    @property\n"
            "    def grad_fn(self):\n"
            "        called.append('grad_fn')\n"
            "        return None\n"
            "class Fake:\n"
            "    @property\n"
            "    def next_functions(self):\n"
            "        called.append('next_functions')\n"
            "        return ()\n"
            "s = (torch.ones(256, requires_grad=True) * 2).as_subclass(Sneaky)\n"
            "fake = Fake()\n")
    node = torch._C.TensorBase.grad_fn.__get__(ip.user_ns["s"])
    assert node is not None and paths.resolve("s.grad_fn", shell=ip).obj is node
    with pytest.raises(paths.PathError, match="no attribute 'next_functions'"):
        paths.resolve("fake.next_functions", shell=ip)
    assert ip.user_ns["called"] == []
