"""A wrapper tensor subclass, made as torch's own subclasses are, for the walk's tests
on the host (tests/hostile/test_hostile_walk.py) and on a GPU (tests/gpu/test_walk_gpu.py)."""
from __future__ import annotations


def wrapper_class(record=None):
    """``Wrapper(t)``: no memory of its own, the real tensor ``t`` in ``.elem``, every
    operation run on the inner tensors. With ``record``, its dispatch and each of its
    attribute reads first call ``record(what)`` (to show that they ran)."""
    import torch
    from torch.utils._pytree import tree_map

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, elem):
            out = torch.Tensor._make_wrapper_subclass(cls, elem.size(), dtype=elem.dtype,
                                                      device=elem.device)
            out.elem = elem
            return out

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            if record is not None:
                record(f"__torch_dispatch__ {func}")

            def unwrap(x):
                return x.elem if type(x) is cls else x

            return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

    if record is not None:
        def __getattribute__(self, name):
            record(f"__getattribute__ {name}")
            return object.__getattribute__(self, name)

        Wrapper.__getattribute__ = __getattribute__
    return Wrapper
