"""Framework backends. Each is active only when its framework is imported.

PyTorch, TensorFlow (and Keras 3 through the variables it tracks), JAX and
CuPy. Importing this package imports none of those frameworks.

The registry finds the backends itself: every module of this package that lists
backends in a module-level ``BACKENDS`` (``pytorch.py``: ``BACKENDS =
[TorchBackend()]``) adds them, placed by their ``order`` (then by module name), so
a new framework is one new file. Helper modules (``nvml.py``, ``torch_peaks.py``,
...) list none. Finding them imports only this package's own modules, and those
import no framework: they read ``sys.modules``.
"""
from __future__ import annotations

import importlib
import pkgutil
import warnings
from typing import Iterable

from .base import (AcceleratorInfo, Backend, FrameworkUsage, Internal, PurgeEstimate, Registry,
                   StorageInfo)
from .base import is_a
from . import cuda_context as _cuda_context


def discover(path: Iterable[str] | None = None,
             package: str = __name__) -> list[tuple[str, Backend]]:
    """``(module name, backend)`` for each backend that a module of the package lists in
    its ``BACKENDS``, modules in name order (``path``: the package's folders, its
    ``__path__`` unless given). Subpackages, modules whose name starts with ``_`` and
    files whose name is no module name (``pytorch copy.py``, ``pytorch-old.py``: an
    editor's or a hand upgrade's leftovers) are left out. A module that fails to import
    is left out with a warning: one broken file must not stop the extension loading."""
    found: list[tuple[str, Backend]] = []
    for info in sorted(pkgutil.iter_modules(list(__path__ if path is None else path)),
                       key=lambda m: m.name):
        if info.ispkg or info.name.startswith("_") or not info.name.isidentifier():
            continue
        try:
            module = importlib.import_module(f"{package}.{info.name}")
        except Exception as exc:  # noqa: BLE001 - the other backends stand
            warnings.warn(f"jupyter_gpumem: backend module {info.name!r} left out: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        for backend in getattr(module, "BACKENDS", None) or ():
            if not is_a(backend, Backend):
                raise TypeError(f"{package}.{info.name}.BACKENDS holds {backend!r}, "
                                f"not a Backend")
            found.append((info.name, backend))
    return found


# in report order (each backend's ``order``); Keras sits before the framework its
# variables live in. Made before the modules are found: some read it (tame.py).
REGISTRY = Registry()
REGISTRY.add(discover())


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
    "REGISTRY", "active_backends", "discover", "internals", "purge_estimate",
]
