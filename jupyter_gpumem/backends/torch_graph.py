"""The autograd graphs of PyTorch as the scan walks them: what a graph's nodes hold
(saved tensors, leaf variables, a custom Function's attributes) and the ledger that
bounds how many nodes the walk gives a Python wrapper (see :class:`GraphLedger`).
Part of the torch backend (:mod:`.pytorch`); never imports torch."""
from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Any, Iterator

from .base import instance_dict


def attributes(obj: Any) -> tuple:
    """``(("attr", name), value)`` of an object's instance dict, read through its C-level
    ``__dict__`` slot (no property or ``__getattribute__`` of the user's runs)."""
    return tuple((("attr", k), v) for k, v in dict.items(instance_dict(obj)) if type(k) is str)


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

    def start(self, deadline: float) -> None:
        self._this_scan = 0
        self.deadline = deadline
        self._reasons = []

    def take_reasons(self) -> list[str]:
        out, self._reasons = self._reasons, []
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


def graph_children(ledger: GraphLedger, saved: dict, root: Any,
               seen: dict) -> Iterator[tuple[tuple, Any]]:
    """Saved tensors and leaf variables of the autograd graph under ``root``,
    breadth first (the newest operations first); ``saved``: node type -> the names of
    its saved tensors, filled as types are met.

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
        for attr in _saved_names(saved, node):
            try:
                value = getattr(node, attr)
            except (RuntimeError, AttributeError):
                continue  # freed by backward(), or not readable
            yield ("graph", node_name, attr), value
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

def _saved_names(saved: dict, node: Any) -> tuple[str, ...]:
    tp = type(node)
    names = saved.get(tp)
    if names is None:
        names = tuple(a for a in dir(tp) if a.startswith("_saved_"))
        saved[tp] = names
    return names
