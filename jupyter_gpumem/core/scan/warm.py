"""The warm scan: a root's last walk is reused while its fingerprint proves that the
walk would read the same again.

The fingerprint and its plan of checks are the C core's (``core/_reach_parts/fingerprint.c``,
``plan.c``); what they cannot prove is walked again, so the report is the one a full scan
gives, byte for byte (tests/core/scan/test_warm.py); only the time differs. Warm scans cost no
more than cold ones taken together (rule 6: the bank, :data:`HASH_SHARE`). A
:class:`WarmScan` belongs to one session and holds no user object. Without the C core,
with ``JUPYTER_GPUMEM_FULL_SCAN=1`` or ``%gpumem --full``, every root is walked. The
story: docs/ARCHITECTURE.md#the-warm-scan.
"""
from __future__ import annotations

import os
import time
import weakref
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

from . import native
from .allocations import Apart
from .kinds import CLASS_SKIP_KEYS
from .types import (ATOMIC_IDS, BUILTIN, CELL, CLASS, CONTAINER, EXCEPTION, FUNCTION, INSTANCE, LRU,
                    METHOD, MODULE, PARTIAL, SKIP, TENSOR, TRACEBACK, classify,
                    is_library_module_name)

#: the environment switch that makes every scan a full one (the warm scan's test switch)
FULL_ENV = "JUPYTER_GPUMEM_FULL_SCAN"
#: the C core's type, or None (no C core, or an interpreter whose dict versions it
#: does not read): every root is then walked each time
FINGERPRINT = native.function("Fingerprint")
#: objects a fingerprint reads at most; a root holding more is walked each time
LIMIT = 4_000_000
#: types judged at most before the record of them starts again
_JUDGED_MAX = 10_000

# what the fingerprint does with an object of each type (core/_reach_parts/fp_kinds.c)
(DOUBT, ATOM, DICT, ODICT, DDICT, SEQ, SET, ITER, PLAIN_TENSOR, REFERENTS,
 FUNCTION_PARTS, CELL_CONTENTS, CLASS_DICT, MODULE_NAME) = range(14)
#: by the types' ids: no class of the user's is ever hashed (see types.keyable_meta)
_EXACT = {id(dict): DICT, id(OrderedDict): ODICT, id(defaultdict): DDICT, id(list): SEQ,
          id(tuple): SEQ, id(set): SET, id(frozenset): SET, id(deque): ITER}
#: kinds the walk reads through their referents, as the fingerprint does
_BY_KIND = {SKIP: ATOM, CLASS: CLASS_DICT, FUNCTION: FUNCTION_PARTS, CELL: CELL_CONTENTS,
            MODULE: MODULE_NAME, METHOD: REFERENTS, BUILTIN: REFERENTS, PARTIAL: REFERENTS,
            LRU: REFERENTS, TRACEBACK: REFERENTS, EXCEPTION: REFERENTS, INSTANCE: REFERENTS}
_FIRST = itemgetter(0)


class Unread(tuple):
    """The path node of a storage a warm scan reused without its path: only each
    holder's largest storage keeps its path (a report reads no other). Reading it is a
    mistake of the caller's, said loudly."""

    __slots__ = ()

    def __iter__(self):
        raise LookupError("a warm scan keeps only each holder's largest path: "
                          "ask with warm=None for the others")


UNREAD = Unread()


@dataclass
class Kept:
    """What one root's walk reached, kept with the fingerprint taken with it."""

    print: tuple
    storages: dict          # key -> (storage info, path node, None); the first has its path
    objects: int
    keep: list = field(default_factory=list)   # what the fingerprint names by address
    plan: Any = None        # what the fingerprint read, as checks (or None)
    cost: float = 0.0       # seconds its walk took: what reusing it saves
    #: the generation of the warm scan's Apart that proved its storages (allocations.py)
    apart: int = -1


def _copy(obj: Any) -> Any:
    """A shallow copy of a plain instance (a Holder), without copy's protocol."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


def _signature(result: Any) -> tuple | None:
    """What an attribution of ``result`` depends on, where every root that holds
    storages was reused (None otherwise): each root's names, kind, object and kept
    storages (the same dict while it is kept); a root that reaches nothing plays no
    part in an attribution, nor in this."""
    kept = result.kept
    if len(kept) != len(result.roots):
        return None
    out = []
    for i in result.holding():   # (a root that reaches nothing plays no part in it)
        if not kept[i]:
            return None
        root, storages = result.roots[i], result.reach[i].storages
        out.append((root.name, root.kind, root.hidden, tuple(root.aliases), root.purge,
                    id(root.obj), id(type(root.obj)), id(storages)))
    return tuple(out)


class WarmScan:
    """What the last scans of one shell walked, per root (see the module docstring)."""

    def __init__(self) -> None:
        self._kept: dict[tuple, Kept] = {}
        self._context: tuple | None = None
        self._judged: dict[int, tuple] = {}    # id(type) -> (weak ref to it, action)
        self._libs: dict[str, bool] = {}
        #: root key -> (id, id(type)) of a root last found unprovable
        self._doubted: dict[tuple, tuple] = {}
        #: the roots walked at least once (a root met for the first time is walked at
        #: once: proving it unchanged needs a walk's record of its tensors first)
        self._met: set = set()
        #: the last attribution: (its roots' signature, holders, storage keys, bytes reached,
        #: the kept storages it was made from, held so that no other takes their address)
        self._attributed: tuple | None = None
        #: plain roots (reaching no storage) found changed: root key -> [scans left
        #: walked without a fingerprint, the next rest's length] (see WarmPass.look)
        self._resting: dict[tuple, list] = {}
        #: plain roots walked once: fingerprinted at their second walk, so that the
        #: first scan costs what it did without plans
        self._plain_once: set = set()
        #: the last attribution's per-root stats, by their storages (see snapshot.Sharing)
        self.stats: dict[int, tuple] = {}
        #: (what it was made from, the C core's Fingerprint), kept from scan to scan
        self._fingerprint: tuple | None = None
        #: seconds reuse saved in the last scans and no fingerprint spent (see WarmPass)
        #: the storages proven apart, kept from scan to scan (allocations.py)
        self.apart = Apart()
        self.bank = 0.0
        #: roots reused and walked by the last scan (benchmarks and tests read them)
        self.reused = 0
        self.walked = 0

    @staticmethod
    def available() -> bool:
        """Whether scans can be warm here (the C core's fingerprint, no FULL_ENV)."""
        return FINGERPRINT is not None and os.environ.get(FULL_ENV, "").strip() in ("", "0")

    def start(self, backends: list, stop: set, devices: set | None,
              reuse: bool = True) -> "WarmPass | None":
        """One scan's use of what is kept (None: every root is walked and nothing kept).
        ``reuse=False``: every root is walked, and what it reached kept for the next."""
        if not self.available():
            return None
        spec, plain, spec_backend = None, frozenset(), None
        for backend in backends:
            got = backend.fingerprint_spec()
            if got is not None:
                spec, plain, spec_backend = got, frozenset(map(id, backend.batch_types())), backend
                break
        context = (tuple(map(id, backends)), frozenset(stop))
        if context != self._context:
            self.clear()
            self._context = context
        known, get_fn, get_ptr, get_held = spec if spec is not None else ({}, None, None, None)
        if len(self._judged) > _JUDGED_MAX:   # classes made and gone, run after run
            self._judged.clear()
        made = (tuple(map(id, (known, get_fn, get_ptr, get_held))), plain)
        if self._fingerprint is None or self._fingerprint[0] != made:
            self._fingerprint = (made, self._made(backends, spec_backend, plain, stop, known,
                                                  get_fn, get_ptr, get_held))
        # (a fingerprint of the same backend's record is kept: the records of tensors it
        # read in earlier scans with it)
        fingerprint = self._fingerprint[1]
        fingerprint.begin()
        return WarmPass(self, fingerprint, reuse,
                        None if devices is None else frozenset(devices),
                        _plans_safe(backends))

    def _made(self, backends: list, spec_backend: Any, plain: frozenset, stop: set,
              known: dict, get_fn: Any, get_ptr: Any, get_held: Any) -> Any:
        """A new C-core Fingerprint, with its judge of types (kept by this scan)."""
        judged, action_of, backends = self._judged, self._action, list(backends)

        def judge(tp: type) -> int:   # (holds no reference to self: the fingerprint is kept)
            entry = judged.get(id(tp))
            if entry is not None and entry[0]() is tp:
                return entry[1]
            action = action_of(tp, backends, spec_backend, plain)
            try:
                judged[id(tp)] = (weakref.ref(tp), action)
            except TypeError:
                pass
            return action

        return FINGERPRINT(judge, self._libs, is_library_module_name, stop, known,
                           get_fn, get_ptr, get_held, CLASS_SKIP_KEYS, LIMIT)

    @staticmethod
    def _action(tp: type, backends: list, spec_backend: Any, plain: frozenset) -> int:
        exact = _EXACT.get(id(tp))   # OrderedDict, defaultdict: dict's subclasses of its own
        if exact is not None:
            return exact
        if id(tp) in ATOMIC_IDS:
            return ATOM
        try:
            kind, backend = classify(tp, backends)
        except Exception:
            return DOUBT
        if kind == TENSOR:
            return PLAIN_TENSOR if backend is spec_backend and id(tp) in plain else DOUBT
        if kind == CONTAINER:
            # a module or an optimizer: its class, then its instance dict (more than its
            # backend's children, never less)
            return REFERENTS if backend is spec_backend else DOUBT
        return _BY_KIND.get(kind, DOUBT)

    def attributed(self, result: Any, compute: Any) -> tuple[list, Any, Any, bool]:
        """``compute()`` (``(holders, storage keys, bytes reached)`` of ``result``), or its
        last answer where every root holding storages was reused from the same kept walk,
        and the roots are those of last time, with the same names and aliases (the
        holders are then copies; the last item says it was reused)."""
        sig = _signature(result)
        last = self._attributed
        if sig is not None and last is not None and last[0] == sig:
            return list(map(_copy, last[1])), last[2], last[3], True
        holders, keys, reached = compute()
        self._attributed = None if sig is None else (
            sig, list(map(_copy, holders)), keys, reached,
            [result.reach[i].storages for i in result.holding()])
        return holders, keys, reached, False

    def clear(self) -> None:
        """Forget every root (the next scan walks them all)."""
        self._kept.clear()
        self._doubted.clear()
        self._met.clear()
        self._resting.clear()
        self._plain_once.clear()
        self._attributed = None
        self._fingerprint = None
        self.stats = {}
        self.bank = 0.0

    def __len__(self) -> int:
        return len(self._kept)


def _plans_safe(backends: list) -> bool:
    """Whether a plan's checks may run now: no backend's getter can run Python code."""
    for backend in backends:
        try:
            if backend.getters_run_code():
                return False
        except Exception:  # noqa: BLE001 - unsure: hashed, as without plans
            return False
    return True


#: the longest rest of a plain root found changed again and again (scans)
REST_MAX = 32
#: plain data of more objects than this is walked each time (its first hash and its
#: plan would cost more than they save: a plan is about 48 bytes a check)
PLAIN_LIMIT = 200_000
#: plain data of at most this many objects, walked in at most this many seconds, is
#: fingerprinted at its first walk
SMALL_PLAIN = 64
SMALL_WALK = 20e-6
#: of a scan's walking time: what it may spend on larger plain data's fingerprints
#: beyond what reuse saved, and what the bank gains besides (the hash of plain data
#: costs about twice its walk)
HASH_SHARE = 0.25
#: seconds the bank of what reuse saved holds at most
BANK_MAX = 1.0


class WarmPass:
    """One scan's look-ups and records (made by :meth:`WarmScan.start`)."""

    def __init__(self, warm: WarmScan, fingerprint: Any, reuse: bool,
                 devices: frozenset | None, plans: bool = True) -> None:
        self.warm = warm
        self.fingerprint = fingerprint
        self.reuse = reuse
        self.devices = devices   # what a walk keeps depends on the devices it counts
        self.plans = plans       # a kept root's plan may be checked (see _plans_safe)
        #: root index -> (print, keep, plan) taken before its walk
        self._pre: dict[int, tuple] = {}
        self._bare: set = set()  # roots walked without a fingerprint (plain data at rest)
        self._seen: set = set()
        #: the scan's steps when the fingerprint last forgot the tensors it read
        self.steps = 0
        #: seconds: the reused roots' last walks, this scan's walks, the larger plain
        #: data's fingerprints (see walked)
        self.saved = self.walking = self.spent = 0.0
        self._cost: dict[int, float] = {}
        self._later: list = []   # larger plain data not fingerprinted yet (see settle)
        warm.reused = warm.walked = 0

    def key(self, root: Any) -> tuple:
        """Where what root ``root``'s walk reached is kept."""
        return (root.name, root.kind, root.hidden, self.devices)

    def forget(self, steps: int) -> None:
        """A step of the scan let other code run (``steps`` so far): the tensors the
        fingerprint read in this scan are read again."""
        self.fingerprint.forget()
        self.steps = steps

    def _checked(self, plan: Any, obj: Any) -> bool:
        try:
            return self.fingerprint.check(plan, obj)
        except Exception:  # noqa: BLE001 - (out of memory, say): hashed, then walked
            return False

    def _hashed(self, obj: Any, keep: list, plan: int) -> tuple | None:
        try:
            return self.fingerprint.of(obj, keep, plan)
        except Exception:  # noqa: BLE001 - as one it cannot prove: walked
            return None

    def look(self, i: int, root: Any) -> Kept | None:
        """Root ``i``'s kept walk where its fingerprint is the one kept with it (its plan's
        checks hold, or else its hash is the same); else None (the caller walks it), its
        fingerprint noted for :meth:`keep`."""
        key = self.key(root)
        self._seen.add(key)
        warm = self.warm
        ident = (id(root.obj), id(type(root.obj)))
        if warm._doubted.get(key) == ident or key not in warm._met:
            # unprovable last time, and still the same object; or not walked yet: walked
            # first (its fingerprint is taken right after the walk: see walked)
            warm._met.add(key)
            warm.walked += 1
            return None
        rest = warm._resting.get(key)
        kept = warm._kept.get(key)
        if rest is not None and rest[0] > 0 and (kept is None or not kept.storages):
            rest[0] -= 1   # plain data found changed lately: walked, as it costs no more
            self._bare.add(i)
            warm.walked += 1
            return None
        if kept is not None and self.reuse and self.plans and kept.plan is not None and \
                self._checked(kept.plan, root.obj):
            warm.reused += 1
            self.saved += kept.cost
            if rest is not None:
                del warm._resting[key]
            return kept
        keep: list = []
        plain = kept is not None and not kept.storages   # kept only with its plan
        got = self._hashed(root.obj, keep, 2 if plain else 1)
        now, plan = (got[:3], got[3]) if got is not None else (None, None)
        if now is not None and kept is not None and kept.print == now and self.reuse:
            kept.keep, kept.plan = keep, plan   # its plan said changed, its hash not
            warm.reused += 1
            self.saved += kept.cost
            return kept
        if plain:   # plain data, changed: rests a while
            span = min(2 * rest[1], REST_MAX) if rest is not None else 1
            warm._resting[key] = [span, span]
        self._pre[i] = (now, keep, plan)
        warm.walked += 1
        return None

    def walked(self, i: int, root: Any, found: dict, stepped: bool, objects: int = 0,
               seconds: float = 0.0, began: int = 0) -> None:
        """Root ``i`` was just walked whole (``found``: its storages; ``seconds``: what
        the walk took), and no other code ran since (``stepped``: a step of the scan came
        during the walk). Where its fingerprint before the walk could not be taken (a
        tensor met for the first time), it is taken now, so it matches what the walk
        read; after a step, nothing is kept of it. Plain data (no storage) is
        fingerprinted with a plan only (see keep): at its first walk where it is small
        (:data:`SMALL_PLAIN`), else from its second walk, up to :data:`PLAIN_LIMIT`
        objects, where this scan can afford it (see the module docstring), now or at
        :meth:`settle` (``began``: the scan's steps when the walk began)."""
        self._cost[i] = seconds
        self.walking += seconds
        got = self._pre.get(i, (None,))[0]
        key = self.key(root)
        ident = (id(root.obj), id(type(root.obj)))
        if got is not None or i in self._bare or self.warm._doubted.get(key) == ident:
            return   # (one found unprovable is not asked again while it is the same)
        larger = False
        # (the walk counts no atoms: its time says what a list of a million strings is)
        if not found and (objects > SMALL_PLAIN or seconds > SMALL_WALK):
            once = self.warm._plain_once
            if not self.plans or objects > PLAIN_LIMIT or key not in once:
                once.add(key)   # larger plain data: fingerprinted from its second walk
                return
            if not self._affords(seconds):
                if not stepped:   # perhaps once the scan has reused more: see settle
                    self._later.append((i, root, seconds, began))
                return
            larger = True
        if stepped:
            self._pre.pop(i, None)
            return
        self._fingerprint(i, root, found, larger)

    def _affords(self, seconds: float) -> bool:
        """Whether the fingerprint of larger plain data whose walk took ``seconds`` fits
        in what this scan saved (its hash costs about two walks)."""
        return self.spent + 2 * seconds <= self.saved + self.warm.bank

    def _fingerprint(self, i: int, root: Any, found: dict, larger: bool) -> None:
        keep: list = []
        # plain data is kept only with its plan: none (too many checks) is given up early
        start = time.perf_counter() if larger else 0.0
        got = self._hashed(root.obj, keep, 1 if found else 2)
        if larger:
            self.spent += time.perf_counter() - start
        if got is None:
            self.warm._doubted[self.key(root)] = (id(root.obj), id(type(root.obj)))
            return
        self._pre[i] = (got[:3], keep, got[3])

    def settle(self, steps: int | None) -> None:
        """Every root is walked: the larger plain data that this scan could not afford
        when it was walked is fingerprinted now where it can, if no step of the scan
        came since its walk began (``steps``: the scan's steps now; None: the caller
        lets no other code run at its steps)."""
        later, self._later = self._later, []
        for i, root, seconds, began in later:
            if (steps is None or steps == began) and self._affords(seconds):
                self._fingerprint(i, root, {}, True)

    def keep(self, i: int, root: Any, found: dict, objects: int, path: Any) -> None:
        """Keep root ``i``'s clean walk: ``found`` (its largest storage first, whose path
        node is ``path``) and ``objects``, with the fingerprint taken beside the walk."""
        key = self.key(root)
        warm = self.warm
        got, keep, plan = self._pre.pop(i, (None, None, None))
        if not found and (plan is None or i in self._bare):
            # plain data with no plan to check (or resting, see look): walked at C speed
            # each time, hashing it would cost as much; walked as if met for the first
            # time, until it holds a storage or can be checked again
            warm._kept.pop(key, None)
            if i not in self._bare:
                warm._met.discard(key)
            return
        if got is None:
            warm._kept.pop(key, None)
            return
        warm._doubted.pop(key, None)
        if found:
            warm._resting.pop(key, None)   # (rests are for plain data)
        storages = dict(zip(found, zip(map(_FIRST, found.values()), repeat(UNREAD),
                                       repeat(None))))
        if storages:
            first = next(iter(storages))
            storages[first] = (storages[first][0], path, None)
        warm._kept[key] = Kept(got, storages, objects, keep, plan, self._cost.get(i, 0.0))

    def drop(self, root: Any) -> None:
        """Root ``root``'s walk was not clean: nothing of it is kept."""
        self.warm._kept.pop(self.key(root), None)

    def close(self) -> None:
        """The scan is over, however it ended: the fingerprint, kept for the next scan,
        lets go of the tensors and gradients it read, and of the walk's record; what
        its reuse saved and its fingerprints did not spend goes to the bank."""
        self.fingerprint.forget()
        warm = self.warm
        earned = self.saved + HASH_SHARE * self.walking - self.spent
        warm.bank = min(BANK_MAX, max(0.0, warm.bank + earned))

    def end(self) -> None:
        """Forget the roots this scan did not meet (names deleted, outputs gone)."""
        for table in (self.warm._kept, self.warm._doubted, self.warm._resting):
            for key in [k for k in table if k[3] == self.devices and k not in self._seen]:
                del table[key]
        for met in (self.warm._met, self.warm._plain_once):
            met.difference_update([k for k in met if k[3] == self.devices and k not in self._seen])
