"""One owner per shell, one way to do each thing: settings parsed once, the magics' one
argument parser, the session as the one owner of what the extension keeps for a shell."""
from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from traitlets import TraitError

from conftest import run
from jupyter_gpumem import settings as settings_mod

torch = pytest.importorskip("torch")


def _magics(shell):
    return shell.magics_manager.registry["GpuMemMagics"]


@pytest.fixture
def watched(ip):
    yield ip
    run(ip, "%gpumem watch off")
    _magics(ip).warn_at = None


def test_warn_at_is_checked_when_set_and_parsed_once_not_every_cell(watched, capsys,
                                                                    monkeypatch):
    m = _magics(watched)
    m.warn_at = None   # (the shell is the process's: a test before may have set it)
    with pytest.raises(TraitError, match="warn_at"):
        m.warn_at = "lots"
    assert m.warn_at is None and m.warn_share is None
    run(watched, "%config GpuMemMagics.warn_at = '150%'")      # refused: one logged line
    assert m.warn_at is None
    m.warn_at = "12.5%"
    assert m.warn_share == 0.125
    m.warn_at = 0.5
    assert m.warn_share == 0.5
    calls = []
    real = settings_mod.parse_share
    monkeypatch.setattr(settings_mod, "parse_share", lambda v: (calls.append(v), real(v))[1])
    run(watched, "import torch\n%gpumem watch on --device cpu")
    calls.clear()
    run(watched, "keep = torch.ones(1000)")
    run(watched, "x = 1")
    assert calls == [], "the footer reads the parsed share"
    m.warn_at = "1%"
    assert calls and set(calls) == {"1%"}, "parsed as it is set"
    calls.clear()
    capsys.readouterr()
    run(watched, "keep2 = torch.ones(1000)")
    assert "above 1%" in capsys.readouterr().out and calls == []


@pytest.mark.parametrize("line", ["tame off status", "tame --give-back off", "tame maybe",
                                  "tame --give-back=yes", "tame --give", "tame --g"])
def test_tame_refuses_what_it_does_not_know_with_its_usage(ip, line):
    with pytest.raises(UsageError, match=r"unknown arguments '.*': %gpumem tame"):
        ip.run_line_magic("gpumem", line)


def test_tame_help_is_its_help_and_nothing_else(ip, capsys):
    """``tame -h`` prints tame's options and stops there, as every command's --help."""
    assert ip.run_line_magic("gpumem", "tame -h") is None
    out = capsys.readouterr()
    assert "--give-back" in out.out and "unknown" not in out.out + out.err


def test_every_purge_a_shell_can_take_reaches_its_session(ip):
    """The magics', the sidebar's, the panel's, and the API's from a cell (with the shell
    or its ``globals()``): each counts once in the session; a dry run and a refused purge
    (nothing deleted) do not; the panel's shown result goes after a purge from elsewhere."""
    pytest.importorskip("ipywidgets")
    from recording_comm import open_sidebar, send

    from jupyter_gpumem.session import session_of
    from jupyter_gpumem.views import panel as panel_mod

    session = session_of(ip)
    run(ip, "import torch, jupyter_gpumem\n" + "\n".join(
        f"{n} = torch.ones(1000)" for n in ("a", "b", "c", "d", "e", "f")))

    def counted(fn) -> int:
        before = session.purges
        fn()
        return session.purges - before

    assert counted(lambda: run(ip, "%gpumem purge a --device cpu")) == 1
    assert counted(lambda: run(ip, "%gpumem purge b --dry-run --device cpu")) == 0
    assert counted(lambda: run(ip, "%gpumem purge nosuch --device cpu", expect_error=True)) == 0
    # no Dask client: refused before anything is deleted, so nothing counts
    assert counted(lambda: run(ip, "%gpumem purge b --cluster", expect_error=True)) == 0
    assert counted(lambda: run(ip, "jupyter_gpumem.purge(['b'], shell=get_ipython(), "
                                   "device='cpu')")) == 1
    assert counted(lambda: run(ip, "jupyter_gpumem.purge(['c'], namespace=globals(), "
                                   "device='cpu')")) == 1
    sidebar = open_sidebar()
    try:
        send(sidebar, {"type": "set_device", "device": "cpu"})
        assert counted(lambda: send(sidebar, {"type": "purge", "names": ["d"], "dry_run": True})) == 0
        assert counted(lambda: send(sidebar, {"type": "purge", "names": ["d"]})) == 1
    finally:
        sidebar.handle_close({"content": {"comm_id": sidebar.comm_id, "data": {}}})
    assert not session.sampler.subscriptions
    run(ip, "%gpumem panel --device cpu")
    panel = panel_mod.current(ip)
    try:
        panel.checkbox("e").value = True
        panel.purge_button.click()
        assert counted(lambda: panel.confirm_button.click()) == 1
        assert "e" not in ip.user_ns and panel.result.value
        run(ip, "%gpumem purge f --device cpu")
        panel.refresh()
        assert panel.result.value == "", "a purge from elsewhere makes the shown result stale"
    finally:
        panel_mod.close(ip)
    assert not {"a", "b", "c", "d", "e", "f"} & set(ip.user_ns)


def test_closing_the_session_alone_takes_back_everything_the_extension_added(ip):
    """``Session.close`` is the one teardown (``%unload_ext`` calls it): with the footer,
    the panel, the sidebar and trace on, closing the session removes the magics, the cell
    hooks, the input transformer, the comm target and the sampling thread."""
    pytest.importorskip("ipywidgets")
    import threading

    import comm
    from recording_comm import open_sidebar

    from jupyter_gpumem.session import close_session, session_of
    from jupyter_gpumem.views import comm as gpucomm

    def ours() -> dict:
        return {"hooks": sorted(getattr(cb, "__qualname__", "") for cbs in
                                ip.events.callbacks.values() for cb in cbs
                                if "CellDispatch" in getattr(cb, "__qualname__", "")),
                "magics": sorted(n for kind in ("line", "cell")
                                 for n in ip.magics_manager.magics[kind]
                                 if n in ("gpumem", "gpuwatch")),
                "transformers": [t for t in ip.input_transformers_cleanup
                                 if getattr(t, "__jupyter_gpumem__", False)],
                "target": gpucomm.TARGET in comm.get_comm_manager().targets,
                "threads": sorted(t.name for t in threading.enumerate()
                                  if t.name.startswith("jupyter_gpumem") and t.is_alive())}

    run(ip, "import torch\nt = torch.ones(1000)")
    run(ip, "%gpumem watch on --device cpu --interval 0.01")
    run(ip, "%gpumem panel --device cpu --interval 0.05")
    open_sidebar()
    run(ip, "%gpumem trace on --device cpu")
    run(ip, "u = torch.ones(1000)")
    session = session_of(ip)
    loaded = ours()
    # %gpumem (line), %%gpumem (cell: fit) and %%gpuwatch
    assert loaded["magics"] == ["gpumem", "gpumem", "gpuwatch"] and loaded["target"]
    assert loaded["threads"] == ["jupyter_gpumem-sampler"] and loaded["transformers"]
    assert len(loaded["hooks"]) == 2
    try:
        close_session(ip)
        assert ours() == {"hooks": [], "magics": [], "transformers": [], "target": False,
                          "threads": []}
        assert session_of(ip) is None and session.watch is None and session.panel is None
        assert session.comm_hub is None and session.tracer is None and session.sampler.closed
        assert "GpuMemMagics" not in ip.magics_manager.registry
    finally:
        ip.extension_manager.loaded.discard("jupyter_gpumem")
        run(ip, "%load_ext jupyter_gpumem")
