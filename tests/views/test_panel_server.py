"""``%gpumem panel`` with 2,300 holders in a real kernel behind a real ``jupyter server``,
driven over the server's kernel websocket as a browser's frontend drives it, so the
server's IOPub rate limiter (1,000 messages a second over 3 s, by default) applies: the
panel appears, nothing says "IOPub message rate exceeded", and selecting all of ``Out``
(300 values) purges them in one confirmation that names the notebook. The time the panel
took is printed (no timing assert)."""
from __future__ import annotations

import json
import time
import uuid

import pytest

pytest.importorskip("torch")
pytest.importorskip("ipywidgets")
websocket = pytest.importorskip("websocket")

from jupyter_harness import TOKEN, Server  # noqa: E402

RATE = "IOPub message rate exceeded"
NAMES, OUTS = 2000, 300


class Browser:
    """Just enough of a frontend over the server's websocket (the JSON wire form)."""

    def __init__(self, server: Server, kernel_id: str):
        self.session = uuid.uuid4().hex
        url = (server.base.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels"
               f"?session_id={self.session}")
        self.ws = websocket.create_connection(url, header=[f"Authorization: token {TOKEN}"],
                                              timeout=120)
        self.models: dict[str, dict] = {}
        self.closed: set[str] = set()
        self.streams: list[str] = []
        self.errors: list[str] = []

    def _send(self, msg_type: str, content: dict, channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": msg_type, "session": self.session,
                       "username": "test", "version": "5.3",
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "parent_header": {}, "metadata": {}, "content": content, "buffers": [],
            "channel": channel}))
        return msg_id

    def _handle(self, msg: dict) -> None:
        kind, content = msg["header"]["msg_type"], msg.get("content") or {}
        if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
            self.models[content["comm_id"]] = dict(content["data"]["state"])
        elif kind == "comm_msg" and (content.get("data") or {}).get("method") == "update":
            self.models.setdefault(content["comm_id"], {}).update(content["data"]["state"])
        elif kind == "comm_close":
            self.closed.add(content.get("comm_id"))
        elif kind == "stream":
            self.streams.append(content["text"])
        elif kind == "error":
            self.errors.append("\n".join(content.get("traceback") or ()))

    def until_idle(self, msg_id: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("channel") == "iopub":
                self._handle(msg)
                if (msg["header"]["msg_type"] == "status"
                        and msg["parent_header"].get("msg_id") == msg_id
                        and msg["content"]["execution_state"] == "idle"):
                    return
        raise TimeoutError("the kernel did not finish")

    def execute(self, code: str) -> str:
        start = len(self.streams)
        self.until_idle(self._send("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True}))
        assert not self.errors, self.errors[-1]
        return "".join(self.streams[start:])

    def widget_msg(self, model_id: str, data: dict) -> None:
        self.until_idle(self._send("comm_msg", {"comm_id": model_id, "data": data}))

    def set_value(self, model_id: str, value) -> None:
        self.widget_msg(model_id, {"method": "update", "state": {"value": value},
                                   "buffer_paths": []})

    def click(self, model_id: str) -> None:
        self.widget_msg(model_id, {"method": "custom", "content": {"event": "click"}})

    def find(self, model_name: str, test=lambda s: True) -> str:
        found = [mid for mid, s in self.models.items() if mid not in self.closed
                 and s.get("_model_name") == model_name and test(s)]
        assert len(found) == 1, (model_name, len(found))
        return found[0]


@pytest.fixture
def browser(tmp_path):
    server = Server(tmp_path, fake_nvml=False)
    try:
        kernel_id, client = server.session("a.ipynb")
        b = Browser(server, kernel_id)
        try:
            yield b
        finally:
            b.ws.close()
    finally:
        server.stop()


def test_a_panel_of_2300_holders_appears_within_the_rate_limit_and_purges_all_of_out(browser):
    b = browser
    b.execute("%load_ext jupyter_gpumem\nimport torch\n"
              f"for i in range({NAMES}): globals()[f'n{{i}}'] = torch.ones(8)")
    for _ in range(OUTS):
        b.execute("torch.ones(8)")
    start = time.perf_counter()
    b.execute("%gpumem panel --device cpu")
    took = time.perf_counter() - start
    out = "".join(b.streams)
    print(f"%gpumem panel with {NAMES} names and {OUTS} Out values: {took:.2f} s, "
          f"{len(b.models)} widget models")
    assert RATE not in out
    rows = [s for s in b.models.values() if s.get("_model_name") == "CheckboxModel"]
    assert 0 < len(rows) <= 60, "a page of rows, not a widget per holder"
    where = b.find("HTMLModel", lambda s: "data-page=" in str(s.get("value")))
    assert f"of {NAMES + OUTS}" in b.models[where]["value"]

    text = b.find("TextModel", lambda s: s.get("placeholder") == "filter names")
    b.set_value(text, "Out[")
    check_all = b.find("ButtonModel", lambda s: s.get("description", "").startswith("Check all"))
    assert b.models[check_all]["description"] == f"Check all {OUTS} shown"
    b.click(check_all)
    purge = b.find("ButtonModel", lambda s: s.get("description") == f"Purge {OUTS} checked")
    assert b.models[purge]["disabled"] is False
    b.click(purge)
    question = b.find("HTMLModel", lambda s: "Delete <b>" in str(s.get("value")))
    asked = b.models[question]["value"]
    assert f"({OUTS} names)" in asked and "a.ipynb" in asked
    b.click(b.find("ButtonModel", lambda s: s.get("description") == "Yes, purge"))
    left = b.execute("print(sum(torch.is_tensor(v) for v in Out.values()), "
                     f"sum(f'n{{i}}' in globals() for i in range({NAMES})))")
    assert left.split() == ["0", str(NAMES)]
    assert RATE not in "".join(b.streams)
    status = [s["value"] for s in b.models.values()
              if isinstance(s.get("value"), str) and "purged Out[" in s["value"]]
    assert status and f"and {OUTS - 10} more" in status[0]
