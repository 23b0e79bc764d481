"""PyTorch's exact peaks for ``%%gpuwatch``: the CUDA caching allocator's counters per
device, and the wrappers of torch's own peak functions (``reset_peak_memory_stats``,
``memory_stats``, ``memory_stats_as_nested_dict``, for ``torch.cuda`` and
``torch.accelerator``) so a user's reset inside a watched cell loses no peak and the
user still reads the real peaks. Used by :class:`~.pytorch.TorchBackend`."""
from __future__ import annotations

from typing import Any, Callable

from .base import PeakCounter, PeakLedgerView, Reading, framework_module
from .base import is_a

FAMILY = "torch"


def _torch():
    return framework_module("torch")


def _unwrapped(fn: Callable) -> Callable:
    """The function under a wrapper of ours (its ``__wrapped__``)."""
    return getattr(fn, "__wrapped__", fn) if getattr(fn, "__jupyter_gpumem__", False) else fn


def flatten_nested(stats: Any) -> Reading:
    """``{"allocated_bytes.all": (current, peak), ...}`` from a nested memory_stats dict."""
    out: Reading = {}
    if not is_a(stats, dict):
        return out
    for stat, pools in stats.items():
        if not is_a(pools, dict):
            continue
        for pool, d in pools.items():
            if is_a(d, dict) and "peak" in d and "current" in d:
                out[f"{stat}.{pool}"] = (int(d["current"]), int(d["peak"]))
    return out


def _raw_cuda_stats(index: int) -> dict:
    torch = _torch()
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        return raw(index)
    return _unwrapped(torch.cuda.memory.memory_stats_as_nested_dict)(index)


class TorchCudaCounter(PeakCounter):
    """The CUDA caching allocator's stats for one device (every ``peak`` field)."""

    family = FAMILY
    exact_label = "torch allocator, exact"
    allocated_field = "allocated_bytes.all"
    reserved_field = "reserved_bytes.all"
    born_lazily = True

    def __init__(self, index: int) -> None:
        self.index = index
        self.device = f"cuda:{index}"
        self.key = (FAMILY, self.device)

    def read(self) -> Reading | None:
        return flatten_nested(_raw_cuda_stats(self.index))

    def reset(self) -> None:
        torch = _torch()
        reset = getattr(torch._C, "_cuda_resetPeakMemoryStats", None)
        if reset is not None:
            reset(self.index)
        else:  # pragma: no cover - very old torch
            _unwrapped(torch.cuda.memory.reset_peak_memory_stats)(self.index)


def counters(device_ids) -> list[PeakCounter]:
    """A counter per CUDA device of ``device_ids``, once torch has initialised CUDA."""
    torch = framework_module("torch")
    try:
        ready = torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        ready = False
    if not ready:
        return []
    return [TorchCudaCounter(int(dev.split(":")[1])) for dev in device_ids
            if dev.startswith("cuda:")]


def counter(key: tuple) -> PeakCounter | None:
    family, device = key
    return TorchCudaCounter(int(device.split(":")[1])) if family == FAMILY else None


def _cuda_key(device) -> tuple:
    torch = _torch()
    from torch.cuda._utils import _get_device_index

    index = _get_device_index(device, optional=True)
    if index is None or index < 0:
        index = torch.cuda.current_device()
    return (FAMILY, f"cuda:{index}")


def _accelerator_key(device_index) -> tuple | None:
    torch = _torch()
    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type != "cuda":
        return None
    if device_index is None:
        index = torch.accelerator.current_device_index()
    elif is_a(device_index, int):
        index = device_index
    else:
        dev = torch.device(device_index)
        index = dev.index if dev.index is not None else torch.accelerator.current_device_index()
    return (FAMILY, f"cuda:{index}")


def _wrap_reset(ledger: PeakLedgerView, key_of: Callable[[Any], tuple | None]):
    def make(original: Callable) -> Callable:
        def reset_peak_memory_stats(device=None, *args, **kwargs):
            try:
                key = key_of(device)
                if key is not None:
                    ledger.before_user_reset(key)
            except Exception:  # noqa: BLE001 - never break the user's call
                pass
            return original(device, *args, **kwargs)
        reset_peak_memory_stats.__doc__ = original.__doc__
        return reset_peak_memory_stats
    return make


def _wrap_nested_stats(ledger: PeakLedgerView):
    def make(original: Callable) -> Callable:
        def memory_stats_as_nested_dict(device=None):
            stats = original(device)
            try:
                if stats:
                    lifted = ledger.user_peaks(_cuda_key(device), flatten_nested(stats))
                    for name, peak in lifted.items():
                        stat, pool = name.rsplit(".", 1)
                        stats[stat][pool]["peak"] = peak
            except Exception:  # noqa: BLE001
                pass
            return stats
        memory_stats_as_nested_dict.__doc__ = original.__doc__
        return memory_stats_as_nested_dict
    return make


def _wrap_flat_stats(ledger: PeakLedgerView):
    def make(original: Callable) -> Callable:
        def memory_stats(device_index=None, /):
            stats = original(device_index)
            try:
                key = _accelerator_key(device_index) if stats else None
                if key is not None:
                    reading = {k[: -len(".peak")]: (int(stats.get(k[: -len(".peak")] + ".current", 0)),
                                                    int(v))
                               for k, v in stats.items() if k.endswith(".peak")}
                    for name, peak in ledger.user_peaks(key, reading).items():
                        stats[name + ".peak"] = peak
            except Exception:  # noqa: BLE001
                pass
            return stats
        memory_stats.__doc__ = original.__doc__
        return memory_stats
    return make


def patches(ledger: PeakLedgerView) -> list[tuple[str, str, Callable[[Callable], Callable]]]:
    """torch's functions that reset or read the allocator's peaks, each with its wrapper."""
    out = []
    for module in ("torch.cuda", "torch.cuda.memory"):
        out += [(module, "reset_peak_memory_stats", _wrap_reset(ledger, _cuda_key)),
                (module, "memory_stats_as_nested_dict", _wrap_nested_stats(ledger))]
    for module in ("torch.accelerator", "torch.accelerator.memory"):
        out += [(module, "reset_peak_memory_stats", _wrap_reset(ledger, _accelerator_key)),
                (module, "memory_stats", _wrap_flat_stats(ledger))]
    return out
