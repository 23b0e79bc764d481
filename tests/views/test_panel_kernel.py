"""The live panel in a real kernel (ipykernel over ZMQ).

One test executes the demo notebook through nbclient and checks the widget
view it displays; the other drives the panel's widgets the way a frontend
does (comm messages of the Jupyter widget protocol) and purges a name.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets")
pytest.importorskip("torch")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import kernel_messages  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "panel.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.fixture
def kernel_env(monkeypatch):
    """Kernels started by the test import jupyter_gpumem from this working tree."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_demo_notebook_shows_the_widget_view(kernel_env):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     store_widget_state=True,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    # run as a person does: the views refresh once the kernel is idle after a cell,
    # so the panel is read a moment after the cell that made `kept`
    # what the panel's checkboxes say in the kernel (widget messages sent after a
    # cell's reply reach a frontend by their comm, but nbclient keeps only a cell's own)
    nb.cells.append(nbformat.v4.new_code_cell(
        "print('checkboxes:', sorted(c.description for c in panel.table.children[2::2]))"))
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
            if "kept =" in cell.source:
                time.sleep(2.0)
        client.set_widgets_metadata()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    panel_cell = next(c for c in nb.cells if c.source.strip() == "%gpumem panel")
    views = [o.data[WIDGET_VIEW] for o in panel_cell.outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(views) == 1 and views[0]["version_major"] == 2
    state = nb.metadata.widgets[WIDGET_STATE]["state"]
    top = state[views[0]["model_id"]]
    assert top["model_name"] == "VBoxModel" and top["model_module"] == "@jupyter-widgets/controls"
    modules = {m["model_module"] for m in state.values()}
    assert modules <= {"@jupyter-widgets/controls", "@jupyter-widgets/base"}  # no custom JS
    checkboxes = {m["state"].get("description") for m in state.values()
                  if m["model_name"] == "CheckboxModel"}
    assert {"model", "opt"} <= checkboxes
    shown = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert all(f"'{name}'" in shown for name in ("model", "opt", "kept")), shown
    html = [m["state"].get("value", "") for m in state.values() if m["model_name"] == "HTMLModel"]
    assert any("data-device=" in v and "data-segment=" in v for v in html)  # device bars
    assert any("<svg" in v and "data-line=" in v for v in html)  # the timeline
    last = "".join(o.get("text", "") for o in nb.cells[-3].outputs)
    assert "readings so far:" in last and "'kept'" in last


class Frontend:
    """Just enough of a widget frontend: tracks widget models, sends their events."""

    def __init__(self, kc):
        self.kc = kc
        self.models: dict[str, dict] = {}
        self.updates: list[tuple[float, str]] = []  # (time, model id) of each state update
        self.stdout: list[str] = []
        self.views: list[str] = []
        self.closed: set[str] = set()

    def _handle(self, msg) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
            self.models[content["comm_id"]] = dict(content["data"]["state"])
        elif kind == "comm_msg" and content["data"].get("method") == "update":
            self.models.setdefault(content["comm_id"], {}).update(content["data"]["state"])
            self.updates.append((time.time(), content["comm_id"]))
        elif kind == "comm_close":
            self.closed.add(content["comm_id"])
        elif kind == "stream" and content["name"] == "stdout":
            self.stdout.append(content["text"])
        elif kind == "display_data" and WIDGET_VIEW in content["data"]:
            self.views.append(content["data"][WIDGET_VIEW]["model_id"])
        elif kind == "error":
            raise AssertionError("kernel error: " + "\n".join(content["traceback"]))

    def _until_idle(self, msg_id: str, timeout: float = 60) -> None:
        for msg in kernel_messages(self.kc.get_iopub_msg, timeout):
            self._handle(msg)
            if (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
                    and msg["parent_header"].get("msg_id") == msg_id):
                return
        raise TimeoutError("the kernel did not finish")

    def execute(self, code: str) -> str:
        self.stdout.clear()
        self._until_idle(self.kc.execute(code))
        return "".join(self.stdout)

    def send(self, model_id: str, data: dict) -> None:
        msg = self.kc.session.msg("comm_msg", {"comm_id": model_id, "data": data})
        self.kc.shell_channel.send(msg)
        self._until_idle(msg["header"]["msg_id"])

    def set_value(self, model_id: str, value) -> None:
        self.send(model_id, {"method": "update", "state": {"value": value}, "buffer_paths": []})

    def click(self, model_id: str) -> None:
        self.send(model_id, {"method": "custom", "content": {"event": "click"}})

    def html(self) -> dict[str, str]:
        """Model id -> value of every open HTML widget."""
        return {mid: s.get("value", "") for mid, s in self.models.items()
                if s.get("_model_name") == "HTMLModel" and mid not in self.closed}

    def find(self, model_name: str, **state) -> str:
        found = [mid for mid, s in self.models.items() if mid not in self.closed
                 and s.get("_model_name") == model_name
                 and all(s.get(k) == v for k, v in state.items())]
        assert len(found) == 1, (model_name, state, found)
        return found[0]


@pytest.fixture
def frontend(kernel_env):
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield Frontend(kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_frontend_checks_a_name_and_purges_it_in_a_real_kernel(frontend):
    fe = frontend
    fe.execute("%load_ext jupyter_gpumem\nimport time, torch\n"
               "x = torch.zeros(2**20)\nkeep = torch.zeros(2**18)")
    fe.execute("%gpumem panel --device cpu --interval 0.2")
    assert len(fe.views) == 1 and fe.models[fe.views[0]]["_model_name"] == "VBoxModel"
    bars = next(mid for mid, value in fe.html().items() if "data-segment=" in value)

    before = len(fe.updates)
    start = time.time()
    fe.execute("big = torch.ones(2**24)\ntime.sleep(0.8)\ndel big\ntime.sleep(0.8)")
    cell_end = start + 1.5  # the cell sleeps 1.6 s: what came before is from the thread
    during = [t for t, mid in fe.updates[before:] if mid == bars and start < t < cell_end]
    assert len(during) >= 2, during  # the bars moved while the cell ran: up 64 MiB, down

    fe.set_value(fe.find("CheckboxModel", description="x"), True)
    purge = fe.find("ButtonModel", description="Purge 1 checked", disabled=False)
    fe.click(purge)
    assert "x" in fe.execute("print(sorted(k for k in ('x', 'keep') if k in globals()))")
    fe.click(fe.find("ButtonModel", description="Yes, purge"))
    assert fe.execute("print('x' in globals(), 'keep' in globals())").strip() == "False True"
    result = [value for value in fe.html().values() if "data-purge-result" in value]
    assert result and "freed 4.0 MiB on cpu" in result[0]
    labels = {s.get("description") for mid, s in fe.models.items()
              if s.get("_model_name") == "CheckboxModel"}
    assert "keep" in labels

    fe.execute("%gpumem panel --close")
    assert fe.views[0] in fe.closed
    names = fe.execute("import threading\nprint([t.name for t in threading.enumerate()])")
    # nothing else subscribed to the session's sampling thread here: it ended with the panel
    assert "jupyter_gpumem-panel" not in names and "jupyter_gpumem-sampler" not in names


def test_a_click_over_a_subshell_while_a_cell_runs_is_queued_and_runs_after_it(frontend):
    """JupyterLab 4.6 sends widget messages over a kernel subshell: a click is handled on
    the subshell's thread while the main thread runs a cell (the panel keeps its widgets'
    route there, views/routes.py, though the kernel's own messages on them come from the
    main thread and the sampling thread). The panel says at once that the purge waits for
    the cell; its dry run runs on the main thread once the cell has ended."""
    fe = frontend
    fe.execute("%load_ext jupyter_gpumem\nimport time, torch, threading\n"
               "x = torch.zeros(2**20)\nkeep = torch.zeros(2**18)\n"
               "import jupyter_gpumem.core.purge as _P\nseen = []\n_real = _P.purge\n"
               "def _rec(*a, **k):\n"
               "    seen.append((threading.current_thread().name, k.get('dry_run', False)))\n"
               "    return _real(*a, **k)\n"
               "_P.purge = _rec")
    fe.execute("%gpumem panel --device cpu --interval 0.2")
    control = fe.kc.session.msg("create_subshell_request", {})
    fe.kc.control_channel.send(control)
    subshell = fe.kc.control_channel.get_msg(timeout=30)["content"]["subshell_id"]

    def over_subshell(model_id: str, data: dict) -> str:
        msg = fe.kc.session.msg("comm_msg", {"comm_id": model_id, "data": data})
        msg["header"]["subshell_id"] = subshell
        fe.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    fe._until_idle(over_subshell(fe.find("CheckboxModel", description="x"),
                                 {"method": "update", "state": {"value": True},
                                  "buffer_paths": []}))
    purge = fe.find("ButtonModel", description="Purge 1 checked", disabled=False)
    cell = fe.kc.execute("time.sleep(3)\nseen.append(('cell ended', None))")
    time.sleep(1.0)     # the bars move meanwhile: kernel messages from other threads
    start = time.monotonic()
    fe._until_idle(over_subshell(purge, {"method": "custom", "content": {"event": "click"}}),
                   timeout=30)
    answered = time.monotonic() - start
    status = [v for v in fe.html().values() if "purge queued: runs when the cell ends" in v]
    assert status and answered < 1.5, (answered, status)
    print(f"the click was answered in {answered:.3f} s while the cell ran")
    fe._until_idle(cell)
    seen = fe.execute("print(seen)")
    assert seen.strip() == "[('cell ended', None), ('MainThread', True)]", seen
    assert [v for v in fe.html().values() if "Delete <b>x</b>" in v]
    fe.click(fe.find("ButtonModel", description="Yes, purge"))
    assert fe.execute("print('x' in globals(), 'keep' in globals())").strip() == "False True"
    assert "('MainThread', False)" in fe.execute("print(seen)")
