"""What the generated cells build with: tensors whose storages are watched (``atom``),
and classes, hooks and functions that are traps, each counting its calls in
:data:`CALLS`.

The cells of a recipe (tests/generated/recipe.py) reach this module as ``gen``, a name
the test puts in the shell's hidden namespace (so it is no user name). Nothing here
keeps a tensor alive: :data:`WEAK` holds torch's ``StorageWeakRef`` of each atom's
storage, which says whether the storage still lives without holding it.

``__del__`` is not a trap: a finalizer that runs because a purge freed its object is the
purge's point.
"""
from __future__ import annotations

import functools
import sys
import types

import torch
from torch.multiprocessing.reductions import StorageWeakRef

#: every call of a trap, in order ("Trap.__len__", "unpack", ...)
CALLS: list[str] = []
#: atom key -> StorageWeakRef of its storage
WEAK: dict[str, StorageWeakRef] = {}
MODULE_PREFIX = "gpumem_gen_"


def called(what: str) -> None:
    CALLS.append(what)


def reset() -> None:
    """Forget the calls and the atoms of the last example."""
    CALLS.clear()
    WEAK.clear()


def _watch(key: str, tensor) -> None:
    WEAK[key] = StorageWeakRef(tensor.untyped_storage())


def atom(key: str, n: int):
    """A new tensor of ``n`` floats (all ``len(key)``), its storage watched as ``key``."""
    t = torch.full((n,), float(len(key)))
    _watch(key, t)
    return t


#: the names :func:`module` put in ``sys.modules`` (since :func:`forget_modules`)
_REGISTERED: set[str] = set()


def module(key: str, value, registered: bool):
    """A module object whose global ``t`` is ``value``; in ``sys.modules`` (as
    ``gpumem_gen_KEY``) where ``registered``."""
    mod = types.ModuleType(MODULE_PREFIX + key)
    mod.t = value
    if registered:
        sys.modules[mod.__name__] = mod
        _REGISTERED.add(mod.__name__)
    return mod


def forget_modules() -> None:
    """Take the modules :func:`module` registered out of ``sys.modules`` (those it
    registered, not every name of ``sys.modules``: thousands, with the frameworks)."""
    for name in _REGISTERED:
        sys.modules.pop(name, None)
    _REGISTERED.clear()


def numpy_view(tensor, start: int):
    """``torch.from_numpy(tensor.numpy()[start:start + 2])``, ``start`` moved back where
    the tensor is shorter, so that the view holds one element at least: a numpy view of no
    element has an address but no byte, and says of no allocation that it keeps it."""
    import torch  # noqa: PLC0415 - the examples import it first
    start = max(min(start, tensor.numel() - 1), 0)
    return torch.from_numpy(tensor.numpy()[start:start + 2])


def with_attr(tensor, value):
    """``tensor``, with ``value`` as its attribute ``extra`` (in the tensor's own
    ``__dict__``, as ``param.main_grad`` is kept by some trainers)."""
    tensor.extra = value
    return tensor


def sparse(key: str, n: int):
    """A sparse COO tensor of ``n`` values; its values' and its indices' storages are
    watched as ``key`` and ``key + ".i"``."""
    values = torch.full((n,), 2.0)
    indices = torch.arange(n).unsqueeze(0)
    t = torch.sparse_coo_tensor(indices, values, (n,))
    _watch(key, t._values())
    _watch(key + ".i", t._indices())
    return t


# -- classes whose every hook is a trap ---------------------------------------------------------
class _TrapMeta(type):
    def __getattribute__(cls, name):
        called(f"metaclass __getattribute__ {name}")
        return type.__getattribute__(cls, name)


def _compared(owner: str):
    """``__eq__`` and ``__hash__`` by identity, each a trap of ``owner``'s."""
    def __eq__(self, other):
        called(f"{owner}.__eq__")
        return self is other

    def __hash__(self):
        called(f"{owner}.__hash__")
        return id(self) >> 4
    return __eq__, __hash__


class Trap(metaclass=_TrapMeta):
    """An instance with a ``__dict__``: every protocol method and property is a trap."""

    def __init__(self, **attrs):
        for key, value in attrs.items():
            object.__setattr__(self, key, value)

    def __getattribute__(self, name):
        called(f"Trap.__getattribute__ {name}")
        return object.__getattribute__(self, name)

    def __getattr__(self, name):
        called(f"Trap.__getattr__ {name}")
        raise AttributeError(name)

    __eq__, __hash__ = _compared("Trap")

    def __len__(self):
        called("Trap.__len__")
        return 0

    def __iter__(self):
        called("Trap.__iter__")
        return iter(())

    def __repr__(self):
        called("Trap.__repr__")
        return "Trap()"

    @property
    def prop(self):
        called("Trap.prop")
        raise RuntimeError("a property was read")

    @property
    def __class__(self):
        called("Trap.__class__")
        return Trap


class SlotTrap:
    """An instance with ``__slots__`` only; its hooks are traps."""

    __slots__ = ("a", "b")

    def __init__(self, a=None, b=None):
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)

    def __getattribute__(self, name):
        called(f"SlotTrap.__getattribute__ {name}")
        return object.__getattribute__(self, name)

    __eq__, __hash__ = _compared("SlotTrap")

    def __repr__(self):
        called("SlotTrap.__repr__")
        return "SlotTrap()"

    @property
    def __class__(self):
        called("SlotTrap.__class__")
        return SlotTrap


def _container_traps(cls, base, names):
    for name in names:
        def method(self, *args, _name=name, _does=getattr(base, name)):
            called(f"{cls.__name__}.{_name}")
            return _does(self, *args)
        method.__name__ = name
        setattr(cls, name, method)
    return cls


class TrapList(list):
    """A list whose protocol methods are traps (the cell fills it with ``list.append``)."""


class TrapDict(dict):
    """A dict whose protocol methods are traps (the cell fills it with ``dict.__setitem__``)."""


_container_traps(TrapList, list, ("__len__", "__iter__", "__getitem__", "__eq__", "__repr__",
                                  "__contains__", "__reversed__"))
_container_traps(TrapDict, dict, ("__len__", "__iter__", "__getitem__", "keys", "items", "values",
                                  "get", "__eq__", "__repr__", "__contains__"))
TrapList.__hash__ = None
TrapDict.__hash__ = None


def trap_list(*items):
    out = TrapList()
    for item in items:
        list.append(out, item)
    return out


def trap_dict(**items):
    out = TrapDict()
    for key, value in items.items():
        dict.__setitem__(out, key, value)
    return out


class FunctionTensor(torch.Tensor):
    """A tensor subclass with a ``__torch_function__`` and properties that are traps."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        called(f"__torch_function__ {getattr(func, '__name__', func)}")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @property
    def device(self):
        called("FunctionTensor.device")
        return torch.device("cpu")


def subclassed(t):
    """``t``'s storage seen through a :class:`FunctionTensor` (no trap runs to make it)."""
    return torch.Tensor._make_subclass(FunctionTensor, t)


class TrapModule(torch.nn.Module):
    """A module with a buffer, a ``__getattr__`` that is a trap and a forward hook that is
    one too."""

    def __init__(self, buffer):
        super().__init__()
        self.register_buffer("buf", buffer)
        self.register_forward_hook(forward_hook)
        self.register_forward_pre_hook(forward_pre_hook)

    def __getattr__(self, name):
        called(f"TrapModule.__getattr__ {name}")
        return super().__getattr__(name)

    def forward(self, x):
        called("TrapModule.forward")
        return x


def forward_hook(module, args, out):
    called("forward hook")


def forward_pre_hook(module, args):
    called("forward pre-hook")


# -- autograd graphs ---------------------------------------------------------------------
def pack(t):
    called("pack hook")
    return t


def unpack(t):
    called("unpack hook")
    return t


def _forward(x):
    called("checkpointed forward")
    return x.sin() * x


def graph(t, mode: str = "plain"):
    """A scalar whose autograd graph saves ``t``'s storage (through a leaf that shares
    it): ``plain``, under saved-tensor hooks that are traps (``hooks``), or through
    non-reentrant checkpoint of a forward that is a trap (``checkpoint``). No trap is
    counted while the graph is made."""
    leaf = t.detach().requires_grad_(True)
    if mode == "hooks":
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = (leaf.sin() * leaf).sum()
    elif mode == "checkpoint":
        from torch.utils.checkpoint import checkpoint

        out = checkpoint(_forward, leaf, use_reentrant=False).sum()
    else:
        out = (leaf.sin() * leaf).sum()
    CALLS.clear()
    return out


# -- functions that hold -----------------------------------------------------------------
def fail(value):
    """Raises; the traceback's frame keeps ``value``."""
    raise ValueError("kept in a frame")


def caught(value):
    """An exception whose traceback keeps ``value`` in a frame's locals."""
    try:
        fail(value)
    except ValueError as err:
        return err


def started(value):
    """A generator suspended after its first ``yield``, ``value`` in its frame."""
    def gen(v):
        yield 0
        yield v
    g = gen(value)
    next(g)
    return g


def cached(value):
    """A ``functools.lru_cache`` function whose cache holds ``value``."""
    box = [value]

    @functools.lru_cache(maxsize=None)
    def get(key):
        return box.pop()
    get(0)
    return get
