"""Shared fixtures: one real IPython shell, reset before each test."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys

import pytest


def _clear_last_error():
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        if hasattr(sys, name):
            delattr(sys, name)


@pytest.fixture
def ip():
    """A real InteractiveShell with the extension loaded and a clean namespace."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.reset(new_session=False)
    _clear_last_error()
    shell.InteractiveTB.tb = None
    shell.run_cell("%load_ext jupyter_gpumem", store_history=False)
    yield shell
    shell.reset(new_session=False)
    _clear_last_error()
    shell.InteractiveTB.tb = None
    gc.collect()


def run(shell, code: str, *, expect_error: bool = False):
    """Run a cell with history (so Out[N] exists); fail the test on an unexpected error."""
    result = shell.run_cell(code, store_history=True)
    if expect_error:
        assert not result.success, f"cell should have failed: {code!r}"
    elif not result.success:
        raise AssertionError(f"cell failed: {code!r}: {result.error_before_exec or result.error_in_exec!r}")
    return result


class Fatal(BaseException):
    """Ends a sampling thread's callback (not an Exception, which a sampler counts and
    survives)."""


def raises_fatal(message: str):
    """A callback (or method) that raises :class:`Fatal` with ``message``."""
    def callback(*args):
        raise Fatal(message)
    return callback


@contextlib.contextmanager
def two_worker_cluster():
    """A real Dask LocalCluster of two worker processes, one thread each (for a
    module-scoped fixture)."""
    from distributed import LocalCluster

    with spawnable_main():
        cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                               dashboard_address=None, silence_logs=50)
    with cluster:
        yield cluster


@contextlib.contextmanager
def spawnable_main():
    """Starting worker processes (a Dask LocalCluster) reads ``__main__.__spec__``; an
    IPython shell made earlier in this process stands in for ``__main__`` without one."""
    main = sys.modules["__main__"]
    lent = "__spec__" not in vars(main)
    if lent:
        main.__spec__ = None
    try:
        yield
    finally:
        if lent:
            del main.__spec__


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_result(code: str, *args: str, drop_env: tuple = (), timeout: float = 300) -> dict:
    """Run ``code`` in a fresh interpreter on this checkout (``args`` its ``sys.argv[1:]``,
    the environment without ``drop_env``); the JSON of its last ``RESULT ...`` line."""
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])
