"""The CUDA context's own device memory, as the driver lets a process read it.

Only what the driver reports without changing anything is read (a primary context on a
device, its limits, the device's multiprocessors and resident threads); the driver library
is used only if a framework loaded it already (``RTLD_NOLOAD``): nothing here loads CUDA,
creates a context or initialises the driver. The context's stack reservation is counted;
what is and is not: docs/ARCHITECTURE.md#the-cuda-context.
"""
from __future__ import annotations

import ctypes
import os
import sys

from .base import Internal
from ..units import fmt_bytes

_LIMIT_STACK, _LIMIT_PRINTF, _LIMIT_HEAP = 0, 1, 2
_ATTR_SMS, _ATTR_THREADS_PER_SM = 16, 39
_NAMES = ("libcuda.so.1", "libcuda.so")


def _driver():
    """The CUDA driver library if this process has loaded it already, else ``None``."""
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None or not sys.platform.startswith("linux"):
        return None
    for name in _NAMES:
        try:
            return ctypes.CDLL(name, mode=noload | getattr(os, "RTLD_LAZY", 1))
        except OSError:
            continue
    return None


def _fn(lib, *names):
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    raise AttributeError(names[0])


def context_limits(ordinal: int) -> dict | None:
    """``{"stack", "printf", "heap", "sms", "threads_per_sm"}`` of this process's primary
    context on CUDA device ``ordinal`` (as CUDA numbers it in this process), or
    ``None`` when there is none (or no driver to ask)."""
    lib = _driver()
    if lib is None:
        return None
    try:
        dev = ctypes.c_int()
        if _fn(lib, "cuDeviceGet")(ctypes.byref(dev), ctypes.c_int(ordinal)) != 0:
            return None   # the driver is not initialised: no context anywhere
        flags, active = ctypes.c_uint(), ctypes.c_int()
        if _fn(lib, "cuDevicePrimaryCtxGetState")(dev, ctypes.byref(flags),
                                                  ctypes.byref(active)) != 0 or not active.value:
            return None
        out: dict = {}
        for key, attr in (("sms", _ATTR_SMS), ("threads_per_sm", _ATTR_THREADS_PER_SM)):
            value = ctypes.c_int()
            if _fn(lib, "cuDeviceGetAttribute")(ctypes.byref(value), attr, dev) == 0:
                out[key] = value.value
        ctx = ctypes.c_void_p()
        # the context is active, so retaining it creates nothing; released below
        if _fn(lib, "cuDevicePrimaryCtxRetain")(ctypes.byref(ctx), dev) != 0:
            return out or None
        try:
            if _fn(lib, "cuCtxPushCurrent_v2", "cuCtxPushCurrent")(ctx) != 0:
                return out or None
            try:
                for key, code in (("stack", _LIMIT_STACK), ("printf", _LIMIT_PRINTF),
                                  ("heap", _LIMIT_HEAP)):
                    value = ctypes.c_size_t()
                    if _fn(lib, "cuCtxGetLimit")(ctypes.byref(value), code) == 0:
                        out[key] = value.value
            finally:
                popped = ctypes.c_void_p()
                _fn(lib, "cuCtxPopCurrent_v2", "cuCtxPopCurrent")(ctypes.byref(popped))
        finally:
            _fn(lib, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease")(dev)
        return out
    except (AttributeError, OSError, ValueError, TypeError):
        return None


def context_internals(dev: str, limits: dict | None) -> list[Internal]:
    """The parts of the CUDA context on ``dev`` that its limits tell (see the module)."""
    if not limits:
        return []
    out: list[Internal] = []
    stack, sms, threads = limits.get("stack"), limits.get("sms"), limits.get("threads_per_sm")
    if stack and sms and threads:
        out.append(Internal(
            "CUDA context: thread stacks", dev, stack * sms * threads, "cuda",
            freed_by_purge=False, kind="outside",
            note=(f"local memory for every thread the GPU can run at once: stack limit "
                  f"{stack:,} B x {threads:,} threads x {sms} multiprocessors; it grows when a "
                  f"kernel needs a deeper stack, and only the end of the process returns it")))
    return out


def rest_remainder(dev: str, nbytes: int, limits: dict | None = None) -> Internal:
    """What is left of the rest once the known parts are taken out."""

    heap = ""
    if limits and (limits.get("heap") or limits.get("printf")):
        heap = (f", and, once a kernel uses them, the device malloc heap (up to "
                f"{fmt_bytes(limits.get('heap') or 0)}) and the printf buffer "
                f"({fmt_bytes(limits.get('printf') or 0)})")
    return Internal(
        "kernel images, library handles and the driver's own", dev, max(nbytes, 0), "cuda",
        freed_by_purge=False, kind="outside",
        note="loaded kernels (CUDA loads them as they are first used), cuBLAS/cuDNN handles, "
             "other libraries' own allocations and the driver's structures" + heap +
             "; CUDA does not break it down, and only the end of the process returns it")
