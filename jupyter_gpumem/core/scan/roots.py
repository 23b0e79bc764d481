"""Where a walk starts: the user's names (a :class:`Root` each), and what it never enters.

IPython's hidden holders (``Out[N]``, ``_``, the last traceback) are roots too;
they are found by the table in :mod:`.hidden`.
"""
from __future__ import annotations

import builtins
import re
import sys
import types
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import Any

from . import native
from .paths import name_text
from .proof import NOT_PROVEN
from .types import ATOMIC, MODULE_DICT, is_a, is_library_module_name

#: IPython's own bookkeeping in ``user_ns``: not the user's names
_HIDDEN_NAME = re.compile(r"^(_|__|___|_\d+|_i|_ii|_iii|_i\d+|_ih|_oh|_dh|In|Out|_exit_code)$")
_SHELL_NAMES = {"exit", "quit", "get_ipython", "__builtin__", "__builtins__", "__name__",
                "__doc__", "__package__", "__loader__", "__spec__"}


@dataclass(slots=True)
class Root:
    """A starting point of the walk: something the user can name. (Slots and a tuple of
    aliases: a long notebook's scan makes one per name, and each is one small object.)"""

    name: str
    obj: Any
    hidden: bool = False
    aliases: tuple[str, ...] = ()
    purge: str | None = None
    kind: str = "user"      # user, path, exception, or a kind of :data:`.hidden.KINDS`


def format_key(key: Any) -> str:
    """``[key]`` as a path shows it; ``[...]`` where its repr would run the user's code."""
    if key is ... or type(key) not in ATOMIC:
        return "[...]"
    text = repr(key)
    return f"[{text}]" if len(text) <= 40 else "[...]"


#: name -> how it is typed (``model``, ``globals()['x[0]']``), or None where it is one of
#: IPython's or the shell's own (``_i42``, ``In``, ``__doc__``): a notebook adds ``_iN``
#: (and ``_N``) every cell, and the footer asks after each one. Trimmed only between two
#: passes over a namespace (:func:`_trim_names`), never during one: a memo emptied while
#: it is read would judge every name again, each pass
_BOOKKEEPING: dict[str, str | None] = {}
_BOOKKEEPING_MAX = 100_000
_UNKNOWN = object()


def _typed(name: str) -> str | None:
    text = _BOOKKEEPING.get(name, _UNKNOWN)
    if text is _UNKNOWN:
        own = (name in _SHELL_NAMES or _HIDDEN_NAME.match(name) is not None
               or (name.startswith("__") and name.endswith("__")))
        text = _BOOKKEEPING[name] = None if own else name_text(name)
    return text


def _is_bookkeeping(name: str) -> bool:
    return _typed(name) is None


def _trim_names(namespace: dict) -> None:
    """Before a pass over ``namespace``: the memo is emptied where it outgrew both its
    bound and twice the namespace (names deleted since), so it never holds more than a
    pass adds to that."""
    if len(_BOOKKEEPING) > max(_BOOKKEEPING_MAX, 2 * len(namespace)):
        _BOOKKEEPING.clear()


_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def _items_except_py(namespace: dict, types: frozenset, memo: list | None = None,
                     judge: Any = None, split: bool = False) -> Any:
    """:func:`_items_except` without the C core: the items are taken in one C call
    (another thread may change the namespace), and the types are compared by address,
    as the C pass does (a metaclass's ``__hash__`` is never asked). It keeps no memo:
    what ``judge`` would leave out stays in, for the caller's own check. ``split``: the
    keys and the values as two lists, as the C pass gives them."""
    skip = frozenset(map(id, types))
    pairs = [(k, v) for k, v in list(dict.items(namespace)) if id(type(v)) not in skip]
    return (list(map(_FIRST, pairs)), list(map(_SECOND, pairs))) if split else pairs


# the C core (see _reach.c): one pass over the table, no Python code run
_items_except = native.function("items_except") or _items_except_py
#: the C core's proof that a dict's keys are all str (None without it)
_str_keys = native.function("str_keys")

#: id(namespace) -> the C pass's memo of where in its table it found which names (the
#: ones left out, the ones kept: ``items_except`` in _reach.c), key strings only
_MEMOS: dict[int, list] = {}
_MEMOS_MAX = 16


def _memo_for(namespace: dict) -> list:
    memo = _MEMOS.get(id(namespace))
    if memo is None:
        if len(_MEMOS) >= _MEMOS_MAX:
            _MEMOS.clear()
        memo = _MEMOS[id(namespace)] = [[], []]
    return memo


def user_roots(namespace: dict, hidden_ns: dict | None = None,
               prove: Any = None) -> list[Root]:
    """The user's own names in a namespace (IPython's bookkeeping left out).

    ``prove``: where given, a callable that says of a list of values which ones are
    proven to reach no storage (a mark 0 or 1 each, in a bytearray;
    :meth:`.reach.Reacher.reach_nothing`):
    those names get no Root (a long notebook's names are mostly plain data, and a Root
    made, read and freed for each of them costs more than the proof)."""
    hidden_ns = hidden_ns or {}
    _trim_names(namespace)
    # names bound to an atomic value and IPython's own names are dropped first, in one
    # pass that does not read again the names it left out last time (IPython adds an
    # ``_iN`` every cell); the rest are looked at one by one
    judged = _items_except is not _items_except_py
    if prove is not None:   # (without the C core, IPython's names too: left out below)
        names, values = _items_except(namespace, ATOMIC, _memo_for(namespace), _is_bookkeeping,
                                      True)
        # the names not proven empty, by their places: the lists are not read again
        # (a pass over them touches every name and value: a cache miss apiece)
        left = list(compress(range(len(values)), prove(values).translate(NOT_PROVEN)))
        keep: Any = zip(map(names.__getitem__, left), map(values.__getitem__, left))
    else:
        keep = _items_except(namespace, ATOMIC, _memo_for(namespace), _is_bookkeeping)
    # the C pass has asked _is_bookkeeping of every name it kept: a plain ASCII name is
    # then typed as it is, with no look-up in the memo (a long notebook's names are
    # tens of thousands, and the memo's table outgrows the caches)
    isascii, isidentifier = str.isascii, str.isidentifier
    out = []
    known, module, unknown = _BOOKKEEPING.get, types.ModuleType, _UNKNOWN
    plain: set = set()   # the types met that are no module's (of type's own metaclass)
    # the names IPython keeps for itself that a user's name could be (most are its own
    # bookkeeping, left out above): usually none, and then no name is looked up
    shadow = {n for n in hidden_ns if type(n) is str and _typed(n) is not None}
    for name, value in keep:   # (one pass: each name's objects are read once)
        if type(name) is not str:
            continue   # ``globals()[42] = ...``: no name to type (see odd_keys)
        if judged and isascii(name) and isidentifier(name):
            text = name   # (name_text's rule for an ASCII name)
        else:
            # ``globals()['x[0]']``: not the first item of ``x``
            text = known(name, unknown)
            if text is unknown:
                text = _typed(name)
            if text is None:
                continue
        if shadow and name in shadow and hidden_ns[name] is value:
            continue
        tp = type(value)
        if type(tp) is not type or tp not in plain:   # (no metaclass's __hash__ is asked)
            if not is_a(value, module):
                if type(tp) is type:
                    plain.add(tp)
            elif is_library_module_name(MODULE_DICT(value).get("__name__")):
                continue
        out.append(Root(text, value, False, (), text))   # (positional: made for each name)
    return out


def odd_keys(namespace: dict | None = None, shell: Any = None) -> list[str]:
    """Keys of the namespace that are not names (``globals()[42] = ...``): the scan
    skips them, and the report says so."""
    ns = shell.user_ns if shell is not None else namespace or {}
    if _str_keys is not None and _str_keys(ns):
        return []   # (asked at every scan: the table's kind says it without a key read)
    keys = list(dict.keys(ns))   # (else C-level passes over the keys)
    return [format_key(k)[1:-1] for k in compress(keys, map(is_not, map(type, keys), repeat(str)))]


def stop_ids_for(shell: Any = None, namespace: dict | None = None) -> set[int]:
    """Objects the walk never enters: namespaces, the shell, module tables."""
    objs: list[Any] = [sys.modules, builtins.__dict__, builtins, sys]
    if namespace is not None:
        objs.append(namespace)
    if shell is not None:
        objs += [shell, shell.user_ns, getattr(shell, "user_ns_hidden", None),
                 getattr(shell, "user_global_ns", None), getattr(shell, "history_manager", None),
                 getattr(shell, "displayhook", None), getattr(shell, "display_pub", None)]
        hm = getattr(shell, "history_manager", None)
        if hm is not None:
            objs += [hm.output_hist, hm.input_hist_parsed, hm.input_hist_raw]
        objs += [shell.user_ns.get("In"), shell.user_ns.get("Out")]
    return {id(o) for o in objs if o is not None}
