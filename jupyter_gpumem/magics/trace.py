"""``%gpumem trace``: argument parsing over the allocation trace (:mod:`..core.trace`)."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from ..core import trace as _trace
from ..core.trace import CONTEXTS, DEFAULT_MAX_ENTRIES, STACKS
from ..session import hook_cells, session_of, unhook_cells
from .args import parser

#: how trace hears of cells: through the shell's session (with the footer and the views),
#: IPython's own events where the extension is not loaded in that shell
SESSION_HOOKS = (hook_cells, unhook_cells)


def _parser():
    p = parser("%gpumem trace", "record where each block of memory was allocated", output=None)
    p.add_argument("state", nargs="?", choices=("on", "off", "status"), default="status")
    p.add_argument("--lines", action="store_true",
                   help="the line too (Python stacks on every allocation); without it, the "
                        "cell alone, nearly free")
    p.add_argument("--stacks", choices=STACKS, default=None,
                   help="with --lines: python: Python frames (cheaper); all: C++ frames too")
    p.add_argument("--context", choices=CONTEXTS, default=None,
                   help="with --lines: alloc: stacks of allocations; all: of frees too")
    p.add_argument("--max-entries", type=int, default=None, dest="max_entries",
                   help="allocator events torch keeps")
    p.add_argument("--save", default=None, metavar="FILE.pickle",
                   help="write a snapshot PyTorch's memory visualizer opens (a pickle)")
    return p


def start_for(shell: Any, device: str, depth: str, **kw) -> str:
    """Start trace for ``shell`` with its session's cell hooks and spans; the session
    owns the tracer."""
    session = session_of(shell)
    line = _trace.start(shell, device, depth=depth, cells=SESSION_HOOKS,
                        spans=session.cells if session is not None else None, **kw)
    if session is not None:
        session.tracer = _trace.tracer()
    return line


def stop_for(shell: Any) -> str:
    session = session_of(shell)
    if session is not None and session.tracer is not None:
        return session.stop_trace()
    return _trace.stop()


def magic_trace(magics: Any, argv: list[str]) -> None:
    """``%gpumem trace on|off [--lines] [--stacks ...] [--max-entries N] [--device D]
    [--save FILE.pickle]``."""
    args = _parser().parse_args(argv)
    if args.max_entries is not None and args.max_entries < 1:
        raise UsageError("--max-entries must be at least 1")
    if (args.stacks or args.context) and not args.lines:
        raise UsageError("--stacks and --context go with --lines (cell depth takes no stacks)")
    if args.save is not None:
        try:
            _trace.check_path(args.save)
        except ValueError as exc:
            raise UsageError(f"--save: {exc}") from None
    if args.state == "on":
        device = magics.device(args.device) if args.device is not None else \
            magics.device(None)
        depth = "lines" if args.lines else "cell"
        print(start_for(magics.shell, device, depth, stacks=args.stacks or "python",
                        context=args.context or "alloc",
                        max_entries=args.max_entries or DEFAULT_MAX_ENTRIES))
        if hasattr(magics, "trace"):
            magics.trace = depth
    elif args.state == "off":
        print(stop_for(magics.shell))
        if hasattr(magics, "trace"):
            magics.trace = False
    elif args.save is None:
        print(_trace.status())
    if args.save is not None:
        if not _trace.is_on():
            raise UsageError("trace is off: `%gpumem trace on` first, then run the cells to record")
        try:
            print(_trace.save(args.save, args.device))
        except (OSError, RuntimeError, ValueError) as exc:
            raise UsageError(f"--save: {exc}") from None


def on_load(shell: Any, magics: Any) -> None:
    """At ``%load_ext``: with ``c.GpuMemMagics.trace = True`` (or ``"cell"``, or
    ``"lines"``), trace from the first cell; trace stops when the extension unloads
    (with the session)."""
    setting = getattr(magics, "trace", False)
    if setting in (True, "cell", "lines") and not _trace.is_on():
        device = getattr(magics, "default_device", "auto") or "auto"
        start_for(shell, device, "lines" if setting == "lines" else "cell")
