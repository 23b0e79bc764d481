"""Trace at its two depths on the CPU, and the rough edges of its faces.

* Cell depth (``%gpumem trace on``): the allocator's history is recorded without stacks
  and each block is mapped to the cell during which it was allocated, from the history's
  timestamps and the session's record of cell spans. Where no GPU can exist, the feed
  is torch's format over real host tensors (their storages are the blocks, their
  allocations the events, with ``time_us``), recorded as torch records it without a
  context: no frames. The mapping is the product's own; a thread allocates between
  cells and while a cell runs. The host recorder at cell depth, through the magics.
* Framework internals named once: blocks shown as internals are left out of what no
  name reaches, and the allocator's rounding past named storages is a group of its
  own, so the groups add up to the unattributed figure.
* What a new user met: a cell magic's rewritten line named instead of the user's,
  "allocated before trace was on" not said for an earlier host tensor, frames twice in
  the saved file, a temporary file's name in an error, a pickle written as ``f.txt``.
"""
from __future__ import annotations

import contextlib
import pickle
import threading

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402
from test_trace import FakeAllocator  # noqa: E402

from jupyter_gpumem.core import trace  # noqa: E402
from jupyter_gpumem.magics import trace as trace_magics  # noqa: E402
from jupyter_gpumem.session import session_of  # noqa: E402

MiB = 1 << 20


class HostTensorFeed(FakeAllocator):
    """torch's allocator format over real host tensors: each allocation is a real
    ``torch.empty`` whose storage is the block (its pointer the block's address). As
    torch does, a block or event recorded without a stack has no ``frames`` key."""

    def _event(self, device: int, action: str, addr: int, size: int, frames) -> None:
        super()._event(device, action, addr, size, frames)
        t = self.traces[device]
        if self.recording and t and not t[-1]["frames"]:
            del t[-1]["frames"]

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[int, torch.Tensor] = {}

    def alloc(self, size: int, *, frames: bool = True, device: int = 0, cpp: bool = False) -> int:
        block = (size + 511) // 512 * 512
        t = torch.empty(block, dtype=torch.uint8)
        addr = t.untyped_storage().data_ptr()
        self.tensors[addr] = t
        fr = self._frames(1) if (self.recording and frames and self.context) else []
        blocks = [{"address": addr, "size": block, "requested_size": size,
                   "state": "active_allocated", "frames": fr}]
        self.segments.append({
            "device": device, "address": addr, "total_size": block, "allocated_size": block,
            "active_size": block, "requested_size": size, "stream": 0,
            "segment_type": "small" if block <= 2 * MiB else "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": fr, "blocks": blocks})
        if not fr:
            del blocks[0]["frames"], self.segments[-1]["frames"]
        self.counter += 1
        self.allocated += block
        self._event(device, "alloc", addr, size, fr)
        return addr

    def free(self, addr: int) -> None:
        super().free(addr)
        self.tensors.pop(addr, None)


@contextlib.contextmanager
def traced(ip, args: str = ""):
    """``%gpumem trace on ARGS --device cpu`` around the block, torch imported first."""
    run(ip, "import torch")
    run(ip, f"%gpumem trace on {args} --device cpu".replace("  ", " "))
    try:
        yield
    finally:
        run(ip, "%gpumem trace off")


@pytest.fixture
def tip(ip):
    trace.stop()
    yield ip
    trace.stop()


def _start(ip, feed, depth="cell", **kw) -> str:
    """As the magics start it: the session's cell hooks and its record of cell spans."""
    ip.user_ns["fake"] = feed
    session = session_of(ip)
    line = trace.start(ip, "cuda", feed=feed, depth=depth, cells=trace_magics.SESSION_HOOKS,
                       spans=session.cells, **kw)
    session.tracer = trace.tracer()
    return line


def test_cell_depth_maps_each_block_to_its_cell_by_time(tip):
    feed = HostTensorFeed()
    line = _start(tip, feed)
    assert feed.enables[-1]["context"] is None, "cell depth: torch records no stacks"
    assert "CUDA recording (cell depth: the history without stacks" in line, line
    assert "cost +" in line and "measured on" in line
    ra = run(tip, "a = fake.alloc(1 << 20)")
    rb = run(tip, "def make(n):\n    return fake.alloc(n)\nb = make(4096)\n"
                  "c = fake.in_thread(8192)")            # a thread, while the cell runs
    assert not any(e.get("frames") for e in feed.traces[0]), "no frame was taken"
    ns = tip.user_ns
    sites = trace.sites_of([("cuda:0", ns[k]) for k in ("a", "b", "c")])
    got = {k: sites[("cuda:0", ns[k])] for k in ("a", "b", "c")}
    assert got["a"].text == f"cell [{ra.execution_count}]" and got["a"].how == "time"
    assert got["b"].text == got["c"].text == f"cell [{rb.execution_count}]"
    # the record the mapping reads is the session's, one span per cell with its count
    assert trace.tracer().spans is session_of(tip).cells
    assert [s.count for s in session_of(tip).cells][-2:] == [ra.execution_count,
                                                             rb.execution_count]


def test_a_block_allocated_by_a_thread_between_cells_says_so(tip):
    feed = HostTensorFeed()
    _start(tip, feed)
    go, out = threading.Event(), []
    tip.user_ns.update(go=go, out=out, threading=threading)
    run(tip, "th = threading.Thread(target=lambda: (go.wait(), out.append(fake.alloc(4096))))\n"
             "th.start()")
    go.set()                       # no cell runs now: the thread allocates in between
    tip.user_ns["th"].join()
    r = run(tip, "after = fake.alloc(512)")
    between = trace.site_of(("cuda:0", out[0]))
    assert between.how == "between"
    assert between.text == "allocated between cells (by a background thread or a callback)"
    assert trace.site_of(("cuda:0", tip.user_ns["after"])).cell == r.execution_count
    groups = trace.unattributed_sites([("cuda:0", tip.user_ns["after"])], "cuda:0")
    assert [g.site.text for g in groups] == [between.text]


def test_cell_depth_rows_lines_and_the_saved_file(tip, tmp_path):
    feed = HostTensorFeed()
    _start(tip, feed)
    r = run(tip, "x = fake.alloc(1 << 20)\ntmp = fake.alloc(2 << 20)\nfake.free(tmp)")
    n = r.execution_count
    lines = trace.cell_lines(n)
    assert [(la.line, la.bytes) for la in lines] == [(None, 3 * MiB)]
    assert lines.peak.bytes == 3 * MiB and lines.held == {None: MiB}
    assert lines.text() == f"cell [{n}] allocated 3.0 MiB, 1.0 MiB kept · peak +3.0 MiB"
    path = tmp_path / "cells.pickle"
    assert "given their cell's frame In[N]" in trace.save(str(path))
    data = pickle.loads(path.read_bytes())
    (block,) = [b for s in data["segments"] for b in s["blocks"]
                if b["address"] == tip.user_ns["x"]]
    assert block["frames"] == [{"filename": f"In[{n}]", "line": 0, "name": f"cell [{n}]"}]
    from torch.cuda import _memory_viz as mv
    assert f"In[{n}]" in mv.memory(data, format_flamegraph=lambda x: x)


def test_lines_depth_keeps_the_stacks(tip):
    feed = HostTensorFeed()
    _start(tip, feed, depth="lines")
    assert feed.enables[-1]["context"] == "alloc"
    r = run(tip, "y = fake.alloc(4096)")
    s = trace.site_of(("cuda:0", tip.user_ns["y"]))
    assert s.text == f"cell [{r.execution_count}] line 1: y = fake.alloc(4096)"


def test_internals_named_once_and_the_groups_add_up(tip):
    """The sites' bytes and the report's unattributed figure (allocated - named bytes -
    internals) agree to the byte."""
    feed = HostTensorFeed()
    _start(tip, feed)
    run(tip, "named = fake.alloc(1000)\nws = fake.alloc(4 << 20)\nlost = [fake.alloc(3000)]")
    ns = tip.user_ns
    sizes = {("cuda:0", ns["named"]): 1000}
    internals = {ns["ws"]: "cuBLAS workspace"}
    groups = trace.unattributed_sites(sizes, "cuda:0", internals)
    figure = feed.allocated - 1000 - (4 << 20)
    assert sum(g.nbytes for g in groups) == figure
    assert [(g.site.how, g.nbytes) for g in groups] == [("time", 3072), ("rounding", 24)]
    assert not any("workspace" in g.text or g.nbytes == 4 << 20 for g in groups)


def test_snapshot_rows_sum_the_sites_left_off(tip):
    from jupyter_gpumem.core.snapshot import SITE_GROUPS, sites_of_unattributed

    feed = HostTensorFeed()
    _start(tip, feed)
    for i in range(SITE_GROUPS + 3):
        run(tip, f"v{i} = [fake.alloc({(i + 1) * 512})]")
    rows = sites_of_unattributed({"cuda:0": 1}, {})["cuda:0"]
    assert len(rows) == SITE_GROUPS + 1 and rows[-1]["text"].endswith("3 other site(s)")
    assert sum(r["bytes"] for r in rows) == feed.allocated


# -- the host at cell depth, through the magics -------------------------------------------------
def test_host_at_cell_depth_names_the_cell(tip, capsys):
    with traced(tip):
        status = trace.status()
        assert "host recording torch calls' results (cell depth: no stacks)" in status, status
        assert "measured on 100 calls" in status, "a short calibration, on this machine"
        r = run(tip, "h = torch.zeros(1000)")
        snap = tip.run_line_magic("gpumem", "h --device cpu -o")
        (row,) = snap.details[0].rows
        assert row.allocated_at == f"cell [{r.execution_count}]"
        capsys.readouterr()
        run(tip, "%%gpuwatch --device cpu\nw = torch.zeros(1 << 20)\n")
        out = capsys.readouterr().out
        assert "allocated 4.0 MiB" in out and "run_cell_magic" not in out, out


def test_setting_validates_its_value(tip):
    from traitlets import TraitError

    magics = tip.magics_manager.registry["GpuMemMagics"]
    with pytest.raises(TraitError, match="True, False, 'cell' or 'lines'"):
        magics.trace = "stacks"
    magics.trace = "lines"
    magics.trace = False


# -- issue points: the rough edges ----------------------------------------------------------------
def test_a_cell_magic_names_the_users_line_not_ipythons_rewriting(tip, capsys):
    with traced(tip, "--lines"):
        capsys.readouterr()
        r = run(tip, "%%gpuwatch --device cpu\nk = 1\nz = torch.zeros(4 << 20)\n")
        out = capsys.readouterr().out
        assert "run_cell_magic" not in out, out
        assert "line 2 16.0 MiB (z = torch.zeros(4 << 20))" in out, out
        s = trace.site_of(("cpu", tip.ev("z.untyped_storage().data_ptr()")))
        assert (s.cell, s.line, s.source) == (r.execution_count, 2, "z = torch.zeros(4 << 20)")


def test_an_earlier_host_tensor_says_allocated_before_trace(tip, capsys):
    run(tip, "import torch\nearly = torch.ones(1000)")
    with traced(tip):
        capsys.readouterr()
        run(tip, "%gpumem early --device cpu")
        out = capsys.readouterr().out
    assert "allocated before trace was on" in out, out


def test_saved_frames_are_each_there_once(tip, tmp_path):
    with traced(tip, "--lines"):
        run(tip, "%%gpuwatch --device cpu\ng = torch.zeros(1 << 20)\n")
        run(tip, "def f():\n    return torch.zeros(1 << 18)\nq = f()")
        path = tmp_path / "s.pickle"
        run(tip, f"%gpumem trace --save {path}")
    data = pickle.loads(path.read_bytes())
    assert data["segments"]
    for seg in data["segments"]:
        keys = [(f["filename"], f["line"], f["name"]) for f in seg["frames"]]
        assert len(keys) == len(set(keys)), keys
    for e in data["device_traces"][0]:
        keys = [(f["filename"], f["line"], f["name"]) for f in e["frames"]]
        assert len(keys) == len(set(keys)), keys


def test_save_says_what_is_wrong_with_the_path(tip, tmp_path):
    from IPython.core.error import UsageError

    run(tip, "import torch")
    magics = tip.magics_manager.registry["GpuMemMagics"]
    trace_magics.magic_trace(magics, ["on", "--device", "cpu"])
    try:
        missing = tmp_path / "nowhere" / "f.pickle"
        with pytest.raises(UsageError) as err:
            trace_magics.magic_trace(magics, ["--save", str(missing)])
        text = str(err.value)
        assert "no such folder" in text and ".tmp" not in text, text
        txt = tmp_path / "f.txt"
        with pytest.raises(UsageError, match=r"\.pickle"):
            trace_magics.magic_trace(magics, ["--save", str(txt)])
        assert not txt.exists() and not list(tmp_path.iterdir())
    finally:
        trace_magics.magic_trace(magics, ["off"])


def test_cell_depth_names_blocks_whose_events_left_the_ring(tip, tmp_path):
    """A training cell turns the history's ring over: the blocks of the cells before keep
    the sites read after those cells, and a block the training cell made at its start
    (Adam's state) is named by the one cell that ran since."""
    feed = HostTensorFeed()
    _start(tip, feed, max_entries=100)
    ra = run(tip, "model = [fake.alloc(4096) for _ in range(5)]")
    rb = run(tip, "state = fake.alloc(8192)\nfor _ in range(200):\n    fake.free(fake.alloc(512))")
    ns = tip.user_ns
    assert not any(e["addr"] in (ns["state"], *ns["model"]) for e in feed.traces[0])
    assert trace.site_of(("cuda:0", ns["state"])).text == f"cell [{rb.execution_count}]"
    assert {trace.site_of(("cuda:0", p)).text for p in ns["model"]} == {
        f"cell [{ra.execution_count}]"}
    path = tmp_path / "ring.pickle"
    trace.save(str(path))
    data = pickle.loads(path.read_bytes())
    named = {b["address"]: b["frames"][0]["filename"] for s in data["segments"]
             for b in s["blocks"] if b["state"] == "active_allocated" and b["frames"]}
    assert named[ns["state"]] == f"In[{rb.execution_count}]"
    assert {named[p] for p in ns["model"]} == {f"In[{ra.execution_count}]"}


def test_a_cell_run_without_history_is_no_numbered_cell(tip):
    feed = HostTensorFeed()
    _start(tip, feed)
    tip.run_cell("quiet = fake.alloc(4096)", store_history=False)
    r = run(tip, "loud = fake.alloc(4096)")
    quiet = trace.site_of(("cuda:0", tip.user_ns["quiet"]))
    assert quiet.cell is None and "outside the numbered cells" in quiet.text, quiet
    assert trace.site_of(("cuda:0", tip.user_ns["loud"])).cell == r.execution_count
