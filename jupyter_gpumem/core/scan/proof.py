"""The small roots' proof: many roots proven to reach no storage together, so that a
long notebook's names (most of them small plain data) are not walked one by one.

:class:`SmallRoots` is part of :class:`~.reach.Reacher` (a mixin: it walks with the
Reacher's walkers). With the C core, one read of each root picks those to walk together
in C (``Walker.pick``), and a few runs of the C walker prove them; without it, the same
roots are walked together by the Python walk, in :meth:`~.reach.Reacher.leads_to`'s
probe. Either way a proof claims no more than walking each root on its own would: a
part whose run meets a tensor, a framework's container, a refusal or a cut (the depth
limit, the time) proves nothing, and is tried again by halves. The story:
docs/ARCHITECTURE.md (rule 6).
"""
from __future__ import annotations

import sys
import time
from gc import is_tracked
from itertools import compress
from typing import Any

from .kinds import HANDLERS
from .types import CONTAINER, Refusals, keyable, split_keyable

#: reach_nothing's bound on a container's items where none is given
SIZE_ANY = sys.maxsize
#: roots proven to reach nothing in one run of the C walker (Reacher.reach_nothing): a part
#: that hands something back is tried again (its new types classified) this many times,
#: then by halves down to this many roots
EMPTY_TRIES, EMPTY_PART = 3, 16
#: Walker.pick's marks (walk.h): picked to walk together, an untracked dict or tuple
PICKED, ATOMS = 1, 2
_ATOMS_ONLY, _PICKED_ONLY = (bytes(int(m == k) for m in range(256)) for k in (ATOMS, PICKED))
NOT_PROVEN = bytes([1, 0]) + bytes(254)   # (``marks.translate``: the roots left to walk)
_PICKED = object()   # reach_nothing's first part: the roots marked PICKED
#: the exact types whose length the Python form's proof reads (a longer one is walked on
#: its own); a root of another type walked together is of a kind read by the referents
_SIZED_PLAIN = (dict, list, tuple, set, frozenset)


class SmallRoots:
    """The proof (see the module docstring); a mixin of :class:`~.reach.Reacher`."""

    def _together_types(self) -> set:
        """The classified types whose roots are walked together: those read through
        their referents, but a framework's container (an optimizer read through its
        referents is left to its own walk: the warm scan proves it cheaply)."""
        return {tp for tp in self._by_referents if self.kinds.get(tp) != CONTAINER}

    def reach_nothing(self, objs: list, until: float, most: int | None = None) -> bytearray:
        """A mark per root of ``objs``: 1 where it is proven to reach no storage, else 0
        (the caller walks it as usual; without the C core: :meth:`_prove_py`). ``most``: a
        container of more items is not tried here (a big root is walked on its own). Many
        small roots are walked together in one run of the C walker, which enters all that
        is plain and hands back the rest; a run that ends before ``until`` with no level
        cut, each object handed back leading nowhere (:meth:`_leads_nowhere`), proves it
        for all. A run that met types not classified yet is tried again once they are;
        one that cut a level or met what leads somewhere (a tensor, a model) goes on by
        halves, down to :data:`EMPTY_PART`. (Marks, not lists: an object made, read and
        freed per root outgrew the caches at 100,000 names.)"""
        native = self.native
        if native is None or not objs:
            return self._prove_py(objs, until, SIZE_ANY if most is None else most)
        # one read of each root, in C: what it picks it pushes onto the walk as it reads it
        # (the first part); the roots of types not classified yet are picked again alone,
        # once the types are (the second part)
        most = SIZE_ANY if most is None else most
        batched = self._together_types()
        marks, fresh, pending = native.pick(objs, batched, most, self.untracked_is_empty, True)
        try:
            return self._prove(objs, until, most, marks, fresh, pending)
        except BaseException:   # (what the first pick pushed is let go of)
            native.clear()
            raise

    def _prove(self, objs: list, until: float, most: int, marks: bytearray, fresh: list,
               pending: list) -> bytearray:
        native, out = self.native, bytearray(marks.translate(_ATOMS_ONLY))   # (atoms only)
        parts: list = [_PICKED]   # (the first part: the roots pushed as they were picked)
        if fresh:
            self.learn(set(fresh))
            batched = self._together_types()
            later, _, _ = native.pick(list(map(objs.__getitem__, pending)), batched, most,
                                      self.untracked_is_empty)
            for i, mark in zip(pending, later):
                out[i] |= mark == ATOMS
            parts.insert(0, list(compress(pending, map(PICKED.__eq__, later))))
        pushed = True
        by_referents = self._by_referents
        nowhere: dict[int, bool] = {}   # id -> whether that object leads nowhere
        self.deadline = until

        def places(part: Any) -> list:   # the first part's, read from the marks where needed
            return list(compress(range(len(marks)), marks.translate(_PICKED_ONLY))) \
                if part is _PICKED else part

        while parts:
            part = parts.pop()
            if part is _PICKED and PICKED not in marks:
                part = []
            if not part or time.perf_counter() >= until:
                if pushed:
                    native.clear()
                    pushed = False
                continue
            for _ in range(EMPTY_TRIES):
                if pushed:
                    pushed = False   # (the first part: pushed as it was picked)
                else:
                    native.push(list(map(objs.__getitem__, places(part))), 0)
                try:
                    got, done = native.run(until)
                    deep = native.deep
                finally:
                    native.clear()
                got, odd = split_keyable(got)
                kinds = set(map(type, got))
                if not kinds <= self._learned:
                    self.learn(kinds)
                # an object met before its type was classified: the next run walks it
                again = not kinds.isdisjoint(by_referents)
                if deep or odd or not all(self._leads_nowhere(o, nowhere) for o in got
                                          if type(o) not in by_referents):
                    part = places(part)
                    if len(part) > EMPTY_PART:   # something to take: by halves
                        half = len(part) // 2
                        parts += [part[:half], part[half:]]
                    break
                if done and not again:
                    if part is _PICKED:   # all of them at once, in C-level passes
                        out = bytearray((int.from_bytes(out, "little") | int.from_bytes(
                            marks.translate(_PICKED_ONLY), "little")).to_bytes(len(out), "little"))
                    else:
                        for i in part:
                            out[i] = 1
                    break
                if not got:
                    break   # out of time: the caller walks them
        return out

    def _leads_nowhere(self, obj: Any, known: dict) -> bool:
        """Whether ``obj``, handed back by the C walker in :meth:`reach_nothing`, leads
        the walk to no storage: a stopped object or one whose kind has no handler (what
        :meth:`_admit` and :meth:`_one_by_one` pass over), or one of another kind (a class,
        a function, a frame) whose probe (:meth:`leads_to` asked for anything: the first
        tensor or framework container met ends it; no graph is walked) finds nothing,
        refuses nothing, is not cut, and leaves nothing behind. A tensor never.
        (``known``: the answers so far, by id.)"""
        tp = type(obj)
        if tp in self.tensor_backend:
            return False
        if id(obj) in self.stop or HANDLERS.get(self.kinds.get(tp)) is None:
            return True
        answer = known.get(id(obj))
        if answer is None:
            answer = known[id(obj)] = self._nothing_in(obj, self.deadline) is True
        return answer

    def _prove_py(self, objs: list, until: float, most: int) -> bytearray:
        """:meth:`reach_nothing` without the C core. The roots ``Walker.pick`` would pick
        (of a kind read through their referents: dicts, lists, tuples, sets of at most
        ``most`` items, instances, cells; not stopped; tracked by the collector, an
        untracked dict or tuple holding atoms only) are walked together as the items of one
        tuple, by :meth:`leads_to`'s probe: a walk that meets no tensor and no framework's
        container (the first ends it), refuses nothing and is cut neither by the depth
        limit nor by the time proves them all (the tuple's level makes each root one
        level deeper than its own walk: a cut there proves nothing, so the halves that
        hold it are walked on their own in the end). A part it does not prove goes on by
        halves, down to :data:`EMPTY_PART` roots; the time's cut ends the proof."""
        out = bytearray(len(objs))
        # a class whose metaclass defines __hash__ or __eq__ is never hashed: walked alone
        ok = list(map(keyable, objs))
        kinds = set(map(type, compress(objs, ok)))
        if not kinds <= self._learned:
            self.learn(kinds)   # (what classify reads of a type runs no code of the user's)
        batched = self._together_types()
        sized = {tp for tp in _SIZED_PLAIN if tp in batched}
        part, stop, atoms = [], self.stop, self.untracked_is_empty
        for i in compress(range(len(objs)), ok):   # (as Walker.pick reads them)
            o = objs[i]
            tp = type(o)
            if tp not in batched or id(o) in stop or (tp in sized and len(o) > most):
                continue   # (the length of an exact builtin only)
            if not is_tracked(o):
                out[i] = atoms and (tp is dict or tp is tuple)
            else:
                part.append(i)
        parts = [part] if part else []
        while parts:
            part = parts.pop()
            if time.perf_counter() >= until:
                break
            proven = self._nothing_in(tuple(map(objs.__getitem__, part)), until)
            if proven is None:
                break   # out of time: the caller walks the rest (and is cut itself)
            if proven:
                for i in part:
                    out[i] = 1
            elif len(part) > EMPTY_PART:
                half = len(part) // 2
                parts += [part[:half], part[half:]]
        return out

    def _nothing_in(self, together: Any, until: float) -> bool | None:
        """Whether :meth:`leads_to`'s probe of ``together`` (an object handed back by the
        C walker, or :meth:`_prove_py`'s tuple of roots) proves that it reaches nothing:
        no tensor or framework container met, nothing refused, no cut; None where the
        time ran out first. The walk's refusals and reasons are the probe's own: none of
        them reaches the scan's result."""
        refusals, self.refusals = self.refusals, Refusals()
        root, self.current_root = self.current_root, None
        try:
            hit = self.leads_to([together], None, {}, until)
            return None if hit is None else hit is False and self.refusals.count == 0
        except Exception:  # noqa: BLE001 - not proven: the roots are walked one by one
            return False
        finally:
            self.refusals, self.current_root = refusals, root
