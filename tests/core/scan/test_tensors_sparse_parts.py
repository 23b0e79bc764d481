"""A tensor whose data lies in several dense parts (a sparse tensor's indices and
values) is listed part by part in ``%gpumem NAME``: each row's path says which part it
is (``s._indices()``, ``s._values()``) and its description is that part's dtype and
shape; the holder's total is the parts' sum."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from conftest import report, run  # noqa: E402

N = 1 << 20
MiB = 1 << 20


def _detail(ip, name):
    snap = report(ip, name)
    held = next(h for h in snap.details if h.name == name)
    return snap, held


def _sparse(ip, extra=""):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(ip, f"import torch\nidx = torch.arange({N}).unsqueeze(0)\n"
                f"s = torch.sparse_coo_tensor(idx, torch.ones({N}), ({N},))\ndel idx{extra}")


def test_a_sparse_tensors_rows_name_its_indices_and_values(ip):
    _sparse(ip)
    snap, held = _detail(ip, "s")
    assert held.total == 12 * MiB
    rows = {r.path: r for r in held.rows}
    assert set(rows) == {"s._indices()", "s._values()"}, [(r.path, r.what) for r in held.rows]
    assert rows["s._indices()"].nbytes == 8 * MiB
    assert rows["s._indices()"].what == f"Tensor int64[1, {N}]"
    assert rows["s._values()"].nbytes == 4 * MiB
    assert rows["s._values()"].what == f"Tensor float32[{N}]"
    text = repr(snap)
    assert "s._indices()" in text and "s._values()" in text, text
    # the report's largest path names the part too
    assert next(h for h in report(ip).holders if h.name == "s").largest_path == "s._indices()"


def test_a_sparse_tensor_inside_a_container(ip):
    _sparse(ip, "\nbox = {'m': s}\ndel s")
    _, held = _detail(ip, "box")
    paths = sorted(r.path for r in held.rows)
    assert paths == ["box['m']._indices()", "box['m']._values()"], paths
    assert held.total == 12 * MiB


def test_a_csr_tensors_rows_name_its_parts(ip):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "Sparse CSR tensor support is in beta state"
        run(ip, "import torch\nd = torch.eye(512)\nc = d.to_sparse_csr()\ndel d")
    _, held = _detail(ip, "c")
    rows = {r.path: r for r in held.rows}
    assert set(rows) == {"c.crow_indices()", "c.col_indices()", "c.values()"}, \
        [(r.path, r.what) for r in held.rows]
    assert rows["c.values()"].what == "Tensor float32[512]"
    assert rows["c.crow_indices()"].what == "Tensor int64[513]"


def test_a_dense_tensors_row_is_its_name(ip):
    run(ip, f"import torch\nt = torch.ones({N})")
    _, held = _detail(ip, "t")
    assert [(r.path, r.what) for r in held.rows] == [("t", f"Tensor float32[{N}]")]
