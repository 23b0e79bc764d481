"""The docs hold: every relative link of the README and of docs/ resolves (the file, and
the heading an anchor names), every dotted reference to the package in a docstring
or a doc (``jupyter_gpumem.core.scan``, :mod:`.hidden`, ``jupyter_gpumem/views/comm.py``)
names something that exists, and so does every path of ours written relative to the
repository, the package or core/ (``core/scan/warm.py``, ``_reach_parts/plan.c``) in a
doc, a docstring or a comment of the package's .py, .c and .h files (a C comment's bare
``plan.c`` too)."""
from __future__ import annotations

import ast
import importlib
import re
import sysconfig
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
    if parts[:3] == ["jupyter_gpumem", "core", "_reach"]:
        # the C core is never imported here (the pure pass must not load it): its name
        # and attributes resolve in its source
        source = Path(ROOT, "jupyter_gpumem", "core", "_reach.c")
        texts = [source.read_text()] + [p.read_text() for p in
                                        sorted(Path(ROOT, "jupyter_gpumem", "core",
                                                    "_reach_parts").glob("*.[ch]"))]
        return source.exists() and all(any(a in t for t in texts) for a in parts[3:])
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


#: a path in prose: ``core/scan/warm.py``, ``core/_reach_parts/plan.c``, ``src/model.ts``
PATHLIKE = re.compile(r"(?<![\w/.\-])((?:[A-Za-z_][\w.\-]*/)+[A-Za-z_][\w\-]*\.(?:py|c|h|ts|md))\b")
#: a file a C comment names bare: ``plan.c``, ``walk.h``
C_FILE = re.compile(r"(?<![\w/.\-])([A-Za-z_]\w*\.[ch])\b")
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
#: where a path of ours may start: the repository, the package, core/, the sidebar's sources
BASES = (ROOT, PACKAGE, PACKAGE / "core", ROOT / "labextension")
C_FOLDERS = (PACKAGE / "core", PACKAGE / "core" / "_reach_parts",
             Path(sysconfig.get_paths()["include"]), Path(sysconfig.get_paths()["include"]) / "internal")


def stale_paths(text: str, bases=BASES, c_comment: bool = False) -> list[str]:
    """The paths of ours that ``text`` names and that exist nowhere. A path is ours where
    its first folder is one of ``bases``' folders (``torch/nn/linear.py`` is not)."""
    stale = []
    for ref in sorted(set(PATHLIKE.findall(text))):
        first = ref.split("/", 1)[0]
        if any((b / first).is_dir() for b in bases) and not any((b / ref).exists() for b in bases):
            stale.append(ref)
    if c_comment:
        stale += [name for name in sorted(set(C_FILE.findall(text)))
                  if not any((f / name).exists() for f in C_FOLDERS)]
    return stale


def _comments():
    """Every comment of the package's .c, .h and .py files, with where it is."""
    for path in sorted([*PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")]):
        source = path.read_text()
        for m in C_COMMENT.finditer(source):
            yield f"{path.relative_to(ROOT)}:{source.count(chr(10), 0, m.start()) + 1}", m.group(0), True
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "#" in line:
                yield f"{path.relative_to(ROOT)}:{n}", line[line.index("#"):], False


def test_every_path_of_ours_in_docs_docstrings_and_comments_exists():
    broken = [f"{where}: {ref}" for where, text in _texts() for ref in stale_paths(text)]
    broken += [f"{where}: {ref}" for where, text, in_c in _comments()
               for ref in stale_paths(text, c_comment=in_c)]
    assert not broken, "\n".join(sorted(broken))


def test_the_path_check_sees_a_moved_module():
    doc = ("The warm scan (`core/scan/warm.py`, was `core/scan_warm.py`) and the plan "
           "(`core/_reach_parts/plan.c`, `_reach_parts/gone.c`); `watch/footer.py`; "
           "`torch/nn/modules/linear.py` is not ours; `src/model.ts`, `src/nowhere.ts`.")
    assert stale_paths(doc) == ["_reach_parts/gone.c", "core/scan_warm.py", "src/nowhere.ts",
                                "watch/footer.py"]
    c_source = "/* the table (table.h), the old header (_fingerprint.h), CPython's pycore_dict.h */"
    (comment,) = C_COMMENT.findall(c_source)
    assert stale_paths(comment, c_comment=True) == ["_fingerprint.h"]


#: a docstring's pointer into the docs: ``docs/ARCHITECTURE.md#the-warm-scan``
DOC_ANCHOR = re.compile(r"\bdocs/(\w+\.md)#([\w\-]+)")


def test_every_docstring_pointer_into_the_docs_names_a_heading():
    broken = [f"{where}: {file}#{frag}" for where, text in _texts() if not where.endswith(".md")
              for file, frag in DOC_ANCHOR.findall(text)
              if not (ROOT / "docs" / file).exists() or frag not in _anchors(ROOT / "docs" / file)]
    assert not broken, "\n".join(sorted(broken))
    planted = "The story: docs/ARCHITECTURE.md#the-warm-scan, docs/ARCHITECTURE.md#no-such-part."
    assert [frag for _, frag in DOC_ANCHOR.findall(planted)
            if frag not in _anchors(ROOT / "docs" / "ARCHITECTURE.md")] == ["no-such-part"]
