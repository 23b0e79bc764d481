"""The optional libraries absent: without ipywidgets, matplotlib or nvidia-ml-py (each
import of them raises ImportError, as where they were never installed) every command
still works or says in one line what it needs, and nothing else breaks.

A child process per case, a real IPython shell, real torch tensors on the CPU.
"""
from __future__ import annotations

import textwrap

import pytest

from conftest import child_result

CHILD = textwrap.dedent(r'''
    import importlib.abc, json, sys

    missing = tuple(sys.argv[1].split(","))

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in missing:
                raise ImportError(f"No module named {name!r} (not installed here)")
            return None

    sys.meta_path.insert(0, Absent())
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    out = {}

    def cell(key, code):
        with capture_output() as cap:
            r = shell.run_cell(code, store_history=True)
        text = cap.stdout + cap.stderr + "".join(o.data.get("text/plain", "") for o in cap.outputs)
        out[key] = {"ok": r.success, "error": type(r.error_in_exec).__name__ if r.error_in_exec else None,
                    "text": text}

    cell("load", "%load_ext jupyter_gpumem")
    cell("setup", "import torch\nx = torch.ones(1 << 18)")
    cell("report", "%gpumem --device cpu")
    cell("panel", "%gpumem panel --device cpu")
    cell("watch", "%%gpuwatch --device cpu\ny = torch.ones(1 << 20)")
    cell("watch_plot", "%%gpuwatch --device cpu --plot\nz = torch.ones(1 << 19)")
    cell("footer_on", "%gpumem watch on --device cpu")
    cell("footer", "w = torch.ones(1 << 18)")
    cell("footer_off", "%gpumem watch off")
    cell("plot", "%gpumem plot")
    cell("auto", "%gpumem")
    cell("purge", "%gpumem purge x --device cpu")
    out["x_gone"] = "x" not in shell.user_ns
    out["loaded"] = sorted(m for m in missing if m in sys.modules)
    cell("unload", "%unload_ext jupyter_gpumem")
    print("RESULT " + json.dumps(out))
''')


def _child(missing: str) -> dict:
    return child_result(CHILD, missing)


def _never_broke(got: dict) -> None:
    for key, value in got.items():
        if isinstance(value, dict):
            assert value["ok"] or value["error"] == "UsageError", (key, value)
            assert "Traceback" not in value["text"], (key, value["text"])


@pytest.fixture(scope="module")
def without_all():
    pytest.importorskip("torch")
    return _child("ipywidgets,matplotlib,pynvml")


def test_without_ipywidgets_matplotlib_and_nvml_every_command_works_or_says_what_it_needs(without_all):
    got = without_all
    _never_broke(got)
    assert got["loaded"] == []                       # none of them came in some other way
    assert "x" in got["report"]["text"] and "only it" in got["report"]["text"]
    assert "pip install ipywidgets" in got["panel"]["text"] and "only it" in got["panel"]["text"]
    assert "%%gpuwatch" in got["watch"]["text"] and "4.0 MiB" in got["watch"]["text"]
    # --plot: the report stands, and one line says what the figure needs
    assert "%%gpuwatch" in got["watch_plot"]["text"] and "matplotlib" in got["watch_plot"]["text"]
    assert "1.0 MiB" in got["footer"]["text"]         # the footer's line after the cell
    assert "matplotlib" in got["plot"]["text"] and got["plot"]["error"] in (None, "UsageError")
    assert "no accelerator" in got["auto"]["text"]    # no NVML: host tensors, said so
    assert got["x_gone"] and got["purge"]["ok"]
    assert got["unload"]["ok"]


def test_without_nvml_alone_the_report_says_no_accelerator():
    pytest.importorskip("torch")
    got = _child("pynvml")
    _never_broke(got)
    assert "no accelerator" in got["auto"]["text"] and "x" in got["report"]["text"]
