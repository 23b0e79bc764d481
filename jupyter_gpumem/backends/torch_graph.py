"""The autograd graphs of PyTorch as the scan walks them: what a graph's nodes hold
(saved tensors, leaf variables, a custom Function's attributes) and the ledger that
bounds how many nodes the walk gives a Python wrapper (see :class:`GraphLedger`).
Part of the torch backend (:mod:`.pytorch`); never imports torch.

A saved tensor is never unpacked (see :class:`SavedReader`): unpacking runs the
saved-tensor hooks the graph was built under, and checkpoint's unpack hook replays
the forward."""
from __future__ import annotations

import gc
import time
import weakref
from collections import deque
from types import CellType, FunctionType
from typing import Any, Iterator

from .base import class_getters, instance_dict


def attributes(obj: Any) -> tuple:
    """``(("attr", name), value)`` of an object's instance dict, read through its C-level
    ``__dict__`` slot (no property or ``__getattribute__`` of the user's runs)."""
    return tuple((("attr", k), v) for k, v in dict.items(instance_dict(obj)) if type(k) is str)


def own_attributes(tensor: Any) -> tuple:
    """A plain tensor's attributes of its own (``t.extra = x``, ``param.main_grad``), as
    :func:`attributes`; ``()`` at once for the usual tensor with none, told by its type's
    traverse (``gc.get_referents``: no code runs, no dict is made). The C core tells the
    same in its batches and fingerprint (core/_reach_parts/batch.c batch_has_attrs)."""
    for ref in gc.get_referents(tensor):
        if type(ref) is dict and ref:
            return attributes(tensor)
    return ()


def any_own_attributes(tensors: list) -> bool:
    """Whether one of ``tensors`` has attributes of its own (see :func:`own_attributes`),
    in one pass over their referents."""
    return any(type(ref) is dict and ref for ref in gc.get_referents(*tensors))


class _Mark:
    """Put in a graph node's ``metadata``: it dies with the node."""

    __slots__ = ("__weakref__",)


class GraphLedger:
    """How far the scan may walk autograd graphs without weakening the process.

    Reading ``grad_fn`` or ``next_functions`` gives a graph node a Python wrapper,
    and torch keeps that wrapper for as long as the node lives. A node that has a
    wrapper is freed through it, and the wrapper's release frees the next node
    inside its own call: freeing a chain of wrapped nodes recurses once per node,
    and about 40,000 of them overflow the C stack (``del loss`` then kills the
    process). Plain torch frees graphs without wrappers iteratively, at any depth.

    So the scan wraps at most :attr:`per_scan` nodes in one scan and keeps the
    nodes it wrapped that still live under :attr:`alive_limit`, process-wide,
    counted exactly: each node it wraps gets a :class:`_Mark` in its ``metadata``
    whose weak reference tells when the node is gone. A graph cut short makes
    the scan partial, with a reason.
    """

    per_scan = 10_000
    alive_limit = 20_000
    _KEY = "jupyter_gpumem"
    _CHECK_EVERY = 256

    def __init__(self) -> None:
        self.alive = 0
        self._refs: set = set()
        self._this_scan = 0
        self.deadline = float("inf")
        self._reasons: list[str] = []
        self.behind = 0   # saved tensors met behind hooks since the last take_notes()
        self.unread = 0   # saved tensors this torch shows only by unpacking them

    def start(self, deadline: float) -> None:
        self._this_scan = 0
        self.deadline = deadline
        self._reasons = []
        self.behind = self.unread = 0

    def take_reasons(self) -> list[str]:
        out, self._reasons = self._reasons, []
        return out

    def take_notes(self) -> list[str]:
        """What the report says of the saved tensors the walk did not read (then
        forgotten): not a partial result, the bytes behind them are not there to read."""
        out = []
        if self.behind:
            out.append(f"autograd graphs: {self.behind:,} saved tensor(s) behind saved-tensor "
                       f"hooks (checkpoint, save_on_cpu, ...), not read: what the pack hooks "
                       f"kept is counted, what unpacking would make is not")
        if self.unread:
            out.append(f"autograd graphs: {self.unread:,} saved tensor(s) not read: this "
                       f"torch shows them only by unpacking, which may run hooks")
        self.behind = self.unread = 0
        return out

    def _gone(self, ref) -> None:
        self._refs.discard(ref)
        self.alive -= 1

    def _cut(self, text: str) -> None:
        if text not in self._reasons:
            self._reasons.append(text)

    def admit(self, node: Any) -> bool:
        """Count ``node``, which has a wrapper now (made by this walk or before); False
        when the walk must not expand it."""
        try:
            meta = node.metadata
            if self._KEY not in meta:
                mark = _Mark()
                meta[self._KEY] = mark
                self._refs.add(weakref.ref(mark, self._gone))
                self.alive += 1
        except Exception:   # a node without metadata: counted for this scan only
            pass
        if self._this_scan >= self.per_scan:
            self._cut(f"autograd graph walked to its first {self.per_scan:,} nodes")
            return False
        self._this_scan += 1
        return True

    def may_expand(self) -> bool:
        """Whether reading the next node's parents (which wraps them) is allowed."""
        if self.alive >= self.alive_limit:
            self._cut(f"autograd graphs not walked further: {self.alive:,} of their nodes "
                      f"already carry the scan's wrappers (more could crash the kernel "
                      f"when the graph is freed)")
            return False
        if not self._this_scan % self._CHECK_EVERY and time.perf_counter() > self.deadline:
            self._cut("time limit reached in an autograd graph")
            return False
        return True


class SavedReader:
    """Reads a graph node's saved tensors without unpacking any: the one place the walk
    reads them.

    A node's ``_raw_saved_<name>`` (a getset of torch's own node type) gives each
    saved tensor as a ``torch._C._autograd.SavedTensor`` (a tuple of them for a list),
    and never runs a hook. Where its ``unpack_hook`` is None, ``data`` is the saved
    tensor; where a hook is set, ``data`` is what the pack hook returned (read as any
    object: save_on_cpu's host copy is counted) and the tensor unpacking would make
    is not read: the walk counts it in :attr:`GraphLedger.behind`. A torch whose
    SavedTensor has no ``data`` and ``unpack_hook`` (they came with compiled
    autograd's support for saved-tensor hooks) shows saved tensors only by unpacking:
    none is read there (:attr:`GraphLedger.unread`). ``_saved_<name>`` (which unpacks)
    is never read.
    """

    PREFIX = "_raw_saved_"

    def __init__(self) -> None:
        self._names: dict[type, tuple] = {}   # node type -> its (name, getset) pairs
        self._readable: dict[type, Any] = {}   # SavedTensor type -> its getters (_reading)

    def _getsets(self, tp: type) -> tuple:
        got = self._names.get(tp)
        if got is None:
            got = self._names[tp] = tuple(
                (name, descr) for name, descr in class_getters(tp)
                if name.startswith(self.PREFIX))
        return got

    def _reading(self, tp: type) -> "tuple | None":
        """``(data, unpack_hook)`` getsets of a SavedTensor type, None where it has not both."""
        got = self._readable.get(tp, self)
        if got is self:
            names = dict(class_getters(tp))
            got = self._readable[tp] = (names["data"], names["unpack_hook"]) \
                if "data" in names and "unpack_hook" in names else None
        return got

    def children(self, ledger: GraphLedger, node: Any,
                 node_name: str) -> Iterator[tuple[tuple, Any]]:
        """``(label, object)`` for what ``node``'s saved tensors hold, read raw."""
        tp = type(node)
        for name, descr in self._getsets(tp):
            try:
                raw = descr.__get__(node, tp)
            except (RuntimeError, AttributeError, TypeError):
                continue  # freed by backward(), or not readable
            attr = "_saved_" + name[len(self.PREFIX):]
            items = raw if type(raw) in (tuple, list) else (raw,)
            for i, item in enumerate(items):
                if item is None:
                    continue
                label = ("graph", node_name, attr if len(items) == 1 and items is not raw
                         else f"{attr}[{i}]")
                yield from self.read(ledger, item, label)

    def read(self, ledger: GraphLedger, item: Any, label: tuple) -> Iterator[tuple[tuple, Any]]:
        """What one SavedTensor holds, under ``label``, without unpacking it."""
        tp = type(item)
        getters = self._reading(tp)
        try:
            hook = getters[1].__get__(item, tp) if getters is not None else None
            data = getters[0].__get__(item, tp) if getters is not None else None
        except Exception:
            getters = None
        if getters is None:
            ledger.unread += 1
            return
        if hook is not None:   # the pack hook's result and the unpack hook's state: a
            ledger.behind += 1   # function's closure (a library's too: checkpoint's
            hook_label = label[:2] + (label[2] + " (unpack hook)",)   # frame), else itself
            if type(hook) is FunctionType:
                for value in closure_values(hook):
                    yield hook_label, value
            else:
                yield hook_label, hook
            label = label[:2] + (label[2] + " (packed)",)
        if data is not None:
            yield label, data


_CLOSURE = FunctionType.__dict__["__closure__"].__get__
_CELL = CellType.__dict__["cell_contents"].__get__


def closure_values(fn: Any) -> list:
    """What a plain function's closure cells hold, read through their C slots (an
    unpack hook's state: checkpoint's frame, which keeps the inputs it will replay
    with)."""
    out = []
    for cell in _CLOSURE(fn) or ():
        try:
            out.append(_CELL(cell))
        except ValueError:   # an empty cell
            pass
    return out


def graph_children(ledger: GraphLedger, saved: SavedReader, root: Any,
               seen: dict) -> Iterator[tuple[tuple, Any]]:
    """Saved tensors and leaf variables of the autograd graph under ``root``,
    breadth first (the newest operations first); ``saved``: the reader of saved
    tensors, which never unpacks one (:class:`SavedReader`).

    Nodes already in ``seen`` (expanded from another tensor of the same
    graph) are not expanded again. The walk stops where :class:`GraphLedger`
    says: reading a node's ``next_functions`` gives every parent node a Python
    wrapper that the node keeps until it dies, and a graph whose nodes carry
    many wrappers is freed recursively (see :class:`GraphLedger`).
    """
    if not ledger.admit(root):
        return
    seen[id(root)] = root
    queue = deque([root])
    while queue:
        node = queue.popleft()
        node_name = type(node).__name__
        variable = getattr(node, "variable", None) if node_name == "AccumulateGrad" else None
        if variable is not None:
            yield ("graph", node_name, "variable"), variable
        # what a custom Function's forward kept on its ctx (the node itself)
        for attr, value in attributes(node):
            yield ("graph", node_name, attr[1]), value
        yield from saved.children(ledger, node, node_name)
        if not ledger.may_expand():
            return
        try:
            parents = node.next_functions
        except (RuntimeError, AttributeError):
            parents = ()
        for parent, _ in parents:
            if parent is not None and id(parent) not in seen and ledger.admit(parent):
                seen[id(parent)] = parent
                queue.append(parent)
