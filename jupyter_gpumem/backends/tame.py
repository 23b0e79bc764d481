"""``%gpumem tame``: make JAX and TensorFlow allocate on demand.

Both read their allocator settings from the environment when they set up their GPUs, not
when imported, so the settings (JAX: ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, with
``--give-back`` ``XLA_PYTHON_CLIENT_ALLOCATOR=platform``; TensorFlow:
``TF_FORCE_GPU_ALLOW_GROWTH=true``) take effect if in ``os.environ`` before that. A
framework that has set up its GPUs keeps what it took: the magic says so. When each
framework reads them: docs/ARCHITECTURE.md#tame.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import REGISTRY

USAGE = "%gpumem tame [--give-back] | %gpumem tame off | %gpumem tame status"

#: values the environment had before the first ``tame`` of this process
_saved: dict[str, str | None] = {}


@dataclass
class TameResult:
    """What ``tame`` set and, per framework, whether it still applies."""

    changed: dict[str, str | None] = field(default_factory=dict)
    frameworks: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{k}={v}" if v is not None else f"{k} unset" for k, v in self.changed.items()]
        out += [f"{name}: {state}" for name, state in self.frameworks.items()]
        return out


def _tameable():
    return [b for b in REGISTRY.backends if b.tame_env]


def settings(give_back: bool = False) -> dict[str, str]:
    """The environment ``tame`` sets: every framework's (see ``Backend.tame_env``)."""
    out: dict[str, str] = {}
    for backend in _tameable():
        out.update(backend.tame_env)
        if give_back:
            out.update(backend.give_back_env)
    return out


def _late(backend) -> str:
    return (f"{backend.name} has already set up its devices and keeps the pool it took: "
            f"restart the kernel and run `%gpumem tame` before `import {backend.module}` (or "
            f"set c.GpuMemMagics.tame = True in ipython_config.py)")


_TOO_LATE = "already set up its devices: too late for this process"


def _state(backend) -> str:
    """Where ``backend`` stands, and what it will do with the environment as it is now."""
    state = backend.tame_state()
    if state == "too late":
        return _TOO_LATE
    if all(os.environ.get(k) == v for k, v in backend.tame_env.items()):
        return f"{state}: it will allocate on demand"
    return f"{state}: it will take its pool up front; `%gpumem tame` still applies"


def status() -> dict[str, str]:
    """Per framework: not imported, imported but not started, or too late; and whether it
    will allocate on demand, as the environment now says."""
    return {b.name: _state(b) for b in _tameable()}


def tame(give_back: bool = False) -> TameResult:
    """Put the allocate-on-demand settings into ``os.environ``; report what applies."""
    wanted = settings(give_back)
    result = TameResult()
    for key, value in wanted.items():
        if os.environ.get(key) != value:
            _saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value
            result.changed[key] = value
    for backend in _tameable():
        state = result.frameworks[backend.name] = _state(backend)
        if state == _TOO_LATE:
            result.warnings.append(_late(backend))
    return result


def untame() -> TameResult:
    """Restore the environment ``tame`` changed (for frameworks not yet started)."""
    result = TameResult()
    for key, value in list(_saved.items()):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
        result.changed[key] = value
        del _saved[key]
    result.frameworks = status()
    return result


