"""PyTorch backend: tensors, parameters, modules, autograd graphs, CUDA counters."""
from __future__ import annotations

import gc
import os
import sys
import weakref
from collections import OrderedDict
from itertools import compress, filterfalse, islice, repeat
from operator import attrgetter, eq, is_not, itemgetter
from typing import Any, Iterator

from . import torch_allocator as _alloc
from . import torch_peaks as _peaks
from . import torch_trace as _trace
from .torch_graph import (GraphLedger, SavedReader, any_own_attributes, attributes,
                          graph_children, node_attr, own_attributes, saved_attr)
from .torch_storage import StorageReader
from .base import (AcceleratorInfo, Backend, FrameworkUsage, Internal, PurgeEstimate, StorageInfo,
                   PeakCounter, PeakLedgerView, framework_module, instance_dict, oom_by_name)
from .base import is_a, is_subtype

_MODULE_OWN = ("_parameters", "_buffers", "_modules")
_MODULE_OWN_SET = frozenset(_MODULE_OWN)
_PLAIN_CONTAINERS = frozenset({dict, OrderedDict, set})
_ATOMIC_GROUP_VALUES = (int, float, bool, str, type(None))   # lr, eps, flags
_PLAIN_VALUES = frozenset(_ATOMIC_GROUP_VALUES)
# the sets above by the types' ids: a value's class is never hashed (a metaclass of the
# user's may define __hash__ or __eq__; see core.scan.types.keyable_meta)
_PLAIN_VALUE_IDS = frozenset(map(id, _PLAIN_VALUES))
_PLAIN_CONTAINER_IDS = frozenset(map(id, _PLAIN_CONTAINERS))
_GRAD = ("attr", "grad")
_GRAD_FN, _GRAD_OF = attrgetter("grad_fn"), attrgetter("grad")
_BASE, _BASE_OF = ("attr", "_base"), attrgetter("_base")
_SECOND, _THIRD = itemgetter(1), itemgetter(2)   # of a record: stamp, storages
_STATE_KEY = ("opt_state_key",)
_DATA = (("attr", "data"),)   # a SavedTensor's own (torch_graph.py's labels)


def _graph_or_base(t: Any, _fn=_GRAD_FN, _base=_BASE_OF) -> Any:
    """What sends a plain tensor the long way: its autograd graph, else its base where it
    is a view (``t[:2]._base``: the view keeps that tensor alive, and whatever storage it
    holds later, after a ``set_`` or a ``.data =``); None for the usual tensor. Its C-level
    getters only: no code of the user's runs."""
    fn = _fn(t)
    return fn if fn is not None else _base(t)


def _counter(stats: dict, name: str) -> dict:
    """``stats[name]['all']`` of ``torch.cuda.memory_stats_as_nested_dict()``, or {}."""
    value = stats.get(name)
    value = value.get("all") if is_a(value, dict) else None
    return value if is_a(value, dict) else {}


def _allocator_key(stats: dict) -> tuple:
    """What changes whenever the allocator's blocks do: its counts of allocations and
    frees, of blocks and of segments (``None`` where torch does not say)."""
    blocks, segments = _counter(stats, "allocation"), _counter(stats, "segment")
    return (blocks.get("allocated"), blocks.get("freed"),
            segments.get("allocated"), segments.get("freed"))


def _alive() -> bool:
    return True


#: torch class names -> what the report calls them
_TYPE_WORDS = {"Tensor": "tensor", "Parameter": "parameter"}


class TorchBackend(Backend):
    """Backend for PyTorch (CUDA, ROCm through the CUDA API, MPS, CPU)."""

    name = "torch"
    module = "torch"
    order = 10

    def __init__(self) -> None:
        self._saved_attrs = SavedReader()
        self._types: tuple | None = None
        self._plain: tuple = ()
        self.reader = StorageReader()   # bytes come from the storage (torch_storage.py)
        self._known = self.reader.known   # id -> (weak ref, stamp, storages)
        self._views: dict[int, tuple] = {}   # GPU -> (allocator counters, AllocatorView)
        self._sizes: dict[int, tuple] = {}   # GPU -> (workspace sizes, where they come from)
        self._graphs: dict[tuple, list] = {}   # graph pool id -> weak refs to its CUDA graphs
        self._dead_pools: set = set()          # pools whose graphs are all gone (ids are unique)
        self.ledger = GraphLedger()

    def start_scan(self, deadline: float) -> None:
        self.ledger.start(deadline)

    def set_deadline(self, deadline: float) -> None:
        self.ledger.deadline = deadline

    def partial_reasons(self) -> list[str]:
        return self.ledger.take_reasons()

    def notes(self) -> list[str]:
        return self.ledger.take_notes()

    torch = Backend.lib

    def tensor_types(self) -> tuple[type, ...]:
        if self._types is None:
            torch = self.torch
            self._types = (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)
            self._plain = (torch.Tensor, torch.nn.Parameter)
            self.reader.setup(torch, self._plain)
        return self._types

    def container_types(self) -> tuple[type, ...]:
        # a custom Function's graph node and a saved tensor met as objects (checkpoint
        # keeps its inputs as saved tensors)
        c = self.torch._C
        return (self.torch.nn.Module, self.torch.optim.Optimizer, c._FunctionBase,
                c._autograd.SavedTensor)

    # -- tensors ---------------------------------------------------------
    def storages(self, obj: Any) -> list[StorageInfo]:
        # a plain tensor's storages are kept while its storage is proven the same, so
        # the scans after each cell do not read every tensor again (torch_storage.py)
        if type(obj) in self._plain:
            return self.reader.plain(obj)
        return self.reader.any(obj)

    def children(self, obj: Any) -> Iterator[tuple[tuple, Any]]:
        torch = self.torch
        tp = type(obj)
        if is_subtype(tp, torch.nn.Module):
            return self._module_children(obj)
        if is_subtype(tp, torch.optim.Optimizer):
            return self._optimizer_children(obj)
        if is_subtype(tp, torch._C._FunctionBase):   # a node met as an object
            return graph_children(self.ledger, self._saved_attrs, obj, {}, None)
        if is_subtype(tp, torch._C._autograd.SavedTensor):
            return self._saved_attrs.read(self.ledger, obj, None, _DATA, ())
        if not is_subtype(tp, torch.Tensor):
            return iter(())
        own = own_attributes(obj) if tp in self._plain else attributes(obj)
        own += self._base_edge(obj)
        fn, grad = self.graph_and_grad(obj)
        if fn is None:
            return iter(own if grad is None else own + ((_GRAD, grad),))
        return iter(list(own) + list(graph_children(self.ledger, self._saved_attrs, fn, {})))

    def _base_edge(self, obj: Any) -> tuple:
        """``((("attr", "_base"), base),)`` where tensor ``obj`` is a view: it keeps its
        base alive (with the base's gradient, graph and whatever storage the base holds
        after a ``set_``); else ``()``. Read without a subclass's code."""
        if type(obj) in self._plain:
            base = obj._base
        else:
            with self.torch._C.DisableTorchFunctionSubclass():
                base = self.torch._C.TensorBase._base.__get__(obj)
        return () if base is None else ((_BASE, base),)

    def graph_and_grad(self, obj: Any) -> tuple:
        """A tensor's ``grad_fn`` and ``grad``, read without a subclass's code."""
        if type(obj) in self._plain:
            fn = obj.grad_fn
            return fn, (obj.grad if fn is None else None)   # only a leaf's grad is kept
        torch = self.torch
        base = torch._C.TensorBase
        with torch._C.DisableTorchFunctionSubclass():
            fn = base.grad_fn.__get__(obj)
            return fn, (base.grad.__get__(obj) if fn is None else None)

    def path_attr(self, obj: Any, name: str) -> Any:
        # a tensor's grad_fn, then the graph's steps as torch_graph.py names them
        torch = self.torch
        tp = type(obj)
        if is_subtype(tp, torch.Tensor):
            if name == "_base":
                base = self._base_edge(obj)
                if not base:
                    raise ValueError("that tensor is no view (its _base is None)")
                return base[0][1]
            if name != "grad_fn":
                raise LookupError(name)
            fn, _ = self.graph_and_grad(obj)
            if fn is None:
                raise ValueError("that tensor has no autograd graph (its grad_fn is None)")
            return fn
        if is_subtype(tp, torch._C._autograd.SavedTensor):
            return saved_attr(self._saved_attrs, obj, name)
        return node_attr(self._saved_attrs, obj, name)

    def describe(self, obj: Any) -> str | None:
        torch = self.torch
        if not is_subtype(type(obj), torch.Tensor):
            return None
        base = torch._C.TensorBase
        with torch._C.DisableTorchFunctionSubclass():
            dtype = str(base.dtype.__get__(obj)).replace("torch.", "")
            return f"{dtype}{list(base.shape.__get__(obj))}"

    def parts(self, obj: Any) -> list[tuple[str, Any]]:
        return self.reader.parts(obj)   # a sparse tensor's (torch_storage.py)

    def batch_types(self) -> frozenset:
        self.tensor_types()
        return frozenset(self._plain)

    def take_many(self, values: list) -> tuple[list, tuple, list] | None:
        if any(map(is_not, map(_graph_or_base, values), repeat(None))) or \
                any_own_attributes(values):
            return None   # a graph, a view's base or a tensor's own attributes: the long way
        recs = list(map(self._known.get, map(id, values)))
        if not all(recs) or not all(map(self.reader.holds, values, map(_SECOND, recs))):
            infos = list(map(self.storages, values))   # first met, or changed: read again
        else:
            infos = list(map(_THIRD, recs))
        return infos, _GRAD, list(map(_GRAD_OF, values))

    def batch_spec(self) -> tuple:
        # take_many's passes, as one loop of the C core runs them
        self.tensor_types()
        return (self._known, (_GRAD_FN, _BASE_OF), self.reader.stamp_getters(), _GRAD_OF,
                self.storages, _GRAD)

    def fingerprint_spec(self) -> tuple:
        self.tensor_types()
        getters = self.torch._C.TensorBase.__dict__
        # (a graph or a view's base: walked each time)
        return (self._known, (getters["grad_fn"], getters["_base"]), self.reader.stamp_getters(),
                getters["grad"])

    def getters_run_code(self) -> bool:   # a torch function mode (set_default_device's)
        return bool(self.torch._C._is_torch_function_mode_enabled())

    def tensor_edges(self, obj: Any, seen: dict):
        tp = type(obj)
        if tp in self._plain:
            own: tuple = own_attributes(obj)
        elif is_subtype(tp, self.torch.Tensor):
            # a subclass's attributes (a wrapper subclass keeps its tensor in one), read
            # through the C-level slot of its __dict__: none of its code runs
            own = attributes(obj)
        else:
            return ()   # a storage
        own += self._base_edge(obj)
        fn, grad = self.graph_and_grad(obj)
        if fn is None:
            return own if grad is None else own + ((_GRAD, grad),)
        if id(fn) in seen:
            return list(own)   # expanded already in this root's walk: not in another root's
        return list(own) + list(graph_children(self.ledger, self._saved_attrs, fn, seen))

    def _module_children(self, module: Any) -> Iterator[tuple[tuple, Any]]:
        d = instance_dict(module)
        for group in _MODULE_OWN:
            table = d.get(group)
            for key, value in (dict.items(table) if is_subtype(type(table), dict) else ()):
                if value is not None:
                    yield ("attr", key), value
        plain, containers, own = _PLAIN_VALUE_IDS, _PLAIN_CONTAINER_IDS, _MODULE_OWN_SET
        for key, value in dict.items(d):
            # skip plain values and the many empty hook tables every module carries
            tid = id(type(value))
            if tid in plain or (tid in containers and not len(value)) or key in own:
                continue
            yield ("attr", key), value

    def _optimizer_children(self, opt: Any) -> list[tuple[tuple, Any]]:
        """Parameters and per-parameter state, straight to the tensors (paths as
        ``opt.param_groups[0]['params'][3]`` and ``opt.state[...]['exp_avg']``).
        A list built by comprehensions: an optimizer holds thousands of tensors."""
        d = instance_dict(opt)
        groups, state = d.get("param_groups"), d.get("state")
        if type(groups) is not list or not is_subtype(type(state), dict):
            return [(("attr", k), v) for k, v in dict.items(d)]
        out: list[tuple[tuple, Any]] = []
        for gi, group in enumerate(groups):
            if type(group) is not dict:
                out.append((("attr_index", "param_groups", gi), group))
                continue
            for key, value in dict.items(group):
                if key == "params" and type(value) is list:
                    out += [(("opt_param", gi, pi), param) for pi, param in enumerate(value)]
                elif id(type(value)) not in _PLAIN_VALUE_IDS:
                    out.append((("opt_group", gi, key), value))
        listed = set(map(id, map(_SECOND, out)))   # parameters are state keys too
        out += [(_STATE_KEY, param) for param in dict.keys(state) if id(param) not in listed]
        per_params = list(dict.values(state))
        out += [(("opt_state", key), value) for per_param in per_params if type(per_param) is dict
                for key, value in dict.items(per_param)]
        out += [(("opt_state", ...), per_param) for per_param in per_params
                if type(per_param) is not dict]
        out += [(("attr", key), value) for key, value in dict.items(d)
                if key not in ("param_groups", "state")]
        return out

    # -- devices ---------------------------------------------------------
    def _cuda_ready(self) -> bool:
        cuda = getattr(self.torch, "cuda", None)
        try:
            return bool(cuda is not None and cuda.is_initialized())
        except Exception:
            return False

    def accelerators(self) -> list[AcceleratorInfo]:
        out: list[AcceleratorInfo] = []
        torch = self.torch
        if self._cuda_ready():
            kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                uuid = getattr(props, "uuid", None)
                uuid = str(uuid) if uuid is not None else None
                if uuid and not uuid.startswith(("GPU-", "MIG-")):
                    uuid = "GPU-" + uuid
                out.append(AcceleratorInfo(f"cuda:{i}", kind, props.name, uuid, props.total_memory))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and sys.platform == "darwin":
            try:
                if mps.is_available():
                    out.append(AcceleratorInfo("mps:0", "mps", "Apple MPS"))
            except Exception:
                pass
        return out

    def usage(self, device_ids, detail: bool = False) -> dict[str, FrameworkUsage]:
        torch = self.torch
        out: dict[str, FrameworkUsage] = {}
        ready = self._cuda_ready()
        for dev in device_ids:
            if dev.startswith("cuda:") and ready:
                i = int(dev.split(":")[1])
                if i >= torch.cuda.device_count():
                    continue
                # one read of the allocator's counters (memory_allocated() and the like
                # each flatten all of them again)
                stats = torch.cuda.memory_stats_as_nested_dict(i)
                allocated = _counter(stats, "allocated_bytes")
                u = FrameworkUsage("torch", allocated=allocated.get("current", 0),
                                   reserved=_counter(stats, "reserved_bytes").get("current", 0),
                                   peak=allocated.get("peak", 0))
                u.free_in_reserved = u.reserved - u.allocated
                if detail:
                    u.largest_free_block = self._largest_free_block(i, stats)
                out[dev] = u
            elif dev.startswith("mps:") and hasattr(torch, "mps"):
                try:
                    out[dev] = FrameworkUsage(
                        "torch",
                        allocated=torch.mps.current_allocated_memory(),
                        reserved=torch.mps.driver_allocated_memory(),
                    )
                except Exception:
                    pass
        return out

    def _largest_free_block(self, index: int, stats: dict) -> int | None:
        """The largest cached block not in use on GPU ``index`` (see :meth:`allocator_view`)."""
        view = self.allocator_view(index, stats)
        return None if view is None else view.largest_free

    # -- the allocator's own memory ----------------------------------------------
    def workspace_sizes(self, index: int) -> tuple[dict[int, str], dict[str, str]]:
        """cuBLAS/cuBLASLt workspace sizes on GPU ``index`` (bytes -> label) and, per
        label, a few words on where the size comes from: torch's own reader where it has
        one, else ``CUBLAS_WORKSPACE_CONFIG`` / ``CUBLASLT_WORKSPACE_SIZE``, else torch's
        default for the GPU's architecture."""
        found = self._sizes.get(index)
        if found is not None:
            return found
        torch = self.torch
        hip = bool(getattr(torch.version, "hip", None))
        major = None
        try:
            major = int(torch.cuda.get_device_properties(index).major)
        except Exception:
            pass
        values = []
        for name in ("_cuda_getCublasWorkspaceSize", "_cuda_getCublasLtWorkspaceSize"):
            reader = getattr(torch._C, name, None)
            try:
                values.append(int(reader()) if reader is not None else None)
            except Exception:
                values.append(None)
        sizes = _alloc.workspace_sizes(major, hip=hip, cublas=values[0], cublaslt=values[1])
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        lt = os.environ.get("CUBLASLT_WORKSPACE_SIZE")
        blas = (", as torch reports" if values[0] is not None else
                f" (CUBLAS_WORKSPACE_CONFIG={config})" if config else
                f" (torch's default for sm {major}.x)" if major is not None else "")
        lt_where = (", as torch reports" if values[1] is not None else
                    f" (CUBLASLT_WORKSPACE_SIZE={lt} KiB)" if lt else " (torch's default)")
        notes = {"cuBLAS workspace": blas, "cuBLASLt workspace": lt_where,
                 "cuBLAS/cuBLASLt workspace": blas}
        found = self._sizes[index] = (sizes, notes)
        return found

    def allocator_view(self, index: int, stats: dict | None = None):
        """GPU ``index``'s segments and blocks (:class:`torch_allocator.AllocatorView`).
        Reading them walks every block of the allocator (milliseconds with thousands of
        tensors), so the view is kept until the allocator has allocated or freed a
        block or a segment."""
        torch = self.torch
        if stats is None:
            stats = torch.cuda.memory_stats_as_nested_dict(index)
        cached = self._views.get(index)
        if cached is not None and cached[0] == _allocator_key(stats):
            return cached[1]
        try:
            segments = self._memory_snapshot()
        except Exception:
            return None
        view = _alloc.AllocatorView(segments, index, self.workspace_sizes(index)[0])
        # the counters as they are after the walk, which may itself have moved them
        key = _allocator_key(torch.cuda.memory_stats_as_nested_dict(index))
        if None not in key:
            self._views[index] = (key, view)
        return view

    def _memory_snapshot(self) -> list:
        return self.torch.cuda.memory_snapshot()

    def dead_graph_pools(self, view) -> set:
        """The CUDA graph pools of ``view`` whose graphs are all deleted: ``empty_cache()``
        gives their free segments back. A pool's graphs are found once among the objects
        the garbage collector tracks (a ``torch.cuda.CUDAGraph`` is one), and kept as weak
        references: the collector is asked again only for a pool not seen before or one
        whose known graphs have all gone (another graph may share it). Pool ids are never
        reused, so a dead pool stays dead."""
        pools = view.graph_pools - self._dead_pools
        if not pools:
            return view.graph_pools & self._dead_pools

        def alive(pool):
            return any(ref() is not None for ref in self._graphs.get(pool, ()))

        if any(pool not in self._graphs or not alive(pool) for pool in pools):
            self._graphs = self._find_graphs()
        for pool in pools:
            if not alive(pool):
                self._dead_pools.add(pool)
                self._graphs.pop(pool, None)
        return view.graph_pools & self._dead_pools

    def _find_graphs(self) -> dict[tuple, list]:
        torch = self.torch
        base = getattr(torch.cuda, "CUDAGraph", None)
        pool_of = getattr(getattr(torch._C, "_CUDAGraph", None), "pool", None)
        if base is None or pool_of is None:
            return {}
        kinds, todo = set(), [base]
        while todo:   # the graph class and its subclasses, by type identity (no user code)
            kind = todo.pop()
            kinds.add(kind)
            todo += type.__subclasses__(kind)
        out: dict[tuple, list] = {}
        for obj in gc.get_objects():
            if type(obj) in kinds:
                try:
                    pool = tuple(pool_of(obj))   # the base method: a subclass's is not run
                except Exception:
                    continue   # not captured yet: no pool
                try:
                    ref = weakref.ref(obj)
                except TypeError:
                    ref = _alive   # cannot be watched: its pool counts as alive
                out.setdefault(pool, []).append(ref)
        return out

    def _gpu_indices(self, device_ids) -> list[int]:
        if not self._cuda_ready():
            return []
        count = self.torch.cuda.device_count()
        out = []
        for dev in device_ids:
            if dev.startswith("cuda:") and dev[5:].isdigit() and int(dev[5:]) < count:
                out.append(int(dev[5:]))
        return out

    def internals(self, device_ids, reached_keys) -> list[Internal]:
        torch = self.torch
        out: list[Internal] = []
        clears = getattr(torch._C, "_cuda_clearCublasWorkspaces", None) is not None
        for index in self._gpu_indices(device_ids):
            dev = f"cuda:{index}"
            view = self.allocator_view(index)
            if view is None:
                continue
            out += view.internals(dev, _alloc.Reached.of(reached_keys, dev),
                                  clears_workspaces=clears,
                                  sizes_note=self.workspace_sizes(index)[1],
                                  released=self.dead_graph_pools(view))
        out += self._nccl(device_ids)
        return out

    def _nccl(self, device_ids) -> list[Internal]:
        """NCCL communicators of ``torch.distributed``: their buffers are allocated by
        NCCL itself, outside torch's allocator, so they are part of the rest."""
        dist = framework_module("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return []
            if "nccl" not in str(dist.get_backend()).lower():
                return []
            world = dist.get_world_size()
            dev = f"cuda:{self.torch.cuda.current_device()}"
        except Exception:
            return []
        if dev not in set(device_ids):
            return []
        return [Internal(
            "NCCL communicator (torch.distributed)", dev, None, "torch", count=world,
            freed_by_purge=False, kind="outside",
            note="NCCL allocates its buffers itself (NCCL_BUFFSIZE per channel and peer), "
                 "outside torch's allocator: they are in the rest; "
                 "torch.distributed.destroy_process_group() returns them")]

    def purge_estimate(self, device_ids, freed: dict, reached_keys=frozenset()) -> PurgeEstimate | None:
        indices = self._gpu_indices(device_ids)
        if not indices:
            return None
        clears = getattr(self.torch._C, "_cuda_clearCublasWorkspaces", None) is not None
        returned: dict[str, int] = {}
        covered: set = set()
        for index in indices:
            dev = f"cuda:{index}"
            view = self.allocator_view(index)
            if view is None:
                continue
            mine = [k for k in freed if len(k) == 2 and k[0] == dev and type(k[1]) is int
                    and view.segment_of(k[1]) is not None]
            covered.update(mine)
            returned[dev] = view.returned(_alloc.Reached(k[1] for k in mine),
                                          _alloc.Reached.of(reached_keys, dev), clears,
                                          released=self.dead_graph_pools(view))
        return PurgeEstimate(returned, covered)

    def release(self) -> list[str]:
        torch = self.torch
        notes: list[str] = []
        if self._cuda_ready():
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:
                clear()
            torch.cuda.empty_cache()
        mps = getattr(torch, "mps", None)
        if mps is not None and sys.platform == "darwin":
            try:
                mps.empty_cache()
            except Exception:
                pass
        return notes

    def type_name(self, name: str) -> str | None:
        return _TYPE_WORDS.get(name)

    # -- weak handles on storages (a purge checks what it freed) ------------------------
    def weak_handles(self, refs: dict, infos: dict) -> dict:
        """A weak reference to each storage itself (an int; it outlives a view's tensor
        object), taken without any ``__torch_function__`` of a subclass."""
        torch = self.torch
        base = getattr(torch._C, "TensorBase", None)
        storage_type = getattr(torch, "UntypedStorage", None)
        quiet = getattr(torch._C, "DisableTorchFunctionSubclass", None)
        if base is None or storage_type is None or quiet is None:
            return {}
        out: dict = {}
        with quiet():
            rest = [k for k, info in infos.items() if info.framework == "torch" and len(k) == 2]
            plain = {torch.Tensor, getattr(torch.nn, "Parameter", torch.Tensor)}
            try:   # plain tensors and parameters, the bulk: C-level passes
                objs = list(map(refs.get, rest))
                mask = list(map(plain.__contains__, map(type, objs)))
                keys = list(compress(rest, mask))
                storages = list(map(base.untyped_storage, compress(objs, mask)))
                del objs
                same = list(map(eq, map(storage_type.data_ptr, storages), map(_SECOND, keys)))
                keys = list(compress(keys, same))
                weak = list(map(storage_type._weak_ref, compress(storages, same)))
                del storages
                out.update(zip(keys, weak))   # ints: nothing more for the collector
                rest = list(filterfalse(out.__contains__, rest))
            except Exception:
                self.release_handles(list(out.values()))
                out = {}
            for key in rest:
                obj = refs.get(key)
                if obj is None:
                    continue
                try:   # a storage, or every component of a tensor's layout (sparse...)
                    tp = type(obj)
                    storages = [obj] if is_subtype(tp, storage_type) else \
                        self.reader.storage_objects(obj) if is_subtype(tp, base) else []
                    for storage in storages:
                        if storage_type.data_ptr(storage) == key[1]:
                            out[key] = storage_type._weak_ref(storage)
                    del storages
                except Exception:
                    pass
                del obj
        return out

    def handle_alive(self, handle: Any) -> bool:
        return not self.torch.UntypedStorage._expired(handle)

    def release_handles(self, handles: list) -> None:
        free = self.torch.UntypedStorage._free_weak_ref
        for handle in handles:
            try:
                free(handle)
            except Exception:
                pass

    def gc_sees_all(self, tp: type) -> bool:
        module = getattr(getattr(self.torch, "nn", None), "Module", None)
        return is_a(module, type) and is_subtype(tp, module)

    def peak_counters(self, device_ids) -> list[PeakCounter]:
        return _peaks.counters(device_ids)

    def peak_counter(self, key: tuple) -> PeakCounter | None:
        return _peaks.counter(key)

    def peak_patches(self, ledger: PeakLedgerView) -> list:
        return _peaks.patches(ledger)

    def is_oom(self, exc: BaseException, text: str) -> bool:
        return oom_by_name(exc) or "DefaultCPUAllocator: can't allocate memory" in text

    def trace_feed(self) -> _trace.CudaFeed:
        return _trace.CudaFeed()

    def host_recorder(self, cells: Any, max_entries: int, stop_code: Any = None):
        return _trace.HostRecorder(cells, max_entries, stop_code) if self.is_active() else None

    def summary_writer(self, logdir: str) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=logdir)

    def hint(self, name: str, obj: Any, nbytes: int) -> str | None:
        torch = self.torch
        tp = type(obj)   # never obj.__class__: a mock's spec would pass for a tensor
        if tp is list or tp is tuple or tp is dict:   # never ==: a metaclass's __eq__
            return self._container_hint(name, obj)
        if not is_subtype(tp, torch.Tensor):
            if is_subtype(tp, torch.optim.Optimizer):
                return (f"`{name}` holds its parameters and their state: "
                        f"purge it together with its model")
            return None
        base = torch._C.TensorBase
        if self.graph_and_grad(obj)[0] is not None:
            store = f"`{name}.item()` or `{name}.detach()`" if self._one_element(obj) \
                else f"`{name}.detach()`"
            return f"`{name}` keeps its autograd graph alive: store {store} instead"
        try:
            with torch._C.DisableTorchFunctionSubclass():
                own = base.numel(obj) * base.element_size(obj)
                storage = torch._C.StorageBase.nbytes(base.untyped_storage(obj))
        except Exception:
            return None
        if storage > 2 * own and storage - own >= 1 << 20:
            return (f"`{name}` is a view that pins its whole base storage: "
                    f"keep `{name}.clone()` instead")
        return None

    #: how many items of a list, tuple or dict the hint looks at
    HINT_ITEMS = 64

    def _one_element(self, obj: Any) -> bool:
        """Whether tensor ``obj`` has one element (``.item()`` works), read without a
        subclass's code."""
        torch = self.torch
        try:
            with torch._C.DisableTorchFunctionSubclass():
                return torch._C.TensorBase.numel(obj) == 1
        except Exception:  # noqa: BLE001 - a tensor refusing numel: no .item() offered
            return False

    def _container_hint(self, name: str, obj: Any) -> str | None:
        """The hint of a plain list, tuple or dict whose tensors keep their autograd
        graphs (``losses.append(loss)`` in a training loop): its first items looked at,
        through the built-in types' own iteration (no user code)."""
        items = dict.values(obj) if type(obj) is dict else obj
        graphs = ones = 0
        for item in islice(items, self.HINT_ITEMS):
            if not is_subtype(type(item), self.torch.Tensor):
                continue
            if self.graph_and_grad(item)[0] is not None:
                graphs += 1
                ones += self._one_element(item)
        if not graphs:
            return None
        store = "`.item()` or `.detach()`" if ones == graphs else "`.detach()`"
        return f"`{name}` keeps the autograd graphs of its tensors alive: store {store} of each instead"


BACKENDS = [TorchBackend()]
