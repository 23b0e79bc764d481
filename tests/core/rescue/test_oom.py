"""The out-of-memory rescue: a real host out-of-memory error in a real kernel (an
address-space limit set on the kernel, calibrated to its size), the offer under the
traceback, ``%gpumem rescue`` and its button (clicked through its comm); chained
exceptions as hidden holders; the frameworks' errors known from their real classes."""
from __future__ import annotations

import pytest

from conftest import run
from kernel_frontend import Kernel
from oom_cells import CHAINED, HELD, IN_FRAME, LIMIT, MiB, SETUP, SHOWN


def _kernel(extension: bool) -> Kernel:
    k = Kernel({"MALLOC_ARENA_MAX": "2"})
    if extension:
        k.ok("%load_ext jupyter_gpumem\n%config GpuMemMagics.default_device = 'cpu'")
    k.ok(SETUP)
    k.ok(SHOWN)
    k.ok(LIMIT)
    return k


@pytest.mark.parametrize("cell, holder", [(IN_FRAME, "last traceback (step(): t)"),
                                          (CHAINED, "sys.last_value.__context__")])
def test_a_real_out_of_memory_error_is_rescued_without_a_restart(cell, holder):
    k = _kernel(extension=True)
    try:
        failed = k.run(cell, cell_id="the-failing-cell")
        assert failed.errors and failed.errors[0][0] == "RuntimeError", failed.errors
        assert "can't allocate memory" in failed.errors[0][1]
        offer = failed.text
        assert "out of memory on the host" in offer and "asked for 1000.0 MiB" in offer
        assert "Out[" in offer and holder in offer, offer
        assert "%gpumem rescue" in offer and "repeats what the cell did" in offer
        assert "other" in offer.split("not taken unless named:")[1]
        assert failed.views, "no rescue button in a kernel"
        # nothing is purged or rerun without the user's command: still held
        assert "Out[" in k.ok("_r = %gpumem --device cpu -o\nprint([h.name for h in _r.holders])\ndel _r")

        rescued = k.run("%gpumem rescue")
        assert rescued.ok, (rescued.errors, rescued.text)
        assert "rescue freed" in rescued.text and "the rerun succeeded" in rescued.text
        assert "done" in rescued.text
        freed = rescued.text.split("rescue freed ")[1].split(" ")[0]
        assert float(freed) >= 2 * HELD - 1, rescued.text
        assert k.ok("print(other.numel(), int(other.sum()))").split() == [str(8 * MiB)] * 2
    finally:
        k.close()


def test_without_the_extension_the_same_notebook_needs_a_restart():
    k = _kernel(extension=False)
    try:
        assert not k.run(IN_FRAME).ok
        k.ok("gc.collect()")
        again = k.run(IN_FRAME)     # Out and the last traceback still hold what it needs
        assert again.errors and "can't allocate memory" in again.errors[0][1]
        assert k.ok("print(other.numel())").strip() == str(8 * MiB)
    finally:
        k.close()


def test_the_button_rescues_through_its_comm_and_names_what_goes():
    k = _kernel(extension=True)
    try:
        k.ok(f"spare = torch.ones({64 * MiB}, dtype=torch.uint8)")
        failed = k.run(IN_FRAME)
        assert failed.views
        text = k.find("TextModel")[-1]
        button = [m for m in k.find("ButtonModel", description="Rescue and rerun")][-1]
        k.comm(text, {"method": "update", "state": {"value": "spare"}, "buffer_paths": []})
        k.comm(button, {"method": "custom", "content": {"event": "click"}})
        asks = [s["value"] for mid, s in k.models.items() if s.get("_model_name") == "HTMLModel"
                and "deletes" in s.get("value", "")]
        assert asks and "spare" in asks[-1], "the confirmation names what goes"
        assert k.ok("print('spare' in globals())").strip() == "True", "nothing goes before Yes"
        yes = k.find("ButtonModel", description="Yes, rescue")[-1]
        k.comm(yes, {"method": "custom", "content": {"event": "click"}})
        status = [s["value"] for s in k.models.values() if s.get("_model_name") == "HTMLModel"
                  and "rescue freed" in s.get("value", "")]
        assert status and "the rerun succeeded" in status[-1] and "spare" in status[-1], status
        assert k.ok("print('spare' in globals(), 'done' in globals())").split() == ["False", "True"]
        assert k.ok("print(other.numel())").strip() == str(8 * MiB)
    finally:
        k.close()


# -- in-process: chains, the rule, bad input ---------------------------------------------
def test_a_chained_exception_is_a_hidden_holder_cleared_by_the_hidden_only_purge(ip):
    from jupyter_gpumem.core.scan.chains import LAST

    run(ip, "import torch\ndef load():\n    t = torch.ones(3 << 20)\n    raise KeyError(1)")
    run(ip, "try:\n    load()\nexcept KeyError:\n    raise ValueError('while handling')",
        expect_error=True)
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    chain = [h for h in snap.holders if h.name == LAST + ".__context__"]
    assert chain and chain[0].hidden and chain[0].total >= 12 << 20
    result = ip.run_line_magic("gpumem", "purge --device cpu -o")
    assert LAST + ".__context__" in result.removed
    assert not [h for h in ip.run_line_magic("gpumem", "--device cpu -o").holders if h.hidden]


def test_an_exception_group_member_is_named_as_the_user_reaches_it(ip):
    from jupyter_gpumem.core.scan.chains import LAST

    run(ip, "import torch\ndef bad():\n    t = torch.ones(2 << 20)\n    raise OSError(1)")
    run(ip, "errs = []\ntry:\n    bad()\nexcept OSError as e:\n    errs.append(e)\n"
        "raise ExceptionGroup('many', [ValueError(2), errs.pop()])", expect_error=True)
    names = {h.name for h in ip.run_line_magic("gpumem", "--device cpu -o").holders if h.hidden}
    assert LAST + ".exceptions[1]" in names, names


def test_rescue_with_nothing_to_rescue_or_a_bad_name_changes_nothing(ip):
    from IPython.core.error import UsageError

    from jupyter_gpumem.session import session_of
    session_of(ip).rescue.offer = None   # an error another test file's cells left behind
    with pytest.raises(UsageError, match="no out-of-memory error"):
        ip.run_line_magic("gpumem", "rescue")
    run(ip, "import torch\nkeep = torch.ones(1 << 20)")
    run(ip, "raise MemoryError('Unable to allocate 1.00 GiB for an array')", expect_error=True)
    with pytest.raises(UsageError):
        ip.run_line_magic("gpumem", "rescue no_such_name")
    assert "keep" in ip.user_ns
    assert session_of(ip).rescue.offer is not None, "a refused rescue keeps the offer"


def test_a_failed_cell_that_awaits_is_rerun_awaited(ip):
    run(ip, "import asyncio\ntries = globals().get('tries', 0) + 1")
    run(ip, "await asyncio.sleep(0)\ntries += 1\nif tries < 3:\n    raise MemoryError('Unable to "
        "allocate 8.00 MiB')\nresult = 'awaited'", expect_error=True)
    from jupyter_gpumem.session import session_of
    assert session_of(ip).rescue.offer.awaits
    run(ip, "%gpumem rescue")
    assert ip.user_ns.get("result") == "awaited"


def test_the_frameworks_errors_are_known_from_their_real_classes():
    from jupyter_gpumem.core.rescue.oom import framework_of, requested_bytes

    tf = pytest.importorskip("tensorflow")
    e = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape"
                                         "[1024,1024,256] and type float on /job:localhost/"
                                         "replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
    assert framework_of(e) == "tensorflow" and requested_bytes(str(e)) == 1 << 30
    jax_errors = pytest.importorskip("jax.errors")
    e = jax_errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                                   "4294967296 bytes.")
    assert framework_of(e) == "jax" and requested_bytes(str(e)) == 4 << 30
    # CuPy is not installed here: its class is known by its name, its message parsed
    OutOfMemoryError = type("OutOfMemoryError", (MemoryError,), {})
    e = OutOfMemoryError("Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes).")
    assert framework_of(e) is not None and requested_bytes(str(e)) == 1 << 30
    assert framework_of(ValueError("shape mismatch")) is None


def test_a_rerun_that_fails_again_leaves_a_new_offer(ip, capsys):
    from jupyter_gpumem.session import session_of

    run(ip, "import torch\nspare = torch.ones(1 << 20)\nattempts = 0")
    cell = "attempts += 1\nif attempts < 3:\n    raise MemoryError('Unable to allocate 2.00 MiB')\nok = attempts"
    run(ip, cell, expect_error=True)
    first = session_of(ip).rescue.offer
    assert first is not None and "spare" in dict(first.names)
    result = ip.run_line_magic("gpumem", "rescue -o")
    assert result.success is False and "MemoryError" in result.error
    second = session_of(ip).rescue.offer
    assert second is not None and second is not first, "a new offer for the new failure"
    assert "%gpumem rescue" in capsys.readouterr().out
    result = ip.run_line_magic("gpumem", "rescue spare -o")
    assert result.success and "spare" in result.removed and "spare" not in ip.user_ns
    assert ip.user_ns["ok"] == 3 and session_of(ip).rescue.offer is None


CUDA_CAPPED = ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
               "139.81 GiB of which 133.27 GiB is free. Including non-PyTorch memory, this process "
               "has 6.52 GiB memory in use. 6.00 GiB allowed; Of the allocated memory 456.00 MiB "
               "is allocated by PyTorch, and 4.49 GiB is reserved by PyTorch but unallocated.")


def test_fragmentation_is_told_from_the_allocators_message_and_the_advice_only_while_off(
        monkeypatch):
    from jupyter_gpumem.core.rescue.oom import EXPANDABLE, read_oom

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    error = type("OutOfMemoryError", (RuntimeError,), {})(CUDA_CAPPED)
    info = read_oom(error)
    assert info.device == "cuda:0" and info.requested == 3 << 29
    assert info.free < info.requested <= info.total_free, "the room under the cap, not NVML's"
    assert info.fragmented and any(EXPANDABLE in line and "new process" in line
                                   for line in info.lines())
    info.largest_free_block = 2 << 30       # a block large enough: not fragmentation
    assert not info.fragmented
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6,expandable_segments:True")
    info = read_oom(error)
    assert info.fragmented and not any(EXPANDABLE in line for line in info.lines())
    plain = type("OutOfMemoryError", (RuntimeError,), {})(
        CUDA_CAPPED.replace("4.49 GiB is reserved", "20.00 MiB is reserved"))
    assert not read_oom(plain).fragmented, "not enough free in total: plain lack of memory"


def test_in_a_kernel_a_failed_cell_that_awaits_is_rerun_awaited():
    k = Kernel()
    try:
        k.ok("%load_ext jupyter_gpumem\n%config GpuMemMagics.default_device = 'cpu'\n"
             "import asyncio\ntries = 0")
        failed = k.run("await asyncio.sleep(0)\ntries += 1\nif tries < 2:\n"
                       "    raise MemoryError('Unable to allocate 8.00 MiB')\nprint('awaited', tries)")
        assert failed.errors and "%gpumem rescue" in failed.text
        rescued = k.run("%gpumem rescue")
        assert rescued.ok, (rescued.errors, rescued.text)
        assert "awaited 2" in rescued.text and "the rerun succeeded" in rescued.text
    finally:
        k.close()
