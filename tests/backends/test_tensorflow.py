"""TensorFlow and Keras 3 on the CPU: attribution, DLPack sharing, purge.

TensorFlow stays out of the main test process (its import changes every later
test's scan, and it must not meet JAX): each ``check_*`` below runs in a child
pytest process, and ``test_in_own_process[...-check_...]`` reports each one's
outcome here. TensorFlow is required (``.ci/run`` installs tensorflow-cpu); a
missing one fails, it is not skipped.

TensorFlow's CPU allocator depends on the CPU: with oneDNN (TensorFlow's
default where the CPU has AVX-512) it keeps statistics, without oneDNN (the
default elsewhere) it keeps none and ``get_memory_info('CPU:0')`` raises. So
every check runs twice, in one child with ``TF_ENABLE_ONEDNN_OPTS=1`` and in
one with ``=0``, whatever this machine's default is.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref

import pytest

from child_checks import (ROOT, SHELL_ON_ALL_DEVICES, assert_passed, in_child,
                          names_of_checks, run_checks, run_python)
from conftest import holder, purge, report, run

FRAMEWORK = "tensorflow"
CHILD = in_child(FRAMEWORK)
MiB = 1 << 20
#: the children's settings: ``TF_ENABLE_ONEDNN_OPTS`` for each
ONEDNN = {"onednn-on": "1", "onednn-off": "0"}
#: in a child: does TensorFlow's CPU allocator keep statistics? (checked by
#: ``check_the_allocator_keeps_statistics_only_with_onednn``)
STATS = os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1"


# -- the parent: run every check in one child process per setting --------------------
def _checks() -> list[str]:
    return names_of_checks(globals())


@pytest.fixture(scope="module")
def child_results(onednn, tmp_path_factory):
    return run_checks(__file__, FRAMEWORK, ".ci/run installs tensorflow-cpu==2.21.0",
                      tmp_path_factory.mktemp(f"child-{onednn}"),
                      TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
                      TF_ENABLE_ONEDNN_OPTS=ONEDNN[onednn], TF_CPU_ALLOCATOR_USE_BFC=None)


def pytest_generate_tests(metafunc):
    if "check" in metafunc.fixturenames:
        metafunc.parametrize("onednn", list(ONEDNN), scope="module")
        metafunc.parametrize("check", _checks())


def test_in_own_process(child_results, check):
    assert_passed(child_results, check)


REMEDY = """
import json
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic('load_ext', 'jupyter_gpumem')
ip.run_line_magic('env', 'TF_CPU_ALLOCATOR_USE_BFC=true')
ip.run_cell('import tensorflow as tf\\nx = tf.ones((1024, 1024))')
snap = ip.run_line_magic('gpumem', '--device cpu -o').to_json()
cpu = next(d for d in snap['devices'] if d['id'] == 'cpu')
print('RESULT', json.dumps([f for f in cpu['frameworks'] if f['name'] == 'tensorflow']))
"""


def test_the_remedy_the_note_gives_brings_the_host_figures_back():
    """Without oneDNN the report says to restart, run ``%env TF_CPU_ALLOCATOR_USE_BFC=true``
    and then import tensorflow; doing just that gives TensorFlow's host figures."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CPU_ALLOCATOR_USE_BFC", None)
    proc = subprocess.run([sys.executable, "-c", REMEDY], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    (fw,) = json.loads(lines[0][len("RESULT "):])
    assert fw["allocated"] is not None and fw["allocated"] >= 4 * MiB, fw
    assert fw["peak"] >= fw["allocated"], fw
    assert fw["note"] is None, fw


# -- the checks (run in the child) ---------------------------------------------------
@pytest.fixture
def tf():
    import tensorflow

    return tensorflow


def current(tf) -> int:
    """What TensorFlow's CPU allocator holds (only where it keeps statistics: oneDNN on)."""
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


class Released:
    """Bytes a purge gave back to TensorFlow, from the objects that held them.

    Where the CPU allocator keeps statistics (oneDNN on): the drop in what it
    holds. Where it keeps none (oneDNN off): the watched tensors' and
    variables' own bytes. Either way every one of them must be gone (weak
    references). Watch them before the purge; the watch keeps no strong
    reference.
    """

    def __init__(self, tf, objects):
        self.tf = tf
        self.before = current(tf) if STATS else None
        self.refs = [weakref.ref(o) for o in objects]
        self.nbytes = sum(o.shape.num_elements() * o.dtype.size for o in objects)

    def freed(self) -> int:
        settle()
        alive = [r() for r in self.refs if r() is not None]
        assert not alive, f"{len(alive)} of {len(self.refs)} watched objects outlived the purge"
        return self.before - current(self.tf) if STATS else self.nbytes


def settle():
    gc.collect()


def check_eager_tensor_is_blamed_and_purged(ip, tf):
    run(ip, "import tensorflow as tf\nx = tf.ones((1024, 1024))\nkeep = tf.ones((256, 1024))")
    h = holder(report(ip), "x")
    assert h.unique == 4 * MiB and h.devices == {"cpu": 4 * MiB} and h.type == "EagerTensor"
    released = Released(tf, [ip.user_ns["x"]])
    result = purge(ip, "x")
    settle()
    assert "x" not in ip.user_ns and "keep" in ip.user_ns
    assert result.freed["cpu"] == 4 * MiB
    assert released.freed() >= 4 * MiB


def check_identity_variable_and_read_share_one_buffer(ip, tf):
    run(ip, "import tensorflow as tf\nx = tf.ones((1024, 1024))\ny = tf.identity(x)\n"
            "v = tf.Variable(x)")
    snap = report(ip)
    for name in ("x", "y", "v"):
        h = holder(snap, name)
        assert (h.unique, h.shared) == (0, 4 * MiB), (name, h.unique, h.shared)
    assert sorted(holder(snap, "x").shared_with) == ["v", "y"]
    cpu = next(d for d in snap.devices if d.id == "cpu")
    assert cpu.attributed == 4 * MiB  # one buffer, counted once


def check_variable_is_blamed_and_purged(ip, tf):
    run(ip, "import tensorflow as tf\nv = tf.Variable(tf.zeros((1024, 2048)))")
    h = holder(report(ip), "v")
    assert h.unique == 8 * MiB and h.type == "ResourceVariable"
    released = Released(tf, [ip.user_ns["v"]])
    purge(ip, "v")
    settle()
    assert released.freed() >= 8 * MiB


KERAS_STEP = """
import numpy as np, tensorflow as tf, keras
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(2048, activation="relu"),
                          keras.layers.Dense(16)])
opt = keras.optimizers.Adam()
x = np.ones((8, 256), np.float32)
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(model(x))
opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
del tape, x
"""


def check_keras_model_and_optimizer_are_blamed_and_purged(ip, tf):
    base = current(tf) if STATS else None
    run(ip, "import tensorflow as tf\nunrelated = tf.ones((64, 1024))")
    run(ip, KERAS_STEP)
    weights = (256 * 2048 + 2048 + 2048 * 16 + 16) * 4
    snap = report(ip, "model")
    m, o = holder(snap, "model"), holder(snap, "opt")
    assert m.type == "Sequential" and o.type == "Adam"
    assert m.total == weights and m.unique == 0  # the optimizer tracks the same variables
    assert "opt" in m.shared_with
    assert o.unique >= 2 * weights  # Adam's two slots per variable
    assert m.largest_path == "model._layers[1]._kernel"
    assert o.largest_path.startswith("opt._")
    rows = {r.path: r for r in holder(snap, "model").rows} if snap.details else {}
    assert rows["model._layers[1]._kernel"].nbytes == 256 * 2048 * 4
    assert o.hint and "purge it together with its model" in o.hint
    # the tf.Variables inside the Keras variables hold the memory
    variables = [v._value for v in ip.user_ns["model"].variables + ip.user_ns["opt"].variables]
    released = Released(tf, variables)
    del variables
    result = purge(ip, "model opt")
    settle()
    assert "unrelated" in ip.user_ns and "model" not in ip.user_ns
    assert not result.still_held
    assert released.freed() >= 3 * weights
    if STATS:  # only an allocator's count sees what no variable holds (checked with oneDNN on)
        assert current(tf) - base <= 64 * 1024 * 4 + 64 * 1024  # back to what `unrelated` holds


def check_purging_the_model_alone_names_the_optimizer(ip, tf):
    run(ip, KERAS_STEP)
    result = purge(ip, "model")
    assert any(s.by == "opt" for s in result.still_held), result.messages


def check_tensor_shared_with_torch_through_dlpack_counts_once(ip, tf):
    run(ip, "import tensorflow as tf, torch\nx = tf.ones((1024, 1024))\n"
            "t = torch.from_dlpack(x)\nu = torch.ones(1024)\n"
            "w = tf.experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(u))")
    snap = report(ip)
    assert (holder(snap, "x").shared, holder(snap, "t").shared) == (4 * MiB, 4 * MiB)
    assert holder(snap, "w").shared_with == ["u"]
    cpu = next(d for d in snap.devices if d.id == "cpu")
    assert cpu.attributed == 4 * MiB + 4096
    purge(ip, "x t")
    settle()
    assert "w" in ip.user_ns and "u" in ip.user_ns


def check_output_history_holds_a_tensor_until_purge(ip, tf):
    run(ip, "import tensorflow as tf")
    run(ip, "tf.ones((1024, 1024))")
    h = next(h for h in report(ip).holders if h.hidden)
    assert h.name.startswith("Out[") and h.unique == 4 * MiB
    released = Released(tf, [ip.user_ns["_"]])
    purge(ip, "")
    settle()
    assert released.freed() >= 4 * MiB


def check_string_and_resource_tensors_are_skipped_safely(ip, tf):
    # TensorFlow aborts the process if a string tensor is exported through DLPack
    run(ip, "import tensorflow as tf\ns = tf.constant(['x' * 1000] * 100)\n"
            "h = tf.Variable(1.0).handle\nn = tf.ones((1024,))")
    snap = report(ip)
    assert snap.holder("s") is None and snap.holder("h") is None
    assert holder(snap, "n").unique == 4096


def check_the_allocator_keeps_statistics_only_with_onednn(tf):
    """The premise of the two children: each really runs the allocator it is meant to."""
    from tensorflow.python.util import _pywrap_util_port

    assert _pywrap_util_port.IsMklEnabled() == STATS
    assert "TF_CPU_ALLOCATOR_USE_BFC" not in os.environ
    if STATS:
        assert tf.config.experimental.get_memory_info("CPU:0")["current"] >= 0
    else:
        with pytest.raises(ValueError, match="Allocator stats not available"):
            tf.config.experimental.get_memory_info("CPU:0")


def check_cpu_allocator_figures_are_reported_or_the_report_says_why_not(ip, tf, monkeypatch):
    run(ip, "import tensorflow as tf\nx = tf.ones((1024, 1024))")
    snap = report(ip)
    cpu = next(d for d in snap.devices if d.id == "cpu")
    fw = next(f for f in cpu.frameworks if f.name == "tensorflow")
    assert cpu.attributed == 4 * MiB  # the scan counts the tensors names reach either way
    notes = [m for m in snap.messages if "allocator statistics" in m]
    if STATS:
        assert fw.allocated == current(tf) and fw.allocated >= 4 * MiB and fw.peak >= fw.allocated
        assert fw.note is None and not notes, snap.messages
        return
    # no statistics: no figure is made up, and one note says why and what to do
    assert (fw.allocated, fw.peak) == (None, None)
    assert snap.unattributed["cpu"] is None  # unknown, not zero
    assert notes == [f"cpu: {fw.note}"], snap.messages
    note = fw.note
    assert "oneDNN is off: TF_ENABLE_ONEDNN_OPTS=0" in note
    assert "restart the kernel, run `%env TF_CPU_ALLOCATOR_USE_BFC=true`, then import tensorflow" \
        in note
    assert f"note: {notes[0]}" in repr(snap).splitlines()
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in snap._repr_html_()
    json_fw = next(f for d in snap.to_json()["devices"] if d["id"] == "cpu"
                   for f in d["frameworks"] if f["name"] == "tensorflow")
    assert {k: json_fw[k] for k in ("allocated", "reserved", "peak", "pool", "note")} == \
        {"allocated": None, "reserved": None, "peak": None, "pool": None, "note": note}
    assert "TF_CPU_ALLOCATOR_USE_BFC" not in os.environ  # the user's to set, never set for them
    # set only after TensorFlow started, it changes nothing: the note says to restart
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    late = next(f for d in report(ip).devices if d.id == "cpu" for f in d.frameworks
                if f.name == "tensorflow")
    assert late.allocated is None
    assert "TF_CPU_ALLOCATOR_USE_BFC is set, but only after TensorFlow had started: restart " \
           "the kernel and set it before importing tensorflow" in late.note


def check_gpu_device_names_map_to_cuda_ordinals(ip, tf):
    from jupyter_gpumem.backends.tensorflow import TensorFlowBackend, _device_from_name

    assert _device_from_name("/job:localhost/replica:0/task:0/device:GPU:1") == ("GPU", 1)
    assert _device_from_name("/job:localhost/replica:0/task:0/device:CPU:0") == ("CPU", 0)
    assert _device_from_name("GPU:3") == ("GPU", 3)
    backend = TensorFlowBackend()
    backend._ordinals = [2, 2, 5]  # two virtual GPUs on CUDA device 2, one on device 5
    assert backend._device_id("GPU", 1) == "cuda:2" and backend._device_id("GPU", 2) == "cuda:5"
    assert backend._device_id("CPU", 0) == "cpu"


def check_importing_tensorflow_does_not_start_its_runtime(tmp_path):
    proc = run_python("import tensorflow as tf\nfrom tensorflow.python.eager import context\n" +
                      SHELL_ON_ALL_DEVICES + "ctx = context.context_safe()\n"
                      "print('STARTED', bool(ctx is not None and ctx._initialized))\n")
    assert "STARTED False" in proc.stdout, proc.stdout + proc.stderr
