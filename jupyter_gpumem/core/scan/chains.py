"""The last error's chained exceptions, as hidden holders of their own.

An exception raised while another was handled keeps it (``__context__``), ``raise ...
from`` keeps its cause (``__cause__``), an exception group keeps its members
(``exceptions``); each keeps its own traceback, whose frames keep their locals. This
module finds them from the last error IPython kept and names each as the user reaches
it (``sys.last_value.__context__``, ``sys.last_value.exceptions[1].__cause__``); the
hidden-holder table (:mod:`.hidden`) lists them as one kind. Everything is read through
the base types' own descriptors: no code of the user's exception classes runs.
"""
from __future__ import annotations

import builtins
import sys
from typing import Any, Callable, Iterator
from ...backends.base import is_a

_CONTEXT = BaseException.__dict__["__context__"]
_CAUSE = BaseException.__dict__["__cause__"]
_TRACEBACK = BaseException.__dict__["__traceback__"]
_GROUP = getattr(builtins, "BaseExceptionGroup", None)
_MEMBERS = _GROUP.__dict__["exceptions"] if _GROUP is not None else None
#: how deep a chain is followed (a chain longer than this is cut, never walked forever)
MAX_CHAIN = 64
#: the name the user reaches the last error by in this Python
LAST = "sys.last_exc" if sys.version_info >= (3, 12) else "sys.last_value"


def last_error(shell: Any = None) -> BaseException | None:
    """The last error IPython kept: ``sys.last_exc``/``sys.last_value``, else the last
    result's ``error_in_exec``."""
    for obj in (getattr(sys, "last_exc", None), getattr(sys, "last_value", None),
                getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None)):
        if is_a(obj, BaseException):
            return obj
    return None


def chained(error: BaseException | None) -> Iterator[tuple[str, BaseException, BaseException]]:
    """``(path, exception, the exception that keeps it)`` for every exception the last
    error keeps, breadth first, each once (``path`` after the last error's name)."""
    if error is None:
        return
    seen = {id(error)}
    todo = [("", error)]
    while todo and len(seen) <= MAX_CHAIN:
        path, exc = todo.pop(0)
        links = [(".__cause__", _CAUSE.__get__(exc)), (".__context__", _CONTEXT.__get__(exc))]
        if _MEMBERS is not None and is_a(exc, _GROUP):
            links += [(f".exceptions[{i}]", e) for i, e in enumerate(_MEMBERS.__get__(exc))]
        for step, nxt in links:
            if is_a(nxt, BaseException) and id(nxt) not in seen:
                seen.add(id(nxt))
                yield path + step, nxt, exc
                todo.append((path + step, nxt))


def find(shell: Any, add: Callable[[str, Any, Any], None]) -> None:
    """The hidden table's ``find``: one root per chained exception of the last error."""
    for path, exc, _ in chained(last_error(shell)):
        add(LAST + path, exc, None)


def owns(name: str) -> bool:
    return name.startswith(LAST + ".")


def clear(name: str, obj: Any, shell: Any) -> bool:
    """Drop the chained exception's traceback (its frames' locals go with it) and unlink
    it from the exception that keeps it, where that link can be set."""
    for path, exc, parent in chained(last_error(shell)):
        if exc is obj and LAST + path == name:
            _TRACEBACK.__set__(exc, None)
            for link in (_CAUSE, _CONTEXT):
                if link.__get__(parent) is exc:
                    link.__set__(parent, None)
            return True
    return False
