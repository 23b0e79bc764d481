"""The docs hold: every relative link of the README and of docs/ resolves (the file, and
the heading an anchor names), and every dotted reference to the package in a docstring
or a doc (``jupyter_gpumem.core.scan``, :mod:`.hidden`, ``jupyter_gpumem/views/comm.py``)
names something that exists."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jupyter_gpumem"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "benchmarks" / "RESULTS.md"]
DOCS = [d for d in DOCS if d.exists()]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.*)$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchor(title: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {anchor(t) for t in HEADING.findall(text)}


def _links(path: Path):
    text = FENCE.sub("", path.read_text())
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):      # http:, https:, mailto:
            continue
        yield target


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in _links(doc):
        file, _, frag = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in _anchors(dest):
            broken.append(f"{target}: no heading #{frag}")
    assert not broken, broken


#: ``jupyter_gpumem.a.b`` or ``jupyter_gpumem/a/b.py`` in prose
DOTTED = re.compile(r"\bjupyter_gpumem(?:\.[A-Za-z_]\w*)+(?![\w/])")   # not a schema id (x/1)
SLASHED = re.compile(r"\bjupyter_gpumem(?:/[\w.]+)+")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _texts():
    for doc in DOCS:
        yield str(doc.relative_to(ROOT)), doc.read_text()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    yield f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", doc


def test_every_dotted_reference_to_the_package_resolves():
    broken = []
    for where, text in _texts():
        for ref in set(DOTTED.findall(text)):
            ref = ref.rstrip(".")
            if ref.endswith((".py", ".c", ".h", ".so", ".json", ".md")):
                continue
            if not _resolves(ref):
                broken.append(f"{where}: {ref}")
        for ref in set(SLASHED.findall(text)):
            ref = ref.rstrip(".")
            if not (ROOT / ref).exists() and not any(ROOT.glob(ref + "*")):
                broken.append(f"{where}: {ref}")
    assert not broken, "\n".join(sorted(broken))
