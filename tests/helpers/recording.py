"""Container subclasses whose protocol methods record that they ran, for the tests that
check no method of the user's runs while the scan reads an object (tests/hostile/test_hostile_walk.py,
tests/helpers/hostile_child.py)."""
from __future__ import annotations


def records(kind: str, *names: str, record):
    """A class decorator for a subclass of a built-in container: each method in ``names``
    first calls ``record("KIND NAME")``, then does what the built-in's does (``__bool__``:
    True)."""
    def decorate(cls):
        base = next(b for b in cls.__mro__ if b.__module__ == "builtins")
        for name in names:
            setattr(cls, name, _recorded(base, name, f"{kind} {name}", record))
        return cls
    return decorate


def _recorded(base, name: str, what: str, record):
    does = (lambda self: True) if name == "__bool__" else getattr(base, name)

    def method(self, *args):
        record(what)
        return does(self, *args)

    method.__name__ = name
    return method
