"""The walk's part that takes tensors: one by one through their backend, or many at once
(a model's parameters, an optimizer's state) in one loop of the C core or in C-level
passes; each storage found is recorded with its path node.

:class:`TensorTaking` is a part of :class:`.reach.Reacher`: it uses the walk's
state (``backend_of``, ``memo``, the storages found, the path node maker) and hands
what the tensors hold back to the walk (``_admit``).
"""
from __future__ import annotations

from itertools import compress, filterfalse, repeat
from operator import is_, is_not, itemgetter, not_
from typing import Any

from ...backends import Backend
from .types import OutOfTime, type_name_of

BATCH = 8               # this many tensors of one container are taken together; fewer, one by one
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
_GRAD = ("attr", "grad")
_UNASKED = object()   # a backend whose batch_spec() the scan has not asked yet


def no_nodes(keys: Any) -> Any:
    """The path node maker of a walk that keeps no paths: a None for each key."""
    return repeat(None, len(keys))


def _stands(found: dict, info: tuple) -> bool:
    """Whether storage ``info`` stands for its key in ``found``: its key is new, or the
    storage there is smaller. Rule: one allocation, one key. Two storages can start at one
    address (a tensor made from a numpy view of another's first bytes,
    ``torch.from_numpy(t.numpy()[:2])``): one key, and the larger of them stands for it,
    whichever the walk met first (its bytes are the allocation's; the first met stood
    before, and a name was blamed for 8 B of 32). The C core's batches do the same."""
    have = found.get(info[0])
    return have is None or have[0][1] < info[1]


def _keep_larger(found: dict, infos: list, node_of: Any) -> None:
    """Each of ``infos`` already under its key in ``found`` that is larger replaces it
    (:func:`_stands`)."""
    for info in infos:
        if _stands(found, info):
            node, = node_of((info[0],))
            found[info[0]] = (info, node, found[info[0]][2])


class TensorTaking:
    """The tensors a walk meets: taken, their storages recorded (see the module)."""

    def _take_tensors(self, tensors: list, kinds_: list) -> None:
        if self._probe is not None:
            self._look_up(tensors)
            return
        backend_of = self.backend_of
        backends = set(map(id, map(backend_of.__getitem__, set(kinds_))))
        if len(backends) == 1:
            groups = [(backend_of[kinds_[0]], tensors, kinds_)]
        else:
            by: dict[int, tuple] = {}
            for t, tp in zip(tensors, kinds_):
                backend = backend_of[tp]
                entry = by.get(id(backend))
                if entry is None:
                    entry = by[id(backend)] = (backend, [], [])
                entry[1].append(t)
                entry[2].append(tp)
            groups = list(by.values())
        for backend, values, types_ in groups:
            if len(values) >= BATCH and not self.describe:
                kinds = self._batch_types.get(id(backend))
                if kinds is None:
                    kinds = self._batch_types[id(backend)] = backend.batch_types()
                if kinds:
                    chosen = list(map(kinds.__contains__, types_))
                    if all(chosen):
                        self._take_batch(backend, values)
                        continue
                    batch = list(compress(values, chosen))
                    if len(batch) >= BATCH:
                        self._take_batch(backend, batch)
                        values = list(compress(values, map(not_, chosen)))
            for t in values:
                try:
                    self._take_one(backend, t)
                except OutOfTime:
                    raise
                except Exception:
                    self.refuse(t)

    def _record(self, tensor: Any, infos: list) -> None:
        found = self._found
        parts = self.parts_of(tensor) if self.describe and len(infos) > 1 else None
        for info in infos:
            if _stands(found, info):
                node, = self._node((info[0],))
                part = parts.get(info[0]) if parts else None
                found[info[0]] = (info, node, None if not self.describe else
                                  self._describe(tensor if part is None else part[1]))

    def parts_of(self, obj: Any) -> dict:
        """Storage key -> ``(step, part)`` of a tensor whose data lies in several dense
        parts (a sparse tensor's indices and values: ``(("part", "_values"), values)``,
        :meth:`Backend.parts`); {} for another (its storages are its own)."""
        backend = self.tensor_backend.get(type(obj))
        if backend is None:
            return {}
        out: dict = {}
        try:
            for name, part in backend.parts(obj):
                for info in backend.storages(part):
                    out.setdefault(info[0], (("part", name), part))
        except Exception:
            return {}
        return out

    def _filter_devices(self, infos: list) -> list:
        devices = self.devices
        if devices is not None and infos and (len(infos) > 1 or infos[0][2] not in devices):
            return [i for i in infos if i[2] in devices]
        return infos

    def _take_one(self, backend: Backend, value: Any) -> None:
        memo = self.memo.get(id(value))
        if memo is None:
            infos, edges = backend.take(value, self._graph_seen)
            infos = self._filter_devices(infos)
            # edges given as a tuple are the same for every root; a list (an autograd
            # graph) depends on what the root has seen and is asked again
            memo = self.memo[id(value)] = [value, infos, edges if type(edges) is tuple else None]
        else:
            infos, edges = memo[1], memo[2]
            if edges is None:
                edges = backend.tensor_edges(value, self._graph_seen)
        if type(edges) is not tuple:
            self.graph_edges[id(value)] = edges
        self._record(value, infos)
        if edges:
            self._admit(list(map(_SECOND, edges)))

    def _take_batch(self, backend: Backend, values: list) -> None:
        """Many tensors at once (an optimizer's state, a model's parameters): in one loop
        of the C core where the backend allows (:meth:`Backend.batch_spec`), else in
        C-level passes over lists; the tensors that need the long way (an autograd
        graph) are found by halves."""
        spec = self._batch_specs.get(id(backend), _UNASKED)
        if spec is _UNASKED:
            spec = self._batch_specs[id(backend)] = \
                backend.batch_spec() if self._c_batch is not None else None
        # how the C loop makes the path nodes: (node type, its head), (None, None) for
        # none; None where only the walk's node callable knows (then the passes below)
        node_args = (None, None) if self._node is no_nodes else getattr(self._node, "args", None)
        if spec is not None and node_args is not None:
            held = self._c_batch(values, self._batched, *spec, self._found, self.devices,
                                 *node_args)
            if held is None:
                self._split_batch(backend, values)
            else:
                self._take_held(backend, held)
            return
        memo = self._batched
        seen = list(map(memo.get, map(id, values)))
        taken = self._take_fresh(backend, values, seen) if None in seen else (
            list(map(_FIRST, seen)), seen[0][1], list(map(_THIRD, seen)))
        if taken is None:
            self._split_batch(backend, values)
            return
        infos, held_label, held = taken
        devices = self.devices
        found = self._found
        if set(map(len, infos)) == {1}:   # one storage each: the common case
            single = list(map(_FIRST, infos))
            if devices is not None and not devices.issuperset(map(_THIRD, single)):
                keep = list(map(devices.__contains__, map(_THIRD, single)))
                single = list(compress(single, keep))
            keys = list(map(_FIRST, single))
            new = list(filterfalse(found.__contains__, dict.fromkeys(keys)))
            if len(new) == len(keys):   # each new, once: the common case
                found.update(zip(keys, zip(single, self._node(keys), repeat(None))))
            else:
                if new:   # the first tensor met with each storage stands for it...
                    info_of = dict(zip(reversed(keys), reversed(single)))
                    found.update(zip(new, zip(map(info_of.__getitem__, new), self._node(new),
                                              repeat(None))))
                _keep_larger(found, single, self._node)   # ...unless a larger one
        else:
            if devices is not None:
                infos = [[i for i in its if i[2] in devices] for its in infos]
            for value, its in zip(values, infos):
                for info in its:
                    if _stands(found, info):
                        node, = self._node((info[0],))
                        found[info[0]] = (info, node, None)
        if any(map(is_not, held, repeat(None))):
            self._take_held(backend, [h for h in held if h is not None])

    def _split_batch(self, backend: Backend, values: list) -> None:
        """A batch where some tensor has an autograd graph: by halves, then one by one."""
        n = len(values)
        if n >= 2 * BATCH:
            self._take_batch(backend, values[:n // 2])
            self._take_batch(backend, values[n // 2:])
            return
        for value in values:
            self._take_one(backend, value)

    def _take_held(self, backend: Backend, held: list) -> None:
        """What a batch's tensors hold (gradients), taken at once in the same way. (No
        memo entry: the path search asks the backend again for the few it meets.)"""
        if len(held) >= BATCH and set(map(type, held)) <= self._batch_types[id(backend)]:
            self._take_batch(backend, held)
        elif held:
            self._admit(held)

    def _take_fresh(self, backend: Backend, values: list, seen: list) -> tuple | None:
        """:meth:`Backend.take_many` of the values not met before in this scan (``seen``
        None), merged in order with those met; None where one has a graph."""
        if not any(map(is_not, seen, repeat(None))):
            fresh = values
        else:
            fresh = list(compress(values, map(is_, seen, repeat(None))))
        taken = backend.take_many(fresh)
        if taken is None:
            return None
        infos, label, held = taken
        new = list(zip(infos, repeat(label), held))
        self._batched.update(zip(map(id, fresh), new))
        if fresh is not values:
            rest = iter(new)
            new = [s if s is not None else next(rest) for s in seen]
            infos, held = list(map(_FIRST, new)), list(map(_THIRD, new))
        return infos, label, held

    def tensor_record(self, obj: Any) -> list | None:
        """``[tensor, storages, edges]`` of a tensor: as the walk took it, or, for one it
        took in a batch (no autograd graph), asked again of its backend (which keeps
        each tensor's storages)."""
        memo = self.memo.get(id(obj))
        if memo is not None and memo[0] is obj:
            return memo
        backend = self.tensor_backend.get(type(obj))
        if backend is None or id(obj) not in self._batched:
            return None   # never taken: its graph (if any) is not read here
        try:
            fn, grad = backend.graph_and_grad(obj)
            if fn is not None:
                return None   # a graph the walk did not expand: not expanded here either
            infos = self._filter_devices(backend.storages(obj))
        except Exception:
            return None
        return [obj, infos, ((_GRAD, grad),) if grad is not None else ()]

    def _describe(self, obj: Any) -> str | None:
        name = type_name_of(type(obj))
        backend = self.backend_of.get(type(obj))
        try:
            text = backend.describe(obj) if backend is not None else None
        except Exception:
            text = None
        return f"{name} {text}" if text else name
