"""``%gpumem tame`` and the ``GpuMemMagics.tame`` setting."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from jupyter_gpumem.backends import tame as tame_mod

ROOT = Path(__file__).resolve().parents[2]
VARS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "TF_FORCE_GPU_ALLOW_GROWTH", "XLA_PYTHON_CLIENT_ALLOCATOR")


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it here (the
    checks import it in a child process, so that this one stays without it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


needs_jax = pytest.mark.skipif(not _installed("jax"), reason="jax is not installed")
needs_tensorflow = pytest.mark.skipif(not _installed("tensorflow"),
                                      reason="tensorflow is not installed")


@pytest.fixture
def clean_env(monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    tame_mod.untame()


def test_tame_sets_the_documented_settings(ip, clean_env, capsys):
    result = ip.run_line_magic("gpumem", "tame -o")
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "XLA_PYTHON_CLIENT_ALLOCATOR" not in os.environ
    out = capsys.readouterr().out
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in out and "TF_FORCE_GPU_ALLOW_GROWTH=true" in out
    if "jax" not in sys.modules:
        assert result.frameworks["jax"].startswith("not imported")
    assert not result.warnings


def test_give_back_and_off_restore_the_environment(ip, clean_env, monkeypatch, capsys):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")
    ip.run_line_magic("gpumem", "tame --give-back")
    assert os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    ip.run_line_magic("gpumem", "tame off")
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert "XLA_PYTHON_CLIENT_ALLOCATOR" not in os.environ
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ
    ip.run_line_magic("gpumem", "tame status")
    assert "TF_FORCE_GPU_ALLOW_GROWTH=false" in capsys.readouterr().out


def test_bad_arguments_are_a_usage_error(ip, clean_env):
    with pytest.raises(UsageError, match="unknown arguments"):
        ip.run_line_magic("gpumem", "tame --everything")
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ


def test_config_trait_applies_when_changed(ip, clean_env):
    ip.run_line_magic("config", "GpuMemMagics.tame = True")
    try:
        assert os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false"
    finally:
        ip.run_line_magic("config", "GpuMemMagics.tame = False")


def _child(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in VARS}
    full.update(env, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=full, timeout=300)


SHELL = ("from IPython.core.interactiveshell import InteractiveShell\n"
         "ip = InteractiveShell.instance()\n"
         "ip.run_line_magic('load_ext', 'jupyter_gpumem')\n")


def _tame_after(setup: str, then: str = "", **env) -> subprocess.CompletedProcess:
    """A child that runs ``setup``, then ``%gpumem tame`` in a fresh shell, then ``then``."""
    return _child(setup + SHELL + "ip.run_line_magic('gpumem', 'tame')\n" + then, **env)


def test_config_trait_applies_on_every_start():
    proc = _child("import os\nfrom traitlets.config import Config\n"
                  "from IPython.core.interactiveshell import InteractiveShell\n"
                  "c = Config()\nc.GpuMemMagics.tame = True\n"
                  "ip = InteractiveShell.instance(config=c)\n"
                  "ip.run_line_magic('load_ext', 'jupyter_gpumem')\n"
                  "print('ENV', os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'),"
                  " os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH'))\n")
    assert "ENV false true" in proc.stdout, proc.stdout + proc.stderr


@needs_jax
def test_imported_but_unstarted_jax_still_takes_the_setting():
    proc = _tame_after("import jax\n", "from jax._src import xla_bridge\n"
                       "print('STARTED', xla_bridge.backends_are_initialized())\n")
    assert "jax: imported, no device used yet: it will allocate on demand" in proc.stdout, \
        proc.stdout + proc.stderr
    assert "STARTED False" in proc.stdout and "warning" not in proc.stderr


@needs_jax
def test_warns_when_a_framework_has_already_set_up_its_devices():
    proc = _tame_after("import jax, jax.numpy as jnp\nx = jnp.ones(4)\n", JAX_PLATFORMS="cpu")
    assert "jupyter_gpumem: warning: jax has already set up its devices" in proc.stderr, \
        proc.stdout + proc.stderr
    assert "%gpumem tame` before `import jax`" in proc.stderr
    assert "jax: already set up its devices: too late" in proc.stdout


@needs_tensorflow
def test_warns_for_tensorflow_started_before_tame():
    proc = _tame_after("import tensorflow as tf\nx = tf.ones(4)\n", CUDA_VISIBLE_DEVICES="")
    assert "warning: tensorflow has already set up its devices" in proc.stderr, \
        proc.stdout + proc.stderr
