"""PyTorch's side of ``%gpumem trace`` (:mod:`jupyter_gpumem.core.trace`): the feed of
its CUDA allocator's history and the recorder of its host storages.

CUDA: torch's ``_record_memory_history``, read back with ``_snapshot()``; started inside
torch's lazy init where CUDA is not initialised yet (:meth:`CudaFeed.on_init`). Host: a
``TorchFunctionMode`` on the shell's thread notes the cell frames of each storage a torch
call returns for the first time (keyed by pointer, with a weak reference to the storage).
Both are made by :class:`~.pytorch.TorchBackend` and read torch from ``sys.modules``:
nothing here imports torch before the user does. The details:
docs/ARCHITECTURE.md#the-allocation-trace.
"""
from __future__ import annotations

import os
import sys
import time
from collections import deque
from typing import Any, Callable

from .base import TraceCost as Cost, framework_module
from .base import is_a

#: the events of torch's history, as trace reads them (the host's are written the same way)
_ALLOC, _FREE = "alloc", "free_requested"
_HERE = os.path.abspath(__file__)
#: the calls of one round of trace's calibration (four rounds with, four without)
CALIBRATION_CALLS = 100


# -- the CUDA allocator's history ------------------------------------------------------------------
class CudaFeed:
    """torch's CUDA caching allocator: what trace's ``Tracer`` asks of it. A test (or an
    allocator of another framework shaped like torch's) gives its own."""

    name = "torch"

    def torch(self):
        return framework_module("torch")

    def state(self) -> str:
        """``absent`` (torch not imported), ``unavailable`` (no CUDA), ``lazy`` (CUDA not
        initialised yet) or ``ready``."""
        torch = self.torch()
        if torch is None or getattr(torch, "cuda", None) is None:
            return "absent"
        try:
            if not torch.cuda.is_available():
                return "unavailable"
            return "ready" if torch.cuda.is_initialized() else "lazy"
        except Exception:  # noqa: BLE001
            return "unavailable"

    def on_init(self, fn: Callable[[], None]) -> Callable[[], None] | None:
        """Run ``fn`` inside torch's lazy CUDA init (before its first allocation); return
        how to take it back."""
        torch = self.torch()
        torch.cuda._lazy_call(fn)
        queued = getattr(torch.cuda, "_queued_calls", None)

        def cancel():
            if is_a(queued, list):
                for i, item in enumerate(list(queued)):
                    if (item[0] if is_a(item, tuple) else item) is fn:
                        try:
                            queued.pop(i)
                        except IndexError:
                            pass
                        break
        return cancel

    def enable(self, *, stacks: str, context: str, max_entries: int, clear: bool = False) -> None:
        record = self.torch().cuda.memory._record_memory_history
        kwargs = dict(enabled="all", context=context, stacks=stacks, max_entries=max_entries)
        if clear:
            try:
                record(**kwargs, clear_history=True)
                return
            except TypeError:
                pass
        record(**kwargs)

    def disable(self) -> None:
        self.torch().cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> dict:
        return self.torch().cuda.memory._snapshot()

    def devices(self) -> list[int]:
        try:
            return list(range(self.torch().cuda.device_count()))
        except Exception:  # noqa: BLE001
            return []

    def _stats(self, index: int) -> dict:
        return self.torch()._C._cuda_memoryStats(index)

    def key(self) -> tuple | None:
        """What changes whenever any device's blocks do (counts of allocations and frees
        of blocks and segments)."""
        out = []
        try:
            for i in self.devices():
                s = self._stats(i)
                a, g = s.get("allocation", {}).get("all", {}), s.get("segment", {}).get("all", {})
                out.append((a.get("allocated"), a.get("freed"), g.get("allocated"), g.get("freed")))
        except Exception:  # noqa: BLE001
            return None
        return tuple(out)

    def allocations(self) -> int | None:
        """Allocations made so far on every device (the allocator's counter)."""
        try:
            return sum(int(self._stats(i)["allocation"]["all"]["allocated"]) for i in self.devices())
        except Exception:  # noqa: BLE001
            return None

    def measure(self, enable: Callable[[], None], calls: int = CALIBRATION_CALLS) -> Cost:
        """Time ``calls`` allocations (each freed at once) of 512 bytes on the current
        device without recording, then ``enable()`` and with it (the best of three
        rounds after one to warm up: a few hundred allocations each way). They reuse one cached
        block; the events they add are cleared by the caller."""
        torch = self.torch()
        empty, uint8 = torch.empty, torch.uint8
        dev = torch.device("cuda", torch.cuda.current_device())

        def deep(n: int):
            # each allocation 8 fresh Python calls deep, as inside a model's forward (torch
            # gathers every frame of the stack for each allocation)
            return deep(n - 1) if n else empty(512, dtype=uint8, device=dev)

        without = _seconds_per_call(deep, calls)
        enable()
        with_ = _seconds_per_call(deep, calls)
        return Cost("CUDA allocation", without, with_, calls)


_DEPTH = 8


def _seconds_per_call(deep: Callable[[int], Any], calls: int) -> float:
    """Seconds one ``deep(_DEPTH)`` takes: the best of three rounds of ``calls``, after one
    round to warm up."""
    def round_() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            deep(_DEPTH)
        return (time.perf_counter() - t0) / calls

    round_()
    return min(round_() for _ in range(3))


# -- the host: a TorchFunctionMode -----------------------------------------------------------------
class _HostRecord:
    __slots__ = ("weak", "nbytes", "inner", "cin", "cout", "time")

    def __init__(self, weak, nbytes, inner, cin, cout, t):
        self.weak, self.nbytes, self.inner, self.cin, self.cout, self.time = weak, nbytes, inner, cin, cout, t


_MODE_CLASS: list = []


def _mode_class(torch):
    """The TorchFunctionMode subclass, made once torch is there (never imported here)."""
    if _MODE_CLASS:
        return _MODE_CLASS[0]
    from torch.overrides import TorchFunctionMode

    class _TraceMode(TorchFunctionMode):
        """Notes the Python stack of each storage a torch function returns first."""

        def __init__(self, recorder: "HostRecorder") -> None:
            super().__init__()
            self._recorder = recorder

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if kwargs is None:
                kwargs = {}
            out = func(*args, **kwargs)
            try:
                self._recorder.note(func, args, kwargs, out)
            except Exception:  # noqa: BLE001 - recording never fails the user's call
                self._recorder.errors += 1
            return out

    _MODE_CLASS.append(_TraceMode)
    return _TraceMode


class HostRecorder:
    """Allocation sites of host (CPU) storages, from what torch functions return.

    ``max_entries`` bounds what is kept, as torch's ring does on a GPU: at most that many
    events (allocations and frees, the oldest dropped first) and at most that many
    storages' records (the oldest recorded dropped first: its storage loses its site)."""

    def __init__(self, cells: Any, max_entries: int = 100_000, stop_code: Any = None) -> None:
        torch = framework_module("torch")
        self.torch = torch
        self.cells = cells
        self.max_entries = max(int(max_entries), 1)
        #: pointer -> record, oldest recorded first (at most ``max_entries``)
        self.records: dict[int, _HostRecord] = {}
        self.by_cell: dict[int, dict[tuple, int]] = {}   # cell -> (filename, line) -> bytes
        self.events: deque = deque(maxlen=self.max_entries)
        #: records dropped to stay within ``max_entries`` (their storages still live)
        self.dropped = 0
        self.errors = 0
        self._tensor, self._param = torch.Tensor, torch.nn.Parameter
        self._strided = torch.strided
        base = torch._C.StorageBase
        self._expired, self._free_weak = base._expired, base._free_weak_ref
        self._stop_code = stop_code
        self._sweep_at = 4096
        #: take each storage's Python frames (trace's line depth); False: its time alone
        #: (cell depth: the cell comes from the time)
        self.frames = True
        self.mode = _mode_class(torch)(self)

    # -- the mode on the shell's thread ------------------------------------------------
    def push(self) -> None:
        if self.on_stack():
            return
        self.torch._C._push_on_torch_function_stack(self.mode)

    def on_stack(self) -> bool:
        C = self.torch._C
        try:
            return any(C._get_function_stack_at(i) is self.mode
                       for i in range(C._len_torch_function_stack()))
        except Exception:  # noqa: BLE001
            return False

    def pop(self) -> None:
        """Take the mode off this thread's stack, wherever it is in it (modes the user
        pushed above it stay, in their order)."""
        C = self.torch._C
        above = []
        try:
            while C._len_torch_function_stack():
                top = C._pop_torch_function_stack()
                if top is self.mode:
                    break
                above.append(top)
        finally:
            for m in reversed(above):
                C._push_on_torch_function_stack(m)

    # -- recording -------------------------------------------------------------------
    def note(self, func, args, kwargs, out) -> None:
        tp = type(out)
        if tp is self._tensor or tp is self._param:
            self._one(func, args, kwargs, out)
        elif tp is tuple or tp is list:
            for o in out:
                if type(o) is self._tensor:
                    self._one(func, args, kwargs, o)

    def _one(self, func, args, kwargs, t) -> None:
        if not t.is_cpu or t.layout is not self._strided or t._is_view():
            return
        ptr = t.data_ptr()
        if not ptr:
            return
        rec = self.records.get(ptr)
        if rec is not None and not self._expired(rec.weak):
            return
        if getattr(func, "__name__", "") == "__get__":
            return   # a property (x.grad, x.data): it allocates nothing
        for a in args:
            if type(a) is self._tensor and a.data_ptr() == ptr:
                return   # in place, or an alias of an input (detach, out=)
        for a in kwargs.values():
            if type(a) is self._tensor and a.data_ptr() == ptr:
                return
        storage = t.untyped_storage()
        sptr = storage.data_ptr()
        if sptr != ptr:
            rec = self.records.get(sptr)
            if rec is not None and not self._expired(rec.weak):
                return
        nbytes = storage.nbytes()
        inner, cin, cout = self._capture(sys._getframe(3)) if self.frames else (None,) * 3
        if rec is not None:
            self._free_weak(rec.weak)
            self.records.pop(sptr, None)   # re-recorded: now the newest
        now = time.time()
        self.records[sptr] = _HostRecord(storage._weak_ref(), nbytes, inner, cin, cout, now)
        if len(self.records) > self.max_entries:
            self._drop_oldest()
        self.events.append((_ALLOC, sptr, nbytes, now, (inner, cin, cout)))
        if cout is not None:
            n = self.cells.number(cout[0])
            if n is not None:
                lines = self.by_cell.setdefault(n, {})
                k = (cout[0], cout[1])
                lines[k] = lines.get(k, 0) + nbytes
        if len(self.records) >= self._sweep_at:
            self.sweep()

    def _capture(self, f) -> tuple:
        """(innermost, innermost cell frame, outermost cell frame) as
        (filename, line, name), walking up to IPython's ``run_code``."""
        fmap = self.cells.filename_map()
        magic_line = self.cells.magic_line
        stop = self._stop_code
        inner = cin = cout = body = None
        depth = 0
        while f is not None and depth < 256:
            code = f.f_code
            if code is stop:
                break
            fn = code.co_filename
            in_cell = fn in fmap or fn.startswith("<ipython-input-")
            fr = None
            if in_cell and not magic_line(fn, f.f_lineno):
                # (a cell magic's rewritten line is not the user's: its body's line is)
                fr = (fn, f.f_lineno, code.co_name)
            elif in_cell and body is not None:
                fr = self.cells.joined(body, fn, f.f_lineno)   # %%time's body: the cell's
                if fr is not None and inner == body:
                    inner = fr
            if in_cell:
                body = None
            if fr is not None:
                if cin is None:
                    cin = fr
                cout = fr
                if inner is None:
                    inner = fr
            elif body is None and cin is None and self.cells.is_body(fn):
                body = (fn, f.f_lineno, code.co_name)
                if inner is None:
                    inner = body
            elif inner is None and fn != _HERE and not fn.endswith(("torch/overrides.py",
                                                                     "torch/utils/_device.py")):
                inner = (fn, f.f_lineno, code.co_name)
            f = f.f_back
            depth += 1
        return inner, cin, cout

    def _drop_oldest(self) -> None:
        """Past ``max_entries`` records: drop the oldest (a gone storage's as a free)."""
        now = time.time()
        while len(self.records) > self.max_entries:
            p = next(iter(self.records))
            r = self.records.pop(p)
            if self._expired(r.weak):
                self.events.append((_FREE, p, r.nbytes, now, None))
            else:
                self.dropped += 1
            self._free_weak(r.weak)

    def kept(self) -> int:
        """The events kept now (at most ``max_entries``)."""
        return len(self.events)

    def sweep(self) -> None:
        """Drop the records of storages that are gone (amortised: when the table has
        doubled since the last sweep)."""
        now = time.time()
        dead = [p for p, r in self.records.items() if self._expired(r.weak)]
        for p in dead:
            r = self.records.pop(p)
            self._free_weak(r.weak)
            self.events.append((_FREE, p, r.nbytes, now, None))
        self._sweep_at = max(4096, 2 * len(self.records))

    def live(self) -> dict[int, _HostRecord]:
        return {p: r for p, r in self.records.items() if not self._expired(r.weak)}

    def clear(self) -> None:
        for r in self.records.values():
            try:
                self._free_weak(r.weak)
            except Exception:  # noqa: BLE001
                pass
        self.records.clear()
        self.events.clear()
        self.by_cell.clear()
        self.dropped = 0

    # -- reading -----------------------------------------------------------------------
    def record(self, ptr: int) -> _HostRecord | None:
        """The record of the live storage at ``ptr`` (its ``nbytes`` and frames), else None."""
        r = self.records.get(ptr)
        if r is None or self._expired(r.weak):
            return None
        return r

    def measure(self, calls: int = CALIBRATION_CALLS) -> Cost:
        """Time ``calls`` small CPU additions without the mode and with a scratch one
        (that records as this one does into a table of its own, dropped afterwards)."""
        torch = self.torch
        scratch = HostRecorder(self.cells, self.max_entries, self._stop_code)
        scratch.frames = self.frames
        a = torch.ones(16)

        def deep(n: int):
            return deep(n - 1) if n else a + a

        without = _seconds_per_call(deep, calls)
        scratch.push()
        try:
            with_ = _seconds_per_call(deep, calls)
        finally:
            scratch.pop()
            scratch.clear()
        return Cost("torch call on the host", without, with_, calls)
