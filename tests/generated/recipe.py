"""Recipes: what a generated example does in the shell, as plain tuples (printable, so a
failure is reproducible and can be pasted into tests/generated/test_found.py).

A recipe is a list of steps. Each step is one cell (``cell_of``), or ``("scan",)``, a point
where the test scans. The :class:`Model` replays the steps on plain Python data: which
object each name binds, which atoms (watched storages, tests/generated/traps.py) each
object reaches, what the hidden holders (``Out``, the last traceback) keep. The test
compares the product with it.

Expressions, as tuples (``KEY`` an atom's key, ``N`` its number of floats)::

    ("atom", KEY, N)             a new tensor
    ("view", KEY, N)             a 2-element view of a new tensor (it keeps all N)
    ("sub", KEY, N)              a new tensor seen through a __torch_function__ subclass
    ("sparse", KEY, N)           a sparse COO tensor (atoms KEY and KEY.i)
    ("graph", KEY, N, MODE)      a scalar whose autograd graph saves KEY (plain|hooks|checkpoint)
    ("name", NAME)               the object NAME binds (shared)
    ("viewof", NAME)             a view of the tensor NAME binds (its storage, shared; it
                                 keeps that tensor alive, its _base, whatever it holds later)
    ("tattr", DENSE, EXPR)       the tensor DENSE (a dense form above) with EXPR as its attribute
    ("numpy", NAME[, START])     a tensor on a numpy view of NAME's tensor from START (0
                                 unless given): a storage of its own inside NAME's bytes
                                 (at the same address where START is 0), which keeps
                                 NAME's alive (never empty: gen.numpy_view)
    (KIND, [EXPR, ...])          KIND: list tuple set deque traplist
    (KIND, [(KEY, EXPR), ...])   KIND: dict odict ddict trapdict trap
    ("slots", EXPR, EXPR)        a __slots__ instance
    (KIND, EXPR)                 KIND: closure default gen exc lru nnmod
    ("module", KEY, EXPR, REG)   a module object (in sys.modules where REG)

Steps::

    ("bind", NAME, EXPR)         NAME = EXPR (a new name or a rebind)
    ("class", CLS, NAME, EXPR)   class CLS(gen.Trap): shared = EXPR; NAME = CLS()
    ("own_", EXPR)               _ = EXPR (the user's own _)
    ("show", EXPR)               a cell whose value is displayed (Out[N], _N, _)
    ("raise", EXPR)              a cell that raises with EXPR in a frame (the last traceback)
    ("append", NAME, EXPR)       NAME.append(EXPR)
    ("setitem", NAME, KEY, EXPR) NAME[KEY] = EXPR
    ("setattr", NAME, KEY, EXPR) NAME.KEY = EXPR (NAME a gen.Trap)
    ("cell", NAME, EXPR)         NAME.__closure__[0].cell_contents = EXPR (NAME a closure)
    ("defaults", NAME, EXPR)     NAME.__defaults__ = (EXPR,) (NAME a function with a default)
    ("del", NAME)                del NAME
    ("inplace", NAME)            NAME.add_(1)
    ("set_", NAME, KEY, N)       NAME.set_(a new tensor)
    ("data", NAME, KEY, N)       NAME.data = a new tensor
    ("setto", NAME, OTHER)       NAME.set_(OTHER): NAME's tensor moves onto OTHER's storage
    ("grow", NAME, N)            NAME.set_(its own storage, 0, (N,)): the storage grows to N
    ("scan",)                    scan here
    ("purge", NAME)              %gpumem purge NAME (last); ("purge", "--all"): --all;
                                 ("purge",): the hidden holders only
"""
from __future__ import annotations

from dataclasses import dataclass, field

DENSE = ("atom", "view", "sub")
SEQUENCES = ("list", "tuple", "set", "deque", "traplist")
MAPPINGS = ("dict", "odict", "ddict", "trapdict", "trap")
WRAPPERS = ("closure", "default", "gen", "exc", "lru", "nnmod")
APPENDABLE = ("list", "deque", "traplist")
SETTABLE = ("dict", "odict", "ddict", "trapdict")

#: what each feature a recipe can use stands for (the known classes the generator found,
#: see tests/generated/conftest.py: KNOWN_OPEN)
FEATURES = ("graph:plain", "graph:hooks", "graph:checkpoint", "sparse", "own_", "set_", "numpy",
            "tattr")


# -- source ----------------------------------------------------------------------------------
def source(expr) -> str:
    """The Python source of an expression."""
    kind = expr[0]
    if kind == "atom":
        return f"gen.atom({expr[1]!r}, {expr[2]})"
    if kind == "view":
        return f"gen.atom({expr[1]!r}, {expr[2]})[1:3]"
    if kind == "sub":
        return f"gen.subclassed(gen.atom({expr[1]!r}, {expr[2]}))"
    if kind == "sparse":
        return f"gen.sparse({expr[1]!r}, {expr[2]})"
    if kind == "graph":
        return f"gen.graph(gen.atom({expr[1]!r}, {expr[2]}), {expr[3]!r})"
    if kind == "name":
        return expr[1]
    if kind == "viewof":
        return f"{expr[1]}[:2]"
    if kind == "tattr":
        return f"gen.with_attr({source(expr[1])}, {source(expr[2])})"
    if kind == "numpy":
        start = expr[2] if len(expr) > 2 else 0
        return f"gen.numpy_view({expr[1]}, {start})"
    if kind in SEQUENCES:
        items = ", ".join(source(e) for e in expr[1])
        return {"list": f"[{items}]", "tuple": f"({items}{',' if len(expr[1]) == 1 else ''})",
                "set": f"{{{items}}}" if expr[1] else "set()",
                "deque": f"collections.deque([{items}])",
                "traplist": f"gen.trap_list({items})"}[kind]
    if kind in MAPPINGS:
        pairs = [(k, source(e)) for k, e in expr[1]]
        plain = "{" + ", ".join(f"{k!r}: {s}" for k, s in pairs) + "}"
        keywords = ", ".join(f"{k}={s}" for k, s in pairs)
        return {"dict": plain, "odict": f"collections.OrderedDict({plain})",
                "ddict": f"collections.defaultdict(list, {plain})",
                "trapdict": f"gen.trap_dict({keywords})", "trap": f"gen.Trap({keywords})"}[kind]
    if kind == "slots":
        return f"gen.SlotTrap({source(expr[1])}, {source(expr[2])})"
    if kind == "closure":
        return f"(lambda v: lambda: v)({source(expr[1])})"
    if kind == "default":
        return f"(lambda v={source(expr[1])}: v)"
    if kind == "gen":
        return f"gen.started({source(expr[1])})"
    if kind == "exc":
        return f"gen.caught({source(expr[1])})"
    if kind == "lru":
        return f"gen.cached({source(expr[1])})"
    if kind == "nnmod":
        return f"gen.TrapModule({source(expr[1])})"
    if kind == "module":
        return f"gen.module({expr[1]!r}, {source(expr[2])}, {expr[3]!r})"
    raise ValueError(f"no such expression: {expr!r}")


def cell_of(step) -> str | None:
    """The cell a step runs (None for ``("scan",)``)."""
    kind = step[0]
    if kind == "bind":
        return f"{step[1]} = {source(step[2])}"
    if kind == "class":
        return (f"class {step[1]}(gen.Trap):\n    shared = {source(step[3])}\n"
                f"{step[2]} = {step[1]}()")
    if kind == "own_":
        return f"_ = {source(step[1])}"
    if kind == "show":
        return source(step[1])
    if kind == "raise":
        return f"gen.fail({source(step[1])})"
    if kind == "append":
        return f"{step[1]}.append({source(step[2])})"
    if kind == "setitem":
        return f"{step[1]}[{step[2]!r}] = {source(step[3])}"
    if kind == "setattr":
        return f"{step[1]}.{step[2]} = {source(step[3])}"
    if kind == "cell":
        return f"{step[1]}.__closure__[0].cell_contents = {source(step[2])}"
    if kind == "defaults":
        return f"{step[1]}.__defaults__ = ({source(step[2])},)"
    if kind == "del":
        return f"del {step[1]}"
    if kind == "inplace":
        return f"{step[1]}.add_(1);"
    if kind == "set_":
        return f"{step[1]}.set_(gen.atom({step[2]!r}, {step[3]}));"
    if kind == "setto":
        return f"{step[1]}.set_({step[2]});"
    if kind == "data":
        return f"{step[1]}.data = gen.atom({step[2]!r}, {step[3]})"
    if kind == "grow":
        return f"{step[1]}.set_({step[1]}.untyped_storage(), 0, ({step[2]},));"
    if kind in ("scan", "purge"):
        return None
    raise ValueError(f"no such step: {step!r}")


def program(recipe) -> str:
    """The whole recipe as one readable text, cell by cell."""
    out = []
    for step in recipe:
        cell = cell_of(step)
        out.append(f"# -- {step!r}" if cell is None else cell)
    return "\n".join(out)


# -- the model -------------------------------------------------------------------------------
#: the '' a new session binds to _, __ and ___ (one object), and a deleted one
EMPTY, ABSENT = object(), object()


@dataclass(eq=False)
class Obj:
    """One object the recipe made: its kind, the atoms it holds itself and its parts."""

    kind: str
    atoms: set = field(default_factory=set)
    kids: list = field(default_factory=list)
    keys: list | None = None        # a mapping's keys, one per kid
    #: atoms kept alive only from C code, where no walk can follow (a tensor made by
    #: ``torch.from_numpy`` holds its numpy array in its deleter, and the array holds
    #: the tensor it views): alive while this object is, seen only where another path
    #: reaches them
    unseen: set = field(default_factory=set)
    #: a view's base (``t[:2]._base``: the tensor it was first cut from, which it keeps
    #: alive with whatever storage that tensor holds now, after a set_ or a .data =); a
    #: view of a view has the first one's base (torch keeps the root, never the middle)
    base: "Obj | None" = None

    def reach(self, seen=None, visible: bool = False) -> set:
        """The atoms this object keeps alive (``visible``: those a walk can follow)."""
        seen = set() if seen is None else seen
        if id(self) in seen:
            return set()
        seen.add(id(self))
        out = set(self.atoms) if visible else self.atoms | self.unseen
        for kid in self.kids:
            out |= kid.reach(seen, visible)
        return out


class Model:
    """What the recipe's steps leave, replayed on :class:`Obj`."""

    def __init__(self) -> None:
        self.names: dict[str, Obj] = {}     # user bindings (the user's own _ included)
        self.shown: list[Obj] = []          # Out entries
        self.last_error: Obj | None = None  # what the last traceback keeps
        self.pinned: list[Obj] = []         # modules in sys.modules
        self.features: set[str] = set()
        self.sizes: dict[str, int] = {}     # atom -> bytes of its storage
        self.fixed: set[str] = set()        # atoms whose storage cannot grow (numpy'd)
        #: the display hook's own _, __, ___ and the namespace's (EMPTY: the '' a new
        #: session has; ABSENT: deleted), as IPython's DisplayHook.update_user_ns keeps them
        self.hook: list = [EMPTY] * 3
        self.unders: list = [EMPTY] * 3
        self.empty_tuple: Obj | None = None   # ``()``: one object, as in Python

    def make(self, expr) -> Obj:
        kind = expr[0]
        if kind in DENSE:
            self.sizes[expr[1]] = 4 * expr[2]
            if kind == "view":   # its base: the new tensor it was cut from, no name's
                base = Obj("tensor", {expr[1]})
                return Obj("tensor", {expr[1]}, [base], base=base)
            return Obj("tensor", {expr[1]})
        if kind == "sparse":
            self.features.add("sparse")
            self.sizes.update({expr[1]: 4 * expr[2], expr[1] + ".i": 8 * expr[2]})
            return Obj("sparse", {expr[1], expr[1] + ".i"})
        if kind == "graph":
            self.features.add("graph:" + expr[3])
            self.sizes[expr[1]] = 4 * expr[2]
            return Obj("graph", {expr[1]})
        if kind == "name":
            return self.names[expr[1]]
        if kind == "tattr":
            self.features.add("tattr")
            tensor = self.make(expr[1])   # (the same tensor, its attribute set)
            return Obj("tensor", set(tensor.atoms), tensor.kids + [self.make(expr[2])],
                       base=tensor.base)
        if kind == "viewof":
            source = self.names[expr[1]]
            root = source.base or source
            return Obj("tensor", set(source.atoms), [root], unseen=set(source.unseen), base=root)
        if kind == "numpy":
            self.features.add("numpy")
            source = self.names[expr[1]]
            self.fixed |= source.atoms   # .numpy() makes a storage resizable no more
            return Obj("tensor", unseen=source.atoms | source.unseen)
        if kind == "tuple" and not expr[1]:
            # one object in Python: every ``()`` is the same (the user's ``_ = ()`` and a
            # cell that shows ``()`` give the display hook the user's very object)
            if self.empty_tuple is None:
                self.empty_tuple = Obj(kind, kids=[])
            return self.empty_tuple
        if kind in SEQUENCES:
            return Obj(kind, kids=[self.make(e) for e in expr[1]])
        if kind in MAPPINGS:
            return Obj(kind, kids=[self.make(e) for _, e in expr[1]], keys=[k for k, _ in expr[1]])
        if kind == "slots":
            return Obj(kind, kids=[self.make(expr[1]), self.make(expr[2])])
        if kind in WRAPPERS:
            return Obj(kind, kids=[self.make(expr[1])])
        if kind == "module":
            obj = Obj(kind, kids=[self.make(expr[2])])
            if expr[3]:
                self.pinned.append(obj)
            return obj
        raise ValueError(f"no such expression: {expr!r}")

    def apply(self, step) -> None:
        kind = step[0]
        if kind == "bind":
            self.names[step[1]] = self.make(step[2])
        elif kind == "class":
            cls = Obj("class", kids=[self.make(step[3])])
            self.names[step[1]] = cls
            self.names[step[2]] = Obj("instance", kids=[cls])
        elif kind == "own_":
            self.features.add("own_")
            self.names["_"] = self.unders[0] = self.make(step[1])
        elif kind == "show":
            self.show(self.make(step[1]))
        elif kind == "raise":
            self.last_error = self.make(step[1])
        elif kind == "append":
            self.names[step[1]].kids.append(self.make(step[2]))
        elif kind in ("cell", "defaults"):
            self.names[step[1]].kids = [self.make(step[2])]
        elif kind in ("setitem", "setattr"):
            # the model keeps one kid per key: a replaced key's old value goes
            target, new = self.names[step[1]], self.make(step[3])
            if step[2] in target.keys:
                target.kids[target.keys.index(step[2])] = new
            else:
                target.keys.append(step[2])
                target.kids.append(new)
        elif kind == "del":
            del self.names[step[1]]
            if step[1] == "_":
                self.unders[0] = ABSENT
        elif kind == "set_":
            self.features.add("set_")
            self.sizes[step[2]] = 4 * step[3]
            self.names[step[1]].atoms, self.names[step[1]].unseen = {step[2]}, set()
        elif kind == "data":
            self.sizes[step[2]] = 4 * step[3]
            self.names[step[1]].atoms, self.names[step[1]].unseen = {step[2]}, set()
        elif kind == "setto":
            self.features.add("set_")
            other = self.names[step[2]]
            self.names[step[1]].atoms = set(other.atoms)
            self.names[step[1]].unseen = set(other.unseen)
        elif kind == "grow":
            self.features.add("set_")
            for key in self.names[step[1]].atoms:
                self.sizes[key] = max(self.sizes[key], 4 * step[2])
        elif kind not in ("inplace", "scan", "purge"):
            raise ValueError(f"no such step: {step!r}")

    def show(self, obj: Obj) -> None:
        """A cell's value shown: it goes into Out and the display hook's ``_``; IPython
        binds the namespace's ``_``, ``__`` and ``___`` to the hook's only where each there
        is the hook's own (or deleted), so the user's own ``_`` stays until the hook's
        ``_`` is that very object (a cell that shows it), and goes with the next value."""
        self.shown.append(obj)
        update = all(u is ABSENT or u is h for u, h in zip(self.unders, self.hook))
        self.hook = [obj] + self.hook[:2]
        if update:
            self.unders = list(self.hook)
            self.names.pop("_", None)

    # what the checks ask
    def held_by(self, names, purged=()) -> set:
        """The atoms the given names reach, and the modules in sys.modules (but those bound
        to a ``purged`` name: a purge of a module's name takes it out of sys.modules too)."""
        out: set = set()
        for name in names:
            out |= self.names[name].reach()
        gone = [self.names[n] for n in purged]
        for obj in self.pinned:
            if not any(obj is g for g in gone):
                out |= obj.reach()
        return out

    def hidden_atoms(self, visible: bool = False) -> set:
        out: set = set()
        for obj in self.shown + ([self.last_error] if self.last_error else []):
            out |= obj.reach(visible=visible)
        return out

    def visible(self) -> set:
        """The atoms some walk can follow to: from a name, a hidden holder or a module in
        sys.modules."""
        out = self.hidden_atoms(visible=True)
        for obj in list(self.names.values()) + self.pinned:
            out |= obj.reach(visible=True)
        return out

    def dense_names(self) -> list[str]:
        """Names bound to a dense tensor (their value can be viewed, changed in place, set_)."""
        return [n for n, o in self.names.items() if o.kind == "tensor"]

    def growable_names(self) -> list[str]:
        """Dense tensors whose storage can grow: not a numpy buffer's (from_numpy: no atom
        of its own), nor one a numpy array was made of (torch fixes its size then)."""
        return [n for n, o in self.names.items()
                if o.kind == "tensor" and o.atoms and not o.atoms & self.fixed]


def replay(recipe) -> Model:
    model = Model()
    for step in recipe:
        model.apply(step)
    return model
