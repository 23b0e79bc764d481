"""What a fit's guard reads of the values a training step names: the modules, optimizers
and tensors among them, one level into lists, tuples, dicts and objects, read through the
containers' own C slots, so that no ``__getitem__``, ``__iter__``, ``values()`` or
``__dict__`` property of a user's subclass runs (never run the user's code)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.backends.torch_fit import StepGuard  # noqa: E402

calls: list[str] = []


class TrapList(list):
    def __getitem__(self, i):
        calls.append("list.__getitem__")
        return list.__getitem__(self, i)

    def __iter__(self):
        calls.append("list.__iter__")
        return list.__iter__(self)


class TrapTuple(tuple):
    def __getitem__(self, i):
        calls.append("tuple.__getitem__")
        return tuple.__getitem__(self, i)


class TrapDict(dict):
    def values(self):
        calls.append("dict.values")
        return dict.values(self)

    def __iter__(self):
        calls.append("dict.__iter__")
        return dict.__iter__(self)


class Box:
    def __init__(self, inner):
        self.inner = inner

    def __getattribute__(self, name):
        if name == "__dict__":
            calls.append("Box.__dict__")
        return object.__getattribute__(self, name)


def test_the_guard_finds_the_step_state_without_running_the_users_containers():
    calls.clear()
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = torch.ones(3, requires_grad=True)
    guard = StepGuard([TrapList([model]), TrapTuple((opt,)), TrapDict(w=weights), Box(model)])
    assert calls == [], calls
    assert guard.modules == [model] and guard.optimizers == [opt]
    assert any(t is weights for t in guard.tensors)
    assert {id(p) for p in guard.params} >= {id(p) for p in model.parameters()} | {id(weights)}
