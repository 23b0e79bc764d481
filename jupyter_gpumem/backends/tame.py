"""``%gpumem tame``: make JAX and TensorFlow allocate on demand.

Both frameworks read their allocator settings from the environment when they
set up their GPUs (JAX: when it creates its GPU client, on the first array or
``jax.devices()``; TensorFlow: when its eager context starts, on the first
op), not when they are imported. So the documented settings take effect if
they are in ``os.environ`` before that moment:

- JAX: ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (no 75% pool up front);
  with ``--give-back`` also ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` (every
  free goes back to the device; slower).
- TensorFlow: ``TF_FORCE_GPU_ALLOW_GROWTH=true`` (grow the pool as needed
  instead of taking the whole card).

A framework that has already set up its GPUs keeps what it took: the magic
says so, and the only cure is a restart with the setting applied first
(``c.GpuMemMagics.tame = True`` applies it at every start).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

SETTINGS = {
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
}
GIVE_BACK = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
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


def _jax_state() -> str:
    if "jax" not in sys.modules:
        return "not imported: it will allocate on demand"
    xb = sys.modules.get("jax._src.xla_bridge")
    check = getattr(xb, "backends_are_initialized", None)
    try:
        started = bool(check()) if check is not None else bool(getattr(xb, "_backends", None))
    except Exception:
        started = True
    if not started:
        return "imported, no device used yet: the setting still applies"
    return "too late"


def _tf_state() -> str:
    if "tensorflow" not in sys.modules:
        return "not imported: it will allocate on demand"
    ctx_mod = sys.modules.get("tensorflow.python.eager.context")
    ctx = ctx_mod.context_safe() if ctx_mod is not None else None
    if ctx is None or not getattr(ctx, "_initialized", False):
        return "imported, no device used yet: the setting still applies"
    return "too late"


_LATE = {
    "jax": "jax has already set up its devices and keeps the pool it took: restart the "
           "kernel and run `%gpumem tame` before `import jax` (or set "
           "c.GpuMemMagics.tame = True in ipython_config.py)",
    "tensorflow": "tensorflow has already set up its devices and keeps the pool it took: "
                  "restart the kernel and run `%gpumem tame` before `import tensorflow` (or "
                  "set c.GpuMemMagics.tame = True in ipython_config.py)",
}


def status() -> dict[str, str]:
    """Per framework: not imported, imported but not started, or too late."""
    return {"jax": _jax_state(), "tensorflow": _tf_state()}


def tame(give_back: bool = False) -> TameResult:
    """Put the allocate-on-demand settings into ``os.environ``; report what applies."""
    wanted = dict(SETTINGS)
    if give_back:
        wanted.update(GIVE_BACK)
    result = TameResult()
    for key, value in wanted.items():
        if os.environ.get(key) != value:
            _saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value
            result.changed[key] = value
    for name, state in status().items():
        if state == "too late":
            result.frameworks[name] = "already set up its devices: too late for this process"
            result.warnings.append(_LATE[name])
        else:
            result.frameworks[name] = state
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


