"""Build hook: compiles the scan's optional C core (jupyter_gpumem/core/_reach.c).

Built in place with setuptools' ``build_ext``, so an editable install uses it too,
and shipped in the wheel (which is then platform-specific). Where no compiler is
found the build goes on without it: the scan then walks in Python, with the same
answers, more slowly (``jupyter_gpumem.core.scan_reach.NATIVE`` is None).
"""
from __future__ import annotations

import glob
import os

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext

SOURCE = "jupyter_gpumem/core/_reach.c"
HEADER = "jupyter_gpumem/core/_fingerprint.h"   # included by SOURCE
MODULE = "jupyter_gpumem.core._reach"


class NativeScanHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or os.environ.get("JUPYTER_GPUMEM_NO_NATIVE"):
            return
        try:
            built = self._build()
        except Exception as exc:  # noqa: BLE001 - any failure: the pure-Python walk
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
        ext = Extension(MODULE, [SOURCE], depends=[HEADER], extra_compile_args=["-O2"])
        dist = Distribution({"name": "jupyter-gpumem-native", "ext_modules": [ext]})
        dist.src_root = root
        cwd = os.getcwd()
        os.chdir(root)
        try:
            cmd = build_ext(dist)
            cmd.inplace = True
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

    def clean(self, versions: list[str]) -> None:
        for path in glob.glob(os.path.join(self.root, "jupyter_gpumem", "core", "_reach*.so")):
            os.remove(path)
