"""Hypothesis strategies that draw recipes (tests/generated/recipe.py): a few names,
each bound to a random nest of containers, instances, closures and tensors, mutated
between scans, and a purge at the end."""
from __future__ import annotations

from hypothesis import strategies as st

from .recipe import (APPENDABLE, DENSE, MAPPINGS, SEQUENCES, SETTABLE, WRAPPERS, Model)

NAMES = ("a", "b", "c", "d")
CLASSES = ("C1", "C2")
SIZES = (8, 64, 1000, 16000)
KEYS = ("x", "y", "z")


class _Keys:
    """Atom keys, new for each recipe (k1, k2, ...)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"k{self.n}"


def _leaf(draw, model: Model, keys: _Keys, allowed: frozenset, hashable: bool = False):
    kinds = ["atom", "view", "sub"]
    if not hashable:
        if "sparse" in allowed:
            kinds.append("sparse")
        kinds += [m for m in ("graph:plain", "graph:hooks", "graph:checkpoint", "tattr")
                  if m in allowed]
        if model.names:
            kinds.append("name")
    if model.dense_names():
        kinds += ["viewof"] + (["numpy"] if "numpy" in allowed else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "name":
        return ("name", draw(st.sampled_from(sorted(model.names))))
    if kind == "viewof":
        return (kind, draw(st.sampled_from(sorted(model.dense_names()))))
    if kind == "numpy":   # at the tensor's address, or one element in
        return (kind, draw(st.sampled_from(sorted(model.dense_names()))),
                draw(st.sampled_from((0, 1))))
    if kind == "tattr":
        return ("tattr", (draw(st.sampled_from(DENSE)), keys(), draw(st.sampled_from(SIZES))),
                _leaf(draw, model, keys, allowed, hashable=True))
    n = draw(st.sampled_from(SIZES))
    if kind.startswith("graph:"):
        return ("graph", keys(), n, kind.split(":")[1])
    return (kind, keys(), n)


def expression(draw, model: Model, keys: _Keys, allowed: frozenset, depth: int = 2):
    """A random expression (see recipe.py for the forms)."""
    if depth <= 0 or draw(st.integers(0, 2)) == 0:
        return _leaf(draw, model, keys, allowed)
    kind = draw(st.sampled_from(SEQUENCES + MAPPINGS + WRAPPERS + ("slots", "module") +
                                (("tattr",) if "tattr" in allowed else ())))
    inner = lambda: expression(draw, model, keys, allowed, depth - 1)  # noqa: E731
    count = lambda: draw(st.integers(0, 3))  # noqa: E731
    if kind == "set":
        return ("set", [_leaf(draw, model, keys, allowed, hashable=True) for _ in range(count())])
    if kind in SEQUENCES:
        return (kind, [inner() for _ in range(count())])
    if kind in MAPPINGS:
        chosen = draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
        return (kind, [(k, inner()) for k in chosen])
    if kind == "slots":
        return ("slots", inner(), inner())
    if kind == "tattr":
        dense = (draw(st.sampled_from(DENSE)), keys(), draw(st.sampled_from(SIZES)))
        return ("tattr", dense, inner())
    if kind == "nnmod":
        return ("nnmod", _dense(draw, model, keys))
    if kind == "module":
        return ("module", keys(), inner(), draw(st.booleans()))
    return (kind, inner())


def _dense(draw, model: Model, keys: _Keys):
    """A dense tensor (a module's buffer)."""
    if model.dense_names() and draw(st.booleans()):
        return ("name", draw(st.sampled_from(sorted(model.dense_names()))))
    return (draw(st.sampled_from(DENSE)), keys(), draw(st.sampled_from(SIZES)))


def _step(draw, model: Model, keys: _Keys, allowed: frozenset):
    expr = lambda: expression(draw, model, keys, allowed)  # noqa: E731
    kinds = ["bind", "bind", "bind", "class", "show", "raise", "scan"]
    if "own_" in allowed:
        kinds.append("own_")
    by_kind = {o.kind for o in model.names.values()}
    if by_kind & set(APPENDABLE):
        kinds.append("append")
    if by_kind & set(SETTABLE):
        kinds.append("setitem")
    for kind, mutation in (("trap", "setattr"), ("closure", "cell"), ("default", "defaults")):
        if kind in by_kind:
            kinds.append(mutation)
    if model.names:
        kinds += ["del", "bind"]
    if model.dense_names():
        kinds += ["inplace", "data"]
        if "set_" in allowed:
            kinds += ["set_", "setto"] + (["grow"] if model.growable_names() else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "bind":
        return ("bind", draw(st.sampled_from(NAMES)), expr())
    if kind == "class":
        return ("class", draw(st.sampled_from(CLASSES)), draw(st.sampled_from(NAMES)), expr())
    if kind in ("show", "raise", "own_"):
        return (kind, expr())
    if kind == "append":
        return ("append", draw(st.sampled_from(
            sorted(n for n, o in model.names.items() if o.kind in APPENDABLE))), expr())
    if kind == "setitem":
        return ("setitem", draw(st.sampled_from(
            sorted(n for n, o in model.names.items() if o.kind in SETTABLE))),
            draw(st.sampled_from(KEYS)), expr())
    if kind in ("setattr", "cell", "defaults"):
        of = {"setattr": "trap", "cell": "closure", "defaults": "default"}[kind]
        name = draw(st.sampled_from(sorted(n for n, o in model.names.items() if o.kind == of)))
        return (kind, name, draw(st.sampled_from(KEYS)), expr()) if kind == "setattr" else \
            (kind, name, expr())
    if kind == "del":
        return ("del", draw(st.sampled_from(sorted(model.names))))
    if kind == "inplace":
        return ("inplace", draw(st.sampled_from(model.dense_names())))
    if kind == "set_":
        return ("set_", draw(st.sampled_from(model.dense_names())), keys(),
                draw(st.sampled_from(SIZES)))
    if kind == "data":
        return ("data", draw(st.sampled_from(model.dense_names())), keys(),
                draw(st.sampled_from(SIZES)))
    if kind == "setto":
        return ("setto", draw(st.sampled_from(model.dense_names())),
                draw(st.sampled_from(model.dense_names())))
    if kind == "grow":
        return ("grow", draw(st.sampled_from(model.growable_names())),
                draw(st.sampled_from(SIZES)))
    return ("scan",)


@st.composite
def recipes(draw, allowed: frozenset, max_steps: int = 10):
    """A recipe: up to ``max_steps`` steps using only the ``allowed`` features, a scan,
    then a purge (of one name, of all, or of the hidden holders only)."""
    model, keys, steps = Model(), _Keys(), []
    for _ in range(draw(st.integers(1, max_steps))):
        step = _step(draw, model, keys, allowed)
        model.apply(step)
        steps.append(step)
    steps.append(("scan",))
    ways = ("hidden", "all", "name", "name") if model.names else ("hidden", "all")
    how = draw(st.sampled_from(ways))
    if how == "name":
        steps.append(("purge", draw(st.sampled_from(sorted(model.names)))))
    else:
        steps.append(("purge", "--all") if how == "all" else ("purge",))
    return steps
