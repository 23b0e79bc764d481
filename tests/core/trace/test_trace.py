"""``jupyter_gpumem.trace`` on the CPU: real IPython cells, real frames.

* The host path for real: a TorchFunctionMode on the shell's thread records where
  the storages that torch calls return were allocated; sites name the cell, the
  line and its source; views, in-place results, properties (``.grad``) and reused
  pointers are not misattributed; cell_lines, unattributed grouping, the saved
  snapshot read by ``torch.cuda._memory_viz``; the mode leaves the stack as it was.
* Where no GPU can exist, the CUDA path runs on a fake allocator feed shaped exactly
  like ``torch.cuda.memory._snapshot()`` (segments / blocks / frames, device_traces of
  alloc / free_requested / free_completed events with ``time_us``), whose frames are
  the real Python stacks of the real cells that call it (innermost first, as torch
  gives them): the mapping logic under test is the product's own.
* The import hook (trace on before ``import torch``) in a child process.
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest

torch = pytest.importorskip("torch")

from conftest import run  # noqa: E402

from jupyter_gpumem.core import trace  # noqa: E402
from jupyter_gpumem.magics import trace as trace_magics  # noqa: E402

MiB = 1 << 20


# -- a fake CUDA allocator, shaped like torch's --------------------------------------------
#: C++ frames as torch gives them with stacks="all" (innermost first)
CPP_FRAMES = [
    {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1300,
     "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
    {"filename": "/pytorch/aten/src/ATen/native/cuda/Blas.cpp", "line": 400, "name": "at::native::addmm_out_cuda_impl"},
    {"filename": "??", "line": 0, "name": "torch::autograd::Engine::thread_main"},
    {"filename": "??", "line": 0, "name": "start_thread"},
]


class FakeAllocator:
    """Blocks and history as torch's caching allocator reports them in ``_snapshot()``.

    ``alloc`` records the caller's real Python stack as torch does with
    ``stacks="python"`` (innermost frame first, every frame up to the interpreter's
    top); ``frames=False`` is an allocation by a C++ thread (autograd's backward), which
    torch records with no frame.
    """

    name = "fake"

    def __init__(self, devices: int = 1, state: str = "ready") -> None:
        self._state = state
        self.recording = False
        self.max_entries = 0
        self.segments: list[dict] = []
        self.traces: list[list] = [[] for _ in range(devices)]
        self.next_addr = 0x7F0000000000
        self.counter = 0
        self.allocated = 0
        self.init_calls: list = []
        self.enables: list[dict] = []
        self.context = None

    # what Tracer asks
    def state(self) -> str:
        return self._state

    def on_init(self, fn):
        self.init_calls.append(fn)
        return lambda: self.init_calls.remove(fn) if fn in self.init_calls else None

    def lazy_init(self) -> None:
        """What torch's lazy CUDA init does: the queued calls run, then it is ready."""
        self._state = "ready"
        for fn in list(self.init_calls):
            fn()
        self.init_calls.clear()

    def enable(self, *, stacks, context, max_entries, clear=False) -> None:
        self.enables.append(dict(stacks=stacks, context=context, max_entries=max_entries,
                                 clear=clear))
        self.recording, self.max_entries = True, max_entries
        self.context = context      # None: torch records the history without stacks
        if clear:
            self.traces = [[] for _ in self.traces]

    def disable(self) -> None:
        self.recording = False
        self.traces = [[] for _ in self.traces]

    def snapshot(self) -> dict:
        return copy.deepcopy({
            "segments": self.segments, "device_traces": self.traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0,
                                   "expandable_segments": False,
                                   "pinned_num_register_threads": 1,
                                   "release_lock_on_cudamalloc": False,
                                   "pinned_use_cuda_host_register": False,
                                   "roundup_power2_divisions": {}},
            "external_annotations": []})

    def devices(self) -> list[int]:
        return list(range(len(self.traces)))

    def key(self):
        return (self.counter,)

    def allocations(self) -> int:
        return self.counter

    def measure(self, enable, calls: int = 200):
        def loop():
            t0 = time.perf_counter()
            for _ in range(calls):
                self.free(self.alloc(512))
            return (time.perf_counter() - t0) / calls
        without = loop()
        enable()
        with_ = loop()
        return trace.Cost("CUDA allocation", without, with_, calls)

    # the allocator
    def _frames(self, depth: int) -> list[dict]:
        out = []
        f = sys._getframe(depth)
        while f is not None:
            out.append({"filename": f.f_code.co_filename, "line": f.f_lineno,
                        "name": f.f_code.co_name})
            f = f.f_back
        return out

    def _event(self, device: int, action: str, addr: int, size: int, frames) -> None:
        if not self.recording:
            return
        t = self.traces[device]
        t.append({"action": action, "addr": addr, "size": size, "stream": 0,
                  "time_us": int(time.time() * 1e6), "compile_context": "N/A",
                  "user_metadata": "", "frames": frames})
        if len(t) > self.max_entries:
            del t[0]

    def alloc(self, size: int, *, frames: bool = True, device: int = 0, cpp: bool = False) -> int:
        block = (size + 511) // 512 * 512
        total = max(block, 2 * MiB if block <= MiB else block)
        addr = self.next_addr
        self.next_addr += total + 0x100000
        fr = self._frames(1) if (self.recording and frames and self.context) else []  # this frame first
        if self.recording and cpp:
            fr = CPP_FRAMES + fr
        blocks = [{"address": addr, "size": block, "requested_size": size,
                   "state": "active_allocated", "frames": fr}]
        if total > block:
            blocks.append({"address": addr + block, "size": total - block,
                           "requested_size": 0, "state": "inactive", "frames": []})
        self.segments.append({
            "device": device, "address": addr, "total_size": total, "allocated_size": block,
            "active_size": block, "requested_size": size, "stream": 0,
            "segment_type": "small" if total <= 2 * MiB else "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": fr, "blocks": blocks})
        self.counter += 1
        self.allocated += block
        self._event(device, "alloc", addr, size, fr)
        return addr

    def free(self, addr: int) -> None:
        for seg in self.segments:
            b = seg["blocks"][0]
            if b["address"] == addr and b["state"] == "active_allocated":
                b["state"] = "inactive"
                b["frames"] = []
                seg["allocated_size"] = seg["active_size"] = 0
                self.counter += 1
                self.allocated -= b["size"]
                self._event(seg["device"], "free_requested", addr, b["requested_size"], [])
                self._event(seg["device"], "free_completed", addr, b["requested_size"], [])
                return
        raise KeyError(addr)

    def in_thread(self, size: int, cpp: bool = False) -> int:
        """An allocation made by a C++ thread (no Python frame), as autograd's backward;
        ``cpp``: with the C++ frames ``stacks="all"`` gives it."""
        out = []
        th = threading.Thread(target=lambda: out.append(self.alloc(size, frames=False, cpp=cpp)))
        th.start()
        th.join()
        return out[0]


# -- fixtures -------------------------------------------------------------------------------
def _stack_len() -> int:
    return torch._C._len_torch_function_stack()


@pytest.fixture
def tip(ip):
    """The shared shell with trace off before and after (and the mode stack as found)."""
    trace.stop()
    depth = _stack_len()
    hooks = list(sys.meta_path)
    yield ip
    trace.stop()
    assert _stack_len() == depth, "trace left a TorchFunctionMode on the stack"
    assert sys.meta_path == hooks, "trace left an import hook"
    for name in ("pre_run_cell", "post_run_cell"):
        assert not [cb for cb in ip.events.callbacks[name]
                    if getattr(cb, "__self__", None).__class__ is trace.Tracer]


def _magics(ip):
    return ip.magics_manager.registry["GpuMemMagics"]


def _ptr(ip, expr: str) -> int:
    return ip.ev(f"({expr}).untyped_storage().data_ptr()")


def _cuda(ip, feed: FakeAllocator, **kw) -> str:
    ip.user_ns["fake"] = feed
    kw.setdefault("depth", "lines")
    return trace.start(ip, "cuda", feed=feed, **kw)


# -- cells and their names -------------------------------------------------------------------
def test_cell_names_from_the_real_compiler(tip):
    r = run(tip, "x = 1\ny = 2")
    fmap = tip.compile._filename_map
    name = [k for k, v in fmap.items() if v == r.execution_count][-1]
    assert name.startswith("<ipython-input-")
    cells = trace.CellNames(tip)
    assert cells.number(name) == r.execution_count
    assert cells.source(name, 2) == "y = 2"
    # names seen elsewhere: a traceback's, the visualizer's, an unknown file
    assert cells.number("<ipython-input-8-0123456789ab>") == 8
    assert cells.number("In[12]") == 12
    assert cells.number("/usr/lib/python3/foo.py") is None
    assert cells.number(None) is None


def test_ipykernel_cell_files_map_to_cells(tip):
    compiler = pytest.importorskip("ipykernel.compiler")
    saved = tip.compile
    tip.compile = compiler.XCachingCompiler()
    try:
        r = run(tip, "z = 41\nz += 1")
        name = [k for k, v in tip.compile._filename_map.items() if v == r.execution_count][-1]
        assert name.endswith(".py") and "ipykernel_" in name     # /tmp/ipykernel_<pid>/<hash>.py
        cells = trace.CellNames(tip)
        assert cells.number(name) == r.execution_count
        assert cells.source(name, 2) == "z += 1"
    finally:
        tip.compile = saved


# -- the host path, for real ----------------------------------------------------------------------
def test_host_sites_name_cell_line_and_source(tip):
    run(tip, "import torch")
    line = trace.start(tip, "cpu", depth="lines")
    assert line.startswith("trace is on: host recording")
    assert "cost +" in line and "per torch call on the host" in line   # measured, one line
    assert "\n" not in line
    r1 = run(tip, "a = torch.ones(1000)\nb = a * 2\nc = b.view(10, 100)\nb.add_(1);")
    r2 = run(tip, "def grow(x):\n    return x.exp()\n")
    r3 = run(tip, "d = grow(a)")
    n1, n2, n3 = r1.execution_count, r2.execution_count, r3.execution_count
    assert trace.site_of(("cpu", _ptr(tip, "a"))).text == f"cell [{n1}] line 1: a = torch.ones(1000)"
    s = trace.site_of(("cpu", _ptr(tip, "b")))
    assert (s.cell, s.line, s.source) == (n1, 2, "b = a * 2")
    # a view shares its base's storage; an in-place op allocated nothing
    assert trace.site_of(("cpu", _ptr(tip, "c"))) == s
    # the innermost cell frame: the function's line, in the cell that defined it
    s = trace.site_of(("cpu", _ptr(tip, "d")))
    assert (s.cell, s.line, s.source, s.function) == (n2, 2, "return x.exp()", "grow")
    assert s.how == "stack" and s.in_cell
    # by bare pointer too; an unknown pointer has no site
    assert trace.site_of(_ptr(tip, "a")).line == 1
    assert trace.site_of(("cpu", 12345)) is None
    assert trace.sites_of([("cpu", _ptr(tip, "a")), ("cpu", 1)]).keys() == {("cpu", _ptr(tip, "a"))}
    # the cell that ran it: its own line, for %%gpuwatch and the footer
    lines = trace.cell_lines(n3)
    assert [(la.line, la.source, la.bytes) for la in lines] == [(1, "d = grow(a)", 4000)]
    assert lines.peak is None
    lines = trace.cell_lines(n1)
    assert [(la.line, la.bytes) for la in lines] == [(1, 4000), (2, 4000)]
    assert lines.text().startswith(f"cell [{n1}] allocated most: line 1 3.9 KiB (a = torch.ones(1000))")


def test_host_does_not_misattribute(tip):
    run(tip, "import torch")
    trace.start(tip, "cpu", depth="lines")
    r = run(tip, "m = torch.nn.Linear(8, 4)\nloss = m(torch.randn(2, 8)).sum()\nloss.backward()")
    run(tip, "g = m.weight.grad\ng2 = m.weight.grad.detach()\nw = m.weight.data")
    n = r.execution_count
    # parameters: allocated by the Linear's constructor, called from the cell's line 1
    s = trace.site_of(("cpu", _ptr(tip, "m.weight")))
    assert (s.cell, s.line, s.source) == (n, 1, "m = torch.nn.Linear(8, 4)")
    assert s.inner and "torch/nn" in s.inner
    # the gradient: allocated by autograd inside torch, never returned by a torch call
    # that allocated it; reading it (.grad, .detach(), .data) is not its site
    assert trace.site_of(("cpu", _ptr(tip, "g"))) is None
    assert trace.site_of(("cpu", _ptr(tip, "w"))) == s


def test_host_pointer_reuse_gets_the_new_site(tip):
    run(tip, "import torch")
    trace.start(tip, "cpu", depth="lines")
    seen = {}
    for i in range(30):
        r = run(tip, f"t = torch.empty(4096)  # round {i}")
        p = _ptr(tip, "t")
        s = trace.site_of(("cpu", p))
        assert (s.cell, s.line) == (r.execution_count, 1)
        seen.setdefault(p, []).append(r.execution_count)
        run(tip, "del t")
    # the allocator gave some pointer back more than once: each got its own site
    assert any(len(v) > 1 for v in seen.values()) or len(seen) == 30


def test_host_unattributed_grouped_by_site(tip):
    run(tip, "import torch")
    trace.start(tip, "cpu", depth="lines")
    r = run(tip, "keep = [torch.zeros(256) for _ in range(3)]\nbig = torch.zeros(4096)\n"
                 "named = torch.ones(10)")
    n = r.execution_count
    reached = [("cpu", _ptr(tip, "named"))]
    groups = trace.unattributed_sites(reached, "cpu")
    top = groups[0]
    assert (top.site.cell, top.site.line, top.nbytes, top.count) == (n, 2, 16384, 1)
    assert (groups[1].site.line, groups[1].nbytes, groups[1].count) == (1, 3 * 1024, 3)
    assert not any(g.site.line == 3 for g in groups)   # reached by a name
    assert groups[1].text == f"3.0 KiB in 3 blocks · cell [{n}] line 1: " \
                             "keep = [torch.zeros(256) for _ in range(3)]"
    assert json.dumps([g.to_json() for g in groups])


def test_host_save_loads_in_memory_viz(tip, tmp_path):
    from torch.cuda import _memory_viz as mv

    run(tip, "import torch")
    trace.start(tip, "cpu", depth="lines")
    r = run(tip, "h1 = torch.zeros(1 << 18)\nh2 = torch.ones(100)\ntmp = h2 * 3\ndel tmp")
    path = tmp_path / "host.pickle"
    msg = trace.save(str(path))
    assert str(path) in msg
    data = pickle.loads(path.read_bytes())
    names = {f["filename"] for seg in data["segments"] for f in seg["frames"]}
    assert f"In[{r.execution_count}]" in names
    assert not any(n.startswith("<ipython-input-") for n in names)
    assert "total_allocated" in mv.segsum(data)
    text = mv.trace(data)
    assert "entries" in text
    flame = mv.memory(data, format_flamegraph=lambda lines: lines)
    assert f"In[{r.execution_count}]:1:<module>" in flame
    assert "<html>" in mv.trace_plot(data) and "<html>" in mv.segment_plot(data)


def test_host_mode_leaves_the_stack_as_it_was(tip):
    from torch.overrides import TorchFunctionMode

    class Mine(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Mine.calls += 1
            return func(*args, **(kwargs or {}))

    run(tip, "import torch")
    base = _stack_len()
    trace.start(tip, "cpu", depth="lines")
    assert _stack_len() == base + 1
    mine = Mine()
    torch._C._push_on_torch_function_stack(mine)     # the user's mode, above ours
    try:
        trace.stop()
        assert _stack_len() == base + 1
        assert torch._C._get_function_stack_at(base) is mine
        torch.ones(2) + 1
        assert Mine.calls >= 1
    finally:
        torch._C._pop_torch_function_stack()
    assert _stack_len() == base


def test_host_recording_never_fails_a_cell(tip):
    run(tip, "import torch")
    trace.start(tip, "cpu", depth="lines")
    rec = trace.tracer().host
    rec._strided = object()   # every check below it now fails inside the mode ...
    rec.note = lambda *a: 1 / 0
    r = run(tip, "s = torch.ones(3).sum().item()")   # ... and the cell's result stands
    assert tip.user_ns["s"] == 3.0 and rec.errors >= 1


def test_host_cost_on_a_small_training_loop(tip):
    """The cost of the host recording, measured: a small MLP with Adam, alternating
    trace off and on (printed; the host path has no target, the CUDA one has)."""
    run(tip, "import torch, time\ntorch.manual_seed(0)\n"
             "net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), "
             "torch.nn.Linear(128, 10))\nopt = torch.optim.Adam(net.parameters())\n"
             "xb, yb = torch.randn(32, 64), torch.randint(0, 10, (32,))\n"
             "def steps(n):\n    t0 = time.perf_counter()\n    for _ in range(n):\n"
             "        loss = torch.nn.functional.cross_entropy(net(xb), yb)\n"
             "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
             "    return time.perf_counter() - t0\nsteps(5)")
    ratios = []
    for _ in range(5):
        run(tip, "t_off = steps(40)")
        trace.start(tip, "cpu", depth="lines", measure=False)
        run(tip, "t_on = steps(40)")
        trace.stop()
        ratios.append(tip.user_ns["t_on"] / tip.user_ns["t_off"])
    ratios.sort()
    print(f"\n[figures] host trace, MLP+Adam on CPU, 40 steps x5 alternating: "
          f"median {ratios[2]:.2f}x (min {ratios[0]:.2f}, max {ratios[-1]:.2f})")
    assert ratios[2] < 5


# -- the CUDA path on a fake allocator feed ------------------------------------------------------
def test_cuda_sites_from_frames(tip):
    feed = FakeAllocator()
    line = _cuda(tip, feed)
    assert line.startswith("trace is on: CUDA recording (lines: python stacks")
    assert "cost +" in line and "per CUDA allocation" in line
    assert feed.enables[-1] == dict(stacks="python", context="alloc",
                                    max_entries=trace.DEFAULT_MAX_ENTRIES, clear=True)
    assert feed.traces == [[]]       # the measurement's events were cleared
    r1 = run(tip, "class Net:\n    def forward(self, n):\n        return fake.alloc(n)\n")
    r2 = run(tip, "net = Net()\nx = fake.alloc(3 * 1024 * 1024)\nout = net.forward(1 << 20)")
    n1, n2 = r1.execution_count, r2.execution_count
    x, out = tip.user_ns["x"], tip.user_ns["out"]
    assert trace.site_of(("cuda:0", x)).text == \
        f"cell [{n2}] line 2: x = fake.alloc(3 * 1024 * 1024)"
    s = trace.site_of(("cuda:0", out))
    assert (s.cell, s.line, s.source, s.function) == (n1, 3, "return fake.alloc(n)", "forward")
    assert s.inner and "test_trace.py" in s.inner   # the innermost frame: the allocator's caller
    # a pointer inside a block is that block's; by bare pointer; not on this device
    assert trace.site_of(("cuda:0", x + 4096)).line == 2
    assert trace.site_of(x).line == 2
    assert trace.site_of(("cuda:1", x)) is None
    assert trace.site_of(("cuda:0", 1)) is None


def test_cuda_before_trace_and_frameless_blocks(tip):
    feed = FakeAllocator()
    tip.user_ns["fake"] = feed
    run(tip, "early = fake.alloc(5 * 1024 * 1024)")        # before trace was on
    trace.start(tip, "cuda:0", feed=feed, depth="lines")
    r = run(tip, "seed = fake.alloc(512)  # loss.backward(): its ones_like\n"
                 "grad = fake.in_thread(2 * 1024 * 1024)\nafter = fake.alloc(1024)")
    n = r.execution_count
    s = trace.site_of(("cuda:0", tip.user_ns["early"]))
    assert s.how == "before" and s.text == "allocated before trace was on"
    s = trace.site_of(("cuda:0", tip.user_ns["grad"]))
    assert (s.cell, s.line, s.how) == (n, 1, "nearest")
    assert s.text.startswith(f"cell [{n}] line 1: seed = fake.alloc(512)")
    assert "no Python frame" in s.text
    # in the next cell, with no line of its own before it: the cell, from the time
    r2 = run(tip, "lone = fake.in_thread(4096)")
    s = trace.site_of(("cuda:0", tip.user_ns["lone"]))
    assert (s.cell, s.line, s.how) == (r2.execution_count, None, "cell")
    assert s.text.startswith(f"cell [{r2.execution_count}] (no Python frame")


def test_cuda_cpp_stacks_are_no_python_frame(tip):
    """With stacks="all" torch adds C++ frames: those of autograd's thread alone are not a
    site; Python frames below C++ ones still are."""
    feed = FakeAllocator()
    line = _cuda(tip, feed, stacks="all")
    assert "all stacks" in line and feed.enables[-1]["stacks"] == "all"
    r = run(tip, "seed = fake.alloc(512, cpp=True)\ngrad = fake.in_thread(1 << 20, cpp=True)")
    n = r.execution_count
    s = trace.site_of(("cuda:0", tip.user_ns["seed"]))
    assert (s.cell, s.line, s.how) == (n, 1, "stack")
    assert "CUDACachingAllocator" not in (s.inner or "")
    s = trace.site_of(("cuda:0", tip.user_ns["grad"]))
    assert (s.cell, s.line, s.how) == (n, 1, "nearest")
    # the frameless grad counts for the line that allocated last before it
    assert [(la.line, la.bytes) for la in trace.cell_lines(n)] == [(1, MiB + 512)]


def test_cuda_frameless_sites_outlive_torchs_ring_buffer(tip):
    feed = FakeAllocator()
    _cuda(tip, feed, max_entries=50)
    r = run(tip, "seed = fake.alloc(512)\ngrad = fake.in_thread(1 << 20)")
    first = trace.site_of(("cuda:0", tip.user_ns["grad"]))
    assert (first.cell, first.line) == (r.execution_count, 1)
    run(tip, "for _ in range(40):\n    fake.free(fake.alloc(256))")    # 120 events: rotated
    assert all(e["addr"] != tip.user_ns["grad"] for e in feed.traces[0])
    assert trace.site_of(("cuda:0", tip.user_ns["grad"])) == first     # kept from before
    # its event gone before any look: allocated after the last look, before the oldest
    # event kept; one cell ran then: that cell
    r = run(tip, "late = fake.in_thread(4096)\nfor _ in range(40):\n    fake.free(fake.alloc(256))")
    s = trace.site_of(("cuda:0", tip.user_ns["late"]))
    assert (s.how, s.cell, s.line) == ("time", r.execution_count, None), s
    # the history is read after a cell while it is small: the site is kept from then
    r = run(tip, "late2 = fake.in_thread(4096)")
    run(tip, "for _ in range(40):\n    fake.free(fake.alloc(256))")
    s = trace.site_of(("cuda:0", tip.user_ns["late2"]))
    assert (s.how, s.cell) == ("cell", r.execution_count), s


def test_cuda_unattributed_grouped_largest_first(tip):
    feed = FakeAllocator()
    _cuda(tip, feed)
    r = run(tip, "named = fake.alloc(1 << 20)\n"
                 "cache = [fake.alloc(1 << 20) for _ in range(3)]\n"
                 "ws = fake.alloc(32 * 1024 * 1024)\nsmall = fake.alloc(4096)")
    n = r.execution_count
    ns = tip.user_ns
    groups = trace.unattributed_sites({ns["named"]}, "cuda:0")
    assert [(g.site.line, g.nbytes, g.count) for g in groups] == [
        (3, 32 * MiB, 1), (2, 3 * MiB, 3), (4, 4096, 1)]
    assert groups[0].text == (f"32.0 MiB in 1 block · "
                              f"cell [{n}] line 3: ws = fake.alloc(32 * 1024 * 1024)")
    # a block shown as a framework internal (a cuBLAS workspace) is not listed again
    groups = trace.unattributed_sites({ns["named"]}, "cuda:0", {ns["ws"]: "cuBLAS workspace"})
    assert [(g.site.line, g.nbytes) for g in groups] == [(2, 3 * MiB), (4, 4096)]
    # storage keys work as well as pointers; a key of another device reaches nothing here
    by_key = trace.unattributed_sites([("cuda:0", ns["named"]), ("cuda:1", ns["small"])], "cuda:0")
    assert sum(g.nbytes for g in by_key) == 35 * MiB + 4096
    assert trace.unattributed_sites([], "cuda:7") == []


def test_cuda_cell_lines_and_peak(tip):
    feed = FakeAllocator()
    _cuda(tip, feed)
    run(tip, "def step(n):\n    t = fake.alloc(n)\n    fake.free(t)\n")
    r = run(tip, "keep = fake.alloc(8 * 1024 * 1024)\n"
                 "for _ in range(3):\n    step(4 * 1024 * 1024)\n"
                 "spike = fake.alloc(16 * 1024 * 1024)\nfake.free(spike)\n"
                 "seed = fake.alloc(512); grads = fake.in_thread(1024 * 1024)")
    n = r.execution_count
    lines = trace.cell_lines(n)
    got = [(la.line, la.bytes) for la in lines]
    # the frameless grads count for the line that allocated last before them (line 6)
    assert got == [(4, 16 * MiB), (3, 12 * MiB), (1, 8 * MiB), (6, MiB + 512)]
    assert lines[0].source == "spike = fake.alloc(16 * 1024 * 1024)"
    # peak above the cell's start: keep (8) + spike (16), at line 4
    assert (lines.peak.line, lines.peak.bytes) == (4, 24 * MiB)
    assert lines.peaks == {"cuda:0": lines.peak}
    assert lines.held == {1: 8 * MiB, 6: MiB + 512}
    text = lines.text()
    assert text.startswith(f"cell [{n}] allocated most: line 4 16.0 MiB (spike = ")
    assert "peak +24.0 MiB at line 4" in text
    assert trace.cell_lines(n, top=1) == [lines[0]]
    assert json.dumps(lines.to_json())
    assert trace.cell_lines(n + 100) == []


def test_cuda_two_devices(tip):
    feed = FakeAllocator(devices=2)
    _cuda(tip, feed)
    r = run(tip, "a0 = fake.alloc(1 << 20, device=0)\na1 = fake.alloc(2 << 20, device=1)")
    s1 = trace.site_of(("cuda:1", tip.user_ns["a1"]))
    assert (s1.cell, s1.line) == (r.execution_count, 2)
    assert trace.site_of(("cuda:0", tip.user_ns["a1"])) is None
    [g] = trace.unattributed_sites([], "cuda:1")
    assert g.nbytes == 2 * MiB and g.device == "cuda:1"
    lines = trace.cell_lines(r.execution_count)
    assert set(lines.peaks) == {"cuda:0", "cuda:1"}
    assert lines.peak.bytes == 2 * MiB


def test_cuda_save_names_cells_and_loads_in_memory_viz(tip, tmp_path):
    from torch.cuda import _memory_viz as mv

    feed = FakeAllocator()
    _cuda(tip, feed)
    r = run(tip, "p = fake.alloc(1 << 20)\nq = fake.alloc(4096)\nfake.free(q)")
    path = tmp_path / "snap.pickle"
    msg = trace.save(str(path))
    assert "1 cell frame" not in msg and "named In[N]" in msg
    data = pickle.loads(path.read_bytes())
    files = {f["filename"] for seg in data["segments"] for b in seg["blocks"] for f in b["frames"]}
    files |= {f["filename"] for e in data["device_traces"][0] for f in e["frames"]}
    assert f"In[{r.execution_count}]" in files
    assert not any(f.startswith("<ipython-input-") for f in files)
    assert set(data) >= {"segments", "device_traces"}
    assert "total_allocated" in mv.segsum(data)
    assert "entries" in mv.trace(data)
    assert f"In[{r.execution_count}]:1:<module>" in mv.memory(data, format_flamegraph=lambda x: x)
    assert "<html>" in mv.trace_plot(data) and "<html>" in mv.segment_plot(data)
    # the live history keeps the cells' own file names: sites still resolve
    assert trace.site_of(("cuda:0", tip.user_ns["p"])).line == 1


def test_cuda_lazy_init_starts_recording_before_the_first_allocation(tip):
    feed = FakeAllocator(state="lazy")
    line = _cuda(tip, feed)
    assert "waiting for torch to initialise CUDA" in line
    assert "cost is measured when recording starts" in line
    assert len(feed.init_calls) == 1 and not feed.recording
    r = run(tip, "fake.lazy_init()\nfirst = fake.alloc(1 << 20)")
    assert feed.recording
    assert trace.site_of(("cuda:0", tip.user_ns["first"])).line == 2
    assert trace.site_of(("cuda:0", tip.user_ns["first"])).cell == r.execution_count
    assert "CUDA recording" in trace.status() and "cost +" in trace.status()
    assert "CUDA allocations since on" in trace.status()
    # off before CUDA ever started: the queued call is taken back
    trace.stop()
    feed2 = FakeAllocator(state="lazy")
    _cuda(tip, feed2)
    trace.stop()
    assert feed2.init_calls == [] and not feed2.recording


def test_cuda_off_stops_recording_and_queries_answer_nothing(tip):
    feed = FakeAllocator()
    _cuda(tip, feed)
    run(tip, "v = fake.alloc(4096)")
    assert trace.is_on()
    assert trace.stop() == "trace is off"
    assert not feed.recording and not trace.is_on()
    assert trace.site_of(("cuda:0", tip.user_ns["v"])) is None
    assert trace.unattributed_sites([], "cuda:0") == []
    assert trace.cell_lines(1) == [] and trace.cell_lines(1).note == "trace is off"
    assert trace.status() == "trace is off"
    with pytest.raises(RuntimeError):
        trace.save("/tmp/never.pickle")


def test_cuda_snapshot_is_read_once_while_counters_stay(tip):
    feed = FakeAllocator()
    _cuda(tip, feed)
    run(tip, "keys = [('cuda:0', fake.alloc(4096)) for _ in range(50)]")
    calls = []
    real = feed.snapshot
    feed.snapshot = lambda: calls.append(1) or real()
    sites = trace.sites_of(tip.user_ns["keys"])
    assert len(sites) == 50 and all(s.line == 1 for s in sites.values())
    once = len(calls)
    assert once <= 1      # none where the history was read after the cell already
    trace.unattributed_sites([], "cuda:0")
    trace.cell_lines(1)
    assert trace.segments() is not None
    assert len(calls) == once
    run(tip, "fake.alloc(1)")       # read after the cell (the history is small), once
    trace.unattributed_sites([], "cuda:0")
    trace.sites_of(tip.user_ns["keys"])
    assert len(calls) == once + 1


# -- the magic and the setting -----------------------------------------------------------------------
def test_magic_trace_on_status_save_off(tip, tmp_path, capsys):
    run(tip, "import torch")
    magics = _magics(tip)
    trace_magics.magic_trace(magics, ["on", "--device", "cpu"])
    out = capsys.readouterr().out
    assert out.startswith("trace is on: host recording") and out.count("\n") == 1
    r = run(tip, "mt = torch.zeros(100)")
    trace_magics.magic_trace(magics, [])
    assert capsys.readouterr().out.startswith("trace is on")
    path = tmp_path / "m.pickle"
    trace_magics.magic_trace(magics, ["--save", str(path)])
    assert "saved" in capsys.readouterr().out and path.exists()
    assert f"In[{r.execution_count}]" in {f["filename"] for s in pickle.loads(path.read_bytes())[
        "segments"] for f in s["frames"]}
    trace_magics.magic_trace(magics, ["off"])
    assert capsys.readouterr().out.strip() == "trace is off"
    from IPython.core.error import UsageError
    with pytest.raises(UsageError):
        trace_magics.magic_trace(magics, ["--save", str(path)])
    with pytest.raises(UsageError):
        trace_magics.magic_trace(magics, ["on", "--max-entries", "0"])


def test_setting_starts_trace_at_load_and_unload_stops_it(tip):
    run(tip, "import torch")
    from jupyter_gpumem.session import session_of

    for setting, site_line in ((True, None), ("cell", None), ("lines", 1)):
        trace_magics.on_load(tip, types.SimpleNamespace(trace=setting, default_device="cpu"))
        assert trace.is_on() and trace.tracer().host_state == "on"
        assert session_of(tip).tracer is trace.tracer(), "the shell's session owns it"
        r = run(tip, "first = torch.ones(7)")
        s = trace.site_of(("cpu", _ptr(tip, "first")))
        assert (s.cell, s.line) == (r.execution_count, site_line)
        tip.run_line_magic("unload_ext", "jupyter_gpumem")      # the session's teardown
        assert not trace.is_on()
        tip.run_line_magic("load_ext", "jupyter_gpumem")
    trace_magics.on_load(tip, types.SimpleNamespace(trace=False))
    assert not trace.is_on()


# -- trace on before `import torch`: the import hook, in a child process ----------------------------
CHILD = textwrap.dedent("""
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    from jupyter_gpumem.core import trace
    assert "torch" not in sys.modules
    line = trace.start(sh, "auto", depth="lines")
    hooks = [type(f).__name__ for f in sys.meta_path]
    r = sh.run_cell("import torch\\nfirst = torch.arange(10.)", store_history=True)
    assert r.success, r.error_in_exec
    site = trace.site_of(("cpu", sh.user_ns["first"].untyped_storage().data_ptr()))
    print(json.dumps({"line": line, "hooks": hooks, "count": r.execution_count,
                      "after": [type(f).__name__ for f in sys.meta_path],
                      "loader": type(sys.modules["torch"].__loader__).__name__,
                      "site": site and site.to_json(), "status": trace.status()}))
    trace.stop()
""")


def test_trace_on_before_import_torch(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=240, env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "waiting for `import torch`" in got["line"]
    assert "AfterImport" in got["hooks"] and "AfterImport" not in got["after"]
    assert got["loader"] != "PostExecLoader"
    assert got["site"]["cell"] == got["count"] and got["site"]["line"] == 2
    assert got["site"]["source"] == "first = torch.arange(10.)"
    assert "host recording" in got["status"]


# -- the framework's side comes from its backend --------------------------------------------------
def test_trace_follows_the_backend_that_gives_a_feed(tip, monkeypatch, tmp_path):
    """Trace asks the backends for a feed and a host recorder: by default torch's; a
    backend of another framework that gives a feed is followed the same way (its import
    waited for, its feed recorded, no host recorder said so), with no torch in it."""
    from jupyter_gpumem import backends as _backends
    from jupyter_gpumem.backends.torch_trace import CudaFeed

    run(tip, "import torch")
    trace.start(tip, "cpu", depth="lines")
    tr = trace.tracer()
    assert tr.backend.name == "torch" and type(tr.feed) is CudaFeed
    assert type(tr.host).__module__ == "jupyter_gpumem.backends.torch_trace"
    trace.stop()

    feed = FakeAllocator(state="absent")

    class OtherBackend(_backends.Backend):
        name, module = "otherfw", "otherfw_runtime"

        def trace_feed(self):
            return feed

    other = OtherBackend()
    monkeypatch.setattr(_backends.REGISTRY, "backends", [_backends.Backend(), other])
    (tmp_path / "otherfw_runtime.py").write_text("")   # installed, with its metadata
    (tmp_path / "otherfw_runtime-1.0.dist-info").mkdir()
    (tmp_path / "otherfw_runtime-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: otherfw_runtime\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "otherfw_runtime", raising=False)
    line = trace.start(tip, "all", depth="lines")
    tr = trace.tracer()
    assert tr.backend is other and tr.feed is feed
    assert "waiting for `import otherfw_runtime`" in line, line
    feed._state = "ready"
    run(tip, "import otherfw_runtime")
    assert feed.recording and tr.cuda == "on"
    assert "host not available (otherfw has no host recorder)" in trace.status(), trace.status()
    tip.user_ns["fake"] = feed
    r = run(tip, "a = fake.alloc(4096)")
    site = trace.site_of(("cuda:0", tip.user_ns["a"]))
    assert site.cell == r.execution_count and site.source == "a = fake.alloc(4096)"
    trace.stop()
    assert not feed.recording


def test_name_rows_say_where_each_storage_was_allocated(ip):
    """``%gpumem NAME`` while trace is on: each row names its cell and line."""
    from conftest import run

    run(ip, "import torch")
    run(ip, "%gpumem trace on --lines --device cpu")
    try:
        run(ip, "x = torch.ones(1000)\ny = [torch.zeros(2000), x]")
        snap = ip.run_line_magic("gpumem", "y --device cpu -o")
    finally:
        run(ip, "%gpumem trace off")
    (detail,) = snap.details
    where = {r.path: r.allocated_at for r in detail.rows}
    assert where["y[0]"].endswith("line 2: y = [torch.zeros(2000), x]"), where
    assert where["y[1]"].endswith("line 1: x = torch.ones(1000)"), where
    assert "allocated at" in repr(snap)


def test_the_footer_and_gpuwatch_name_the_lines_that_allocated(ip, capsys):
    from conftest import run

    run(ip, "import torch")
    run(ip, "%gpumem trace on --lines --device cpu")
    try:
        run(ip, "%gpumem watch on --device cpu")
        capsys.readouterr()
        run(ip, "a = torch.ones(100)\nb = torch.zeros(300_000)")
        footer = capsys.readouterr().out
        run(ip, "%gpumem watch off")
        ip.run_cell_magic("gpuwatch", "--device cpu -o w", "c = torch.ones(200_000)")
        report = repr(ip.user_ns["w"])
    finally:
        run(ip, "%gpumem trace off")
    assert "b = torch.zeros(300_000)" in footer, footer
    assert "c = torch.ones(200_000)" in report, report


def test_what_no_name_reaches_is_grouped_by_site_in_the_snapshot(ip):
    """The snapshot's unattributed part, by allocation site (the host keeps no allocator
    figure to be unattributed, so the device's unattributed bytes are given here)."""
    import importlib

    from conftest import run

    snap_mod = importlib.import_module("jupyter_gpumem.core.snapshot")
    run(ip, "import torch")
    run(ip, "%gpumem trace on --lines --device cpu")
    try:
        run(ip, "kept = torch.ones(1000)\nhidden_away = [torch.zeros(50_000)]")
        lost = ip.user_ns.pop("hidden_away")   # held by the test only: no name reaches it
        reached = {("cpu", ip.user_ns["kept"].untyped_storage().data_ptr()): 4000}
        sites = snap_mod.sites_of_unattributed({"cpu": 200_000}, reached)
    finally:
        run(ip, "%gpumem trace off")
    del lost
    (first, *_) = sites["cpu"]
    assert "hidden_away = [torch.zeros(50_000)]" in first["text"], sites
    assert first["bytes"] == 200_000


def test_trace_hears_of_cells_through_the_session_not_hooks_of_its_own(ip):
    """One pair of cell hooks per shell: `%gpumem trace on` joins the session's."""
    from jupyter_gpumem.session import session_of

    events = ip.events.callbacks
    before = (len(events["pre_run_cell"]), len(events["post_run_cell"]))
    run(ip, "%gpumem trace on --device cpu")
    try:
        assert (len(events["pre_run_cell"]), len(events["post_run_cell"])) == before
        session = session_of(ip)
        tr = trace.tracer()
        assert (tr._pre, tr._post) in session.dispatch.hooks
        run(ip, "x = 1")
        assert tr.spans is session.cells, "one record of cell spans: the session's"
        assert any(s.count == ip.execution_count - 1 for s in session.cells), "the cell was heard"
    finally:
        run(ip, "%gpumem trace off")
    assert (trace.tracer() is None or not trace.is_on())
    assert not any(h[0].__qualname__.startswith("Tracer.") for h in session_of(ip).dispatch.hooks)
