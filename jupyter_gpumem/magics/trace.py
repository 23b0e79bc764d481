"""``%gpumem trace``: argument parsing over the allocation trace (:mod:`..core.trace`)."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from ..core.trace import (CONTEXTS, DEFAULT_MAX_ENTRIES, STACKS, is_on, save, start, status, stop,
                          tracer)
from ..session import hook_cells, unhook_cells
from .args import parser

#: how trace hears of cells: through the shell's session (with the footer and the views),
#: IPython's own events where the extension is not loaded in that shell
SESSION_HOOKS = (hook_cells, unhook_cells)


def _parser():
    p = parser("%gpumem trace", "record where each block of memory was allocated", output=None)
    p.add_argument("state", nargs="?", choices=("on", "off", "status"), default="status")
    p.add_argument("--stacks", choices=STACKS, default=None,
                   help="python: Python frames (cheaper); all: C++ frames too")
    p.add_argument("--context", choices=CONTEXTS, default=None,
                   help="alloc: stacks of allocations; all: of frees too")
    p.add_argument("--max-entries", type=int, default=None, dest="max_entries",
                   help="allocator events torch keeps")
    p.add_argument("--save", default=None, metavar="FILE",
                   help="write a snapshot PyTorch's memory visualizer opens")
    return p


def magic_trace(magics: Any, argv: list[str]) -> None:
    """``%gpumem trace on|off [--stacks ...] [--max-entries N] [--device D] [--save FILE]``."""
    args = _parser().parse_args(argv)
    if args.max_entries is not None and args.max_entries < 1:
        raise UsageError("--max-entries must be at least 1")
    if args.state == "on":
        device = magics.device(args.device) if args.device is not None else \
            magics.device(None)
        print(start(magics.shell, device, stacks=args.stacks or "python",
                    context=args.context or "alloc",
                    max_entries=args.max_entries or DEFAULT_MAX_ENTRIES,
                    cells=SESSION_HOOKS))
        if hasattr(magics, "trace"):
            magics.trace = True
    elif args.state == "off":
        print(stop())
        if hasattr(magics, "trace"):
            magics.trace = False
    elif args.save is None:
        print(status())
    if args.save is not None:
        if not is_on():
            raise UsageError("trace is off: `%gpumem trace on` first, then run the cells to record")
        try:
            print(save(args.save, args.device))
        except (OSError, RuntimeError) as exc:
            raise UsageError(f"--save: {exc}") from None


def on_load(shell: Any, magics: Any) -> None:
    """At ``%load_ext``: with ``c.GpuMemMagics.trace = True``, trace from the first cell;
    trace stops when the extension unloads."""
    if hasattr(magics, "add_cleanup"):
        magics.add_cleanup(lambda: stop() if is_on() and tracer().shell is shell else None)
    if getattr(magics, "trace", False) is True and not is_on():
        device = getattr(magics, "default_device", "auto") or "auto"
        start(shell, device, cells=SESSION_HOOKS)
