"""Run a test module's ``check_*`` functions in one child pytest process.

A framework that must not share the main test process (TensorFlow, JAX)
keeps its checks in its own module; the parent runs them all in one child
and reports each outcome as ``test_in_own_process[check_...]``.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD_VARIABLE = "JUPYTER_GPUMEM_TEST_CHILD"


# Python code: a fresh IPython shell with the extension, one report and one bare purge
# of every device (what a check's own child process runs after importing a framework)
SHELL_ON_ALL_DEVICES = (
    "from IPython.core.interactiveshell import InteractiveShell\n"
    "ip = InteractiveShell.instance()\n"
    "ip.run_line_magic('load_ext', 'jupyter_gpumem')\n"
    "ip.run_line_magic('gpumem', '--device all')\n"
    "ip.run_line_magic('gpumem', 'purge --device all')\n")


def run_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter at the checkout's root, this environment."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ), timeout=300)


def in_child(framework: str) -> bool:
    """True inside the child process that runs ``framework``'s checks."""
    return os.environ.get(CHILD_VARIABLE) == framework


def run_checks(test_file: str, framework: str, install_hint: str, tmp_dir: Path,
               **env: str | None) -> tuple[dict[str, tuple[str, str]], str]:
    """Run the module's checks in a child; ``{check: (outcome, text)}`` and its output tail.

    ``env`` is added to this process's environment for the child; a variable
    given as ``None`` is removed from it.
    """
    if importlib.util.find_spec(framework) is None:
        pytest.fail(f"{framework} is not installed: {install_hint}")
    xml = tmp_dir / "results.xml"
    child_env = dict(os.environ, **{k: v for k, v in env.items() if v is not None},
                     **{CHILD_VARIABLE: framework},
                     PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in [k for k, v in env.items() if v is None]:
        child_env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
         "python_functions=check_*", f"--junitxml={xml}", test_file],
        cwd=ROOT, env=child_env, capture_output=True, text=True, timeout=900)
    results: dict[str, tuple[str, str]] = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            bad = [c for c in case if c.tag in ("failure", "error", "skipped")]
            outcome = bad[0].tag if bad else "passed"
            text = (bad[0].get("message", "") + "\n" + (bad[0].text or "")) if bad else ""
            results[case.get("name")] = (outcome, text)
    return results, proc.stdout[-6000:] + proc.stderr[-3000:]


def names_of_checks(module_globals: dict) -> list[str]:
    """The ``check_*`` functions of a test module, for parametrizing its parent test."""
    return sorted(n for n, f in module_globals.items() if n.startswith("check_") and callable(f))


def assert_passed(child_results: tuple[dict, str], check: str) -> None:
    """The parent test's verdict on one check the child ran."""
    results, output = child_results
    assert check in results, f"{check} did not run in the child:\n{output}"
    outcome, text = results[check]
    assert outcome == "passed", f"{check} {outcome}:\n{text}"
