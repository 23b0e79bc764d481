"""Where the torch backend's bytes come from: a tensor's storages (rule 5 of
docs/ARCHITECTURE.md#never-harm-the-notebook-by-construction), decided in
:class:`StorageReader`. Part of the torch backend (:mod:`.pytorch`); never imports torch.

A tensor's bytes are its storages' ``nbytes()``; a kept answer stands only while its
**stamp** holds (the same storage object, with the same bytes at the same address); the
C core checks the same stamp (:meth:`StorageReader.stamp_getters`). Every layout is
counted by its storages; meta holds none. The stamp and the layouts:
docs/ARCHITECTURE.md#bytes-from-the-storage.
"""
from __future__ import annotations

import weakref
from typing import Any

from .base import StorageInfo, instance_dict, is_subtype

_new_info = tuple.__new__   # StorageInfo without the named tuple's Python-level __new__
_UNNAMED = object()         # a device not met yet


class _KeyedRef(weakref.ref):
    """A weak reference carrying its tensor's key in the record: one callback for all."""
    __slots__ = ("key",)


def device_id(dev: Any) -> str:
    """``cuda:0``, ``cpu``, ``mps:0`` from a ``torch.device``."""
    text = str(dev)
    return text if text == "cpu" or ":" in text else text + ":0"


class StorageReader:
    """A tensor's storages (see the module): the one place the torch backend reads
    bytes, and the record of plain tensors' storages (:attr:`known`: id(tensor) ->
    ``(weak ref to the tensor, stamp, storages)``, an entry leaving with its tensor)."""

    def __init__(self) -> None:
        self.known: dict[int, tuple] = {}
        known = self.known
        self._forget = lambda ref: known.pop(ref.key, None)
        self._device_names: dict = {}
        self.torch: Any = None

    def setup(self, torch: Any, plain: tuple) -> None:
        """Bind torch's C getters (once the backend has found torch)."""
        self.torch = torch
        self._plain = plain
        base, sbase = torch._C.TensorBase, torch._C.StorageBase
        self._storage_of = base.untyped_storage
        self._nbytes, self._data_ptr = sbase.nbytes, sbase.data_ptr
        self._device, self._layout = base.device.__get__, base.layout.__get__
        self._strided = torch.strided
        t = torch
        self._parts = {
            t.sparse_coo: (base._indices, base._values),
            t.sparse_csr: (base.crow_indices, base.col_indices, base.values),
            t.sparse_bsr: (base.crow_indices, base.col_indices, base.values),
            t.sparse_csc: (base.ccol_indices, base.row_indices, base.values),
            t.sparse_bsc: (base.ccol_indices, base.row_indices, base.values),
        }
        self._nested = (base._nested_tensor_size, base._nested_tensor_strides,
                        base._nested_tensor_storage_offsets)
        self._is_nested = base.is_nested.__get__
        self._is_quantized = base.is_quantized.__get__
        self._per_channel = {getattr(t, n) for n in ("per_channel_affine",
                             "per_channel_symmetric", "per_channel_affine_float_qparams")
                             if hasattr(t, n)}
        self._channel_parts = (base.q_per_channel_scales, base.q_per_channel_zero_points)
        self._qscheme = base.qscheme

    def stamp_getters(self) -> tuple:
        """``(storage of a tensor, bytes of a storage, data pointer of a storage)``: what
        the C core calls to check a stamp (each a method of torch's C classes)."""
        return self._storage_of, self._nbytes, self._data_ptr

    def holds(self, tensor: Any, stamp: tuple) -> bool:
        """Whether ``stamp`` still stands for ``tensor``'s storage: the same storage
        object, with the same bytes at the same address."""
        try:
            storage = self._storage_of(tensor)
        except Exception:
            return False
        return (stamp[0]() is storage and self._nbytes(storage) == stamp[1]
                and self._data_ptr(storage) == stamp[2])

    # -- reading ----------------------------------------------------------------------
    def plain(self, obj: Any) -> list[StorageInfo]:
        """The storages of a tensor or parameter of torch's own classes: the record's
        while its stamp holds, else read and recorded."""
        cached = self.known.get(id(obj))
        if cached is not None and self.holds(obj, cached[1]):
            return cached[2]
        return self._read(obj, record=True)

    def any(self, obj: Any) -> list[StorageInfo]:
        """The storages of any tensor (a subclass's read through TensorBase with its
        ``__torch_function__`` off: none of its code runs) or storage object."""
        torch = self.torch
        tp = type(obj)
        if is_subtype(tp, torch.TypedStorage):
            obj = instance_dict(obj).get("_untyped_storage")
            tp = type(obj)
        if is_subtype(tp, torch._C.StorageBase):
            return self._info(obj, device_id(torch._C.StorageBase.device.__get__(obj)))
        if not is_subtype(tp, torch.Tensor):
            return []
        with torch._C.DisableTorchFunctionSubclass():
            return self._read(obj, record=False)

    def storage_objects(self, obj: Any) -> list:
        """The storage objects behind a tensor, every component of every layout."""
        torch = self.torch
        with torch._C.DisableTorchFunctionSubclass():
            return [s for t in self._tensors(obj) for s in self._storage(t)]

    def parts(self, obj: Any) -> list[tuple[str, Any]]:
        """``(method, dense tensor)`` of each part holding a sparse tensor's data
        (``("_values", values)``), read without a subclass's code; [] for another
        tensor (its storages are its own)."""
        torch = self.torch
        if not is_subtype(type(obj), torch.Tensor):
            return []
        with torch._C.DisableTorchFunctionSubclass():
            return [(part.__name__, part(obj)) for part in self._parts.get(self._layout(obj), ())]

    def _name(self, obj: Any) -> str | None:
        dev = self._device(obj)
        name = self._device_names.get(dev, _UNNAMED)
        if name is _UNNAMED:   # "meta" holds no memory: named None
            name = self._device_names[dev] = None if dev.type == "meta" else device_id(dev)
        return name

    def _tensors(self, obj: Any) -> list:
        """The dense tensors whose storages hold ``obj``'s data: itself, or its
        components."""
        layout = self._layout(obj)
        parts = self._parts.get(layout)
        if parts is not None:
            return [part(obj) for part in parts]
        if layout is not self._strided:
            return []   # jagged: its tensors are its attributes; others keep none
        if self._is_nested(obj):
            return [obj] + [part(obj) for part in self._nested]
        if self._is_quantized(obj) and self._qscheme(obj) in self._per_channel:
            return [obj] + [part(obj) for part in self._channel_parts]
        return [obj]

    def _storage(self, tensor: Any) -> list:
        try:
            return [self._storage_of(tensor)]
        except (RuntimeError, NotImplementedError, TypeError):
            return []

    def _read(self, obj: Any, record: bool) -> list[StorageInfo]:
        name = self._name(obj)
        if name is None:
            return []
        try:
            tensors = self._tensors(obj)
        except (RuntimeError, NotImplementedError, TypeError):
            return []
        if len(tensors) != 1 or tensors[0] is not obj:
            out: list[StorageInfo] = []
            for t in tensors:
                for storage in self._storage(t):
                    out += self._info(storage, self._name(t))
            return out
        storages = self._storage(obj)
        if not storages:
            return []
        storage = storages[0]
        if not record or type(obj) not in self._plain:
            return self._info(storage, name)
        nbytes, ptr = self._nbytes(storage), self._data_ptr(storage)
        key = (name, ptr) if ptr else (name, "torch", id(storage))
        infos = [_new_info(StorageInfo, (key, nbytes, name, "torch"))] if nbytes else []
        try:
            ref = _KeyedRef(obj, self._forget)
            stamp = (weakref.ref(storage), nbytes, ptr)
        except TypeError:
            return infos
        ref.key = id(obj)
        self.known[id(obj)] = (ref, stamp, infos)
        return infos

    def _info(self, storage: Any, dev: str | None) -> list[StorageInfo]:
        if dev is None:
            return []
        nbytes = self._nbytes(storage)
        if not nbytes:
            return []
        try:
            ptr = self._data_ptr(storage)
        except RuntimeError:
            return []   # a wrapper subclass's storage: no memory of its own
        key = (dev, ptr) if ptr else (dev, "torch", id(storage))
        return [_new_info(StorageInfo, (key, nbytes, dev, "torch"))]
