"""jupyter_gpumem: which notebook names hold accelerator memory, and how to get it back.

Load it in IPython or Jupyter with ``%load_ext jupyter_gpumem``; from a script
use :func:`snapshot`, :func:`purge` and :func:`watch` (see :mod:`.api`).
Importing the package imports neither IPython nor any framework.
"""
from __future__ import annotations

from .api import PurgeError, PurgeResult, Snapshot, Watch, __version__, purge, snapshot, watch

__all__ = ["__version__", "snapshot", "purge", "watch", "PurgeError", "PurgeResult", "Snapshot", "Watch",
           "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ip) -> None:
    """``%load_ext jupyter_gpumem``: register the magics and the sidebar's comm target."""
    from . import extension  # the IPython-facing layer, imported only when IPython loads it

    extension.load(ip)


def unload_ipython_extension(ip) -> None:
    """``%unload_ext jupyter_gpumem``: remove every magic, hook, thread and comm target."""
    from . import extension

    extension.unload(ip)


def _jupyter_server_extension_points():
    """The Jupyter server extension (``jupyter_gpumem.server``: the kernels' GPU memory)."""
    return [{"module": "jupyter_gpumem.server"}]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "jupyter-gpumem"}]
