"""Framework backends. Each is active only when its framework is imported.

PyTorch, TensorFlow (and Keras 3 through the variables it tracks), JAX and
CuPy. Importing this package imports none of those frameworks.
"""
from __future__ import annotations

from .base import (AcceleratorInfo, Backend, FrameworkUsage, Internal, PurgeEstimate, Registry,
                   StorageInfo)
from . import cuda_context as _cuda_context
from .cupy import CupyBackend
from .jax import JaxBackend
from .pytorch import TorchBackend
from .tensorflow import KerasBackend, TensorFlowBackend

# in report order; Keras sits before the framework its variables live in
REGISTRY = Registry()
REGISTRY.backends += [TorchBackend(), KerasBackend(REGISTRY.active), TensorFlowBackend(),
                      JaxBackend(), CupyBackend()]


def active_backends() -> list[Backend]:
    """The backends whose framework the user has imported."""
    return REGISTRY.active()


def internals(device_ids, reached_keys, backends=None) -> tuple[list[Internal], list[str]]:
    """Every active backend's internals on these devices, then the CUDA context's own
    parts on each CUDA device where this process has one; and one line per backend
    that failed (its internals are left out, the rest stands)."""
    ids = list(device_ids)
    out: list[Internal] = []
    errors: list[str] = []
    for backend in active_backends() if backends is None else backends:
        try:
            out += backend.internals(ids, reached_keys)
        except Exception as exc:
            errors.append(f"{backend.name}: its internals could not be read ({type(exc).__name__}: {exc})")
    for dev in ids:
        if dev.startswith("cuda:") and dev[5:].isdigit():
            try:
                limits = _cuda_context.context_limits(int(dev[5:]))
                out += _cuda_context.context_internals(dev, limits)
            except Exception:
                pass
    return out, errors


def purge_estimate(device_ids, freed: dict, reached_keys, backends=None) -> dict[str, int]:
    """Bytes a purge gives back per device when the storages in ``freed`` (key ->
    StorageInfo) are freed and every framework releases its caches: each backend
    counts the storages in its own pools and what its caches give back, and a storage
    no backend accounts for counts its own size."""
    ids = list(device_ids)
    out: dict[str, int] = {dev: 0 for dev in ids}
    rest = dict(freed)
    for backend in active_backends() if backends is None else backends:
        try:
            est = backend.purge_estimate(ids, rest, reached_keys)
        except Exception:
            est = None
        if est is None:
            continue
        for dev, n in est.returned.items():
            if dev in out:
                out[dev] += int(n)
        for key in est.covered:
            rest.pop(key, None)
    for info in rest.values():
        out[info.device] = out.get(info.device, 0) + info.nbytes
    return out


__all__ = [
    "AcceleratorInfo", "Backend", "FrameworkUsage", "Internal", "PurgeEstimate", "StorageInfo",
    "REGISTRY", "active_backends", "internals", "purge_estimate",
]
