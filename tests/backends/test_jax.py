"""JAX (CPU build) and Keras 3 on JAX: attribution, shards, DLPack, purge.

JAX stays out of the main test process (its import changes every later test's
scan, and it must not meet TensorFlow): each ``check_*`` below runs in one
child pytest process (with two host devices, so arrays can be sharded, and
Keras on its JAX backend), and ``test_in_own_process[check_...]`` reports
each one's outcome here. JAX is required (``.ci/run`` installs it); a
missing one fails, it is not skipped.
"""
from __future__ import annotations

import gc

import pytest

from child_checks import (SHELL_ON_ALL_DEVICES, assert_passed, in_child, names_of_checks,
                          run_checks, run_python)
from conftest import holder, purge, report, run

FRAMEWORK = "jax"
CHILD = in_child(FRAMEWORK)
MiB = 1 << 20


# -- the parent: run every check in one child process ------------------------------
def _checks() -> list[str]:
    return names_of_checks(globals())


@pytest.fixture(scope="module")
def child_results(tmp_path_factory):
    return run_checks(__file__, FRAMEWORK, ".ci/run installs jax", tmp_path_factory.mktemp("child"),
        KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2", TF_CPP_MIN_LOG_LEVEL="2")


def pytest_generate_tests(metafunc):
    if "check" in metafunc.fixturenames:
        metafunc.parametrize("check", _checks())


def test_in_own_process(child_results, check):
    assert_passed(child_results, check)


# -- the checks (run in the child) ---------------------------------------------------
@pytest.fixture
def jax():
    import jax

    return jax


def live_ids(jax) -> set[int]:
    return {id(a) for a in jax.live_arrays()}


def check_array_is_blamed_and_purged(ip, jax):
    run(ip, "import jax, jax.numpy as jnp\na = jnp.ones((1024, 1024))\nkeep = jnp.ones(1024)")
    h = holder(report(ip), "a")
    assert (h.unique, h.devices, h.type) == (4 * MiB, {"cpu": 4 * MiB}, "ArrayImpl")
    a_id, keep = id(ip.user_ns["a"]), ip.user_ns["keep"]
    result = purge(ip, "a")
    gc.collect()
    assert result.freed["cpu"] == 4 * MiB
    assert a_id not in live_ids(jax) and id(keep) in live_ids(jax)


def check_pytree_and_output_history(ip, jax):
    run(ip, "import jax, jax.numpy as jnp\n"
            "params = {'w': jnp.zeros((512, 1024)), 'b': [jnp.zeros(1024)]}")
    run(ip, "params['w'] * 2")
    snap = report(ip)
    h = holder(snap, "params")
    assert h.unique == 2 * MiB + 4096 and h.largest_path == "params['w']"
    out = next(h for h in snap.holders if h.hidden)
    assert out.name.startswith("Out[") and out.unique == 2 * MiB
    purge(ip, "params")  # the Out entry does not share params' buffers: it stays
    assert any(h.hidden for h in report(ip).holders)
    purge(ip, "")
    gc.collect()
    assert not jax.live_arrays()


def check_sharded_array_counts_every_shard(ip, jax):
    run(ip, "import jax, jax.numpy as jnp, numpy as np\n"
            "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
            "mesh = Mesh(np.array(jax.devices()), ('x',))\n"
            "s = jax.device_put(jnp.ones((1024, 1024)), NamedSharding(mesh, P('x')))\n"
            "r = jax.device_put(jnp.ones((512, 1024)), NamedSharding(mesh, P()))")
    assert len(jax.devices()) == 2
    snap = report(ip, "s r")
    assert holder(snap, "s").unique == 4 * MiB and holder(snap, "s").tensors == 2
    assert holder(snap, "r").unique == 2 * 2 * MiB  # replicated: one copy per device


def check_unreachable_arrays_are_the_unattributed_rest(ip, jax):
    run(ip, "import jax, jax.numpy as jnp, json\nseen = jnp.ones(1024)\n"
            "json._hidden_by_test = jnp.ones((1024, 1024))")  # a library module is not walked
    try:
        snap = report(ip)
        cpu = next(d for d in snap.devices if d.id == "cpu")
        fw = next(f for f in cpu.frameworks if f.name == "jax")
        assert fw.allocated == 4 * MiB + 4096
        assert snap.unattributed["cpu"] >= 4 * MiB
    finally:
        import json

        del json._hidden_by_test


def check_array_shared_with_torch_through_dlpack_counts_once(ip, jax):
    run(ip, "import jax, jax.numpy as jnp, torch\na = jnp.ones((1024, 1024))\n"
            "t = torch.from_dlpack(a)")
    snap = report(ip)
    assert (holder(snap, "a").shared, holder(snap, "t").shared) == (4 * MiB, 4 * MiB)
    assert next(d for d in snap.devices if d.id == "cpu").attributed == 4 * MiB
    result = purge(ip, "a t")
    assert result.freed["cpu"] == 4 * MiB and not result.still_held


def check_keras_model_on_jax_is_blamed_and_purged(ip, jax):
    run(ip, "import os, keras\nassert keras.backend.backend() == 'jax'\n"
            "model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024), "
            "keras.layers.Dense(8)])\nmodel.build((None, 256))")
    weights = (256 * 1024 + 1024 + 1024 * 8 + 8) * 4
    snap = report(ip, "model")
    h = holder(snap, "model")
    assert h.unique == weights and h.largest_path == "model._layers[1]._kernel"
    before = len(jax.live_arrays())
    purge(ip, "model")
    gc.collect()
    assert before - len(jax.live_arrays()) >= 4


def check_preallocation_note_names_pool_in_use_and_the_cure(jax):
    from jupyter_gpumem.backends.jax import JaxBackend

    # the figures memory_stats() gave on an H200 right after the first array
    stats = {"bytes_in_use": 256, "pool_bytes": 106 << 30, "peak_bytes_in_use": 256,
             "bytes_limit": 106 << 30, "largest_free_block_bytes": (106 << 30) - 256}
    usage = JaxBackend()._from_stats("cuda:0", stats)
    assert (usage.allocated, usage.pool, usage.reserved) == (256, 106 << 30, 106 << 30)
    assert "preallocated a pool of 106.0 GiB" in usage.note and "256 B" in usage.note
    assert "%gpumem tame" in usage.note and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in usage.note
    small = JaxBackend()._from_stats("cuda:0", {"bytes_in_use": 1 << 20, "pool_bytes": 2 << 20})
    assert small.note is None


def check_importing_jax_does_not_create_its_backends(tmp_path):
    proc = run_python("import jax\nfrom jax._src import xla_bridge\n" + SHELL_ON_ALL_DEVICES +
                      "print('STARTED', xla_bridge.backends_are_initialized())\n")
    assert "STARTED False" in proc.stdout, proc.stdout + proc.stderr
