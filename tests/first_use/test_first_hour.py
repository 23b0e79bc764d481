"""What a newcomer meets first: a missing optional package is named with the extra that
brings it, and a C core that was not built is said once, at the first load. Each case
runs in a child process where the package in question cannot be imported (an import
hook refuses it, as if it were not installed)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCK = textwrap.dedent('''\
    import importlib.abc, sys
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Refuse())
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
''')


def child(blocked: list[str], body: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = f"BLOCKED = {blocked!r}\n" + BLOCK + textwrap.dedent(body)
    import os
    e = {k: v for k, v in os.environ.items() if k != "JUPYTER_GPUMEM_PURE_SCAN"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=e)


def test_a_missing_c_core_is_said_once_at_the_first_load():
    done = child(["jupyter_gpumem.core._reach"], '''
        ip.run_cell("%load_ext jupyter_gpumem")
        ip.run_cell("%unload_ext jupyter_gpumem")
        ip.run_cell("%load_ext jupyter_gpumem")
        ip.run_cell("%gpumem --device cpu")
    ''')
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "C core is not built" in line]
    assert len(said) == 1, done.stderr
    assert "scans walk in Python" in said[0] and "pip install ." in said[0]
    assert "holder" in done.stdout or "no tensors" in done.stdout or "cpu" in done.stdout


def test_asking_for_the_python_form_is_not_a_missing_core():
    done = child([], '''
        ip.run_cell("%load_ext jupyter_gpumem")
    ''', env={"JUPYTER_GPUMEM_PURE_SCAN": "1"})
    assert done.returncode == 0, done.stderr
    assert "C core" not in done.stderr


def test_a_plot_without_matplotlib_names_the_package_and_the_extra():
    done = child(["matplotlib"], '''
        ip.run_cell("%load_ext jupyter_gpumem")
        ip.run_cell("import torch")
        r = ip.run_cell("%%gpuwatch --plot --device cpu\\nx = torch.ones(1000)\\n")
        print("cell ok", r.success)
        r = ip.run_cell("%gpumem plot")
        print("plot ok", r.success)
    ''')
    assert done.returncode == 0, done.stderr
    assert "cell ok True" in done.stdout
    assert "%%gpuwatch" in done.stdout            # the report itself came
    assert ("jupyter_gpumem: %%gpuwatch --plot: plotting needs matplotlib, which is not "
            "installed: pip install matplotlib (the package's [plot] extra)") in done.stderr, \
        done.stderr
    assert "ModuleNotFoundError" not in done.stderr
    assert "plotting needs matplotlib, which is not installed: pip install matplotlib " \
           "(the package's [plot] extra)" in done.stdout + done.stderr
