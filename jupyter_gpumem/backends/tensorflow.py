"""TensorFlow backend (eager tensors, ``tf.Variable``) and the Keras 3 backend.

A tensor's key is ``(device, pointer)`` as for every framework, read from a DLPack capsule
(no copy), only for the dtypes and devices TensorFlow can export; anything else is keyed
by identity, which can only over-count. TensorFlow is looked at only after the user
imported it, and asked for figures only once its eager context exists (asking earlier
would start it, and take the whole card). Why: docs/ARCHITECTURE.md#tensorflows-keys.
"""
from __future__ import annotations

import ctypes
import os
import re
from typing import Any, Callable, Iterator

from .base import (DLPACK_DEVICES, AcceleratorInfo, Backend, FrameworkUsage, Internal, PurgeEstimate,
                   StorageInfo, framework_module, xla_is_oom)
from .base import is_a
from ..units import fmt_bytes

#: dtypes TensorFlow can export through DLPack (see module docstring)
_DLPACK_DTYPES = frozenset({
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128",
})
#: dtypes whose elements are handles or Python-side objects, not fixed-size data
_OPAQUE_DTYPES = frozenset({"string", "resource", "variant"})
_DEVICE_RE = re.compile(r"(?:^|/)device:([A-Za-z_]+):(\d+)$|^/?([A-Za-z_]+):(\d+)$")
_MiB = 1 << 20
#: Keras attributes that only link layers of one model graph to each other
_KERAS_SKIP = frozenset({"_inbound_nodes", "_outbound_nodes"})

# -- DLPack ----------------------------------------------------------------
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]

def dlpack_address(capsule: Any) -> tuple[int, int, int] | None:
    """``(data pointer, DLPack device type, device id)`` of an unconsumed capsule.

    Reads the ``DLTensor`` at the head of a ``DLManagedTensor`` (capsule name
    ``dltensor``), or behind the version, context, deleter and flags of a
    ``DLManagedTensorVersioned`` (``dltensor_versioned``).
    """
    for name, offset in ((b"dltensor", 0), (b"dltensor_versioned", 32)):
        if _capsule_is_valid(capsule, name):
            base = _capsule_get_pointer(capsule, name)
            if not base:
                return None
            head = base + offset
            data = ctypes.c_void_p.from_address(head).value or 0
            dev_type = ctypes.c_int32.from_address(head + 8).value
            dev_id = ctypes.c_int32.from_address(head + 12).value
            byte_offset = ctypes.c_uint64.from_address(head + 40).value
            return data + byte_offset, dev_type, dev_id
    return None


def _device_from_name(name: str) -> tuple[str, int] | None:
    """``'/job:localhost/replica:0/task:0/device:GPU:1'`` -> ``('GPU', 1)``."""
    m = _DEVICE_RE.search(name or "")
    if not m:
        return None
    kind = m.group(1) or m.group(3)
    return kind.upper(), int(m.group(2) or m.group(4))


def _bool_env(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


def _onednn_enabled() -> bool | None:
    """Whether TensorFlow runs with oneDNN, from the module TensorFlow has already loaded."""
    port = framework_module("tensorflow.python.util._pywrap_util_port")
    try:
        return bool(port.IsMklEnabled()) if port is not None else None
    except Exception:
        return None


def _no_cpu_stats_note(exc: BaseException) -> str:
    """Why TensorFlow's host figures are missing, and how the user can get them."""
    missing = ("its allocated, peak and unattributed host bytes are unknown; tracked tensors "
               "still counts the TensorFlow tensors that names reach")
    if _onednn_enabled() is False:
        setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
        why = ("oneDNN is off: TF_ENABLE_ONEDNN_OPTS=" + setting.strip()
               if setting is not None and _bool_env("TF_ENABLE_ONEDNN_OPTS") is False
               else "oneDNN is off, TensorFlow's default on this CPU")
        if _bool_env("TF_CPU_ALLOCATOR_USE_BFC"):
            fix = ("TF_CPU_ALLOCATOR_USE_BFC is set, but only after TensorFlow had started: "
                   "restart the kernel and set it before importing tensorflow")
        else:
            fix = ("To get them: restart the kernel, run `%env TF_CPU_ALLOCATOR_USE_BFC=true`, "
                   "then import tensorflow")
        return f"TensorFlow keeps no allocator statistics on this CPU ({why}): {missing}. {fix}"
    text = str(exc).strip()
    first = text.splitlines()[0][:200] if text else type(exc).__name__
    return f"TensorFlow reports no statistics for its CPU allocator ({first}): {missing}"


class TensorFlowBackend(Backend):
    """Backend for TensorFlow eager tensors and resource variables."""

    name = "tensorflow"
    module = "tensorflow"
    order = 30

    def __init__(self) -> None:
        self._types: tuple | None = None
        self._ordinals: list[int] | None = None

    # -- runtime state -----------------------------------------------------
    @staticmethod
    def _context():
        """TensorFlow's eager context, only once it has been initialised."""
        mod = framework_module("tensorflow.python.eager.context")
        if mod is None:
            return None
        try:
            ctx = mod.context_safe()
        except Exception:
            return None
        if ctx is None or not getattr(ctx, "_initialized", False):
            return None
        return ctx

    def _tf(self):
        return framework_module("tensorflow")

    def tensor_types(self) -> tuple[type, ...]:
        if self._types is None:
            ops = framework_module("tensorflow.python.framework.ops")
            rv = framework_module("tensorflow.python.ops.resource_variable_ops")
            types_ = []
            if ops is not None and hasattr(ops, "EagerTensor"):
                types_.append(ops.EagerTensor)
            if rv is not None and hasattr(rv, "BaseResourceVariable"):
                types_.append(rv.BaseResourceVariable)
            if not types_:
                return ()  # tensorflow is still importing: ask again next time
            self._types = tuple(types_)
        return self._types

    def gpu_ordinals(self) -> list[int]:
        """CUDA ordinal of each TensorFlow logical GPU (``GPU:k`` -> ordinal).

        TensorFlow numbers the GPUs it uses from 0; with
        ``tf.config.set_visible_devices`` or virtual devices that is not the
        CUDA ordinal. The physical device ``/physical_device:GPU:j`` is CUDA
        ordinal ``j``; every visible one yields one logical GPU per virtual
        device configured on it.
        """
        if self._ordinals is not None:
            return self._ordinals
        if self._context() is None:
            return []
        out: list[int] = []
        try:
            config = self._tf().config
            for phys in config.get_visible_devices("GPU"):
                found = _device_from_name(phys.name)
                if found is None:
                    continue
                logical = config.get_logical_device_configuration(phys)
                out.extend([found[1]] * max(len(logical or ()), 1))
        except Exception:
            return []
        self._ordinals = out  # fixed once the context exists
        return out

    def _device_id(self, kind: str, index: int) -> str:
        if kind == "CPU":
            return "cpu"
        if kind == "GPU":
            ordinals = self.gpu_ordinals()
            return f"cuda:{ordinals[index] if index < len(ordinals) else index}"
        return f"{kind.lower()}:{index}"

    # -- tensors ---------------------------------------------------------
    def storages(self, obj: Any) -> list[StorageInfo]:
        rv = framework_module("tensorflow.python.ops.resource_variable_ops")
        if rv is not None and is_a(obj, rv.BaseResourceVariable):
            try:
                obj = obj.value()  # a read shares the variable's buffer
            except Exception:
                return []  # not initialised, or not readable here
        return self._tensor_storages(obj)

    def _tensor_storages(self, t: Any) -> list[StorageInfo]:
        try:
            dtype = t.dtype
            count = t.shape.num_elements()
            nbytes = (count or 0) * dtype.size
            where = _device_from_name(t.backing_device) or _device_from_name(t.device)
        except Exception:
            return []
        if not nbytes or where is None or dtype.name in _OPAQUE_DTYPES:
            return []
        dev = self._device_id(*where)
        if dtype.name in _DLPACK_DTYPES and where[0] in ("CPU", "GPU"):
            address = self._dlpack(t)
            if address is not None:
                ptr, dl_type, dl_id = address
                kind = DLPACK_DEVICES.get(dl_type)
                if kind == "cpu":
                    dev = "cpu"
                elif kind == "cuda":
                    dev = self._device_id("GPU", dl_id)
                if ptr:
                    return [StorageInfo((dev, ptr), nbytes, dev, "tensorflow")]
        return [StorageInfo((dev, "tensorflow", id(t)), nbytes, dev, "tensorflow")]

    def _dlpack(self, t: Any) -> tuple[int, int, int] | None:
        try:
            capsule = self._tf().experimental.dlpack.to_dlpack(t)
        except Exception:
            return None
        try:
            return dlpack_address(capsule)
        except Exception:
            return None
        finally:
            del capsule  # unconsumed: its destructor drops TensorFlow's reference

    # -- devices ---------------------------------------------------------
    def accelerators(self) -> list[AcceleratorInfo]:
        if self._context() is None:
            return []
        out = []
        seen = set()
        try:
            config = self._tf().config
            physical = config.get_visible_devices("GPU")
        except Exception:
            return []
        for phys in physical:
            found = _device_from_name(phys.name)
            if found is None or found[1] in seen:
                continue
            seen.add(found[1])
            name = None
            try:
                name = config.experimental.get_device_details(phys).get("device_name")
            except Exception:
                pass
            out.append(AcceleratorInfo(f"cuda:{found[1]}", "cuda", name))
        return out

    def _growth(self, logical_index: int) -> tuple[bool | None, int | None]:
        """(memory growth on?, configured memory limit in bytes) of a logical GPU."""
        forced = _bool_env("TF_FORCE_GPU_ALLOW_GROWTH")
        try:
            config = self._tf().config
            physical = config.get_visible_devices("GPU")
            k = 0
            for phys in physical:
                logical = config.get_logical_device_configuration(phys) or [None]
                for conf in logical:
                    if k == logical_index:
                        limit = getattr(conf, "memory_limit", None) if conf is not None else None
                        growth = config.experimental.get_memory_growth(phys)
                        if forced is not None:
                            growth = forced
                        return bool(growth), int(limit) * _MiB if limit else None
                    k += 1
        except Exception:
            pass
        return forced, None

    def usage(self, device_ids, detail: bool = False) -> dict[str, FrameworkUsage]:
        if self._context() is None:
            return {}
        out: dict[str, FrameworkUsage] = {}
        experimental = self._tf().config.experimental
        ids = set(device_ids)
        if "cpu" in ids:
            out["cpu"] = self._cpu_usage(experimental)
        for dev, (k, current, peak) in self._gpu_info(ids - {"cpu"}).items():
            growth, limit = self._growth(k)
            usage = FrameworkUsage("tensorflow", allocated=current, peak=peak, pool=limit)
            usage.note = self._pool_note(dev, current, peak, growth, limit)
            out[dev] = usage
        return out

    @staticmethod
    def _cpu_usage(experimental) -> FrameworkUsage:
        """The host figures of TensorFlow's CPU allocator, or a note saying why there are none.

        TensorFlow counts host memory only where its CPU allocator is a BFC
        allocator: with oneDNN on, or with ``TF_CPU_ALLOCATOR_USE_BFC=true``.
        With oneDNN off (``TF_ENABLE_ONEDNN_OPTS=0``, and TensorFlow's default
        on CPUs without AVX-512) it keeps no statistics and
        ``get_memory_info('CPU:0')`` raises. The bytes of the TensorFlow
        tensors that names reach are still counted by the scan ("tracked
        tensors"); what is missing is the allocator's own total, so host bytes
        no name reaches cannot be shown. The environment is the user's to set:
        the note says how, nothing is changed here.
        """
        try:
            info = experimental.get_memory_info("CPU:0")
            return FrameworkUsage("tensorflow", allocated=int(info["current"]),
                                  peak=int(info["peak"]))
        except Exception as exc:
            usage = FrameworkUsage("tensorflow")
            usage.note = _no_cpu_stats_note(exc)
            return usage

    @staticmethod
    def _pool_note(dev: str, current: int, peak: int, growth: bool | None,
                   limit: int | None) -> str:

        if limit:
            held = f"a pool of up to {fmt_bytes(limit)} (its configured memory limit)"
        elif growth:
            held = f"a pool of at least {fmt_bytes(peak)} (its peak; memory growth is on)"
        else:
            held = ("nearly all of the card's free memory, taken when it started "
                    "(memory growth is off; TensorFlow does not report the pool's size: "
                    "see this process's NVML figure)")
        text = (f"tensorflow keeps {held} and uses {fmt_bytes(current)} of it; "
                f"TensorFlow never gives its pool back inside the process")
        if not growth:
            text += (": to avoid it, run `%gpumem tame` before `import tensorflow` "
                     "(TF_FORCE_GPU_ALLOW_GROWTH=true) after a kernel restart")
        return text

    tame_env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}   # grow the pool, not the whole card

    def tame_state(self) -> str:
        if framework_module("tensorflow") is None:
            return "not imported"
        ctx_mod = framework_module("tensorflow.python.eager.context")
        ctx = ctx_mod.context_safe() if ctx_mod is not None else None
        if ctx is None or not getattr(ctx, "_initialized", False):
            return "imported, no device used yet"
        return "too late"

    def is_oom(self, exc: BaseException, text: str) -> bool:
        # eager ops raise ResourceExhaustedError ("OOM when allocating tensor ..."), no status
        return xla_is_oom(self, exc, text) or type(exc).__name__ == "ResourceExhaustedError"

    def tensorboard_may_import(self) -> bool:
        """TensorBoard imports TensorFlow when it is installed (and TensorFlow takes the
        GPU): only once the user has imported it may TensorBoard use it."""
        return True

    def release(self) -> list[str]:
        """TensorFlow's allocator cannot give memory back; say so per GPU."""
        gpus = self._gpu_info([f"cuda:{ordinal}" for ordinal in self.gpu_ordinals()])
        return [f"tensorflow: freed tensors go back to TensorFlow's pool on {dev} (now "
                f"{fmt_bytes(current)} in use, peak {fmt_bytes(peak)}), not to the device: "
                f"TensorFlow cannot give its pool back inside the process"
                for dev, (_, current, peak) in gpus.items()]

    def _gpu_info(self, device_ids) -> dict[str, tuple[int, int, int]]:
        """cuda:N -> (logical index, current, peak) for the GPUs among ``device_ids``."""
        if self._context() is None:
            return {}
        ids = set(device_ids)
        out: dict[str, tuple[int, int, int]] = {}
        experimental = self._tf().config.experimental
        for k, ordinal in enumerate(self.gpu_ordinals()):
            dev = f"cuda:{ordinal}"
            if dev not in ids or dev in out:
                continue
            try:
                info = experimental.get_memory_info(f"GPU:{k}")
            except Exception:
                continue
            out[dev] = (k, int(info["current"]), int(info["peak"]))
        return out

    def internals(self, device_ids, reached_keys) -> list[Internal]:

        out: list[Internal] = []
        for dev, (k, current, peak) in self._gpu_info(device_ids).items():
            growth, limit = self._growth(k)
            if limit:
                nbytes, how = max(limit - current, 0), f"its configured limit {fmt_bytes(limit)}"
            elif growth:
                nbytes, how = max(peak - current, 0), f"at least its peak {fmt_bytes(peak)} (memory growth)"
            else:
                nbytes, how = None, "nearly all of the card, taken at start (TensorFlow does not say how much)"
            out.append(Internal(
                "TensorFlow BFC pool: free space", dev, nbytes, "tensorflow",
                freed_by_purge=False, kind="cached",
                note=f"TensorFlow's BFC allocator keeps a pool of {how}, "
                     f"{fmt_bytes(current)} in use, and never gives it back inside the process"))
        return out

    def purge_estimate(self, device_ids, freed: dict, reached_keys=frozenset()):
        """Freed tensors go back to TensorFlow's pool, never to the device."""
        gpus = self._gpu_info(device_ids)
        if not gpus:
            return None
        covered = {k for k, info in freed.items()
                   if info.framework == "tensorflow" and info.device in gpus}
        return PurgeEstimate({dev: 0 for dev in gpus}, covered)

    def hint(self, name: str, obj: Any, nbytes: int) -> str | None:
        return None


# -- Keras 3 -----------------------------------------------------------------------
class KerasBackend(Backend):
    """Keras 3 models, layers and optimizers, through the variables they track.

    A Keras variable keeps its value in ``_value``: a ``tf.Variable`` (TensorFlow
    backend), a ``jax.Array`` (JAX) or a torch parameter; its storage is the
    one the owning framework's backend reports. Layers and optimizers list
    their sublayers and variables first, so paths read
    ``model._layers[1]._kernel`` or ``opt._momentums[0]`` rather than a walk
    through Keras' trackers.
    """

    name = "keras"
    module = "keras"
    order = 20     # before the framework its variables live in

    def __init__(self, others: Callable[[], list[Backend]] = list) -> None:
        self._types: dict[str, tuple] = {}
        self._others = others   # the active backends: a variable's value is one of theirs

    def joined(self, registry: Any) -> None:
        self._others = registry.active

    def _lookup(self, what: str) -> tuple:
        found = self._types.get(what)
        if found is not None:
            return found
        paths = {
            "variable": ("keras.src.backend.common.variables", "Variable"),
            "layer": ("keras.src.layers.layer", "Layer"),
            "optimizer": ("keras.src.optimizers.base_optimizer", "BaseOptimizer"),
        }
        module, attr = paths[what]
        tp = getattr(framework_module(module), attr, None)
        if tp is None:
            return ()  # keras is still importing, or laid out otherwise
        self._types[what] = (tp,)
        return self._types[what]

    def tensor_types(self) -> tuple[type, ...]:
        return self._lookup("variable")

    def container_types(self) -> tuple[type, ...]:
        return self._lookup("layer") + self._lookup("optimizer")

    def storages(self, obj: Any) -> list[StorageInfo]:
        value = _instance_dict(obj).get("_value")
        if value is None:
            return []
        for backend in self._others():
            if backend is self:
                continue
            types_ = backend.tensor_types()
            if types_ and is_a(value, types_):
                return backend.storages(value)
        return []

    def children(self, obj: Any) -> Iterator[tuple[tuple, Any]]:
        if is_a(obj, self._lookup("variable")):
            return
        # The walk takes a variable the moment it is given and keeps the first
        # path it finds; other children go on its stack, the last given explored
        # first. So: variables held directly (``_kernel``), then variables in
        # lists, then the rest, then sublayers and the optimizer, then layers in
        # lists (explored first, in order). Graph connectivity (``_inbound_nodes``)
        # only leads to layers the model lists anyway.
        variable = self._lookup("variable")
        tracked = variable + self._lookup("layer") + self._lookup("optimizer")
        rest, layers, lists, direct = [], [], [], []
        for key, value in dict.items(_instance_dict(obj)):
            if key in _KERAS_SKIP:
                continue
            if is_a(value, variable):
                direct.append((("attr", key), value))
            elif is_a(value, tracked) or key == "optimizer":
                layers.append((("attr", key), value))
            elif is_a(value, (list, tuple)) and _items(value) \
                    and is_a(_items(value)[0], tracked):
                lists += [(("attr_index", key, i), v) for i, v in enumerate(_items(value))]
            else:
                rest.append((("attr", key), value))
        yield from direct
        yield from [(label, v) for label, v in lists if is_a(v, variable)]
        yield from rest
        yield from layers[::-1]
        yield from [(label, v) for label, v in lists if not is_a(v, variable)][::-1]

    def hint(self, name: str, obj: Any, nbytes: int) -> str | None:
        if is_a(obj, self._lookup("optimizer")):
            return (f"`{name}` holds its slot variables and its model's variables: "
                    f"purge it together with its model")
        return None


def _items(seq: Any) -> list:
    """Items of a list or tuple; TensorFlow's tracked ``ListWrapper`` keeps them in ``_storage``."""
    if type(seq) is list or type(seq) is tuple:
        return list(seq)
    storage = _instance_dict(seq).get("_storage")
    if is_a(storage, list):
        return list(storage)
    return list(list.__iter__(seq)) if is_a(seq, list) else list(tuple.__iter__(seq))


def _instance_dict(obj: Any) -> dict:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return {}
    return d if is_a(d, dict) else {}


BACKENDS = [KerasBackend(), TensorFlowBackend()]
