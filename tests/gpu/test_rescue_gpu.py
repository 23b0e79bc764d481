"""The out-of-memory rescue on a real CUDA device, each scenario in a child process
(rescue_child.py: the memory cap and the allocator setting are the process's):

- a cap from ``torch.cuda.set_per_process_memory_fraction`` (4 GiB): 1.5 GiB shown in
  ``Out`` and 1.5 GiB in the failing traceback's frame, a 2 GiB request fails; the lines
  under the traceback name both holders, ``%gpumem rescue`` frees them, the rerun passes
  and the user's own tensor stays;
- fragmentation: a variable-length workload leaves 4.5 GiB free in holes of its cache
  under a 6 GiB cap, and a 1.5 GiB request fails with the default allocator; the
  advice names ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and how it takes
  effect, and the same workload relaunched with it passes;
- reruns: a cell that appends 256 MiB to a list is flagged on its third run (the level is
  the allocator's allocated bytes), a cell that rebinds is never flagged in ten runs.

Skips, with the reason, where torch, CUDA or IPython is absent."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("IPython", reason="IPython is not installed (see GPU.md: wheels.sh)")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: the rescue's GPU path needs one")

CHILD = Path(__file__).with_name("rescue_child.py")


def child(mode: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    done = subprocess.run([sys.executable, str(CHILD), mode], env={**environ, **env},
                          capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    print(f"\n---- {mode} {env}\n{text[-4000:]}")
    assert done.returncode == 0, text[-3000:]
    return text


def test_a_capped_out_of_memory_error_is_rescued():
    text = child("oom")
    assert "CELL-FAILED" in text and "OutOfMemoryError" in text
    assert "out of memory on cuda:0" in text and "asked for 2.0 GiB" in text
    offer = text.split("out of memory on cuda:0", 1)[1]
    assert "Out[" in offer and "last traceback (step(): t)" in offer, offer
    assert "%gpumem rescue" in offer
    assert "rescue freed" in text and "the rerun succeeded" in text and "RERUN-DONE" in text
    assert "KEEP-INTACT True" in text


def test_fragmentation_is_told_and_expandable_segments_fixes_it_in_a_new_process():
    pytest.importorskip("cupy", reason="the scenario fills the device with CuPy's runtime call")
    text = child("fragment")
    assert "CELL-FAILED" in text, "the default allocator should fail on this workload"
    assert "fragmentation:" in text and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    assert "new process" in text
    relaunched = child("fragment", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    assert "CELL-PASSED" in relaunched and "RERUN-DONE" in relaunched
    assert "fragmentation:" not in relaunched


def test_a_cell_leaking_on_the_gpu_is_flagged_and_a_clean_one_is_not():
    text = child("reruns")
    flags = [line for line in text.splitlines() if "keeps more on each rerun" in line]
    assert len(flags) == 1 and "acc +256.0 MiB" in flags[0] and "%gpumem purge acc" in flags[0], \
        flags
