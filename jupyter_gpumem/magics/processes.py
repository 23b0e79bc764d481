"""``%gpumem --processes`` and ``%gpumem purge --orphans``: the other processes on the GPUs."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from ..core import devices as _devices
from ..core.processes import orphans as _orphans
from ..core import processes as _processes


def report(magics: Any, args: Any, device: _devices.DeviceSelection) -> Any:
    """``%gpumem --processes``: every other process on the selected devices, named."""
    if args.names or args.cluster:
        raise UsageError("--processes lists the processes on the devices: give no names and "
                         "no --cluster")
    if device.device == "cpu":
        raise UsageError("--processes lists the processes on the GPUs: --device cpu has none")
    usages = [d for d in _devices.read_devices(device) if d.kind != "cpu"]
    return magics.show(_processes.report(usages if usages else None), args.output)


def purge_orphans(magics: Any, args: Any, device: _devices.DeviceSelection) -> Any:
    """``%gpumem purge --orphans [--dry-run] [--grace S]``: end this user's orphans that
    hold GPU memory, each step printed as it happens."""
    if args.names or args.all or args.cluster:
        raise UsageError("--orphans ends processes, not names: give no names, --all or "
                         "--cluster")
    if device.device == "cpu":
        raise UsageError("--orphans ends processes on the GPUs: --device cpu has none")
    try:
        grace = _orphans.check_grace(_orphans.GRACE if args.grace is None else args.grace)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    devices = None
    if device.device not in ("auto", "all", "cuda"):
        devices = [d for d in _devices.read_devices(device) if d.kind != "cpu"]
    result = _orphans.purge_orphans(dry_run=args.dry_run, grace=grace, devices=devices,
                                    on_step=lambda s: print(s.text().strip(), flush=True))
    return magics.show(result, args.output)
