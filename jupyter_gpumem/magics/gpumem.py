"""``%gpumem`` and ``%%gpuwatch``: argument parsing over the Python API, nothing clever."""
from __future__ import annotations

import functools
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import (Magics, cell_magic, line_magic, magics_class, no_var_expand,
                                output_can_be_silenced)
from IPython.display import display

from .. import cluster
from ..core import devices as _devices
from ..core.sampler import check_interval
from ..core.scan.paths import PathError
from ..core import purge as _purge
from ..core import snapshot as _snapshot
from .. import session as _session
from ..settings import GpuMemSettings
from . import panel as _panel
from . import fit as _fit
from . import processes as _processes
from . import rescue as _rescue
from . import tame as _tame
from . import trace as _trace
from . import watch as _watch
from .args import (GUIDE, expand_line, help_stops, parser, report_errors, split_line,
                   usage_errors)

#: subcommands served by the other magics modules: name -> function(magics, argv)
SUBCOMMANDS: dict[str, Callable[[Any, list[str]], Any]] = {
    "watch": _watch.magic_watch,
    "history": _rescue.magic_history,
    "plot": _watch.magic_plot,
    "panel": _panel.magic_panel,
    "tame": _tame.magic_tame,
    "trace": _trace.magic_trace,
    "rescue": _rescue.magic_rescue,
}

#: every form of the magics, one a line (``%gpumem?`` and ``%gpumem help`` show it);
#: a new subcommand adds its line here
USAGE = """\
%gpumem [NAME ...] [-v] [--full] [--device auto|all|cpu|cuda:N] [-o]
%gpumem --cluster [--device ...] [-o]
%gpumem --processes [--device ...] [-o]
%gpumem purge [NAME|PATH ...] [--all] [--dry-run] [--device ...] [-o]
%gpumem purge [NAME|PATH ...] --cluster [--all] [--dry-run] [--device ...] [-o]
%gpumem purge --orphans [--dry-run] [--grace S] [--device ...] [-o]
%gpumem watch on|off|status [--warn-at 80%] [--auto-purge-hidden|--no-auto-purge-hidden] [--interval S] [--device ...]
%gpumem history [--save FILE] [--tensorboard DIR] [--last N] [--clear] [-o]
%gpumem rescue [NAME|PATH ...] [-o]
%gpumem plot [--last N] [--device ...] [--save FILE] [-o]
%gpumem panel [--device ...] [--interval S] [--window S] [--close]
%gpumem tame [--give-back] | off | status [-o]
%gpumem trace on|off|status [--lines] [--stacks python|all] [--context alloc|all] [--max-entries N] [--device ...] [--save FILE.pickle]
%%gpuwatch [-o NAME] [-v] [--interval S] [--plot] [--device ...]
""" + _fit.USAGE


@functools.cache   # a parser is read, never changed, by each call: built once
def _report_parser():
    p = parser("%gpumem", "who holds accelerator memory")
    p.add_argument("names", nargs="*", help="names or paths to detail")
    p.add_argument("-v", dest="verbose", action="store_true",
                   help="name every object the scan could not read, not only the first few")
    p.add_argument("--cluster", action="store_true",
                   help="the Dask cluster this notebook drives: its workers' devices and the "
                   "names that hold their keys")
    p.add_argument("--full", action="store_true",
                   help="walk every name again, even those proved unchanged since the last scan")
    p.add_argument("--processes", action="store_true",
                   help="every other process on the GPUs: who it is and what it holds")
    return p


def _purge_parser():
    p = parser("%gpumem purge", "delete names and free their memory")
    p.add_argument("names", nargs="*", help="names or paths to purge")
    p.add_argument("--all", action="store_true", help="every user name that holds memory")
    p.add_argument("--dry-run", action="store_true", help="show what would go; change nothing")
    p.add_argument("--cluster", action="store_true",
                   help="release what the names hold on the Dask cluster and free it there")
    p.add_argument("--orphans", action="store_true",
                   help="end this user's orphaned processes (a restarted kernel's left-overs) "
                   "that hold GPU memory")
    p.add_argument("--grace", default=None,
                   help="with --orphans: seconds between SIGTERM and SIGKILL (default 3)")
    return p


@magics_class
class GpuMemMagics(Magics, GpuMemSettings):
    """The jupyter_gpumem magics; the traits of :class:`~..settings.GpuMemSettings` are the
    extension's settings (``c.GpuMemMagics.scan_time_limit``)."""

    # -- helpers for the other modules ------------------------------------------
    @staticmethod
    def interval(value: Any, what: str = "--interval") -> float:
        """A validated sampling interval (seconds, finite, 1 ms .. 1 h) or a UsageError."""
        try:
            return check_interval(value, what)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def selection(self, value: str | None, present: bool = True) -> _devices.DeviceSelection:
        """The device selection of ``--device`` (or the configured default), made once
        here (:func:`~jupyter_gpumem.core.devices.select`); one this process does not
        have (``cuda:0`` without a GPU) is refused unless ``present`` is false (a
        cluster's workers have devices of their own)."""
        value = value if value is not None else self.default_device
        try:
            return _devices.select(value, present=present)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def device(self, value: str | None, present: bool = True) -> str:
        """The text of a validated device selection (:meth:`selection`), for the
        commands that keep it (the watch, the panel, trace, fit)."""
        value = value if value is not None else self.default_device
        try:
            return _devices.check_present(value) if present else _devices.parse_device(value)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def show(self, result: Any, output: bool) -> Any:
        """Display a result (HTML in a notebook, text in a terminal); with -o return it
        instead, as ``%timeit -o`` does: the cell shows it as its value (once), and
        ``r = %gpumem -o`` shows nothing."""
        if output:
            return result
        display(result)
        return None

    # -- the magics ------------------------------------------------------------------
    @line_magic
    @no_var_expand
    @report_errors
    def gpumem(self, line: str = "") -> Any:
        """Who holds accelerator memory, and purge it (every form: :data:`USAGE`)."""
        argv = split_line(expand_line(self.shell, line))
        if argv and argv[0] in ("help", "-h", "--help"):
            print(USAGE)
            return None
        if argv and argv[0] == "purge":
            return self._purge(argv[1:])
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](self, argv[1:])
        return self._report(argv)

    def _parse(self, parser: Any, argv: list[str]) -> tuple[Any, _devices.DeviceSelection]:
        args = parser.parse_args(argv)
        return args, self.selection(args.device, present=not getattr(args, "cluster", False))

    def _report(self, argv: list[str]) -> Any:
        args, device = self._parse(_report_parser(), argv)
        if args.processes:
            return _processes.report(self, args, device)
        if args.cluster:
            return self._cluster_report(args, device.device)
        session = _session.session_of(self.shell)
        snap = usage_errors(lambda: _snapshot.build(
            shell=self.shell, device=device, names=args.names or None,
            time_limit=self.scan_time_limit, warm=session.warm if session else None,
            full=args.full), PathError)
        for name in args.names:
            if not any(h.name == name for h in snap.details):
                raise UsageError(_devices.holds_nothing(name, [d.id for d in snap.devices]))
        if args.verbose:
            snap.list_every_refusal()
        return self.show(snap, args.output)

    def _purge(self, argv: list[str]) -> Any:
        args, device = self._parse(_purge_parser(), argv)
        if args.orphans:
            return _processes.purge_orphans(self, args, device)
        if args.grace is not None:
            raise UsageError("--grace goes with --orphans")
        if args.cluster:
            return self._cluster_purge(args, device.device)
        result = usage_errors(lambda: _session.purge(
            args.names, shell=self.shell, all=args.all, dry_run=args.dry_run, device=device,
            time_limit=self.scan_time_limit), _purge.PurgeError)
        return self.show(result, args.output)

    def _cluster_report(self, args: Any, device: str) -> Any:
        """``%gpumem --cluster``: the Dask cluster's workers and the names holding keys."""
        if args.names:
            raise UsageError("--cluster reports every name that holds keys: give no names "
                             f"(got {' '.join(args.names)})")
        snap = usage_errors(lambda: cluster.snapshot(
            shell=self.shell, device=device, time_limit=self.scan_time_limit),
            cluster.ClusterError, "--cluster: ")
        return self.show(snap, args.output)

    def _cluster_purge(self, args: Any, device: str) -> Any:
        """``%gpumem purge NAME ... --cluster``: release the names' keys on the cluster."""
        result = usage_errors(lambda: _session.purge(
            args.names, shell=self.shell, cluster=True, all=args.all, dry_run=args.dry_run,
            device=device, time_limit=self.scan_time_limit),
            (cluster.ClusterError, _purge.PurgeError), "--cluster: ")
        return self.show(result, args.output)

    @cell_magic
    @output_can_be_silenced
    @help_stops
    def gpuwatch(self, line: str, cell: str) -> Any:
        """Run the cell and report what it did to memory, peaks included.

        %%gpuwatch [-o NAME] [--interval S] [--plot] [-v] [--device ...]

        -o NAME: the report (a WatchResult) into NAME; --interval S: seconds between
        samples; --plot: the cell's memory over time; -v: every holder, not the first
        few. The cell's own exception reaches you as usual, the report under it.
        Every command and setting: docs/GUIDE.md.
        """
        # (not wrapped in report_errors: the watch reports its own failures in one line)
        __tracebackhide__ = True  # noqa: F841
        return _watch.cell_magic_gpuwatch(self, line, cell)

    @cell_magic("gpumem")
    @output_can_be_silenced
    @help_stops
    def gpumem_cell(self, line: str, cell: str) -> Any:
        """``%%gpumem fit VAR [--min 1] [--max N] [--step 8] [--target B] [--device ...]
        [-o NAME]``: the largest VAR whose run of the cell fits in the memory free now.

        Not wrapped in ``report_errors``: an exception of the cell other than out of memory
        stops the search and reaches the user as usual."""
        __tracebackhide__ = True  # noqa: F841
        argv = line.split(None, 1)
        if not argv or argv[0] != "fit":
            raise UsageError(f"the cell form is {_fit.USAGE}")
        return _fit.magic_fit(self, argv[1] if len(argv) > 1 else "", cell)

    @help_stops
    async def gpuwatch_async(self, line: str, cell: str) -> Any:
        """``%%gpuwatch`` over a cell with top-level ``await``: what IPython awaits.

        The extension's input transformer turns such a cell into
        ``await get_ipython().magics_manager.registry['GpuMemMagics'].gpuwatch_async(line, cell)``,
        so IPython (and ipykernel, in its own event loop) runs it as an async cell.
        """
        __tracebackhide__ = True  # noqa: F841
        return await _watch.cell_magic_gpuwatch_async(self, line, cell)


GpuMemMagics.gpumem.__doc__ = f"""Who holds accelerator memory, and purge it.

{USAGE}

`%gpumem help` prints the same; each command's options: {GUIDE}."""
GpuMemMagics.gpuwatch.__doc__ = (GpuMemMagics.gpuwatch.__doc__ or "").replace(
    "docs/GUIDE.md", GUIDE)
