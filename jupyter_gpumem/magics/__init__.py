"""The magics: ``%gpumem`` and ``%%gpuwatch``, argument parsing over the API, nothing clever.

- :mod:`.gpumem`: :class:`~.gpumem.GpuMemMagics` (the settings, the report, purge);
- :mod:`.args`: the common options (``--device``, ``-o``), the line splitter, the guard;
- :mod:`.watch`, :mod:`.panel`, :mod:`.trace`, :mod:`.tame`: the subcommands.
"""
from __future__ import annotations

from .gpumem import GpuMemMagics

__all__ = ["GpuMemMagics"]
