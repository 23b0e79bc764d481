"""One teardown: loading and unloading the extension 20 times, with every view open
each time, leaves the shell as it was: its event hooks, input transformers, magics,
comm targets, threads, patches, import hooks, standard streams and sampling.

A fresh interpreter (so the baseline is a shell that never saw the extension), a real
IPython shell, real ipywidgets for the panel, the real ``comm`` package for the
sidebar, real torch tensors on the CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent(r'''
    import gc, json, resource, sys, threading, tracemalloc, uuid
    import comm
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    manager = comm.get_comm_manager()

    def state():
        """Everything of the shell and the process the extension may add to."""
        from jupyter_gpumem import session as _session
        from jupyter_gpumem.watch.peaks import LEDGER
        torch = sys.modules.get("torch")
        patched = []
        if torch is not None:
            for mod in (torch.cuda, torch.cuda.memory):
                for name in dir(mod):
                    if getattr(getattr(mod, name, None), "__jupyter_gpumem__", False):
                        patched.append(f"{mod.__name__}.{name}")
        return {
            "callbacks": sorted(f"{ev}:{getattr(cb, '__qualname__', repr(cb))}"
                                for ev, cbs in ip.events.callbacks.items() for cb in cbs),
            "transformers": [repr(t) for t in ip.input_transformers_cleanup],
            "magics": sorted(n for kind in ("line", "cell") for n in ip.magics_manager.magics[kind]
                             if n in ("gpumem", "gpuwatch")),
            # (IPython's own ExtensionMagics comes with the first %load_ext of anything)
            "registry": sorted(set(ip.magics_manager.registry) - {"ExtensionMagics"}),
            "comm_targets": sorted(manager.targets),
            "comms": len(manager.comms),
            "threads": sorted(t.name for t in threading.enumerate() if "gpumem" in t.name),
            "session": _session.session_of(ip) is not None,
            "meta_path": [type(f).__name__ for f in sys.meta_path],
            "tracemalloc": tracemalloc.is_tracing(),
            "getrusage": bool(getattr(resource.getrusage, "__jupyter_gpumem__", False)),
            "torch_patched": patched,
            "ledger_open": LEDGER.open_count(),
            "stdout": [type(sys.stdout).__name__, type(sys.stdout.write).__name__,
                       "flush" in vars(sys.stdout) if hasattr(sys.stdout, "__dict__") else False],
            "stderr": [type(sys.stderr).__name__, type(sys.stderr.write).__name__,
                       "flush" in vars(sys.stderr) if hasattr(sys.stderr, "__dict__") else False],
            "settings_observers": 0,
        }

    def open_sidebar():
        from jupyter_gpumem.views import comm as gpucomm
        c = comm.create_comm(target_name=gpucomm.TARGET, primary=False, comm_id=uuid.uuid4().hex)
        manager.register_comm(c)
        manager.targets[gpucomm.TARGET](c, {"content": {"comm_id": c.comm_id,
                                                         "target_name": gpucomm.TARGET, "data": {}}})
        c.handle_msg({"content": {"comm_id": c.comm_id, "data": {"type": "set_device", "device": "cpu"}}})
        return c

    def cell(code):
        r = ip.run_cell(code, store_history=True)
        assert r.success, (code, r.error_before_exec or r.error_in_exec)

    # imported before the baseline: the user's, not ours (ipywidgets registers its own
    # comm targets on import)
    import ipywidgets, torch  # noqa: F401,E401
    baseline = state()
    counts, loaded = [], None
    for i in range(20):
        cell("%load_ext jupyter_gpumem")
        cell("import torch\nt = torch.ones(1000)")
        cell("%gpumem watch on --device cpu --interval 0.01")
        cell("%gpumem panel --device cpu --interval 0.05")
        sidebar = open_sidebar()
        cell("%gpumem trace on")
        cell("%%gpuwatch --device cpu\nu = torch.ones(2000)")
        cell("%gpumem --device cpu")
        if loaded is None:
            loaded = state()
        cell("%unload_ext jupyter_gpumem")
        sidebar.close()
        after = state()
        if after != baseline:
            print("DIFF " + json.dumps({k: [baseline[k], after[k]] for k in after
                                        if after[k] != baseline[k]}))
            break
        ip.user_ns.pop("t", None); ip.user_ns.pop("u", None)
        gc.collect()
        counts.append(len(gc.get_objects()))
    print("RESULT " + json.dumps({"cycles": len(counts), "counts": counts,
                                  "loaded": {k: loaded[k] for k in ("threads", "comm_targets",
                                                                   "magics", "session")}}))
''')


def test_twenty_load_unload_cycles_with_every_view_open_leave_the_shell_as_it_was():
    pytest.importorskip("torch")
    pytest.importorskip("ipywidgets")
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    diffs = [ln for ln in proc.stdout.splitlines() if ln.startswith("DIFF ")]
    assert not diffs, diffs[0]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["cycles"] == 20
    # every view was open: the state compared really had something to take back
    loaded = got["loaded"]
    assert loaded["threads"] == ["jupyter_gpumem-sampler"] and loaded["session"]
    assert "jupyter_gpumem" in loaded["comm_targets"] and loaded["magics"] == ["gpumem", "gpumem", "gpuwatch"]
    # nothing piles up from one cycle to the next (the first cycles warm caches up)
    counts = got["counts"]
    assert counts[-1] - counts[4] < 15 * 200, counts
