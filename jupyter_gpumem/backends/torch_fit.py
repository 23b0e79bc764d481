"""PyTorch's side of ``%%gpumem fit``: what a training step touches and how to put it back.

:class:`StepGuard` is given the values a cell's code names (its ``co_names`` read from
the user's namespace) and finds among them, one level deep, the modules, optimizers and
tensors the step reaches. Around the search it

- sets the gradients that existed aside (on an accelerator a gradient that owns its
  storage moves to host memory, the same tensor object, so the trials see the device as
  after ``zero_grad(set_to_none=True)``; on the host, or a view such as a distributed
  bucket's, it stays where it is) and puts the very tensors back after;
- copies the modules' buffers (BatchNorm's running statistics and counters) to the host
  and writes them back after each trial;
- reads the parameters' version counters (``t._version``) before and after each trial: a
  step that changed them (an optimizer step) is reported, and the parameters are written
  back from the copy taken before the first trial; state an optimizer created is dropped.

Nothing here imports torch: it reads ``sys.modules``.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Iterable

from . import torch_peaks as _peaks
from .base import instance_dict, is_a

#: messages of the host allocator's out-of-memory (a plain RuntimeError)
_HOST_OOM = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory",
             "CUDA out of memory", "out of memory")


def _torch() -> Any:
    return sys.modules.get("torch")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocator's out-of-memory: torch's ``OutOfMemoryError``, the
    host allocator's RuntimeError, or Python's ``MemoryError``."""
    if is_a(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return is_a(exc, RuntimeError) and any(m in str(exc) for m in _HOST_OOM)


def peak_field(device: str) -> tuple[tuple, str, str]:
    """The peak counter's key, its field and how the answer names it, for ``cuda:N``."""
    return (_peaks.FAMILY, device), "allocated_bytes.all", "torch allocator's exact peak"


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def requested(message: str) -> int | None:
    """The bytes an out-of-memory message says were asked for: the host allocator's
    ``you tried to allocate 159383552 bytes``, CUDA's ``Tried to allocate 20.00 MiB``."""
    m = re.search(r"tried to allocate (\d+) bytes", message, re.I)
    if m:
        return int(m.group(1))
    m = re.search(r"tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", message, re.I)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def device_free(device: str) -> int | None:
    """Bytes a new allocation on ``device`` (``cuda:N``) may take now: the device's free
    memory plus what torch's cache holds unused; None where torch has no such device."""
    torch = _torch()
    if torch is None or not device.startswith("cuda:"):
        return None
    index = int(device.split(":")[1])
    free, total = torch.cuda.mem_get_info(index)
    allocated = torch.cuda.memory_allocated(index)
    cached = torch.cuda.memory_reserved(index) - allocated
    out = int(free) + max(int(cached), 0)
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if fraction is not None:   # set_per_process_memory_fraction caps the allocator
        try:
            out = min(out, int(fraction(index) * total) - int(allocated))
        except Exception:  # noqa: BLE001 - no cap read: the device's figure stands
            pass
    return out


def device_used(device: str) -> tuple[int, int] | None:
    """``(allocated, reserved)`` bytes of torch's allocator on ``device`` (``cuda:N``)."""
    torch = _torch()
    if torch is None or not device.startswith("cuda:") or not torch.cuda.is_initialized():
        return None
    index = int(device.split(":")[1])
    return int(torch.cuda.memory_allocated(index)), int(torch.cuda.memory_reserved(index))


def synchronize(device: str) -> None:
    torch = _torch()
    if torch is not None and device.startswith("cuda:") and torch.cuda.is_initialized():
        torch.cuda.synchronize(int(device.split(":")[1]))


def _owns_its_storage(t: Any) -> bool:
    """Whether tensor ``t`` alone spans its storage (not a view of another, as a gradient in a
    distributed bucket is): only then does moving its bytes give the device memory back,
    and only then may they move without cutting it from what it shares them with."""
    try:
        return t._base is None and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    except Exception:  # noqa: BLE001 - a layout without one plain storage stays where it is
        return False


class StepGuard:
    """The modules, optimizers, parameters and buffers a step reaches, and their state."""

    def __init__(self, values: Iterable[Any]) -> None:
        torch = _torch()
        self.modules: list = []
        self.optimizers: list = []
        self.tensors: list = []
        if torch is None:
            return
        module_t, tensor_t = torch.nn.Module, torch.Tensor
        optim_t = torch.optim.Optimizer
        seen: set[int] = set()

        def add(value: Any, depth: int) -> None:
            if id(value) in seen:
                return
            seen.add(id(value))
            if is_a(value, module_t):
                self.modules.append(value)
            elif is_a(value, optim_t):
                self.optimizers.append(value)
            elif is_a(value, tensor_t):
                self.tensors.append(value)
            # containers read through their C slots: no __getitem__, values() or
            # __dict__ property of a subclass of the user's runs (rule 1)
            elif depth and is_a(value, list):
                for item in list.__getitem__(value, slice(0, 1000)):
                    add(item, depth - 1)
            elif depth and is_a(value, tuple):
                for item in tuple.__getitem__(value, slice(0, 1000)):
                    add(item, depth - 1)
            elif depth and is_a(value, dict):
                for item in list(dict.values(value))[:1000]:
                    add(item, depth - 1)
            elif depth and type(value).__module__ != "builtins":
                for item in list(dict.values(instance_dict(value)))[:1000]:
                    add(item, 0)

        for value in values:
            add(value, 1)
        params: dict[int, Any] = {}
        for m in self.modules:
            for p in m.parameters():
                params.setdefault(id(p), p)
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    params.setdefault(id(p), p)
        for t in self.tensors:
            if t.is_leaf and t.requires_grad:
                params.setdefault(id(t), t)
        self.params = list(params.values())
        self.buffers = [b for m in self.modules for b in m.buffers()]
        self.grads: list = []          # (param, its grad set aside, where it was)
        self.buffer_copies: list = []
        self.param_copies: list | None = None
        self.versions: list[int] = []
        self.optimizer_keys: list[set] = []

    # -- before the search ---------------------------------------------------------
    def begin(self) -> None:
        """Set the gradients aside, copy the buffers and the parameters to the host."""
        torch = _torch()
        if torch is None:
            return
        with torch.no_grad():
            for p in self.params:
                g = p.grad
                if g is None:
                    continue
                where = g.device
                if where.type != "cpu" and _owns_its_storage(g):
                    g.data = g.to("cpu")   # the same tensor, its bytes in host memory
                self.grads.append((p, g, where))
                p.grad = None
            self.buffer_copies = [(b, b.detach().to("cpu", copy=True)) for b in self.buffers]
            self.param_copies = [p.detach().to("cpu", copy=True) for p in self.params]
        self.versions = [p._version for p in self.params]
        self.optimizer_keys = [set(opt.state.keys()) for opt in self.optimizers]

    @property
    def grad_bytes(self) -> int:
        return sum(g.numel() * g.element_size() for _, g, _ in self.grads)

    # -- after each trial -------------------------------------------------------------
    def after_trial(self) -> str | None:
        """Drop the gradients the trial made, write the buffers back; ``"restored"`` when
        the trial changed a parameter and the parameters were written back, ``"changed"``
        when no copy was kept to write back, else None."""
        torch = _torch()
        if torch is None:
            return None
        for p in self.params:
            p.grad = None
        changed = [p._version for p in self.params] != self.versions
        restored = changed and self.param_copies is not None
        with torch.no_grad():
            for b, copy in self.buffer_copies:
                b.copy_(copy)
            if restored:
                for p, copy in zip(self.params, self.param_copies):
                    p.copy_(copy)
            for opt, keys in zip(self.optimizers, self.optimizer_keys):
                for key in [k for k in opt.state if k not in keys]:
                    del opt.state[key]
        self.versions = [p._version for p in self.params]
        return "restored" if restored else "changed" if changed else None

    def drop_param_copies(self) -> None:
        """The first trial left the parameters alone: the copy is not kept (it costs memory
        the trials should have)."""
        self.param_copies = None

    # -- after the search ------------------------------------------------------------------
    def end(self) -> None:
        """Put the gradients set aside back, as they were."""
        torch = _torch()
        if torch is None:
            return
        for p in self.params:
            p.grad = None
        with torch.no_grad():
            for p, g, where in self.grads:
                if g.device != where:
                    g.data = g.to(where)
                p.grad = g   # the very tensor: a name or list that held it holds it still
        self.grads = []
        self.buffer_copies = []
        self.param_copies = None
