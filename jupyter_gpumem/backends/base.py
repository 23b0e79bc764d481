"""The small interface every framework backend implements.

A backend answers, for objects of its framework: is this a tensor, which
storage does it use (a key that is the same for every view of that memory),
how many bytes and on which device; which children the garbage collector
cannot see (gradients, autograd saved tensors); the device counters of its
allocator; and how to release its caches. A backend is active only while
its framework is already in ``sys.modules``: backends never import one.
"""
from __future__ import annotations

import importlib.metadata as _metadata
import json
import os
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple

from ..units import JsonFields, json_field


class StorageInfo(NamedTuple):
    """One block of memory that tensors point into.

    ``key`` identifies the memory itself: ``(device, base pointer)`` where a
    pointer is known, so views, aliases and DLPack exchanges between
    frameworks are counted once. (A named tuple: the scan makes one per
    tensor, so it must be cheap.)
    """

    key: tuple
    nbytes: int
    device: str
    framework: str


@dataclass
class FrameworkUsage(JsonFields):
    """What one framework's allocator reports for one device, in bytes (its JSON: the
    ``frameworks`` of a ``DeviceUsage`` in docs/PROTOCOL.md)."""

    name: str
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None
    pool: int | None = None
    note: str | None = None
    # the device's fragmentation (DeviceUsage.fragmentation), not in this object's JSON
    free_in_reserved: int | None = json_field(None, leave_out=True)
    largest_free_block: int | None = json_field(None, leave_out=True)


@dataclass
class Internal(JsonFields):
    """Memory a framework or the CUDA context keeps for itself on one device: a holder
    of its own, listed under the notebook's names.

    ``kind`` says where the bytes sit: ``"allocated"`` (inside the framework's
    allocated bytes, so no longer "unattributed": cuBLAS workspaces, a CUDA
    graph's kept blocks), ``"cached"`` (reserved by the framework but not
    allocated: its cached free blocks) or ``"outside"`` (outside every
    framework's pool, part of the reconciliation line's rest: thread stacks of
    the CUDA context, NCCL). ``freed_by_purge``: whether ``%gpumem purge`` gives
    these bytes back to the device. ``nbytes`` is ``None`` where the framework
    says that the memory exists but not how much. Its JSON: the ``Internal`` object of
    docs/PROTOCOL.md.
    """

    label: str
    device: str
    nbytes: int | None = json_field(key="bytes")
    framework: str = ""
    count: int | None = None
    freed_by_purge: bool = False
    kind: str = "allocated"
    note: str | None = None
    #: its blocks ``(address, size)`` where the framework knows them (for trace, which
    #: leaves them out of what no name reaches: they are shown here already)
    blocks: tuple = json_field((), leave_out=True)


class PurgeEstimate(NamedTuple):
    """What a framework gives back to each device when a purge frees some storages and
    releases its caches: bytes per device, and the storage keys those figures
    account for (the rest are counted by their own size)."""

    returned: dict
    covered: set


@dataclass
class AcceleratorInfo:
    """A device a framework can see: ``cuda:0`` and how to find it in NVML (a
    ``DeviceUsage`` is one with its memory figures)."""

    id: str
    kind: str = "cuda"
    name: str | None = None
    uuid: str | None = None
    total: int | None = None


Children = Iterable["tuple[tuple, Any]"]

_TYPE_DICT = type.__dict__["__dict__"].__get__
_TYPE_MRO = type.__dict__["__mro__"].__get__
_GETSET = type(type.__dict__["__dict__"])
_PROXY_ITEMS = type(type.__dict__).items
_FGET = property.__dict__["fget"].__get__
_BUILTIN = type(len)


def dict_descriptor(tp: type) -> Any:
    """The C-level ``__dict__`` descriptor of ``tp``'s instances, or ``None`` (no
    instance dict, or a class that replaced it with something of its own)."""
    for klass in _TYPE_MRO(tp):
        d = _TYPE_DICT(klass)
        if "__dict__" in d:
            descr = d["__dict__"]
            return descr if type(descr) is _GETSET else None
    return None


def class_getters(tp: type) -> list[tuple[str, Any]]:
    """``(name, descriptor)`` of every C-level getter of ``tp`` and its bases: a getset,
    or a property whose getter is a built-in function (a pybind11 class's), read from the
    classes' own dicts (no ``__dir__`` or ``__getattr__`` of a metaclass runs), the first
    in the MRO for each name. Any other object, a property of Python code included, is
    left out: ``descriptor.__get__(obj, tp)`` runs only C code."""
    out: dict[str, Any] = {}
    for klass in _TYPE_MRO(tp):
        for name, descr in _PROXY_ITEMS(_TYPE_DICT(klass)):   # a class's own dict
            if type(name) is str and name not in out:
                out[name] = descr
    return [(k, v) for k, v in out.items() if type(v) is _GETSET or (
        type(v) is property and type(_FGET(v)) is _BUILTIN)]


#: metaclass -> whether the classes it makes hash and compare as ``type``'s do (asking a
#: metaclass is safe: its own metaclass is ``type``)
_META_KEYABLE: dict = {type: True}


def keyable_meta(meta: type) -> bool:
    """Whether classes whose metaclass is ``meta`` can be hashed and compared without the
    user's code: no class along ``meta``'s MRO before ``type`` defines ``__eq__`` or
    ``__hash__``. Hashing such a class would run the user's ``__hash__``, or fail (an
    ``__eq__`` alone makes the class unhashable)."""
    known = _META_KEYABLE.get(meta)
    if known is None:
        known = True
        try:
            for klass in _TYPE_MRO(meta):
                if klass is type:
                    break
                d = _TYPE_DICT(klass)
                if "__hash__" in d or "__eq__" in d:
                    known = False
                    break
        except Exception:  # noqa: BLE001 - an odd metaclass: never a key then
            known = False
        if len(_META_KEYABLE) < 10_000:
            _META_KEYABLE[meta] = known
    return known


def is_subtype(tp: type, cls: "type | tuple[type, ...]") -> bool:
    """``issubclass(tp, cls)`` that runs none of the user's code: where ``tp``'s metaclass
    defines ``__hash__`` or ``__eq__`` (which an abstract base class's check calls: it
    keeps the classes it was asked about in sets), ``tp``'s real MRO is read and its
    classes compared by identity (a virtual subclass registered with an abstract base
    class is not one then). The one place the package asks about a type of the user's
    (tests/test_layout.py holds the layers that read the user's objects to it)."""
    meta = type(tp)
    if meta is type or keyable_meta(meta):
        return issubclass(tp, cls)
    classes = cls if type(cls) is tuple else (cls,)
    try:
        return any(b is c for b in _TYPE_MRO(tp) for c in classes)
    except TypeError:   # not a class: as issubclass says of it
        return False


def is_a(obj: Any, cls: "type | tuple[type, ...]") -> bool:
    """``isinstance`` by the object's real type: never asks ``obj.__class__`` (a
    property of the user's, a mock's spec, a dead weak proxy), which ``isinstance``
    does wherever the type alone says no, nor its metaclass's ``__hash__`` (see
    :func:`is_subtype`). The one way the package asks what an object is
    (tests/test_layout.py holds the layers that read the user's objects to it)."""
    tp = type(obj)
    return issubclass(tp, cls) if type(tp) is type else is_subtype(tp, cls)


def instance_dict(obj: Any) -> dict:
    """``obj.__dict__`` read through the C slot: no property or ``__getattribute__``
    of the object's class runs. Empty when there is none."""
    descr = dict_descriptor(type(obj))
    d = descr.__get__(obj) if descr is not None else None
    return d if type(d) is dict else {}


# -- the real framework, never a stand-in --------------------------------------------
#: a framework's top-level module -> the distributions that install it ("x-*": every
#: distribution whose name starts with "x-")
DISTRIBUTIONS = {
    "torch": ("torch",),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                   "tensorflow-macos", "tf-nightly", "tf-nightly-*", "tensorflow-rocm"),
    "keras": ("keras", "tf-keras"),
    "cupy": ("cupy", "cupy-cuda11x", "cupy-cuda12x", "cupy-cuda13x", "cupy-rocm-*",
             "cupy-cuda*"),
}
_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__
_verdicts: dict[int, tuple] = {}   # id(module) -> (weak ref to it, whether it is real)
_homes: dict[str, tuple] = {}      # top-level name -> the folders its distributions install


def _installed_homes(top: str, names: tuple) -> tuple:
    """Where the distributions ``names`` put ``top``: ``<site-packages>/<top>`` of each
    installed one, and the source folder of an editable install. Asked once per name."""
    found = _homes.get(top)
    if found is not None:
        return found
    dists = []
    for name in names:
        if not name.endswith("*"):
            try:
                dists.append(_metadata.distribution(name))
            except _metadata.PackageNotFoundError:
                pass
    if not dists and any(n.endswith("*") for n in names):
        prefixes = tuple(n[:-1] for n in names if n.endswith("*"))
        dists = [d for d in _metadata.distributions()
                 if str(d.metadata.get("Name") or "").lower().startswith(prefixes)]
    homes = []
    for dist in dists:
        homes.append(os.path.realpath(str(dist.locate_file(top))))
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}")
        except (ValueError, OSError):
            url = {}
        if type(url) is dict and (url.get("dir_info") or {}).get("editable") and \
                str(url.get("url", "")).startswith("file://"):
            homes.append(os.path.realpath(url["url"][len("file://"):]))
    found = _homes[top] = tuple(homes)
    return found


def _is_real(module: Any, name: str, distributions: tuple) -> bool:
    if type(module) is not types.ModuleType:
        return False   # a module subclass or any other object put there
    path = dict.get(_MODULE_DICT(module), "__file__")
    if type(path) is not str or not path:
        return False   # made at run time
    path = os.path.realpath(path)
    top = name.partition(".")[0]
    return any(path.startswith(home + os.sep) or   # a package, or a module of one file
               (os.path.dirname(path) == os.path.dirname(home) and
                os.path.basename(path).partition(".")[0] == top)
               for home in _installed_homes(top, distributions or DISTRIBUTIONS.get(top, (top,))))


def with_room(fn, *args):
    """``fn(*args)`` with 200 more frames of recursion limit than now (put back after;
    a limit only bounds the stack, so a higher one for a moment changes no answer), or
    None where it still fails. The one answer to a ``RecursionError`` met while deciding
    something about an object or a type: that the stack was deep says nothing of it."""
    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(old + 200)
        return fn(*args)
    except Exception:  # noqa: BLE001 - still unreadable: the caller decides nothing
        return None
    finally:
        sys.setrecursionlimit(old)


def framework_module(name: str, distributions: tuple = ()) -> Any:
    """``sys.modules[name]`` where it is a module of the real framework (``torch``,
    ``jax._src.xla_bridge``): a plain module whose file lies where an installed
    distribution of that framework put it (``distributions``, else the framework's in
    :data:`DISTRIBUTIONS`, else the one named like its top-level module); else
    ``None``. A stand-in (a mock, a module made at run time, a file of the user's named
    like the framework) is never read, so no ``__getattr__`` of its runs. Decided once
    per module object (a weak reference tells when it is gone); the one place backends
    look a framework up."""
    module = dict.get(sys.modules, name)
    if module is None:
        return None
    got = _verdicts.get(id(module))
    if got is not None and got[0]() is module:
        return module if got[1] else None
    try:
        real = _is_real(module, name, distributions)
    except RecursionError:
        # a low recursion limit (the user's, or deep in a walk) says nothing of the
        # module: the look-up (importlib.metadata, realpath) is asked again with room
        real = with_room(_is_real, module, name, distributions)
        if real is None:
            return None   # not proved real: not read, and not decided for good
    except Exception:  # noqa: BLE001 - not proved real: not read, and not decided for good
        return None
    try:
        ref = weakref.ref(module, lambda r, key=id(module): _verdicts.pop(key, None))
    except TypeError:
        return module if real else None
    _verdicts[id(module)] = (ref, real)
    return module if real else None


#: a counter reading: field -> (current bytes, peak bytes)
Reading = dict


class PeakCounter:
    """One resettable high-water mark (or a family of them) for one device: what
    ``%%gpuwatch`` reads for an exact peak (see :mod:`jupyter_gpumem.watch.peaks`)."""

    key: tuple = ()                    # (family, device)
    device: str = ""
    family: str = ""                   # the backend's name, or a host counter's
    exact_label: str = ""
    allocated_field: str | None = None   # the field of the allocated bytes' peak
    reserved_field: str | None = None    # the field of the reserved bytes' peak
    born_lazily: bool = False          # the allocator may begin inside a watched scope

    def read(self) -> Reading | None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class PeakLedgerView:
    """What a backend's patches of the user's own peak functions ask the ledger."""

    def before_user_reset(self, key: tuple) -> None:
        """Fold the peak the user is about to reset into every open scope."""

    def user_peaks(self, key: tuple, reading: Reading) -> dict:
        """Peaks a user's reading should show (lifted by what scopes reset)."""
        return {f: p for f, (_, p) in reading.items()}


#: ``(module name, attribute, make(original) -> wrapper)``: a function of the user's to patch
Patch = tuple


class Backend:
    """Base class: a backend for one framework (see the module docstring)."""

    #: short name shown in reports
    name = ""
    #: top-level module that must already be imported for the backend to work
    module = ""

    #: the distributions that install :attr:`module` (empty: :data:`DISTRIBUTIONS`' entry,
    #: else the distribution named like the module)
    distributions: tuple = ()

    @property
    def lib(self) -> Any:
        """The framework's module (only while :meth:`is_active`)."""
        module = framework_module(self.module, self.distributions)
        if module is None:
            raise KeyError(self.module)
        return module

    def is_active(self) -> bool:
        """True when the user has imported the framework: the real one
        (:func:`framework_module`), never a stand-in under its name."""
        return framework_module(self.module, self.distributions) is not None

    def tensor_types(self) -> tuple[type, ...]:
        """Types whose instances :meth:`storages` understands."""
        return ()

    def container_types(self) -> tuple[type, ...]:
        """Types whose children :meth:`children` lists better than a generic walk."""
        return ()

    def storages(self, obj: Any) -> list[StorageInfo]:
        """The storages a tensor of this framework uses (empty when none)."""
        return []

    def children(self, obj: Any) -> Iterator[tuple[tuple, Any]]:
        """Edges the generic walk cannot see, as ``(label, child)`` pairs.

        Labels are tuples understood by :func:`jupyter_gpumem.core.scan.format_path`.
        """
        return iter(())

    def tensor_edges(self, obj: Any, seen: dict) -> "tuple | list":
        """Like :meth:`children` for a tensor, as a sequence (empty on the fast path).

        ``seen`` lives for one root's walk: a backend records there the graph
        nodes it has expanded (id -> node, which also keeps each id valid), so
        a graph reached through many of its tensors is expanded once. Return a
        tuple when the edges do not depend on ``seen`` (the scan then reuses
        them for every root), a list when they do.
        """
        return tuple(self.children(obj))

    def weak_handles(self, refs: dict, infos: dict) -> dict:
        """``key -> handle`` for storages of ``infos`` (key -> :class:`StorageInfo`) this
        framework can watch without keeping them alive, from ``refs`` (key -> an object
        using the storage); a purge asks :meth:`handle_alive` whether each went, then
        gives them back with :meth:`release_handles`. The keys left out are watched
        through a weak reference to their object."""
        return {}

    def handle_alive(self, handle: Any) -> bool:
        """Whether the storage of a :meth:`weak_handles` handle is still in use."""
        return True

    def release_handles(self, handles: list) -> None:
        """Give back handles :meth:`weak_handles` took."""

    def gc_sees_all(self, tp: type) -> bool:
        """Whether the garbage collector sees all that a container of type ``tp`` holds,
        so that the walk may read it by its referents (a PyTorch module, whose children
        are its instance dict's entries; not an optimizer, whose come in batches)."""
        return False

    def graph_and_grad(self, obj: Any) -> tuple:
        """A tensor's autograd node and gradient (``None`` where it has none)."""
        return None, None

    def path_attr(self, obj: Any, name: str) -> Any:
        """Attribute ``name`` of ``obj`` where a path the scan prints steps through a link
        only this framework reads (a tensor's ``grad_fn``, an autograd graph's
        ``next_functions`` and saved tensors), read as the walk reads it: no user code,
        no hook. LookupError where this backend reads no such attribute of ``obj``;
        ValueError, its text the reason, where it does but cannot read it now."""
        raise LookupError(name)

    def describe(self, obj: Any) -> str | None:
        """A tensor's dtype and shape in a few words, read without its code."""
        return None

    def parts(self, obj: Any) -> list[tuple[str, Any]]:
        """``(method, tensor)`` of each part holding the data of a tensor of several
        parts (a sparse tensor's ``_indices``, ``_values``), where the report names the
        part of each storage (``s._values()``); [] for another."""
        return []

    def take(self, obj: Any, seen: dict) -> tuple:
        """:meth:`storages` and :meth:`tensor_edges` of a tensor met for the first time
        in a scan, in one call (a backend may do both at once, faster)."""
        return self.storages(obj), self.tensor_edges(obj, seen)

    def batch_types(self) -> frozenset:
        """Exact tensor types :meth:`take_many` handles."""
        return frozenset()

    def take_many(self, values: list) -> "tuple[list, tuple, list] | None":
        """For many tensors of :meth:`batch_types` met in one container (an optimizer's
        state): the storages of each, the label of the one tensor each may hold, and
        that tensor or ``None`` (a gradient), found with C-level passes instead of a
        call per tensor. ``None`` when some tensor needs the long way (:meth:`take`):
        an autograd graph, say."""
        return None

    def fingerprint_spec(self) -> "tuple | None":
        """What the warm scan's fingerprint reads of a plain tensor (core/_reach_parts/fp_tensor.c):
        ``(known, grad_fn, stamp_getters, grad)``, the record of :meth:`batch_spec`, the
        getters of its storage stamp (see :meth:`batch_spec`) and two getters (getset or
        method descriptors are called through their C functions). None: this backend's
        tensors are walked each time."""
        return None

    def getters_run_code(self) -> bool:
        """Whether reading a tensor through :meth:`fingerprint_spec`'s getters can run
        Python code now (a framework's mode that intercepts them): the warm scan then
        hashes each root again instead of running its plan of checks, which holds no
        reference to what it checks (core/_reach_parts/plan.c)."""
        return False

    def batch_spec(self) -> "tuple | None":
        """:meth:`take_many` as the C core's one loop runs it (``_reach.take_batch``):
        ``(known, get_fn, stamp_getters, get_held, storages, label)``. For each tensor, an
        autograd graph where ``get_fn(t)`` is not None (the batch then goes the long
        way); its storages ``known[id(t)][2]`` where the stamp ``known[id(t)][1]`` holds
        (the backend's own record: a weak reference to the storage object, its bytes and
        its data pointer, checked with ``stamp_getters``: the storage of a tensor, the
        bytes and the data pointer of a storage), else ``storages(t)``; the one tensor it
        holds ``get_held(t)`` (or None) under ``label``. None: :meth:`take_many` is
        called. The getters must run no user code on :meth:`batch_types`' exact types."""
        return None

    def start_scan(self, deadline: float) -> None:
        """A scan begins; it must end by ``deadline`` (``time.perf_counter()``)."""

    def set_deadline(self, deadline: float) -> None:
        """The walk of the next root must end by ``deadline``."""

    def partial_reasons(self) -> list[str]:
        """Why the walk since the last call left something out (then forgotten)."""
        return []

    def notes(self) -> list[str]:
        """What the report should say of the walk since the last call, the result not
        partial for it (saved tensors behind hooks, not read), then forgotten."""
        return []

    def accelerators(self) -> list[AcceleratorInfo]:
        """Accelerators this framework has already initialised."""
        return []

    def usage(self, device_ids: Iterable[str], detail: bool = False) -> dict[str, FrameworkUsage]:
        """Allocator counters per device id, for devices already in use."""
        return {}

    def release(self) -> list[str]:
        """Give cached memory back to the device; return one-line notes."""
        return []

    def internals(self, device_ids: Iterable[str], reached_keys: "set | frozenset") -> list[Internal]:
        """What the framework keeps for itself on these devices (workspaces, cached
        blocks, private pools, ...), found from what it exposes (allocator
        snapshots, configuration, counters), never by allocating or freeing.
        ``reached_keys``: the storage keys the notebook's names reach, which are
        not internals."""
        return []

    def purge_estimate(self, device_ids: Iterable[str], freed: dict,
                       reached_keys: "set | frozenset" = frozenset()) -> PurgeEstimate | None:
        """What a purge gives back to the device when the storages in ``freed``
        (key -> :class:`StorageInfo`) are freed and :meth:`release` runs; ``None``
        where the framework cannot say (each freed storage then counts its size).
        ``reached_keys``: every storage the names reach before the purge."""
        return None

    def hint(self, name: str, obj: Any, nbytes: int) -> str | None:
        """A one-line hint when ``obj`` held by ``name`` matches a leak pattern."""
        return None

    def peak_counters(self, device_ids: Iterable[str]) -> list[PeakCounter]:
        """The exact peak counters available now on these devices (never creating a
        device context to get one)."""
        return []

    def peak_counter(self, key: tuple) -> PeakCounter | None:
        """The counter of ``key`` (one of this backend's), to read it again."""
        return None

    def peak_patches(self, ledger: PeakLedgerView) -> list:
        """The functions of the framework that reset or read its peaks, wrapped so a
        user's reset inside a watched scope loses no peak and the user still sees the
        real peaks: a list of :data:`Patch`."""
        return []

    #: environment settings that make the framework allocate on demand (``%gpumem tame``),
    #: read when it sets up its devices; and those that also give every free back
    tame_env: dict = {}
    give_back_env: dict = {}

    def tame_state(self) -> str:
        """Whether :attr:`tame_env` can still apply: ``not imported``, ``imported, no
        device used yet``, or ``too late`` (it set up its devices already)."""
        return "not imported"

    def type_name(self, name: str) -> str | None:
        """What an object whose class is called ``name`` is, in a user's words
        (``tensor`` for torch's ``Tensor``); None: the class name says it."""
        return None

    def is_oom(self, exc: BaseException, text: str) -> bool:
        """Whether ``exc`` (its message ``text``) is this framework's out-of-memory error."""
        return False

    # -- the allocation trace (``%gpumem trace``, :mod:`jupyter_gpumem.core.trace`) --------
    def trace_feed(self) -> Any | None:
        """The allocation history of this framework's device allocator, as ``%gpumem
        trace`` reads it, or ``None`` where it keeps none. Asked once when trace starts,
        whether the framework is imported yet or not (the feed's ``state()`` says so).
        Trace follows the first backend, in report order, that gives a feed; what a feed
        answers: :class:`jupyter_gpumem.core.trace.Tracer` (the torch one:
        :class:`jupyter_gpumem.backends.torch_trace.CudaFeed`)."""
        return None

    def host_recorder(self, cells: Any, max_entries: int, stop_code: Any = None) -> Any | None:
        """A recorder of where this framework's host (CPU) storages are allocated, for the
        backend trace follows, or ``None``. Asked only while :meth:`is_active`. ``cells``
        names notebook cells by code file; ``stop_code``: the code object where a stack
        walk stops (IPython's ``run_code``). What a recorder answers:
        :class:`jupyter_gpumem.backends.torch_trace.HostRecorder`."""
        return None

    # -- exports and the cluster -------------------------------------------------------------
    def summary_writer(self, logdir: str) -> Any | None:
        """A TensorBoard ``SummaryWriter`` (``add_scalar``, ``close``) this framework brings,
        writing to ``logdir``; ``None`` where it brings none; ImportError where it would but
        what it needs is not installed. Asked only while :meth:`is_active`."""
        return None

    def tensorboard_may_import(self) -> bool:
        """Whether TensorBoard may import this framework (it is imported already and
        TensorBoard would use it). While no active backend says so, TensorBoard is kept to
        its stub that imports no framework. Asked only while :meth:`is_active`."""
        return False

    def pointer_device(self, ptr: int) -> str | None:
        """The device (``cuda:1``) of a raw CUDA pointer, where this framework can ask the
        driver; ``None`` where it cannot. Asked only while :meth:`is_active`."""
        return None

    # -- the registry ----------------------------------------------------------------------------
    #: where this backend stands in the registry, so in reports: lower first, ties by the
    #: name of the module that defines it
    order: int = 100

    def joined(self, registry: "Registry") -> None:
        """The registry has taken this backend in (one that reads the other backends keeps
        ``registry.active``)."""


def oom_by_name(exc: BaseException) -> bool:
    """The ``OutOfMemoryError`` class of torch and CuPy, known by its name."""
    return type(exc).__name__ == "OutOfMemoryError"


def xla_is_oom(backend: Backend, exc: BaseException, text: str) -> bool:
    """:meth:`Backend.is_oom` of a framework on XLA's runtime (JAX, TensorFlow): the
    status its failed allocations carry."""
    return "RESOURCE_EXHAUSTED" in text


#: DLPack device types -> where the memory is: kDLCPU, kDLCUDA, kDLCUDAHost (pinned),
#: kDLROCM, kDLROCMHost, kDLCUDAManaged ("cuda": a GPU, ROCm's through the CUDA API too)
DLPACK_DEVICES = {1: "cpu", 2: "cuda", 3: "cpu", 10: "cuda", 11: "cpu", 13: "cuda"}


@dataclass
class Registry:
    """The known backends, in report order."""

    backends: list[Backend] = field(default_factory=list)

    def active(self) -> list[Backend]:
        return [b for b in self.backends if b.is_active()]

    def add(self, found: "Iterable[tuple[str, Backend]]") -> None:
        """Take in ``(module name, backend)`` pairs, placed by :attr:`Backend.order`, then by
        module name, then in the order each module lists them."""
        ranked = sorted(((b.order, module, i), b) for i, (module, b) in enumerate(found))
        for _, backend in ranked:
            self.backends.append(backend)
            backend.joined(self)


def _fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.2f} µs" if us < 10 else f"{us:.1f} µs" if us < 1000 else f"{us / 1000:.1f} ms"


@dataclass
class TraceCost:
    """What an allocation trace's recording costs, measured on a fixed micro-workload with
    and without it (what a trace feed's and a host recorder's ``measure`` return)."""

    what: str            # "CUDA allocation" or "torch call on the host"
    without: float       # seconds per operation
    with_: float
    calls: int

    @property
    def extra(self) -> float:
        return max(self.with_ - self.without, 0.0)

    @property
    def ratio(self) -> float:
        return self.with_ / self.without if self.without > 0 else float("nan")

    @property
    def text(self) -> str:
        return (f"+{_fmt_us(self.extra)} per {self.what} ({_fmt_us(self.without)} -> "
                f"{_fmt_us(self.with_)}, {self.ratio:.2f}x, measured on {self.calls} calls)")
