"""Let ``jupyter_gpumem.snapshot(...)`` work after its module of the same name is imported.

Importing the submodule ``jupyter_gpumem.purge`` replaces the package's
``purge`` function with the module object; giving that module a ``__call__``
keeps both ``jupyter_gpumem.purge(...)`` and ``jupyter_gpumem.purge.PurgeError``
working, whatever was imported first.
"""
from __future__ import annotations

import sys
import types
from typing import Callable


def make_module_callable(module_name: str, fn: Callable) -> None:
    """Calling the module ``module_name`` calls ``fn``."""
    module = sys.modules[module_name]

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return fn(*args, **kwargs)

    CallableModule.__call__.__doc__ = fn.__doc__
    module.__class__ = CallableModule
