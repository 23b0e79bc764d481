"""``%gpumem trace on --max-entries N`` on the host (``--device cpu``): the recorder keeps
at most N events and N storages' sites (the oldest dropped), ``--save`` writes at most N,
and ``%gpumem trace`` says the limit and how many are kept."""
from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402

from jupyter_gpumem.core import trace  # noqa: E402


@pytest.fixture
def tip(ip):
    trace.stop()
    run(ip, "import torch")
    yield ip
    trace.stop()


def _status(ip, capsys) -> str:
    capsys.readouterr()
    run(ip, "%gpumem trace")
    return capsys.readouterr().out


def test_host_keeps_at_most_max_entries(tip, capsys, tmp_path):
    run(tip, "%gpumem trace on --max-entries 3 --device cpu")
    run(tip, "xs = [torch.ones(1000 + i) for i in range(24)]")
    rec = trace.tracer().host
    assert len(rec.events) <= 3 and len(rec.records) <= 3
    snap = tip.run_line_magic("gpumem", "xs --device cpu -o")
    (detail,) = snap.details
    sited = [r.path for r in detail.rows if r.allocated_at]
    # the three newest keep their site; the 21 before lost theirs
    assert sorted(sited) == ["xs[21]", "xs[22]", "xs[23]"], sited

    status = _status(tip, capsys)
    assert "3 host event(s) kept of at most 3" in status, status
    assert "21 older storage(s) lost their site" in status, status

    path = tmp_path / "three.pickle"
    run(tip, f"%gpumem trace --save {path}")
    assert "saved 3 host storage(s)" in capsys.readouterr().out
    data = pickle.loads(path.read_bytes())
    assert len(data["segments"]) == 3
    events = data["device_traces"][0]
    assert len([e for e in events if e["action"] == "alloc"]) == 3


def test_default_status_says_the_limit_and_the_count(tip, capsys):
    run(tip, "%gpumem trace on --device cpu")
    run(tip, "ys = [torch.ones(10) for _ in range(5)]")
    status = _status(tip, capsys)
    assert "5 host event(s) kept of at most 100,000" in status, status
    assert "oldest go first" not in status and "lost their site" not in status


def test_a_storage_recorded_again_is_the_newest(tip):
    """Pointer reuse: a storage recorded anew at an old record's pointer moves to the
    end (it is not the oldest, dropped first)."""
    run(tip, "%gpumem trace on --lines --max-entries 2 --device cpu")
    # a tensor over an array of the user's: the same pointer again, for sure
    run(tip, "import numpy\nbuf = numpy.zeros(512)\na = torch.as_tensor(buf)\n"
             "old = a.untyped_storage().data_ptr()")
    run(tip, "x1 = torch.ones(5000)")
    run(tip, "del a\nb = torch.as_tensor(buf)")
    assert tip.ev("b.untyped_storage().data_ptr()") == tip.user_ns["old"]
    run(tip, "c = torch.ones(300)")
    rec = trace.tracer().host
    assert len(rec.records) == 2
    sites = trace.sites_of([("cpu", tip.ev(f"{n}.untyped_storage().data_ptr()"))
                            for n in ("b", "c", "x1")])
    assert sorted(s.source for s in sites.values()) == ["b = torch.as_tensor(buf)",
                                                        "c = torch.ones(300)"], sites
