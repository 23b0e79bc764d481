"""``%%gpumem fit VAR``: the largest batch a training step takes on the memory free now.

Each trial runs the cell's code in a scratch namespace (a copy of the user's, with ``VAR``
bound to the size), inside a peak scope of :data:`~..watch.peaks.LEDGER` (the allocator's
exact counter on a GPU, the process's VmHWM on the host); an out-of-memory is caught, its
traceback's frames cleared, the scratch names dropped and the caches given back before the
next trial. :class:`~..backends.torch_fit.StepGuard` sets gradients aside and restores
buffers and parameters. The search is :func:`~..core.fit.search`.
"""
from __future__ import annotations

import ctypes
import gc
import resource
import time
import traceback
import types
from typing import Any

from IPython.core.error import UsageError

from ..backends import active_backends
from ..backends import torch_fit
from ..core import devices as _devices
from ..core.fit import Grid, search
from ..core.fit.result import FitResult, Trial, accumulation
from ..units import fmt_bytes, one_line
from ..watch.peaks import LEDGER
from .args import parser, split_line

try:
    _LIBC = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc: the heap keeps its free pages
    _LIBC = None

USAGE = "%%gpumem fit VAR [--min 1] [--max N] [--step 8] [--target B] [--device ...] [-o NAME]"

#: the counter and field each device's peak is read from, and how the answer names it
MEASURES = {"cpu": (("rss", "cpu"), "rss", "the process's peak resident set, VmHWM")}


def _parser():
    p = parser("%%gpumem fit", "the largest batch the cell's step takes on the memory free now",
               output=None)
    p.add_argument("variable", help="the name the cell reads as its batch size")
    p.add_argument("--min", dest="smallest", type=int, default=1)
    p.add_argument("--max", dest="biggest", type=int, default=None)
    p.add_argument("--step", type=int, default=8)
    p.add_argument("--target", type=int, default=None)
    p.add_argument("-o", dest="output", default=None, metavar="NAME",
                   help="store the result in this variable")
    return p


def code_names(code: types.CodeType) -> set[str]:
    """Every global name the code (and the functions and comprehensions it defines) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def referenced(names: set[str], ns: dict, depth: int = 3) -> list[Any]:
    """The values the names reach in ``ns``, and, through the functions among them (and
    bound methods: their object too), the globals and closure cells those functions read,
    ``depth`` calls deep: what a step such as ``train_step(bs)`` touches."""
    out: list[Any] = []
    seen: set[int] = set()

    def add(value: Any, level: int) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        out.append(value)
        owner = getattr(value, "__self__", None) if isinstance(value, types.MethodType) else None
        if owner is not None:
            add(owner, level)
        fn = value.__func__ if isinstance(value, types.MethodType) else value
        if level and isinstance(fn, types.FunctionType):
            scope = fn.__globals__
            for name in code_names(fn.__code__):
                if name in scope:
                    add(scope[name], level - 1)
            for cell in fn.__closure__ or ():
                try:
                    add(cell.cell_contents, level - 1)
                except ValueError:   # an empty cell
                    pass

    for name in sorted(names):
        if name in ns:
            add(ns[name], depth)
    return out


def host_free() -> int | None:
    """What a new allocation of this process may take: the address space left under
    RLIMIT_AS, and the host's available memory, whichever is less."""
    status = _devices.read_proc("/proc/self/status").decode()
    vm = next(int(line.split()[1]) * 1024 for line in status.splitlines()
              if line.startswith("VmSize:"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    meminfo = _devices.read_proc("/proc/meminfo").decode()
    avail = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines()
                  if line.startswith("MemAvailable:")), None)
    left = None if soft == resource.RLIM_INFINITY else soft - vm
    figures = [f for f in (left, avail) if f is not None]
    return min(figures) if figures else None


def _device(magics: Any, value: str | None) -> str:
    device = magics.device(value)
    if device == "auto":
        accs = _devices.accelerators()
        device = accs[0].id if accs else "cpu"
    if device == "cuda":
        device = "cuda:0"
    if device != "cpu" and not device.startswith("cuda:"):
        raise UsageError(f"fit runs on one device, cpu or cuda:N (not {device})")
    return device


def _release() -> None:
    """Free what a trial left: its cycles, the frameworks' caches, the C heap's free pages."""
    gc.collect()
    if _LIBC is not None:
        try:
            _LIBC.malloc_trim(0)
        except Exception:  # noqa: BLE001 - only glibc has it
            pass
    for backend in active_backends():
        try:
            backend.release()
        except Exception:  # noqa: BLE001 - a cache left is memory the next trial lacks
            pass


def magic_fit(magics: Any, line: str, cell: str) -> Any:
    """Parse, check, then search (see the module's docstring)."""
    args = _parser().parse_args(split_line(line))
    var = args.variable
    if not var.isidentifier():
        raise UsageError(f"fit needs the name of the batch size, not {var!r}")
    if args.output is not None and not args.output.isidentifier():
        raise UsageError(f"-o needs a variable name, not {args.output!r}")
    if args.smallest < 1 or args.step < 1:
        raise UsageError("--min and --step must be at least 1")
    if args.biggest is not None and args.smallest > args.biggest:
        raise UsageError(f"--min ({args.smallest}) is above --max ({args.biggest})")
    if args.target is not None and args.target < 1:
        raise UsageError("--target must be at least 1")
    grid = Grid(args.smallest, args.biggest, args.step)
    if grid.count < 1:
        raise UsageError(f"no multiple of --step {args.step} lies between --min "
                         f"{args.smallest} and --max {args.biggest}")
    device = _device(magics, args.device)
    shell = magics.shell
    source = shell.transform_cell(cell)
    try:
        code = compile(source, "<%%gpumem fit>", "exec")
    except SyntaxError as exc:
        raise UsageError(f"the cell does not compile: {exc}") from None
    names = code_names(code)
    if var not in names:
        raise UsageError(f"the cell never reads {var}: nothing to vary")
    if not source.strip():
        raise UsageError("the cell is empty: give the training step to fit")
    result = run_fit(shell.user_ns, code, names, var, grid, device)
    if args.target is not None:
        result.accumulation = accumulation(args.target, result.largest)
    if args.output:
        shell.user_ns[args.output] = result
    return result


class _Stop(Exception):
    """A trial raised something other than out-of-memory: the search stops, that shows."""


def run_fit(user_ns: dict, code: types.CodeType, names: set[str], var: str, grid: Grid,
            device: str) -> FitResult:
    """The search on ``device``, every trial's garbage freed, the notebook left as it was."""
    guard = torch_fit.StepGuard(referenced(names - {var}, user_ns))
    if device == "cpu":
        key, fld, measure = MEASURES["cpu"]
        free = host_free

        def used() -> int | None:
            return _devices.process_memory()[0]
    else:
        key, fld, measure = torch_fit.peak_field(device)

        def free() -> int | None:
            return torch_fit.device_free(device)

        def used() -> int | None:
            got = torch_fit.device_used(device)
            return None if got is None else got[0]
    failure: list[BaseException] = []

    def run(size: int) -> Trial:
        if failure:
            raise _Stop
        before = free()
        scratch = dict(user_ns)
        scratch[var] = size
        error = None
        scope = LEDGER.open([device])
        t0 = time.perf_counter()
        try:
            exec(code, scratch)  # noqa: S102 - the user's own cell, as IPython would run it
            torch_fit.synchronize(device)
        except BaseException as exc:  # noqa: BLE001 - out-of-memory is a trial's outcome
            if not torch_fit.is_oom(exc) or isinstance(exc, KeyboardInterrupt):
                failure.append(exc)
            else:
                error = one_line(f"{type(exc).__name__}: {exc}")
                traceback.clear_frames(exc.__traceback__)
                exc.__traceback__ = None
            del exc
        finally:
            seconds = time.perf_counter() - t0
            LEDGER.close(scope, [device])
            scratch.clear()
            del scratch
            changed = guard.after_trial()
            _release()
        if changed:
            failure.append(UsageError(
                "the cell changes the parameters (their version counters moved: an optimizer "
                "step?): fit measures a step without it, and refused; " + (
                    "the parameters were written back" if changed == "restored" else
                    "they could not be written back (no copy was kept past the first trial)")))
        guard.drop_param_copies()
        if failure:
            raise _Stop
        start = scope.start.get(key, {}).get(fld)
        top = scope.peak(key, fld)
        peak = None if start is None or top is None else max(top - start, 0)
        return Trial(size=size, ok=error is None, peak=peak, seconds=seconds, error=error,
                     free=before, requested=torch_fit.requested(error) if error else None)

    _release()
    start_used = used()
    guard.begin()
    aside = (len(guard.grads), guard.grad_bytes)
    try:
        _release()
        result = search(run, grid, free, variable=var, device=device, measure=measure)
    except _Stop:
        result = None
    finally:
        guard.end()
        _release()
    if failure:
        raise failure[0]
    result.before, result.after = start_used, used()
    notes = []
    if aside[0]:
        notes.append(f"gradients: the trials ran as after zero_grad(set_to_none=True); the "
                     f"{aside[0]} gradients that existed ({fmt_bytes(aside[1])}) were set aside"
                     + (" in host memory" if device != "cpu" else " (still held on the host)")
                     + " and put back")
    elif guard.params:
        notes.append("gradients: none existed before; the trials' own were dropped")
    result.notes = notes + result.notes
    return result
