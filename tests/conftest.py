"""Shared fixtures and helpers: one real IPython shell, reset before each test, and
what several test files use (host reports and purges, a Dask cluster, kernels' messages,
child processes)."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

#: the shared helpers (tests/helpers) import as top-level modules from every test folder
HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)


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


def run_watched(shell, code: str):
    """``code`` as a cell under the ``watch on`` footer (``--device cpu``), which is turned
    off after it, whatever happened; the cell's result."""
    shell.run_line_magic("gpumem", "watch on --device cpu")
    try:
        return run(shell, code)
    finally:
        shell.run_line_magic("gpumem", "watch off")


def report(ip, names: str = ""):
    """``%gpumem`` of the host (``--device cpu``), as the snapshot object."""
    return ip.run_line_magic("gpumem", f"{names} --device cpu -o")


def holders_by_name(ip, flags: str = "") -> dict:
    """The holders of ``%gpumem {flags} --device cpu``, by name."""
    return {h.name: h for h in report(ip, flags).holders}


def purge(ip, args: str):
    """``%gpumem purge ARGS`` on the host, as the result object."""
    return ip.run_line_magic("gpumem", f"purge {args} --device cpu -o")


def holder(snap, name):
    """The snapshot's holder ``name``; the test fails where it was not blamed."""
    found = snap.holder(name)
    assert found is not None, f"{name} not blamed; holders: {[h.label for h in snap.holders]}"
    return found


def weak(ip, expr: str):
    """A weak handle (torch's ``StorageWeakRef``) on the storage of the tensor ``expr``
    names in the shell (no strong reference kept)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    tensor = eval(expr, ip.user_ns)  # test code, not user input
    ref = StorageWeakRef(tensor.untyped_storage())
    del tensor
    return ref


@pytest.fixture
def unrelated(ip):
    """``keep``, a tensor of sevens (1 MiB) in the shell that no purge of the test may
    free; its weak handle."""
    run(ip, f"import torch\nkeep = torch.full(({1 << 18},), 7.0)")
    ref = weak(ip, "keep")
    yield ref
    gc.collect()
    assert not ref.expired(), "purge freed an unrelated tensor"
    assert "keep" in ip.user_ns and float(ip.user_ns["keep"][0]) == 7.0


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


@pytest.fixture(scope="module")
def cluster():
    """:func:`two_worker_cluster`, one for each module that asks for it."""
    with two_worker_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    """A Dask client of ``cluster``; each worker has imported torch and the product's
    worker side once, before any test reads a figure."""
    import torch
    from distributed import Client, wait

    from jupyter_gpumem import cluster as jc

    with Client(cluster) as c:
        workers = sorted(c.scheduler_info()["workers"])
        ns = {"client": c, "warm": c.map(torch.ones, [1, 2], workers=workers, pure=False)}
        wait(ns["warm"])
        jc.purge(["warm"], client=c, namespace=ns, device="cpu")
        yield c


@pytest.fixture
def workers(client):
    return sorted(client.scheduler_info()["workers"])


def stored(client) -> dict:
    """Worker -> the keys its data store holds (read by the test, not the product)."""
    return client.run(lambda dask_worker: list(dask_worker.data))


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


def kernel_messages(get, seconds: float, poll: float = 1):
    """The messages ``get`` (a kernel client's ``get_shell_msg`` or ``get_iopub_msg``)
    gives within ``seconds``, each waited for at most ``poll`` seconds; the caller stops
    when it has what it waits for."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            msg = get(timeout=poll)
        except queue.Empty:
            continue
        yield msg


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_result(code: str, *args: str, drop_env: tuple = (), set_env: dict | None = None,
                 timeout: float = 300, any_exit: bool = False) -> dict:
    """Run ``code`` in a fresh interpreter on this checkout (``args`` its ``sys.argv[1:]``,
    the environment without ``drop_env`` and with ``set_env``); the JSON of its last
    ``RESULT ...`` line. The child must exit with 0, unless ``any_exit``."""
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env.update(set_env or {})
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert (any_exit or proc.returncode == 0) and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture
def fake_nvml(monkeypatch, tmp_path):
    """The file-driven fake NVML in place of pynvml; the stand-in device file's prefix
    counted as a GPU device file. Yields (nvml file, device file)."""
    import importlib.util

    import gpu_holders as gh
    from jupyter_gpumem.backends import nvml
    from jupyter_gpumem.core import processes

    spec = importlib.util.spec_from_file_location("pynvml", gh.FAKE_NVML_DIR + "/pynvml.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_state", nvml._fresh_state())
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML", str(path))
    dev = gh.device_file(tmp_path)
    monkeypatch.setattr(processes, "GPU_DEVICE_FILES", processes.GPU_DEVICE_FILES + (dev,))
    gh.write_nvml(path, [])
    started: list = []
    yield path, dev, started
    for pid in started:
        gh.end(pid)
    nvml._state = nvml._fresh_state()


def sampling_threads() -> list[str]:
    """Names of the sampling threads alive: a session's, or a script watch's own."""
    return [t.name for t in threading.enumerate()
            if t.name in ("jupyter_gpumem-sampler", "jupyter_gpumem-watch") and t.is_alive()]


def same_report(warm, full) -> None:
    """The two snapshots are the same report: the scan's part byte for byte."""
    assert [d.attributed for d in warm.devices] == [d.attributed for d in full.devices]
    # the devices' readings are taken anew by each call: the same ones for both
    full.devices, full.unattributed, full.processes = warm.devices, warm.unattributed, warm.processes
    full.time, full.scan_seconds = warm.time, warm.scan_seconds
    assert repr(warm) == repr(full)
    assert warm._repr_html_() == full._repr_html_()
    assert warm.to_json() == full.to_json()


@pytest.fixture
def server(tmp_path):
    """A real ``jupyter server`` with NVML faked (tests/helpers/jupyter_harness.py),
    stopped after the test."""
    from jupyter_harness import Server

    s = Server(tmp_path, fake_nvml=True)
    yield s
    s.stop()


def ipython_with_profile(tmp_path, config: str, code: str) -> subprocess.CompletedProcess:
    """``python -m IPython -c CODE`` in a fresh process whose profile's ipython_config.py
    is ``config`` (the profile in ``tmp_path``); its completed process (text)."""
    profile = tmp_path / "profile_default"
    profile.mkdir()
    (profile / "ipython_config.py").write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--profile-dir", str(profile), "-c", code],
        capture_output=True, text=True, timeout=120)
