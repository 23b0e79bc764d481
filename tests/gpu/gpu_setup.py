"""The set-up the GPU tests of this folder share: torch with a CUDA device (without
one the test module is skipped), the sizes they leak, and the training step of the
tiny GPT (benchmarks/tiny_gpt.py) that the internals and trace tests run.

A plain module, not a ``conftest.py`` (gpu_floor.py says why). It imports torch
only when :func:`cuda_torch` is called.
"""
from __future__ import annotations

import pytest

MIB = 1 << 20
GIB_FLOATS = 1 << 28     # 1 GiB of float32

# One Adam step of the tiny GPT on ``batch`` (token ids, 16 x 129), the body of a
# training loop (the caller indents it): needs ``model``, ``opt``, ``torch`` and ``F``.
GPT_STEP = """\
logits = model(batch[:, :-1])
loss = F.cross_entropy(logits.reshape(-1, 512), batch[:, 1:].reshape(-1))
opt.zero_grad(set_to_none=True)
loss.backward()
opt.step()
"""


def cuda_torch():
    """torch, for a test module of the GPU machine: called at the module's top, it skips
    the whole module where torch is not installed or sees no CUDA device."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: these tests run on the GPU machine", allow_module_level=True)
    return torch
