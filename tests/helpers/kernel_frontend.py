"""A real kernel (jupyter_client) and just enough of a frontend for the rescue's and the
reruns' tests: it runs cells (with a cell id in the request's metadata, as JupyterLab
sends), keeps what each cell printed and its errors, and tracks widget models so a test
can click a button through its comm."""
from __future__ import annotations

import os
import uuid

from conftest import ROOT, kernel_messages

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class Cell:
    """What one execution gave: stdout text, error names and messages, widget views."""

    def __init__(self) -> None:
        self.stdout: list[str] = []
        self.errors: list[tuple[str, str]] = []
        self.views: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.stdout)

    @property
    def ok(self) -> bool:
        return not self.errors


class Kernel:
    def __init__(self, env: dict | None = None) -> None:
        from jupyter_client import KernelManager

        extra = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                 **(env or {})}
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env={**os.environ, **extra})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.models: dict[str, dict] = {}

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def _until_idle(self, msg_id: str, cell: Cell, timeout: float) -> Cell:
        for msg in kernel_messages(self.kc.get_iopub_msg, timeout):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
                self.models[content["comm_id"]] = dict(content["data"]["state"])
            elif kind == "comm_msg" and content["data"].get("method") == "update":
                self.models.setdefault(content["comm_id"], {}).update(content["data"]["state"])
            elif kind == "stream":
                cell.stdout.append(content["text"])
            elif kind == "error":
                cell.errors.append((content["ename"], content["evalue"]))
            elif kind == "display_data" and WIDGET_VIEW in content["data"]:
                cell.views.append(content["data"][WIDGET_VIEW]["model_id"])
            if (kind == "status" and content["execution_state"] == "idle"
                    and msg["parent_header"].get("msg_id") == msg_id):
                return cell
        raise TimeoutError("the kernel did not finish")

    def run(self, code: str, cell_id: str | None = None, timeout: float = 120) -> Cell:
        """Run ``code`` as the frontend's cell ``cell_id`` (a new id when None)."""
        msg = self.kc.session.msg("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": False})
        msg["metadata"]["cellId"] = cell_id or str(uuid.uuid4())
        self.kc.shell_channel.send(msg)
        return self._until_idle(msg["header"]["msg_id"], Cell(), timeout)

    def ok(self, code: str, cell_id: str | None = None) -> str:
        cell = self.run(code, cell_id)
        assert cell.ok, (code, cell.errors, cell.text)
        return cell.text

    def comm(self, model_id: str, data: dict, timeout: float = 120) -> Cell:
        msg = self.kc.session.msg("comm_msg", {"comm_id": model_id, "data": data})
        self.kc.shell_channel.send(msg)
        return self._until_idle(msg["header"]["msg_id"], Cell(), timeout)

    def find(self, model_name: str, **state) -> list[str]:
        return [mid for mid, s in self.models.items() if s.get("_model_name") == model_name
                and all(s.get(k) == v for k, v in state.items())]
