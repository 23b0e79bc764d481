"""Without the C core (no compiler at install, or the source tree on PYTHONPATH) the
product works the same: every use of ``core/_reach`` has its Python form.

The whole suite runs a second time with ``JUPYTER_GPUMEM_PURE_SCAN=1``
(scripts/test.sh); here a child process makes the module truly unimportable (an
import of it raises ImportError, as where it was never built) and runs the commands a
user runs first in a real shell.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, child_result
from jupyter_gpumem.core import devices
from jupyter_gpumem.core.scan import native

CHILD = textwrap.dedent(r'''
    import importlib.abc, json, sys

    class NoCore(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "jupyter_gpumem.core._reach":
                raise ImportError("no C core here (a build without a compiler)")
            return None

    if sys.argv[1] == "blocked":
        sys.meta_path.insert(0, NoCore())

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext jupyter_gpumem", store_history=False)
    out = {}

    def text(cap):
        return cap.stdout + cap.stderr + "".join(o.data.get("text/plain", "") for o in cap.outputs)

    setup = ("import torch\nmodel = torch.nn.Linear(64, 64)\n"
             "records = [{'id': i, 't': torch.ones(8) if i % 100 == 0 else None} for i in range(2000)]\n"
             "keep = {'a': torch.ones(1 << 16)}")
    assert shell.run_cell(setup, store_history=True).success
    with capture_output() as cap:
        r = shell.run_cell("snap = %gpumem --device cpu -o", store_history=True)
    out["report_ok"] = r.success and "jupyter_gpumem:" not in text(cap)
    snap = shell.user_ns.get("snap")
    out["report_text"] = text(cap) + str(snap)
    out["holders"] = None if snap is None else sorted(
        (h["name"], h["unique"], h["shared"], h["largest_path"], h["tensors"]) for h in snap.to_json()["holders"])
    with capture_output() as cap:
        r = shell.run_cell("%%gpuwatch --device cpu\nz = torch.zeros(1 << 20)", store_history=True)
    out["watch_ok"] = r.success and "could not start" not in text(cap) \
        and "%%gpuwatch" in text(cap)
    out["watch_text"] = text(cap)
    with capture_output() as cap:
        shell.run_cell("%gpumem watch on --device cpu", store_history=True)
        shell.run_cell("w = torch.zeros(1 << 18)", store_history=True)
        shell.run_cell("%gpumem watch off", store_history=True)
    out["footer_text"] = text(cap)
    with capture_output() as cap:
        r = shell.run_cell("%gpumem purge keep --device cpu", store_history=True)
    out["purge_ok"] = r.success and "keep" not in shell.user_ns
    out["purge_text"] = text(cap)
    out["core_loaded"] = "jupyter_gpumem.core._reach" in sys.modules
    from jupyter_gpumem.core.scan import native, reach as scan_reach
    out["native"] = native.CORE is not None and scan_reach.NATIVE is not None
    print("RESULT " + json.dumps(out))
''')


def _child(mode: str) -> dict:
    return child_result(CHILD, mode, drop_env=(native.PURE_ENV,))


@pytest.fixture(scope="module")
def blocked():
    pytest.importorskip("torch")
    return _child("blocked")


def test_without_the_c_core_every_first_command_works(blocked):
    """%gpumem, %%gpuwatch, the footer and a purge, with the C core unimportable."""
    assert not blocked["core_loaded"] and not blocked["native"]
    assert blocked["report_ok"], blocked["report_text"]
    assert "keep" in blocked["report_text"] and "records" in blocked["report_text"]
    assert blocked["watch_ok"], blocked["watch_text"]
    assert "4.0 MiB" in blocked["watch_text"]            # the new 1 Mi-float tensor
    footer = blocked["footer_text"]
    assert "jupyter_gpumem:" not in footer and "1.0 MiB" in footer, footer
    assert blocked["purge_ok"], blocked["purge_text"]


def test_without_the_c_core_the_report_is_the_one_with_it(blocked):
    """The README's promise: the Python walk gives the same answers."""
    if native.CORE is None:
        pytest.skip("the C core is not built here: nothing to compare against")
    with_core = _child("as-built")
    assert with_core["native"] and with_core["core_loaded"]
    assert blocked["holders"] == with_core["holders"]
    assert {name for name, *_ in blocked["holders"]} >= {"keep", "model", "records"}


def test_the_python_proc_reader_reads_from_the_start_every_time(monkeypatch):
    """Without the C core, /proc files are read with os.pread at offset 0: the same
    bytes as a fresh open, again and again on the kept descriptor."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc")
    monkeypatch.setattr(devices, "_pread", devices._pread_py)
    monkeypatch.setattr(devices, "_PROC_FDS", {})
    first = devices.read_proc("/proc/self/cmdline")
    with open("/proc/self/cmdline", "rb") as f:
        assert first == f.read()
    assert devices.read_proc("/proc/self/cmdline") == first
    rss, peak = devices.process_memory()
    assert rss and peak and peak >= rss


def test_pure_switch_keeps_the_c_core_out_of_the_process():
    """Under JUPYTER_GPUMEM_PURE_SCAN=1 (the suite's second pass) the package never
    loads the C core, whatever is built."""
    if os.environ.get(native.PURE_ENV):
        assert native.CORE is None
        assert "jupyter_gpumem.core._reach" not in sys.modules
    else:
        env = dict(os.environ, **{native.PURE_ENV: "1"})
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        code = ("import sys, jupyter_gpumem.core.scan, jupyter_gpumem.core.devices, "
                "jupyter_gpumem.session; print('jupyter_gpumem.core._reach' in sys.modules)")
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, cwd=ROOT, timeout=120)
        assert got.stdout.strip() == "False", got.stderr
