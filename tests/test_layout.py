"""The package's layout holds: imports point down the layers, form no cycle, and are
made at module level; importing the package (and its script API) imports no IPython.

The imports are read with ``ast`` from the sources, not by importing them, so a
late import hidden in a function counts as much as one at the top.
"""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_gpumem"
NAME = PACKAGE.name

#: function-level imports of the package's own modules that are allowed, and why
ALLOWED_LATE = {
    # IPython calls ``jupyter_gpumem.load_ipython_extension``: the package itself must
    # not import the IPython-facing layer, or ``import jupyter_gpumem`` would import IPython
    ("jupyter_gpumem", "jupyter_gpumem.extension"),
}

#: layers, bottom first: a module may import its own layer and the ones below only
LAYERS = [
    ["units"],
    ["backends"],
    ["core"],
    ["cluster"],
    ["settings", "session", "handoff", "dispatch", "refresh"],
    ["watch"],
    ["api"],
    ["server"],    # the Jupyter server extension: core and api, never IPython
    ["cli"],       # ``jupyter gpumem``: asks the servers, reads core; never IPython
    ["views"],
    ["magics"],
    ["extension"],
    [""],          # the package's __init__: re-exports the API, loads the extension lazily
]

#: layers that never import IPython, widgets or matplotlib, at any level
NO_FRONTEND = ("units", "backends", "core", "cluster", "settings", "session", "handoff",
               "dispatch", "refresh", "watch", "api", "server", "cli")
FRONTEND = ("IPython", "ipywidgets", "ipykernel", "matplotlib")


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


class Import:
    def __init__(self, source: str, target: str, line: int, late: bool) -> None:
        self.source, self.target, self.line, self.late = source, target, line, late

    def __repr__(self) -> str:
        return f"{self.source}:{self.line} -> {self.target}" + (" (in a function)" if self.late else "")


def _parents(tree: ast.AST) -> dict:
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _in_function(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _trees(modules: dict):
    """``(module, is_package, syntax tree)`` of each module, by name."""
    for module, (path, is_package) in sorted(modules.items()):
        yield module, is_package, ast.parse(path.read_text(), str(path))


def imports(other: bool = False, modules: dict | None = None) -> list[Import]:
    """Every import of a module of the package by a module of the package
    (``other``: of anything else instead); ``from . import x`` is an edge to ``x``.
    ``modules``: the importers to read, MODULES by default (the package's modules are
    always what a target is looked up in)."""
    found = []
    for module, is_package, tree in _trees(modules or MODULES):
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                           for a in node.names]
            else:
                continue
            late = _in_function(node, parents)
            for target in dict.fromkeys(targets):
                ours = target == NAME or target.startswith(NAME + ".")
                if ours != other:
                    found.append(Import(module, target, node.lineno, late))
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module} is in no layer of test_layout.LAYERS: place it")


def test_no_import_cycle():
    edges: dict[str, set[str]] = {}
    for imp in imports():
        if imp.target in MODULES:
            edges.setdefault(imp.source, set()).add(imp.target)
    assert _cycles(edges) == []


def test_no_function_level_import_of_the_package():
    late = [imp for imp in imports() if imp.late and (imp.source, imp.target) not in ALLOWED_LATE]
    assert late == []


def test_imports_point_down_the_layers():
    up = [imp for imp in imports() if imp.target in MODULES
          and _layer(imp.target) > _layer(imp.source)]
    assert up == []


def test_the_lower_layers_import_no_frontend():
    found = [imp for imp in imports(other=True)
             if imp.target.split(".")[0] in FRONTEND
             and imp.source.split(".")[1:2] and imp.source.split(".")[1] in NO_FRONTEND]
    assert found == []


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_importing_the_package_and_its_script_api_imports_no_ipython():
    out = _fresh("""
        import sys
        import jupyter_gpumem, jupyter_gpumem.watch
        print(sorted(m for m in sys.modules if m.split('.')[0] in
                     ('IPython', 'ipywidgets', 'ipykernel', 'matplotlib')))
        print(callable(jupyter_gpumem.watch))
    """)
    assert out.splitlines() == ["[]", "True"]


def test_the_public_functions_stay_functions_whatever_is_imported():
    """No submodule shadows ``snapshot``, ``purge`` or ``watch``, and no module is patched
    to be callable: every module of the package imported, they are still the API's."""
    out = _fresh("""
        import importlib, types
        import jupyter_gpumem
        from jupyter_gpumem import api
        names = %r
        for name in sorted(names):
            importlib.import_module(name)
        print(all(type(getattr(jupyter_gpumem, n)) is types.FunctionType
                  and getattr(jupyter_gpumem, n) is getattr(api, n)
                  for n in ('snapshot', 'purge', 'watch')))
        print(sorted(n for n in names if type(importlib.import_module(n)) is not types.ModuleType))
    """ % sorted(MODULES))
    assert out.splitlines() == ["True", "[]"]


# -- frameworks: named only by their backends ------------------------------------------------
#: the frameworks' top-level modules: only backends/ may import them or look them up
FRAMEWORKS = ("torch", "tensorflow", "keras", "jax", "jaxlib", "cupy")


def _framework_module(name: object) -> bool:
    """``torch``, ``torch.cuda``, ``cupy.cuda.runtime``: a framework's module by its name."""
    if type(name) is not str or name.split(".")[0] not in FRAMEWORKS:
        return False
    return all(part.isidentifier() for part in name.split("."))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def framework_mentions(modules=None) -> list[str]:
    """Where a module outside ``backends/`` names a framework's module: an import of it,
    or its name as a string (``sys.modules.get("torch")``, ``"cupy" in sys.modules``,
    ``import_module("jax")``, an import hook waiting for ``"torch"``: every lookup
    style). Docstrings and comments may mention them."""
    found = []
    for module, _, tree in _trees(modules or MODULES):
        if module.split(".")[1:2] == ["backends"]:
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module] if not node.level else []
            elif isinstance(node, ast.Constant) and id(node) not in docs:
                names = [node.value]
            else:
                continue
            found += [f"{module}:{node.lineno} {name}" for name in names
                      if _framework_module(name)]
    return found


def test_no_module_outside_the_backends_names_a_framework():
    assert framework_mentions() == []


def test_the_framework_check_sees_every_lookup_style(tmp_path):
    """The check itself, on a module written to break it in each way (and a docstring and
    a comment that may mention a framework)."""
    path = tmp_path / "bad.py"
    path.write_text(textwrap.dedent('''\
        """Reads torch's allocator (a docstring may say so)."""
        import sys
        import cupy.cuda                      # an import
        from jax import numpy                 # a from-import
        t = sys.modules.get("torch")          # a lookup
        ok = "tensorflow" in sys.modules      # a membership test
        k = sys.modules["keras"]
        note = "import torch first"           # prose is no module name
        # torch in a comment
    '''))
    got = framework_mentions({f"{NAME}.core.bad": (path, False)})
    assert [g.split(" ", 1)[1] for g in got] == ["cupy.cuda", "jax", "torch", "tensorflow",
                                                 "keras"], got


def test_a_backend_module_dropped_into_the_package_is_found(tmp_path):
    """A new framework is one new file: a copy of the package with one backend module
    added (and no other file changed) lists it in its registry, in its place by its
    ``order``, and finding it imports no framework."""
    import shutil

    copy = tmp_path / NAME
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "backends" / "zzfw.py").write_text(textwrap.dedent('''\
        """A framework no one has installed, in one file."""
        from .base import Backend


        class ZzBackend(Backend):
            name = "zzfw"
            module = "zzfw_runtime"
            order = 35          # after TensorFlow's, before JAX's


        BACKENDS = [ZzBackend()]
    '''))
    # the framework, installed: its package and its distribution's metadata
    site = tmp_path / "site"
    (site / "zzfw_runtime").mkdir(parents=True)
    (site / "zzfw_runtime" / "__init__.py").write_text("")
    (site / "zzfw_runtime-1.0.dist-info").mkdir()
    (site / "zzfw_runtime-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: zzfw_runtime\nVersion: 1.0\n")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys, types
        from {NAME} import backends
        print(backends.__file__)
        print([b.name for b in backends.REGISTRY.backends])
        print([m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r}])
        sys.modules["zzfw_runtime"] = types.ModuleType("zzfw_runtime")   # a stand-in
        print([b.name for b in backends.active_backends()])
        del sys.modules["zzfw_runtime"]
        sys.path.insert(0, {str(site)!r})
        import zzfw_runtime
        print([b.name for b in backends.active_backends()])
    """)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    where, names, frameworks, stand_in, active = proc.stdout.strip().splitlines()
    assert where.startswith(str(copy))
    assert names == str(["torch", "keras", "tensorflow", "zzfw", "jax", "cupy"])
    assert frameworks == "[]" and stand_in == "[]" and active == "['zzfw']"


def test_leftover_and_broken_files_in_backends_neither_register_twice_nor_stop_the_load(tmp_path):
    """An editor's copy (``pytorch copy.py``) registers nothing, and a backend module that
    fails to import is left out with a warning while the others load."""
    import shutil

    copy = tmp_path / NAME
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(copy / "backends" / "pytorch.py", copy / "backends" / "pytorch copy.py")
    shutil.copy(copy / "backends" / "pytorch.py", copy / "backends" / "pytorch-old.py")
    (copy / "backends" / "stale.py").write_text(
        "from .base import RemovedInThisVersion  # a file a hand upgrade left behind\n")
    proc = subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(f"""
        import {NAME}
        from {NAME} import backends
        print([b.name for b in backends.REGISTRY.backends])
    """)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(["torch", "keras", "tensorflow", "jax",
                                                        "cupy"])
    assert "backend module 'stale' left out: ImportError" in proc.stderr


# -- each room's face: sizes, private names, module state -----------------------------------
MAX_LINES = 700
#: a C header holds declarations, types and invariants only (its part's face)
MAX_HEADER_LINES = 100
#: the files the size caps cover: the modules and the C core's sources and headers
SIZED = (".py", ".c", ".h")

#: module-level names of the package that are changed after import, or instances of its
#: classes, each truly per process (never per shell: a shell's state belongs to its
#: session), and why
PER_PROCESS = {
    "session._sessions": "the one registry of sessions, one per shell",
    "backends.REGISTRY": "the frameworks' backends, found once",
    "watch.sampling.PROCESS_SAMPLER": "the sampler of script watches, which have no session",
    "watch.peaks.LEDGER": "allocator and host peaks: the process's counters",
    "watch.peaks._PATCHES": "the framework functions wrapped for peaks, patched once",
    "core.trace._RECORDING": "torch's allocation history is process-wide: one recording",
    "core.cells._RUN_CELL_ASYNC": "IPython's run_cell_async code object, one per process",
    "core.devices._PARSED": "device names parsed once (a pure cache of strings)",
    "core.devices._PROC_FDS": "this process's open /proc descriptors",
    "core.devices._AVAILABLE": "the host's available memory, read at most every 50 ms",
    "core.scan.roots._BOOKKEEPING": "which names are IPython's bookkeeping (a cache of strings)",
    "core.scan.hidden._USER_BOUND": "per shell, weakly keyed by it: which of _, __, ___ the user "
                                    "bound (IPython keeps no record of it; see observe_underscores)",
    "core.scan.roots._MEMOS": "the C pass's memo per namespace: key strings only, 16 at most; "
                         "losing it costs speed, never an answer",
    "core.scan.types._module_is_library": "which modules are libraries (a cache of names)",
    "backends.nvml._local": "NVML's batch of readings of the thread that reads",
    "backends.tame._saved": "the environment variables tame set: the process's environment",
    "backends.torch_trace._MODE_CLASS": "a torch class looked up once",
    "backends.nvml._exit_hook": "NVML's shutdown at exit, registered once",
    "units._PLANS": "JSON field plans per dataclass (a pure cache)",
    "extension._SAID_ABSENT": "whether the process was told its scan's C core is absent "
                              "(said once, at the first load)",
    "settings._SAID": "the rejected settings the process was told of (each said once)",
    "core.render._LAST_TABLE": "the last holders table laid out, by its rows (a pure cache)",
    "backends.base._META_KEYABLE": "per metaclass: may its classes be hashed (a cache)",
    "backends.base._verdicts": "per module object: is it the real framework (a cache, "
                               "each entry leaving with its module)",
    "backends.base._homes": "where each framework's distributions are installed (a cache "
                            "of paths)",
    "views.panel._box_classes": "widget classes made once",
}

#: module-level instances of the package's classes that are frozen values, not state
FROZEN = {"core.scan.hidden.OUTPUT", "core.scan.hidden.UNDERSCORE", "core.scan.hidden.RESULT",
          "core.scan.hidden.TRACEBACK", "core.scan.hidden.CHAIN", "core.trace.queries.UNNUMBERED", "core.trace.sites.BEFORE",
          "core.scan.NOTHING",
          "core.trace.sites.BETWEEN", "core.scan.warm.UNREAD"}

_MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update",
             "setdefault", "add", "discard", "move_to_end", "appendleft", "__setitem__"}


def _module_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    return names


def _classes() -> set[str]:
    return {n.name for _, _, tree in _trees(MODULES) for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef)}


def mutated_module_state(modules=None) -> set[str]:
    """Module-level names a function of their module changes (rebinds with ``global``,
    assigns an item or attribute of, or calls a mutating method on) and module-level
    instances of the package's classes or of ``threading.local`` (but FROZEN values)."""
    found = set()
    classes = _classes()
    for module, _, tree in _trees(modules or MODULES):
        top = _module_level_names(tree)
        short = module.split(".", 1)[1] if "." in module else ""
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
                f = node.value.func
                called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if called in classes or called == "local":
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                        if isinstance(t, ast.Name) and f"{short}.{t.id}" not in FROZEN:
                            found.add(f"{short}.{t.id}")
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
            for node in ast.walk(fn):
                name = None
                if isinstance(node, ast.Global):
                    found.update(f"{short}.{n}" for n in node.names if n in top)
                elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                    targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) \
                        else [node.target]
                    for t in targets:
                        if isinstance(t, (ast.Subscript, ast.Attribute)) and \
                                isinstance(t.value, ast.Name):
                            name = t.value.id
                            if name in top and name not in local:
                                found.add(f"{short}.{name}")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in _MUTATORS and isinstance(node.func.value, ast.Name):
                    name = node.func.value.id
                    if name in top and name not in local:
                        found.add(f"{short}.{name}")
    return found


def oversized(root: Path = PACKAGE) -> dict[str, int]:
    """The files under ``root`` over their cap, with their lines: a module (``.py``) or a
    C source (``.c``) over MAX_LINES, a C header (``.h``) over MAX_HEADER_LINES."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.suffix not in SIZED or not path.is_file():
            continue
        cap = MAX_HEADER_LINES if path.suffix == ".h" else MAX_LINES
        if (n := len(path.read_text().splitlines())) > cap:
            found[path.relative_to(root).as_posix()] = n
    return found


def test_no_file_of_the_package_is_over_700_lines_nor_header_over_100():
    assert oversized() == {}


def test_the_size_checks_see_what_they_look_for(tmp_path):
    """Planted offenders (a module and a C source one line over MAX_LINES, a header one
    over MAX_HEADER_LINES) are found; files at their cap are not."""
    parts = tmp_path / "core" / "_parts"
    parts.mkdir(parents=True)
    (tmp_path / "core" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "core" / "fine.py").write_text("x = 1\n" * MAX_LINES)
    (parts / "long.c").write_text("int x;\n" * (MAX_LINES + 1))
    (parts / "fine.c").write_text("int x;\n" * MAX_LINES)
    (parts / "long.h").write_text("int x;\n" * (MAX_HEADER_LINES + 1))
    (parts / "fine.h").write_text("int x;\n" * MAX_HEADER_LINES)
    (parts / "notes.txt").write_text("x\n" * (MAX_LINES + 1))
    assert oversized(tmp_path) == {"core/long.py": MAX_LINES + 1,
                                   "core/_parts/long.c": MAX_LINES + 1,
                                   "core/_parts/long.h": MAX_HEADER_LINES + 1}


#: the most lines the body of the ``Session`` class may take: it keeps ownership only (the
#: settings, the registry, the purge funnel, the teardown); each of its other jobs is a
#: module of its own beside it (dispatch.py, refresh.py, cluster/live.py)
SESSION_MAX_LINES = 300


def class_lines(path: Path, name: str) -> int:
    """The lines of the class ``name`` in ``path``, from its ``class`` line to its last."""
    tree = ast.parse(path.read_text(), str(path))
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(found) == 1, f"{path}: {len(found)} classes {name}"
    return found[0].end_lineno - found[0].lineno + 1


def test_the_session_class_keeps_ownership_only():
    assert class_lines(MODULES[f"{NAME}.session"][0], "Session") <= SESSION_MAX_LINES


def test_the_session_size_check_sees_a_long_class(tmp_path):
    """The check itself, on a planted ``Session`` of one line more than allowed (and
    one exactly at the limit)."""
    for extra, over in ((0, False), (1, True)):
        path = tmp_path / f"session_{extra}.py"
        body = "".join(f"    x{i} = {i}\n" for i in range(SESSION_MAX_LINES - 1 + extra))
        path.write_text(f"import os\n\n\nclass Session:\n{body}\n\ndef after():\n    pass\n")
        assert (class_lines(path, "Session") > SESSION_MAX_LINES) is over


def private_imports(modules=None) -> list[str]:
    """``from .x import _y`` and ``x._y`` across modules of the package: a room's face is
    what the others may use. (The C core's module ``core/_reach`` is a module, not a
    private name of another module.)"""
    modules = modules or MODULES
    found = []
    for module, is_package, tree in _trees(modules):
        bound = {}          # a local name -> the package module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node)
                if not (base == NAME or base.startswith(NAME + ".")):
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in modules or full == f"{NAME}.core._reach":
                        bound[a.asname or a.name] = full
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        found.append(f"{module}:{node.lineno} from {base} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith(NAME) and a.asname:
                        bound[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in bound and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and bound[node.value.id] != module:
                found.append(f"{module}:{node.lineno} {node.value.id}.{node.attr}")
    return sorted(found)


def test_no_private_name_is_used_across_modules():
    assert private_imports() == []


def test_module_state_is_per_process_only():
    """No module keeps per-shell state: every module-level name a function changes is
    one of PER_PROCESS, each with its reason (a new one is either a session's or added
    there with why it is the process's)."""
    assert mutated_module_state() == set(PER_PROCESS)


def test_the_room_checks_see_what_they_look_for(tmp_path):
    """The private-name and module-state checks on a module written to break both."""
    path = tmp_path / "bad.py"
    path.write_text(textwrap.dedent('''\
        from ..core import purge as _purge
        from ..core.render import _table
        from .scope import Watch
        _PENDING: list = []
        HUB = Watch()
        COUNT = [0]
        TABLE = {"a": 1}

        def note(x):
            _PENDING.append(x)
            COUNT[0] += 1
            return _purge._Target, TABLE["a"]
    '''))
    mods = {**MODULES, f"{NAME}.watch.bad": (path, False)}
    bad = {f"{NAME}.watch.bad": (path, False)}
    assert [f for f in private_imports(mods) if ".bad:" in f] == [f"{NAME}.watch.bad:12 _purge._Target",
                                     f"{NAME}.watch.bad:2 from {NAME}.core.render import _table"]
    assert mutated_module_state(bad) == {"watch.bad._PENDING", "watch.bad.COUNT", "watch.bad.HUB"}


# -- what an object is, by its real type ----------------------------------------------------
#: the layers that read the user's objects: they ask what an object is by its real type
#: (``is_a`` of backends/base.py), never with ``isinstance``, which reads ``obj.__class__``
#: (a property or ``__getattribute__`` of the user's) wherever the type alone says no; and
#: about a type through ``is_subtype``, never ``issubclass``, which an abstract base
#: class answers by hashing the type (a metaclass's ``__hash__`` of the user's runs)
REAL_TYPE_ONLY = ("backends", "core", "watch")
#: the one place that calls ``issubclass`` (guarded: see is_subtype; is_a's own fast path
#: is for a type whose metaclass is ``type`` itself)
SUBCLASS_ASKED_IN = {(f"{NAME}.backends.base", "is_subtype"), (f"{NAME}.backends.base", "is_a")}


def isinstance_calls(modules=None) -> list[str]:
    """``isinstance(...)`` and ``issubclass(...)`` (also as ``builtins.``) called in the
    REAL_TYPE_ONLY layers, but for ``issubclass`` in SUBCLASS_ASKED_IN."""
    modules = modules or MODULES
    found = []
    for module, _, tree in _trees(modules):
        if module.split(".")[1:2] not in ([layer] for layer in REAL_TYPE_ONLY):
            continue
        allowed: set = set()   # the issubclass calls of the one function that may
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (module, node.name) in SUBCLASS_ASKED_IN:
                allowed |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or id(node) in allowed:
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else None
            if name in ("isinstance", "issubclass"):
                found.append(f"{module}:{node.lineno}")
    return sorted(found)


def test_the_layers_that_read_user_objects_never_call_isinstance(tmp_path):
    """A framework's backend asked for a hint about any root (a class whose metaclass
    traps ``__getattribute__``, an instance whose ``__class__`` is a property) once ran
    ``isinstance`` on it; the watch's holder fingerprints asked ``issubclass`` of JAX's
    abstract ``Array``, which hashed a user's class (its metaclass's ``__hash__`` ran):
    ``backends/``, ``core/`` and ``watch/`` ask ``is_a`` and ``is_subtype``. The check, on
    modules written to break it, and on the package."""
    path = tmp_path / "bad.py"
    path.write_text("import builtins\n\ndef f(x):\n    return isinstance(x, int) or "
                    "builtins.isinstance(x, str)\n\n\ndef is_subtype(t):\n"
                    "    return issubclass(t, int)\n")
    bad = {f"{NAME}.backends.bad": (path, False), f"{NAME}.views.fine": (path, False),
           f"{NAME}.watch.bad": (path, False)}
    assert isinstance_calls(bad) == [f"{NAME}.backends.bad:4", f"{NAME}.backends.bad:4",
                                     f"{NAME}.backends.bad:8", f"{NAME}.watch.bad:4",
                                     f"{NAME}.watch.bad:4", f"{NAME}.watch.bad:8"]
    assert isinstance_calls() == []

# -- core/ reads as a few nouns -------------------------------------------------------------
#: core/'s top level holds at most this many modules (``.py`` files, its ``__init__`` too):
#: the rest live in its packages (scan/, purge/, trace/, ...), one noun each
MAX_CORE_MODULES = 10
#: prefixes no module of core/'s top may have: the scan's and the purge's modules live in
#: their packages
CORE_PREFIXES = ("scan", "purge")
#: packages whose ``__init__`` is their face, with the inner modules that are public too
#: (nouns of their own): a module of the package outside one imports the package or those,
#: never another of its modules
FACES = {"core.purge": (), "core.scan": ("hidden", "paths", "native")}
#: the faces the tests and benchmarks keep too (the scan's tests read its inner modules)
STRICT_FACES = ("core.purge",)
ROOT = PACKAGE.parent


def crowded_core(core: Path = PACKAGE / "core") -> list[str]:
    """core/'s top-level modules where there are more than MAX_CORE_MODULES, else []."""
    names = sorted(p.name for p in core.glob("*.py"))
    return names if len(names) > MAX_CORE_MODULES else []


def prefixed_modules(package: Path = PACKAGE) -> list[str]:
    """Modules named after a package: at core/'s top one prefixed ``scan_`` or ``purge_``,
    anywhere one prefixed by a package beside it (``core/trace_x.py`` next to ``core/trace/``:
    it belongs inside) or named after its own folder, bare or as a prefix
    (``core/processes/processes.py``, ``core/scan/scan_kinds.py``: inside, the prefix says
    nothing)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.stem == "__init__" or "__pycache__" in path.parts:
            continue
        folder = path.parent
        owners = {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()}
        owners.add(folder.name)
        if folder == package / "core":
            owners.update(CORE_PREFIXES)
        if any(path.stem == o or path.stem.startswith(o + "_") for o in owners):
            found.append(str(path.relative_to(package)))
    return found


def _outside_modules() -> dict[str, tuple[Path, bool]]:
    """The Python files of the tests, benchmarks and scripts, by a module-like name."""
    out = {}
    for folder in ("tests", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            out[".".join(path.relative_to(ROOT).with_suffix("").parts)] = (path, False)
    return out


def behind_a_face(modules: dict | None = None, outside: dict | None = None) -> list[str]:
    """Imports of a module inside one of FACES (not one of its public ones) by a module
    outside it: ``modules`` (the package's) against every face, ``outside`` (the tests',
    the benchmarks', the scripts') against STRICT_FACES."""
    found = []
    for importers, faces in ((modules or MODULES, FACES),
                             (outside if outside is not None else _outside_modules(), STRICT_FACES)):
        for imp in imports(modules=importers):
            for face in faces:
                full = f"{NAME}.{face}"
                public = {f"{full}.{m}" for m in FACES[face]}
                inside = imp.source == full or imp.source.startswith(full + ".")
                if imp.target.startswith(full + ".") and imp.target not in public and not inside:
                    found.append(repr(imp))
    return found


def test_core_has_at_most_ten_modules_at_its_top():
    assert crowded_core() == []


def test_no_module_is_named_after_a_package():
    assert prefixed_modules() == []


def test_nothing_outside_the_purge_or_the_scan_imports_their_inner_modules():
    assert behind_a_face() == []


def test_the_noun_checks_see_what_they_look_for(tmp_path):
    """Each check of core/'s shape, on a tree written to break it."""
    core = tmp_path / "pkg" / "core"
    (core / "scan").mkdir(parents=True)
    (core / "fit").mkdir()
    for name in ("__init__", "devices", "scan_kinds", "purge_plan", "fit_result", "trace_cells",
                 "scan/__init__", "scan/kinds", "scan/scan_types", "scan/scan", "fit/__init__"):
        (core / f"{name}.py").write_text("")
    assert prefixed_modules(tmp_path / "pkg") == ["core/fit_result.py", "core/purge_plan.py",
                                                  "core/scan/scan.py", "core/scan/scan_types.py",
                                                  "core/scan_kinds.py"]
    assert crowded_core(core) == []                 # 6 modules at its top
    for i in range(5):
        (core / f"noun{i}.py").write_text("")
    assert len(crowded_core(core)) == 11            # one too many

    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent('''\
        import jupyter_gpumem.core.purge.result as result
        from ..core.purge import PurgeError, execute       # the face: fine
        from ..core.purge import plan                      # a module behind it
        from ..core.purge.targets import Target            # a name from behind it
        from ..core.scan import Root, hidden               # the face, and a public module
        from ..core.scan.paths import PathError            # a public module
        from ..core.scan.roots import odd_keys             # behind the scan's face
    '''))
    inner = tmp_path / "inner.py"
    inner.write_text("from .plan import make_plan\nfrom . import targets\nfrom ..scan.types import TENSOR\n")
    test = tmp_path / "test_x.py"
    test.write_text("from jupyter_gpumem.core.scan import reach\nfrom jupyter_gpumem.core.purge.plan import Budget\n")
    got = behind_a_face({f"{NAME}.cluster.bad": (bad, False), f"{NAME}.core.purge.inner": (inner, False)},
                        {"tests.test_x": (test, False)})
    assert got == [f"{NAME}.cluster.bad:1 -> {NAME}.core.purge.result",
                   f"{NAME}.cluster.bad:3 -> {NAME}.core.purge.plan",
                   f"{NAME}.cluster.bad:4 -> {NAME}.core.purge.targets",
                   f"{NAME}.cluster.bad:7 -> {NAME}.core.scan.roots",
                   f"{NAME}.core.purge.inner:3 -> {NAME}.core.scan.types",
                   "tests.test_x:2 -> jupyter_gpumem.core.purge.plan"], got


# -- the tests mirror core/ ------------------------------------------------------------------
def unmirrored_core_tests(tests: Path = ROOT / "tests" / "core",
                          core: Path = PACKAGE / "core") -> list[str]:
    """Files under tests/core that name no part of core/: each folder there must be a
    package of core/ at the same place, each file ``test_<name>[_<more>].py`` where
    ``<name>`` is a module or package of that folder's package (or the package itself),
    and nothing else lives there (helpers go to tests/helpers)."""
    found = []
    for path in sorted(tests.rglob("*")):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        where = path.parent.relative_to(tests)
        package = core / where
        if not (package / "__init__.py").is_file() or path.suffix != ".py" \
                or not path.stem.startswith("test_"):
            found.append(str(path.relative_to(tests)))
            continue
        owners = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
        owners |= {d.name for d in package.iterdir() if (d / "__init__.py").is_file()}
        if where.parts:
            owners.add(package.name)
        name = path.stem[len("test_"):]
        if not any(name == o or name.startswith(o + "_") for o in owners):
            found.append(str(path.relative_to(tests)))
    return found


def test_the_tests_of_core_mirror_core():
    assert unmirrored_core_tests() == []


def test_the_mirror_check_finds_a_test_that_names_no_part_of_core(tmp_path):
    """The check itself, on a planted tree: a folder that is no package of core/, a file
    named after no module, a helper among the tests; the right names pass."""
    core, tests = tmp_path / "core", tmp_path / "tests"
    for folder in ("", "purge"):
        (core / folder).mkdir(exist_ok=True)
        (core / folder / "__init__.py").write_text("")
    (core / "purge" / "plan.py").write_text("")
    (core / "files.py").write_text("")
    for name in ("purge/test_plan.py", "purge/test_plan_edges.py", "purge/test_purge.py",
                 "test_files.py", "test_purge_all.py",
                 "purge/test_planner.py", "purge/helpers.py", "scan/test_kinds.py", "test_cells.py"):
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text("")
    assert unmirrored_core_tests(tests, core) == [
        "purge/helpers.py", "purge/test_planner.py", "scan/test_kinds.py", "test_cells.py"]
