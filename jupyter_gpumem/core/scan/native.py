"""The package's optional C core (``core/_reach.c``): the one place that loads it.

It is built at install where a compiler is found (``hatch_build.py``) and shipped in
the platform wheel. Every use of it has a Python form with the same answers: the
scan's walk (:mod:`.reach`), the pass over a namespace (:mod:`.roots`) and the
/proc readers (:mod:`.devices`). :data:`CORE` is the loaded module, or None where it
was not built, cannot be imported, or ``JUPYTER_GPUMEM_PURE_SCAN=1`` is set: then
every one of those takes its Python form (the test suite runs once each way).
"""
from __future__ import annotations

import os
from types import ModuleType

#: the environment switch that makes the package behave as if the C core were absent
PURE_ENV = "JUPYTER_GPUMEM_PURE_SCAN"


#: the C core's module, or None (see the module docstring)
CORE: ModuleType | None = None
#: why the core is absent where nobody asked for the Python form (one line), else ""
ABSENT = ""
if os.environ.get(PURE_ENV, "").strip() in ("", "0"):
    try:
        from .. import _reach as CORE
    except ImportError as exc:
        CORE = None
        ABSENT = ("the scan's C core is not built here (no C compiler at install, or the "
                  f"source tree on the path: {exc}): scans walk in Python, 5-8x slower over "
                  "large plain data, about 1.3x over a model; `pip install .` with a C "
                  "compiler builds it")


def function(name: str):
    """The C core's function ``name``, or None where the core is absent or lacks it."""
    return getattr(CORE, name, None)
