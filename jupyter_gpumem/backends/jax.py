"""JAX backend: ``jax.Array`` buffers, the device allocators' statistics, caches.

An array's storage is each addressable shard's device buffer, keyed by
``(device, unsafe_buffer_pointer())``: arrays that alias one buffer, and
tensors of other frameworks that share it through DLPack, count once.

JAX is asked nothing until its backends exist: ``jax.devices()`` or
``jax.live_arrays()`` would otherwise create them, and on a GPU that
preallocates 75% of the card.
"""
from __future__ import annotations

import os
from typing import Any

from .base import (AcceleratorInfo, Backend, FrameworkUsage, Internal, PurgeEstimate, StorageInfo,
                   framework_module, xla_is_oom)
from ..units import fmt_bytes
from .base import is_a

_GiB = 1 << 30
_HOST_MEMORY_KINDS = frozenset({"pinned_host", "unpinned_host"})


def _off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("0", "false", "no", "off")


def device_id(device: Any, memory_kind: str | None = None) -> str:
    """``cuda:N`` (N: the CUDA ordinal in this process), ``cpu`` or ``tpu:N``."""
    if memory_kind in _HOST_MEMORY_KINDS:
        return "cpu"
    platform = getattr(device, "platform", "cpu")
    if platform == "cpu":
        return "cpu"
    index = getattr(device, "local_hardware_id", None)
    if index is None:
        index = device.id
    if platform in ("gpu", "cuda", "rocm"):
        return f"cuda:{index}"
    return f"{platform}:{index}"


class JaxBackend(Backend):
    """Backend for JAX (GPU through CUDA or ROCm, CPU, TPU)."""

    name = "jax"
    module = "jax"
    order = 40

    jax = Backend.lib

    def initialized(self) -> bool:
        """True once JAX has created its backends (never creates them)."""
        xb = framework_module("jax._src.xla_bridge")
        if xb is None:
            return False
        check = getattr(xb, "backends_are_initialized", None)
        try:
            return bool(check()) if check is not None else bool(getattr(xb, "_backends", None))
        except Exception:
            return False

    def tensor_types(self) -> tuple[type, ...]:
        array = getattr(framework_module("jax"), "Array", None)
        return (array,) if is_a(array, type) else ()

    # -- arrays ------------------------------------------------------------
    def storages(self, obj: Any) -> list[StorageInfo]:
        try:
            if obj.is_deleted():
                return []
            sharding = obj.sharding
            kind = getattr(sharding, "memory_kind", None)
            devices = sharding.device_set
            if len(devices) == 1 and obj.is_fully_addressable:
                dev = device_id(next(iter(devices)), kind)
                return self._info(dev, obj.unsafe_buffer_pointer(), _size(obj))
            out = []
            for shard in obj.addressable_shards:
                data = shard.data
                dev = device_id(shard.device, kind)
                out += self._info(dev, data.unsafe_buffer_pointer(), _size(data))
            return out
        except Exception:
            return []  # a tracer, a deleted or donated buffer, an exotic array

    @staticmethod
    def _info(dev: str, ptr: int, nbytes: int) -> list[StorageInfo]:
        if not nbytes:
            return []
        key = (dev, ptr) if ptr else (dev, "jax", id(ptr))
        return [StorageInfo(key, nbytes, dev, "jax")]

    # -- devices -------------------------------------------------------------
    def _devices(self) -> list[Any]:
        if not self.initialized():
            return []
        jax = self.jax
        xb = framework_module("jax._src.xla_bridge")
        platforms = list(getattr(xb, "_backends", {}) or {}) or [None, "cpu"]
        out, seen = [], set()
        for platform in platforms:
            try:
                devices = jax.local_devices(backend=platform) if platform else jax.local_devices()
            except Exception:
                continue
            for d in devices:
                if id(d) not in seen:
                    seen.add(id(d))
                    out.append(d)
        return out

    def accelerators(self) -> list[AcceleratorInfo]:
        out = []
        for d in self._devices():
            dev = device_id(d)
            if dev == "cpu":
                continue
            kind = "cuda"
            try:
                if "rocm" in str(d.client.platform_version).lower():
                    kind = "rocm"
            except Exception:
                pass
            if not dev.startswith("cuda:"):
                kind = dev.split(":")[0]
            out.append(AcceleratorInfo(dev, kind, getattr(d, "device_kind", None)))
        return out

    def usage(self, device_ids, detail: bool = False) -> dict[str, FrameworkUsage]:
        ids = set(device_ids)
        out = {dev: self._from_stats(dev, stats) for dev, stats in self._pool_stats(ids).items()}
        devices = self._devices()
        # live_arrays() hands out every array: only on the main thread (detail), never
        # from a sampling thread, which must not hold the user's arrays even briefly
        if detail and "cpu" in ids and any(device_id(d) == "cpu" for d in devices):
            live = self._live_bytes("cpu")
            if live is not None:
                out["cpu"] = FrameworkUsage("jax", allocated=live)
        return out

    def _from_stats(self, dev: str, stats: dict) -> FrameworkUsage:
        in_use = int(stats.get("bytes_in_use", 0))
        pool = stats.get("pool_bytes")
        if pool is None:
            pool = stats.get("bytes_reserved")
        pool = int(pool) if pool is not None else None
        usage = FrameworkUsage("jax", allocated=in_use, reserved=pool if pool else None,
                               peak=stats.get("peak_bytes_in_use"), pool=pool)
        if pool:
            usage.free_in_reserved = max(pool - in_use, 0)
            if "largest_free_block_bytes" in stats:
                usage.largest_free_block = int(stats["largest_free_block_bytes"])
        usage.note = self._pool_note(dev, in_use, pool, stats.get("bytes_limit"))
        return usage

    @staticmethod
    def _pool_note(dev: str, in_use: int, pool: int | None, limit: Any) -> str | None:

        if not pool or pool - in_use < 64 << 20:
            return None
        preallocating = not _off("XLA_PYTHON_CLIENT_PREALLOCATE") \
            and os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower() != "platform"
        if preallocating and pool >= _GiB and pool >= 4 * max(in_use, 1):
            fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")
            return (f"jax preallocated a pool of {fmt_bytes(pool)} on {dev} "
                    f"({fraction} of the card) and uses {fmt_bytes(in_use)} of it; "
                    f"it keeps the pool until the process ends: to avoid it, run "
                    f"`%gpumem tame` before `import jax` (XLA_PYTHON_CLIENT_PREALLOCATE=false) "
                    f"after a kernel restart")
        return (f"jax keeps {fmt_bytes(pool - in_use)} of freed memory in its pool on {dev} "
                f"(pool {fmt_bytes(pool)}, in use {fmt_bytes(in_use)}) and does not give it "
                f"back to the device; XLA_PYTHON_CLIENT_ALLOCATOR=platform before `import jax` "
                f"(`%gpumem tame --give-back`) frees on every delete, more slowly")

    def _pool_stats(self, device_ids) -> dict[str, dict]:
        """``memory_stats()`` of each accelerator among ``device_ids`` that has them."""
        ids = set(device_ids)
        out: dict[str, dict] = {}
        for d in self._devices():
            dev = device_id(d)
            if dev == "cpu" or dev not in ids or dev in out:
                continue
            try:
                stats = d.memory_stats()
            except Exception:
                stats = None
            if stats:
                out[dev] = stats
        return out

    def internals(self, device_ids, reached_keys) -> list[Internal]:

        out: list[Internal] = []
        for dev, stats in self._pool_stats(device_ids).items():
            in_use = int(stats.get("bytes_in_use", 0))
            pool = stats.get("pool_bytes")
            if pool is None:
                pool = stats.get("bytes_reserved")
            if pool and int(pool) > in_use:
                out.append(Internal(
                    "JAX (XLA) pool: free space", dev, int(pool) - in_use, "jax",
                    freed_by_purge=False, kind="cached",
                    note=f"XLA's allocator keeps its pool ({fmt_bytes(int(pool))}, "
                         f"{fmt_bytes(in_use)} in use) until the process ends: freed arrays "
                         f"go back to it, not to the device"))
        return out

    def purge_estimate(self, device_ids, freed: dict, reached_keys=frozenset()):
        """Freed arrays go back to XLA's pool, which never shrinks: nothing comes back
        to the device, unless the pool-less platform allocator is in use."""
        stats = self._pool_stats(device_ids)
        if not stats:
            return None
        pooled = {dev for dev, s in stats.items()
                  if s.get("pool_bytes") is not None or s.get("bytes_reserved") is not None}
        covered = {k for k, info in freed.items() if info.framework == "jax" and info.device in pooled}
        return PurgeEstimate({dev: 0 for dev in pooled}, covered)

    def _live_bytes(self, platform: str) -> int | None:
        """Bytes of every live array on a platform, each buffer counted once."""
        try:
            arrays = self.jax.live_arrays(platform)
        except Exception:
            return None
        seen: dict[tuple, int] = {}
        for arr in arrays:
            for info in self.storages(arr):
                seen[info.key] = info.nbytes
        return sum(seen.values())

    tame_env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}   # no 75% pool up front
    give_back_env = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}   # every free goes back

    def tame_state(self) -> str:
        if framework_module("jax") is None:
            return "not imported"
        xb = framework_module("jax._src.xla_bridge")
        check = getattr(xb, "backends_are_initialized", None)
        try:
            started = bool(check()) if check is not None else bool(getattr(xb, "_backends", None))
        except Exception:
            started = True
        if not started:
            return "imported, no device used yet"
        return "too late"

    is_oom = xla_is_oom

    def release(self) -> list[str]:
        """Clear JAX's compilation caches (they keep constants alive on the device)."""
        if not self.initialized():
            return []
        notes = []
        try:
            self.jax.clear_caches()
        except Exception as exc:
            notes.append(f"jax: could not clear its caches ({exc})")
        for d in self._devices():
            dev = device_id(d)
            if dev == "cpu":
                continue
            try:
                stats = d.memory_stats() or {}
            except Exception:
                continue
            note = self._pool_note(dev, int(stats.get("bytes_in_use", 0)),
                                   stats.get("pool_bytes"), stats.get("bytes_limit"))
            if note:
                notes.append(note)
        return notes


def _size(arr: Any) -> int:
    try:
        return int(arr.on_device_size_in_bytes())
    except Exception:
        return int(getattr(arr, "nbytes", 0) or 0)


BACKENDS = [JaxBackend()]
