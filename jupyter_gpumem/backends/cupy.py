"""CuPy backend: ``cupy.ndarray`` memory, the device memory pool, the pinned pool.

An array's storage is its ``MemoryPointer.mem``: the pool chunk (or the
foreign buffer of an array made through DLPack) that every view of it
shares, keyed by ``(cuda:N, mem.ptr)`` with ``mem.size`` bytes.

CuPy's public pool counters read the *current* device only, and switching
device creates a CUDA context where none exists. So the pools are read on
the current device (asking which device is current creates nothing), and
on another device only where NVML shows this process already has a
context there.
"""
from __future__ import annotations

import gc
from typing import Any

from .base import (AcceleratorInfo, Backend, FrameworkUsage, Internal, PurgeEstimate, StorageInfo,
                   framework_module, oom_by_name)
from ..units import fmt_bytes
from . import nvml
from .base import is_a

_MiB = 1 << 20


def _format_uuid(raw: Any) -> str | None:
    if is_a(raw, str):
        return raw if raw.startswith(("GPU-", "MIG-")) else "GPU-" + raw
    try:
        h = bytes(raw).hex()
    except Exception:
        return None
    if len(h) != 32:
        return None
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class CupyBackend(Backend):
    """Backend for CuPy arrays and pools."""

    name = "cupy"
    module = "cupy"
    order = 50

    cupy = Backend.lib

    def tensor_types(self) -> tuple[type, ...]:
        nd = getattr(framework_module("cupy"), "ndarray", None)
        return (nd,) if is_a(nd, type) else ()

    def storages(self, obj: Any) -> list[StorageInfo]:
        try:
            pointer = obj.data
            mem = pointer.mem
            ptr, size, dev_index = int(mem.ptr), int(mem.size), int(mem.device_id)
        except Exception:
            return []
        if not ptr or not size:
            return []
        dev = f"cuda:{dev_index}"
        return [StorageInfo((dev, ptr), size, dev, "cupy")]

    # -- pools ----------------------------------------------------------------
    def _devices_in_use(self) -> list[int]:
        """The current device, and every device where this process has a context (NVML)."""
        try:
            current = int(self.cupy.cuda.runtime.getDevice())
        except Exception:
            return []
        found = {current}
        for ordinal, index in enumerate(nvml.visible_indices()):
            if (nvml.process_used(index) or 0) > 0:
                found.add(ordinal)
        return sorted(found)

    def _on_device(self, index: int, fn):
        cupy = self.cupy
        if int(cupy.cuda.runtime.getDevice()) == index:
            return fn()
        with cupy.cuda.Device(index):
            return fn()

    def _pool_figures(self) -> dict[int, tuple[int, int]]:
        """``{device ordinal: (used, total)}`` of CuPy's default pool, where it holds memory."""
        try:
            pool = self.cupy.get_default_memory_pool()
        except Exception:
            return {}
        out = {}
        for index in self._devices_in_use():
            try:
                used, total = self._on_device(index, lambda: (int(pool.used_bytes()),
                                                              int(pool.total_bytes())))
            except Exception:
                continue
            if total:
                out[index] = (used, total)
        return out

    def pinned_free(self) -> tuple[int, int | None]:
        """(free blocks, their bytes or ``None``) kept by the pinned host pool."""
        try:
            pool = self.cupy.get_default_pinned_memory_pool()
            blocks = int(pool.n_free_blocks())
        except Exception:
            return 0, None
        if not blocks:
            return 0, 0
        nbytes = 0
        for ref in gc.get_referents(pool):
            groups = ref.values() if is_a(ref, dict) else ()
            for group in groups:
                if is_a(group, (list, set, tuple)):
                    nbytes += sum(int(getattr(m, "size", 0) or 0) for m in group)
        return blocks, nbytes or None

    # -- devices ------------------------------------------------------------------
    def accelerators(self) -> list[AcceleratorInfo]:
        out = []
        runtime = getattr(getattr(framework_module("cupy"), "cuda", None), "runtime", None)
        kind = "rocm" if getattr(runtime, "is_hip", False) else "cuda"
        for index in sorted(self._pool_figures()):
            name = uuid = total = None
            try:  # the pool holds memory there, so this device has a context already
                props = runtime.getDeviceProperties(index)
                raw_name = props.get("name")
                name = raw_name.decode() if is_a(raw_name, bytes) else raw_name
                uuid = _format_uuid(props.get("uuid")) if kind == "cuda" else None
                total = props.get("totalGlobalMem")
            except Exception:
                pass
            out.append(AcceleratorInfo(f"cuda:{index}", kind, name, uuid, total))
        return out

    def usage(self, device_ids, detail: bool = False) -> dict[str, FrameworkUsage]:

        ids = set(device_ids)
        out: dict[str, FrameworkUsage] = {}
        for index, (used, total) in self._pool_figures().items():
            dev = f"cuda:{index}"
            if dev not in ids:
                continue
            u = FrameworkUsage("cupy", allocated=used, reserved=total)
            u.free_in_reserved = total - used
            if total - used >= _MiB:
                u.note = (f"cupy keeps {fmt_bytes(total - used)} of freed memory in its pool: "
                          f"`%gpumem purge` gives it back")
            out[dev] = u
        if "cpu" in ids:
            blocks, nbytes = self.pinned_free()
            if blocks:
                size = fmt_bytes(nbytes) if nbytes is not None else f"{blocks} block(s)"
                out["cpu"] = FrameworkUsage(
                    "cupy pinned", pool=nbytes,
                    note=f"cupy's pinned host pool keeps {size} of freed pinned memory: "
                         f"`%gpumem purge` gives it back")
        return out

    def _plan_cache(self) -> tuple[int, int, int] | None:
        """(device ordinal, cached plans, bytes their work areas hold) of the current
        device's FFT plan cache, where ``cupy.fft`` is in use."""
        config = framework_module("cupy.fft.config")
        if config is None:
            return None
        try:
            cache = config.get_plan_cache()
            count, size = int(cache.get_curr_size()), int(cache.get_curr_memsize())
            return int(self.cupy.cuda.runtime.getDevice()), count, size
        except Exception:
            return None

    def internals(self, device_ids, reached_keys) -> list[Internal]:

        ids = set(device_ids)
        out: list[Internal] = []
        for index, (used, total) in sorted(self._pool_figures().items()):
            dev = f"cuda:{index}"
            if dev in ids and total > used:
                out.append(Internal(
                    "CuPy memory pool: free blocks", dev, total - used, "cupy",
                    freed_by_purge=True, kind="cached",
                    note=f"CuPy keeps freed arrays' memory in its pool ({fmt_bytes(total)} in "
                         f"all, {fmt_bytes(used)} in use); `%gpumem purge` calls "
                         f"free_all_blocks()"))
        plans = self._plan_cache()
        if plans is not None and plans[2] and f"cuda:{plans[0]}" in ids:
            out.append(Internal(
                "CuPy FFT plan cache", f"cuda:{plans[0]}", plans[2], "cupy", count=plans[1],
                freed_by_purge=True, kind="allocated",
                note="work areas of cached cuFFT plans, taken from CuPy's pool; "
                     "`%gpumem purge` clears the cache"))
        if "cpu" in ids:
            blocks, nbytes = self.pinned_free()
            if blocks:
                out.append(Internal(
                    "CuPy pinned host pool: free blocks", "cpu", nbytes, "cupy", count=blocks,
                    freed_by_purge=True, kind="cached",
                    note="freed pinned host memory CuPy keeps for reuse; `%gpumem purge` "
                         "gives it back"))
        return out

    def purge_estimate(self, device_ids, freed: dict, reached_keys=frozenset()):
        """Freed arrays go back to the pool, and the purge empties the pool: their bytes,
        the pool's free blocks and the FFT plans' work areas come back."""
        figures = self._pool_figures()
        ids = [d for d in device_ids if d.startswith("cuda:")]
        if not figures or not ids:
            return None
        returned: dict[str, int] = {}
        covered = set()
        for key, info in freed.items():
            if info.framework == "cupy" and info.device in ids:
                covered.add(key)
                returned[info.device] = returned.get(info.device, 0) + info.nbytes
        for index, (used, total) in figures.items():
            dev = f"cuda:{index}"
            if dev in ids:
                returned[dev] = returned.get(dev, 0) + total - used
        plans = self._plan_cache()
        if plans is not None and f"cuda:{plans[0]}" in ids:
            dev = f"cuda:{plans[0]}"
            returned[dev] = returned.get(dev, 0) + plans[2]
        return PurgeEstimate(returned, covered)

    def is_oom(self, exc: BaseException, text: str) -> bool:
        return oom_by_name(exc)

    def pointer_device(self, ptr: int) -> str | None:
        """The device the CUDA driver places ``ptr`` on (``cudaPointerGetAttributes``)."""
        try:
            return f"cuda:{int(self.cupy.cuda.runtime.pointerGetAttributes(ptr).device)}"
        except Exception:
            return None

    def release(self) -> list[str]:
        """Free the unused blocks of CuPy's device pools, pinned pool and FFT plans."""

        cupy = self.cupy
        notes: list[str] = []
        pool = cupy.get_default_memory_pool()
        for index, (_, before) in sorted(self._pool_figures().items()):
            try:
                after = self._on_device(index, lambda: (pool.free_all_blocks(), int(pool.total_bytes()))[1])
            except Exception as exc:
                notes.append(f"cupy: could not free its pool on cuda:{index} ({exc})")
                continue
            if before - after:
                notes.append(f"cupy: gave {fmt_bytes(before - after)} of its pool back to cuda:{index}")
        try:
            blocks, nbytes = self.pinned_free()
            if blocks:
                cupy.get_default_pinned_memory_pool().free_all_blocks()
                size = fmt_bytes(nbytes) if nbytes is not None else f"{blocks} block(s)"
                notes.append(f"cupy: gave {size} of pinned host memory back")
        except Exception as exc:
            notes.append(f"cupy: could not free its pinned pool ({exc})")
        config = framework_module("cupy.fft.config")
        if config is not None:
            try:
                config.get_plan_cache().clear()
            except Exception:
                pass
        return notes


BACKENDS = [CupyBackend()]
