"""The autograd graphs of PyTorch as the scan walks them: what a graph's nodes hold
(saved tensors, leaf variables, a custom Function's attributes) and the ledger that
bounds how many nodes the walk gives a Python wrapper (see :class:`GraphLedger`).
Part of the torch backend (:mod:`.pytorch`); never imports torch.

A saved tensor is never unpacked (see :class:`SavedReader`): unpacking runs the
saved-tensor hooks the graph was built under, and checkpoint's unpack hook replays
the forward.

The paths of what a graph holds (the one place they are made): a label
``("graph", route, tail)``, whose text (``core.scan.format_label``) is a path a user can
type back, step for step the way the graph links, so two nodes of one type never read
alike::

    loss.grad_fn.next_functions[0][0].next_functions[2][0]._saved_mat1

``route`` names the node: ``"grad_fn"`` for a tensor's own node (``.grad_fn``), ``None``
for a node met as an object itself, ``(parent route, i)`` for the node at
``next_functions[i][0]`` of the parent (``.next_functions[i][0]``): a chain of pairs,
one per node, as the breadth-first walk meets it (the shortest way there). ``tail`` is
the steps inside the node, in the path labels' own kinds: ``(("attr", "_saved_mat1"),)``
(``._saved_mat1``), ``(("attr", "_saved_indices"), ("index", 1))``, ``(("attr",
"variable"),)`` (a leaf's), a custom Function's attribute ``(("attr", "extra"),)``. A
saved tensor behind a saved-tensor hook is named by what is read of it: the pack hook's
result ``._raw_saved_x.data`` and the unpack hook's state
``._raw_saved_x.unpack_hook→closure:frame``. The node's type is not in the path (it
could not be typed back). A route of more than 24 nodes (a recurrent net's, thousands
deep) shows its first and last 8 around ``…(N steps)…`` (``core.scan.graph_text``):
read, not typed back (two nodes read alike there only where both ends and the count
agree). The path reads as Python would, and the paths a user types
(``%gpumem 'loss.grad_fn.next_functions[0][0]._saved_mat1'``) are resolved through
:meth:`.pytorch.TorchBackend.path_attr`, which reads the graph as this walk does: no
saved tensor unpacked, no hook run."""
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
        self._names: dict[type, tuple] = {}   # node type -> its (getset, plain, raw) triples
        self._readable: dict[type, Any] = {}   # SavedTensor type -> its getters (reading_of)

    def _getsets(self, tp: type) -> tuple:
        """``(getset, ("attr", "_saved_x"), ("attr", "_raw_saved_x"))`` of each saved
        tensor (or list of them) of a node type."""
        got = self._names.get(tp)
        if got is None:
            got = self._names[tp] = tuple(
                (descr, ("attr", "_saved_" + name[len(self.PREFIX):]), ("attr", name))
                for name, descr in class_getters(tp) if name.startswith(self.PREFIX))
        return got

    def raw(self, node: Any, name: str) -> Any:
        """``node._raw_saved_<name>`` (a SavedTensor, or a tuple of them), read through
        the node type's getset (no hook runs); LookupError where it has none."""
        tp = type(node)
        for descr, _, raw in self._getsets(tp):
            if raw[1] == self.PREFIX + name:
                return descr.__get__(node, tp)
        raise LookupError(name)

    def saved_data(self, item: Any) -> tuple:
        """``(data, unpack hook)`` of one SavedTensor, read raw; LookupError where this
        torch shows saved tensors only by unpacking."""
        tp = type(item)
        getters = self.reading_of(tp)
        if getters is None:
            raise LookupError("data")
        return getters[0].__get__(item, tp), getters[1].__get__(item, tp)

    def reading_of(self, tp: type) -> "tuple | None":
        """``(data, unpack_hook)`` getsets of a SavedTensor type, None where it has not both."""
        got = self._readable.get(tp, self)
        if got is self:
            names = dict(class_getters(tp))
            got = self._readable[tp] = (names["data"], names["unpack_hook"]) \
                if "data" in names and "unpack_hook" in names else None
        return got

    def children(self, ledger: GraphLedger, node: Any,
                 route: Any) -> Iterator[tuple[tuple, Any]]:
        """``(label, object)`` for what ``node`` (at ``route``)'s saved tensors hold, read
        raw (labels: the module docstring)."""
        tp = type(node)
        for descr, plain, raw_step in self._getsets(tp):
            try:
                raw = descr.__get__(node, tp)
            except (RuntimeError, AttributeError, TypeError):
                continue  # freed by backward(), or not readable
            one = type(raw) not in (tuple, list)
            items = (raw,) if one else raw
            for i, item in enumerate(items):
                if item is None:
                    continue
                at = () if one else (("index", i),)
                yield from self.read(ledger, item, route, (plain,) + at, (raw_step,) + at)

    def read(self, ledger: GraphLedger, item: Any, route: Any, plain: tuple,
             raw: tuple) -> Iterator[tuple[tuple, Any]]:
        """What one SavedTensor holds, without unpacking it: its tensor under the tail
        ``plain`` (``._saved_x``), or, behind a hook, what the hooks keep under the tail
        ``raw`` (``._raw_saved_x``) and their steps (``.data``, ``.unpack_hook``)."""
        tp = type(item)
        getters = self.reading_of(tp)
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
            hooked = raw + (_UNPACK_HOOK,)   # frame), else the hook itself
            if type(hook) is FunctionType:
                for name, value in closure_values(hook):
                    yield ("graph", route, hooked + (("closure", name),)), value
            else:
                yield ("graph", route, hooked), hook
            plain = raw + (_DATA,)
        if data is not None:
            yield ("graph", route, plain), data


_CLOSURE = FunctionType.__dict__["__closure__"].__get__
_CODE = FunctionType.__dict__["__code__"].__get__
_CELL = CellType.__dict__["cell_contents"].__get__
_DATA, _UNPACK_HOOK, _VARIABLE = ("attr", "data"), ("attr", "unpack_hook"), (("attr", "variable"),)


def closure_values(fn: Any) -> list:
    """``(name, value)`` of what a plain function's closure cells hold, read through their
    C slots (an unpack hook's state: checkpoint's frame, which keeps the inputs it will
    replay with)."""
    out = []
    cells = _CLOSURE(fn) or ()
    names = _CODE(fn).co_freevars
    for i, cell in enumerate(cells):
        try:
            out.append((names[i] if i < len(names) else str(i), _CELL(cell)))
        except ValueError:   # an empty cell
            pass
    return out


def graph_children(ledger: GraphLedger, saved: SavedReader, root: Any,
                   seen: dict, head: "str | None" = "grad_fn") -> Iterator[tuple[tuple, Any]]:
    """Saved tensors and leaf variables of the autograd graph under ``root``,
    breadth first (the newest operations first); ``saved``: the reader of saved
    tensors, which never unpacks one (:class:`SavedReader`). Labelled as the module
    docstring says, ``root`` at the route ``head`` (``"grad_fn"``: a tensor's node,
    ``None``: a node met as an object).

    Nodes already in ``seen`` (expanded from another tensor of the same
    graph) are not expanded again. The walk stops where :class:`GraphLedger`
    says: reading a node's ``next_functions`` gives every parent node a Python
    wrapper that the node keeps until it dies, and a graph whose nodes carry
    many wrappers is freed recursively (see :class:`GraphLedger`).
    """
    if not ledger.admit(root):
        return
    seen[id(root)] = root
    queue = deque([(root, head)])
    while queue:
        node, route = queue.popleft()
        variable = getattr(node, "variable", None) \
            if type(node).__name__ == "AccumulateGrad" else None
        if variable is not None:
            yield ("graph", route, _VARIABLE), variable
        # what a custom Function's forward kept on its ctx (the node itself)
        for attr, value in attributes(node):
            yield ("graph", route, (attr,)), value
        yield from saved.children(ledger, node, route)
        if not ledger.may_expand():
            return
        try:
            parents = node.next_functions
        except (RuntimeError, AttributeError):
            parents = ()
        for i, (parent, _) in enumerate(parents):
            if parent is not None and id(parent) not in seen and ledger.admit(parent):
                seen[id(parent)] = parent
                queue.append((parent, (route, i)))


def _node_getters(tp: type) -> "dict | None":
    """The C-level getters of a graph node's type (one whose ``next_functions`` is a C
    getter, as torch's nodes and a custom Function's are), else None."""
    got = dict(class_getters(tp))
    return got if "next_functions" in got else None


def saved_attr(saved: SavedReader, item: Any, name: str) -> Any:
    """``data`` or ``unpack_hook`` of a SavedTensor, read raw (LookupError for another
    name)."""
    if name not in ("data", "unpack_hook"):
        raise LookupError(name)
    try:
        data, hook = saved.saved_data(item)
    except LookupError:
        raise ValueError("this torch shows saved tensors only by unpacking them") from None
    return data if name == "data" else hook


def node_attr(saved: SavedReader, node: Any, name: str) -> Any:
    """Attribute ``name`` of a graph node, as a path of the scan names it (the module
    docstring) and as the walk reads it: ``next_functions``, ``variable`` and
    ``_raw_saved_x`` through the node type's C getters, ``_saved_x`` through
    ``_raw_saved_x`` and its SavedTensor's ``data`` (never unpacked: refused where a hook
    is set). LookupError where ``node`` is no graph node or ``name`` none of those;
    ValueError (its text the reason) where it cannot be read so."""
    tp = type(node)
    getters = _node_getters(tp)
    if getters is None:
        raise LookupError(name)
    try:
        if name in ("next_functions", "variable") or name.startswith(SavedReader.PREFIX):
            if name not in getters:
                raise LookupError(name)
            return getters[name].__get__(node, tp)
        if not name.startswith("_saved_"):
            raise LookupError(name)
        rest = name[len("_saved_"):]
        raw = saved.raw(node, rest)
        if type(raw) not in (tuple, list):
            return _unhooked(saved, raw, rest)
        return tuple(_unhooked(saved, item, rest) for item in raw)
    except RuntimeError as exc:   # freed by backward()
        raise ValueError(f"not readable: {str(exc).splitlines()[0]}") from None


def _unhooked(saved: SavedReader, item: Any, rest: str) -> Any:
    """The tensor a SavedTensor keeps, where no saved-tensor hook is set on it."""
    if item is None:
        return None
    try:
        data, hook = saved.saved_data(item)
    except LookupError:
        raise ValueError("this torch shows saved tensors only by unpacking them, "
                         "which may run hooks: not read") from None
    if hook is not None:
        raise ValueError(f"behind a saved-tensor hook, never unpacked: what the pack "
                         f"hook kept is ._raw_saved_{rest}.data")
    return data
