"""Loading, unloading, output forms and the Python API."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import ipython_with_profile, run

FRAMEWORKS = ("torch", "tensorflow", "jax", "cupy")


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_load_and_report_import_no_framework():
    out = _python("""
        import sys
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_cell("%load_ext jupyter_gpumem")
        ip.run_cell("x = [1, 2, 3]")
        ip.run_cell("%gpumem")
        ip.run_cell("%gpumem --device all")
        ip.run_cell("%gpumem purge --dry-run")
        print("IMPORTED", [m for m in ("torch", "tensorflow", "jax", "cupy") if m in sys.modules])
    """)
    assert "IMPORTED []" in out
    assert "no accelerator" in out


def test_unload_removes_every_magic_hook_thread_and_comm_target():
    out = _python("""
        import threading
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        def ours():
            cbs = [cb for ev in ip.events.callbacks.values() for cb in ev
                   if 'jupyter_gpumem' in getattr(cb, '__module__', '') or
                      'jupyter_gpumem' in repr(getattr(cb, '__self__', ''))]
            threads = [t.name for t in threading.enumerate() if 'gpumem' in t.name]
            magics = [n for kind in ('line', 'cell') for n in ip.magics_manager.magics[kind]
                      if n in ('gpumem', 'gpuwatch')]
            return cbs, threads, magics, 'GpuMemMagics' in ip.magics_manager.registry
        before = ours()
        ip.run_cell("%load_ext jupyter_gpumem")
        ip.run_cell("import torch; t = torch.ones(10)")
        ip.run_cell("%gpumem watch on --device cpu")
        loaded = ours()
        ip.run_cell("%unload_ext jupyter_gpumem")
        after = ours()
        print("LOADED", loaded[2], loaded[3])
        print("AFTER", after == before, after)
        ip.run_cell("%load_ext jupyter_gpumem")
        print("RELOADED", ours()[2])
    """)
    assert "LOADED ['gpumem', 'gpuwatch', 'gpumem'] True" in out   # line gpumem; cell gpuwatch, gpumem (fit)
    assert "AFTER True" in out, out
    assert "RELOADED ['gpumem', 'gpuwatch', 'gpumem']" in out


def test_autoload_through_ipython_config(tmp_path):
    out = ipython_with_profile(
        tmp_path, "c.InteractiveShellApp.extensions = ['jupyter_gpumem']\n"
        "c.GpuMemMagics.default_device = 'cpu'\n",
        "m = get_ipython().find_magic('gpumem').__self__; print('DEVICE', m.default_device)")
    assert "DEVICE cpu" in out.stdout, out.stdout + out.stderr


def test_config_magic_sets_traits(ip):
    ip.run_line_magic("config", "GpuMemMagics.default_device = 'cpu'")
    try:
        run(ip, "import torch\nt = torch.ones(1024)")
        snap = ip.run_line_magic("gpumem", "-o")
        assert snap.device == "cpu" and snap.holder("t") is not None
    finally:
        ip.run_line_magic("config", "GpuMemMagics.default_device = 'auto'")


def test_output_forms_share_one_result(ip):
    pytest.importorskip("torch")
    run(ip, "import torch\nmodel = torch.nn.Linear(256, 256)\nsmall = torch.ones(4)")
    snap = ip.run_line_magic("gpumem", "--device cpu -o")
    data = snap.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["schema"] == "jupyter_gpumem.snapshot/1"
    names = [h["name"] for h in data["holders"]]
    assert names[0] == "model", "largest first"
    text = repr(snap)
    header = next(line for line in text.splitlines() if line.startswith("holder"))
    row = next(line for line in text.splitlines() if line.startswith("model"))
    assert row.index("257.0 KiB") + len("257.0 KiB") == header.index("only it") + len("only it"), \
        "byte columns are right-aligned under their header"
    html = snap._repr_html_()
    assert "<table" in html and "model.weight" in html
    result = ip.run_line_magic("gpumem", "purge model --device cpu -o")
    rdata = result.to_json()
    assert json.loads(json.dumps(rdata)) == rdata and rdata["removed"] == ["model"]
    assert "<table" in result._repr_html_() and "freed" in repr(result)


def test_holders_are_kept_without_references(ip):
    """A kept Snapshot pins no memory: it holds names and numbers only."""
    torch = pytest.importorskip("torch")
    from torch.multiprocessing.reductions import StorageWeakRef

    run(ip, "import torch\nt = torch.ones(1 << 18)")
    ref = StorageWeakRef(ip.user_ns["t"].untyped_storage())
    snap = ip.run_line_magic("gpumem", "t --device cpu -o")
    ip.run_line_magic("gpumem", "purge t --device cpu")
    import gc

    gc.collect()
    assert ref.expired() and snap.holder("t").total == 1 << 20


def test_python_api_from_a_plain_script():
    out = _python("""
        import gc, torch, jupyter_gpumem
        from torch.multiprocessing.reductions import StorageWeakRef
        ns = {"weights": torch.ones(1 << 18), "cfg": {"lr": 0.1, "buf": torch.zeros(1 << 16)}}
        ref = StorageWeakRef(ns["weights"].untyped_storage())
        snap = jupyter_gpumem.snapshot(ns, device="cpu")
        print("HOLDERS", [(h.name, h.unique) for h in snap.holders])
        try:
            jupyter_gpumem.purge(["nosuch"], namespace=ns, device="cpu")
        except jupyter_gpumem.PurgeError as exc:
            print("ERROR", exc)
        res = jupyter_gpumem.purge(["weights", "cfg['buf']"], namespace=ns, device="cpu")
        gc.collect()
        print("GONE", ref.expired(), sorted(ns), sorted(ns["cfg"]), res.freed)
    """)
    assert "HOLDERS [('weights', 1048576), ('cfg', 262144)]" in out
    assert "ERROR name 'nosuch' is not defined (nothing was deleted)" in out
    assert "GONE True ['cfg'] ['lr'] {'cpu': 1310720}" in out


def test_gpumem_name_shows_that_names_storages_not_the_holders_table(ip):
    import torch

    ip.user_ns.update(model=torch.nn.Linear(64, 64), other=torch.ones(1000))
    text = repr(ip.run_line_magic("gpumem", "model --device cpu -o"))
    assert "model: 16.2 KiB in 2 storage(s)" in text and "model.weight" in text, text
    assert "only it" not in text and "other" not in text, text


def test_a_rejected_setting_is_said_once_per_process_not_at_each_reload(tmp_path):
    """A bad value in ipython_config.py costs one line at the first load, and the setting
    keeps its default; %reload_ext and %load_ext again do not say it again."""
    out = ipython_with_profile(
        tmp_path, "c.InteractiveShellApp.extensions = ['jupyter_gpumem']\n"
        "c.GpuMemMagics.scan_time_limit = -1\n",
        "ip = get_ipython()\nip.run_line_magic('reload_ext', 'jupyter_gpumem')\n"
        "ip.run_line_magic('unload_ext', 'jupyter_gpumem')\n"
        "ip.run_line_magic('load_ext', 'jupyter_gpumem')\n"
        "m = ip.find_magic('gpumem').__self__; print('LIMIT', m.scan_time_limit)")
    said = out.stdout + out.stderr
    assert said.count("GpuMemMagics.scan_time_limit") == 1, said
    assert "the setting keeps 3.0" in said and "LIMIT 3.0" in out.stdout, said


def test_each_commands_help_is_shown_and_nothing_runs(ip, capsys):
    """``--help`` of a command prints its options (not "unrecognized arguments") and runs
    nothing, quietly (no error after the help): the cell under ``%%gpuwatch --help`` does
    not run."""
    for line in ("purge --help", "watch --help", "trace -h", "history --help", "plot --help",
                 "purge --all --help", "rescue --help"):
        capsys.readouterr()
        result = ip.run_cell(f"%gpumem {line}")
        out = capsys.readouterr()
        command = "%gpumem " + line.split()[0]
        assert out.out.lstrip().startswith(f"{command} [-h]"), out.out[:200]
        assert "docs/GUIDE.md" in out.out and "unrecognized" not in out.out + out.err
        assert result.success and result.result is None, result
        assert "Error" not in out.out + out.err, out.out + out.err
    ip.user_ns.pop("ran_it", None)
    capsys.readouterr()
    ip.run_cell("%%gpuwatch --help\nran_it = True")
    out = capsys.readouterr()
    assert out.out.lstrip().startswith("%%gpuwatch [-h]") and "ran_it" not in ip.user_ns
    assert "Error" not in out.out + out.err, out.out + out.err
    for line, cell in (("%%gpumem fit bs --help", "ran_it = True"),
                       ("%%gpuwatch --help", "await __import__('asyncio').sleep(0)\nran_it = True")):
        result = ip.run_cell(f"{line}\n{cell}")
        out = capsys.readouterr()
        assert result.success and "ran_it" not in ip.user_ns, (line, out.out[-300:], out.err)
        assert "[-h]" in out.out and "Error" not in out.out + out.err, out.out + out.err


def test_the_guide_is_found_in_a_checkout_and_in_a_wheels_package(tmp_path):
    """--help ends with where the guide is: docs/GUIDE.md in a checkout; in an installed
    wheel (no docs/ beside the package) the copy the wheel carries, by its path."""
    from jupyter_gpumem.magics.args import GUIDE, guide

    assert GUIDE == "docs/GUIDE.md"      # this checkout
    package = tmp_path / "site-packages" / "jupyter_gpumem"
    package.mkdir(parents=True)
    assert guide(package) == "docs/GUIDE.md of the project's source"
    (package.parent / "docs").mkdir()    # another package's docs/ in site-packages
    (package.parent / "docs" / "GUIDE.md").write_text("# not ours")
    assert guide(package) == "docs/GUIDE.md of the project's source"
    (package / "GUIDE.md").write_text("# guide")
    assert guide(package) == str(package / "GUIDE.md")
