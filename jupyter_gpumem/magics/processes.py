"""``%gpumem --processes`` and ``%gpumem purge --orphans``: the other processes on the GPUs."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from ..core import devices as _devices
from ..core import processes as _processes


def report(magics: Any, args: Any, device: str) -> Any:
    """``%gpumem --processes``: every other process on the selected devices, named."""
    if args.names or args.cluster:
        raise UsageError("--processes lists the processes on the devices: give no names and "
                         "no --cluster")
    if device == "cpu":
        raise UsageError("--processes lists the processes on the GPUs: --device cpu has none")
    usages = [d for d in _devices.read_devices(device) if d.kind != "cpu"]
    return magics.show(_processes.report(usages if usages else None), args.output)
