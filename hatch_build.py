"""Build hook: compiles the scan's optional C core (jupyter_gpumem/core/_reach.c).

Built in place with setuptools' ``build_ext`` from the one file ``SOURCE``, which
#includes its parts (``PARTS``, every one listed in the build's dependencies), so an
editable install uses it too, and shipped in the wheel (which is then
platform-specific). It is always compiled
from the source (``force``): a ``.so`` left in the tree by an earlier build is never
packed. Where no compiler is found the build goes on without it, and any such
leftover is removed: the scan then walks in Python, with the same answers, more
slowly (``jupyter_gpumem.core.scan.native.CORE`` is None, and loading the extension says
so in one line).

The wheel carries the sidebar's built files without their source maps and build
leftovers (``LEFTOVERS``): this hook runs after the sidebar's build and drops them.
"""
from __future__ import annotations

import glob
import os

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext

SOURCE = "jupyter_gpumem/core/_reach.c"
LABEXTENSION = "jupyter_gpumem/labextension"
#: what the sidebar's build leaves beside the files JupyterLab loads (never shipped)
LEFTOVERS = ("*.map", "build_log.json", "*.orig")
#: the parts SOURCE #includes (its .c and .h files): each a dependency of the build
PARTS = "jupyter_gpumem/core/_reach_parts"
MODULE = "jupyter_gpumem.core._reach"


def native_depends(root: str) -> list[str]:
    """Every part of the C core (``PARTS/*.c``, ``PARTS/*.h``), relative to ``root``:
    the build's dependencies, so that a change of any part rebuilds the module."""
    found = glob.glob(os.path.join(root, PARTS, "*.[ch]"))
    return sorted(os.path.relpath(p, root).replace(os.sep, "/") for p in found)


class NativeScanHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        if version != "editable":
            self._drop_leftovers()
        if os.environ.get("JUPYTER_GPUMEM_NO_NATIVE"):
            self._remove_built()
            return
        try:
            built = self._build()
        except Exception as exc:  # noqa: BLE001 - any failure: the pure-Python walk
            self._remove_built()
            self.app.display_warning(
                f"jupyter_gpumem: the scan's C core was not built ({type(exc).__name__}: {exc});"
                " the scan walks in Python")
            return
        build_data["artifacts"].append(built)
        if version != "editable":
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def _build(self) -> str:
        root = self.root
        ext = Extension(MODULE, [SOURCE], depends=native_depends(root),
                        extra_compile_args=["-O2"])
        dist = Distribution({"name": "jupyter-gpumem-native", "ext_modules": [ext]})
        dist.src_root = root
        cwd = os.getcwd()
        os.chdir(root)
        try:
            cmd = build_ext(dist)
            cmd.inplace = True
            cmd.force = True    # compile from the source, whatever lies in the tree
            cmd.build_temp = os.path.join("build", "native")
            cmd.ensure_finalized()
            cmd.run()
            path = cmd.get_ext_fullpath(MODULE)
        finally:
            os.chdir(cwd)
        path = os.path.relpath(os.path.join(root, path), root)
        if not os.path.exists(os.path.join(root, path)):
            raise FileNotFoundError(path)
        self.app.display_info(f"jupyter_gpumem: built the scan's C core {path}")
        return "/" + path.replace(os.sep, "/")   # an artifact pattern, from the root

    def _remove_built(self) -> None:
        """Remove a C core left in the tree by an earlier build (it may be stale)."""
        for path in glob.glob(os.path.join(self.root, "jupyter_gpumem", "core", "_reach*.so")):
            os.remove(path)

    def _drop_leftovers(self) -> None:
        """Drop the sidebar build's source maps and logs (see ``LEFTOVERS``)."""
        for pattern in LEFTOVERS:
            for path in glob.glob(os.path.join(self.root, LABEXTENSION, "**", pattern),
                                  recursive=True):
                os.remove(path)

    def clean(self, versions: list[str]) -> None:
        self._remove_built()
