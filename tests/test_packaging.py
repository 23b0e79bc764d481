"""The wheel: the C core compiled from the source or absent, never a leftover ``.so``;
the sidebar's files without source maps or build logs.

Each test copies the tracked tree (and the sidebar built by the editable install, so
no Node.js build runs) into a temporary folder and builds a wheel there with the
build backend in this environment (``--no-build-isolation``: no download).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILT_SIDEBAR = ROOT / "jupyter_gpumem" / "labextension"
#: the C core: the one file compiled, and the parts it #includes
CORE_SOURCE = "jupyter_gpumem/core/_reach.c"
CORE_PARTS = "jupyter_gpumem/core/_reach_parts"

pytestmark = [
    pytest.mark.skipif(not (BUILT_SIDEBAR / "static" / "style.js").exists(),
                       reason="the sidebar is not built here (the editable install builds it)"),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to list the tracked tree"),
]


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    shutil.copytree(BUILT_SIDEBAR, src / "jupyter_gpumem" / "labextension")
    return src


def _wheel(src: Path, out: Path, **env) -> list[str]:
    pytest.importorskip("hatchling")
    pytest.importorskip("hatch_jupyter_builder")
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = glob.glob(str(out / "*.whl"))
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def _core_parts() -> list[str]:
    """The C core's parts in the tree (its .c and .h files), as the archives name them."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / CORE_PARTS).iterdir()
                  if p.suffix in (".c", ".h"))


def _plant_stale_core(src: Path) -> Path:
    """A C core as an earlier build would have left it, newer than its source."""
    name = "_reach" + sysconfig.get_config_var("EXT_SUFFIX")
    stale = src / "jupyter_gpumem" / "core" / name
    stale.write_bytes(b"not a shared object: a leftover of an earlier build")
    return stale


def test_without_a_compiler_a_leftover_core_is_never_packed(tmp_path):
    src = _tree(tmp_path)
    stale = _plant_stale_core(src)
    names = _wheel(src, tmp_path / "out", CC="/bin/false")
    assert not [n for n in names if "core/_reach" in n and not n.endswith((".c", ".h"))], names
    assert not stale.exists(), "the leftover stays in the tree, where an editable install loads it"


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")
def test_with_a_compiler_the_core_is_compiled_from_the_source(tmp_path):
    src = _tree(tmp_path)
    _plant_stale_core(src)
    names = _wheel(src, tmp_path / "out")
    cores = [n for n in names if n.startswith("jupyter_gpumem/core/_reach") and n.endswith(".so")]
    assert len(cores) == 1, names
    out = tmp_path / "unpacked"
    with zipfile.ZipFile(glob.glob(str(tmp_path / "out" / "*.whl"))[0]) as z:
        z.extract(cores[0], out)
    assert (out / cores[0]).read_bytes()[:4] == b"\x7fELF", "the planted leftover was packed"
    assert set(_core_parts()) <= set(names), "the wheel lacks parts of the C core's source"


def test_every_part_of_the_c_core_is_included_and_a_dependency_of_its_build():
    """The one compiled file includes each part, and the build hook lists each one as a
    dependency (a change of any part rebuilds the module)."""
    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))
    parts = _core_parts()
    assert any(p.endswith(".h") for p in parts) and any(p.endswith(".c") for p in parts)
    assert hatch_build.SOURCE == CORE_SOURCE and hatch_build.PARTS == CORE_PARTS
    assert hatch_build.native_depends(str(ROOT)) == parts
    source = (ROOT / CORE_SOURCE).read_text()
    included = {line.split('"')[1] for line in source.splitlines()
                if line.startswith("#include \"")}
    assert {p[len("jupyter_gpumem/core/"):] for p in parts} == included


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")
def test_the_sdist_carries_every_part_and_its_wheel_compiles_the_core(tmp_path):
    src = _tree(tmp_path)
    run = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d",
                          str(tmp_path / "sdist")], cwd=src, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    (sdist,) = glob.glob(str(tmp_path / "sdist" / "*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert set(_core_parts()) | {CORE_SOURCE} <= set(names), names
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    built = _wheel(unpacked, tmp_path / "out")
    assert [n for n in built if n.startswith("jupyter_gpumem/core/_reach") and n.endswith(".so")]


def test_the_sidebar_ships_without_source_maps_or_build_leftovers(tmp_path):
    src = _tree(tmp_path)
    names = _wheel(src, tmp_path / "out", JUPYTER_GPUMEM_NO_NATIVE="1")
    sidebar = [n for n in names if "labextensions/jupyter-gpumem/" in n]
    assert any(n.endswith("static/style.js") for n in sidebar), sidebar
    assert any(n.endswith("/package.json") for n in sidebar), sidebar
    left = [n for n in sidebar if n.endswith((".map", "build_log.json", ".orig"))]
    assert not left, left
    # the production build (minified, its licences listed), also after an editable
    # install (``pip install -e .``, which scripts/demo.sh and scripts/setup.sh run): a
    # development build would ship unminified chunks pointing to source maps left out
    assert any(n.endswith("static/third-party-licenses.json") for n in sidebar), sidebar
    scripts = [n for n in sidebar if n.endswith(".js")]
    with zipfile.ZipFile(glob.glob(str(tmp_path / "out" / "*.whl"))[0]) as z:
        mapped = [n for n in scripts if b"\n//# sourceMappingURL=" in z.read(n)]
    assert not mapped, mapped
    # the guide every --help points to, for a wheel's user (who has no docs/)
    assert "jupyter_gpumem/GUIDE.md" in names, [n for n in names if "GUIDE" in n]
