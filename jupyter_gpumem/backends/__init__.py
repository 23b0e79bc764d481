"""Framework backends. Each is active only when its framework is imported.

PyTorch, TensorFlow (and Keras 3 through the variables it tracks), JAX and
CuPy. Importing this package imports none of those frameworks.
"""
from __future__ import annotations

from .base import AcceleratorInfo, Backend, FrameworkUsage, Registry, StorageInfo
from .cupy import CupyBackend
from .jax import JaxBackend
from .pytorch import TorchBackend
from .tensorflow import KerasBackend, TensorFlowBackend

# in report order; Keras sits before the framework its variables live in
REGISTRY = Registry([TorchBackend(), KerasBackend(), TensorFlowBackend(), JaxBackend(),
                     CupyBackend()])

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def register(backend: Backend) -> None:
    """Add a backend (used by the optional framework modules)."""
    if all(type(b) is not type(backend) for b in REGISTRY.backends):
        REGISTRY.backends.append(backend)


def active_backends() -> list[Backend]:
    """The backends whose framework the user has imported."""
    return REGISTRY.active()


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``1.5 KiB`` for the backends' one-line notes."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


__all__ = [
    "AcceleratorInfo", "Backend", "FrameworkUsage", "StorageInfo",
    "REGISTRY", "register", "active_backends", "human_bytes",
]
