"""An import hook that waits for the framework: trace starts once it is imported."""
from __future__ import annotations

import sys
from typing import Any, Callable

from ...units import complain


class AfterImport:
    """A ``sys.meta_path`` finder that calls ``callback(module)`` once ``name`` has been
    imported (its module executed), then takes itself out. It finds nothing itself."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback
        self._busy = False

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = PostExecLoader(spec.loader, self)
        return spec


class PostExecLoader:
    def __init__(self, loader, hook: AfterImport) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            # the module keeps its own loader, as if nothing had been in between
            try:
                module.__loader__ = self._loader
                module.__spec__.loader = self._loader
            except Exception:  # noqa: BLE001
                pass
        self._hook.remove()
        try:
            self._hook.callback(module)
        except Exception as exc:  # noqa: BLE001 - the user's import stands
            complain(f"trace could not start after `import {self._hook.name}`", exc)

    def __getattr__(self, name):
        return getattr(self._loader, name)

