"""Framework backends. Each is active only when its framework is imported."""
from __future__ import annotations

from .base import AcceleratorInfo, Backend, FrameworkUsage, Registry, StorageInfo
from .pytorch import TorchBackend

REGISTRY = Registry([TorchBackend()])


def register(backend: Backend) -> None:
    """Add a backend (used by the optional framework modules)."""
    if all(type(b) is not type(backend) for b in REGISTRY.backends):
        REGISTRY.backends.append(backend)


def active_backends() -> list[Backend]:
    """The backends whose framework the user has imported."""
    return REGISTRY.active()


__all__ = [
    "AcceleratorInfo", "Backend", "FrameworkUsage", "StorageInfo",
    "REGISTRY", "register", "active_backends",
]
