"""This user's running Jupyter servers (found as ``jupyter server list`` finds them) and
their answers, each asked with a bound on the time: a server that does not answer in
time, refuses, or has no jupyter_gpumem extension is named with why, never waited on."""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

try:
    from jupyter_server.serverapp import list_running_servers
except ImportError:          # no Jupyter server installed: no server to ask
    list_running_servers = None

TIMEOUT = 5.0
KERNELS = "api/gpumem/kernels"


@dataclass
class Asked:
    """A server, and its answer to one request or why there is none."""

    info: dict
    status: int | None = None
    answer: object = None
    error: str | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.info.get("url") or f"unix socket {self.info.get('sock')}"

    @property
    def ok(self) -> bool:
        return self.error is None


def running(runtime_dir: str | None = None) -> list[dict]:
    """The info of each running Jupyter server of this user (its runtime files)."""
    if list_running_servers is None:
        return []
    return sorted(list_running_servers(runtime_dir),
                  key=lambda i: (str(i.get("url")), i.get("pid") or 0))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _connection(info: dict, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection to the server and the path of its base URL."""
    if info.get("sock"):
        return _UnixConnection(info["sock"], timeout), info.get("base_url") or "/"
    parts = urlsplit(info["url"])
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    return conn, parts.path or "/"


def request(info: dict, method: str, path: str, timeout: float = TIMEOUT) -> Asked:
    """``method path`` (relative to the server's base URL) with the server's token."""
    out = Asked(info)
    t0 = time.monotonic()
    try:
        conn, base = _connection(info, timeout)
        headers = {"Authorization": f"token {info['token']}"} if info.get("token") else {}
        try:
            conn.request(method, base.rstrip("/") + "/" + path, headers=headers)
            response = conn.getresponse()
            out.status = response.status
            body = response.read()
        finally:
            conn.close()
    except (socket.timeout, TimeoutError):
        out.error = f"no answer within {timeout:g} s"
    except ssl.SSLError as exc:
        out.error = f"TLS: {exc.reason or exc}"
    except OSError as exc:
        out.error = f"cannot connect ({exc.strerror or type(exc).__name__})"
    except (http.client.HTTPException, ValueError, KeyError) as exc:
        out.error = f"no HTTP answer ({type(exc).__name__})"
    out.seconds = time.monotonic() - t0
    if out.error is not None:
        return out
    if out.status in (401, 403):
        out.error = (f"not allowed ({out.status}): the server wants a password or another "
                     "token")
    elif out.status == 404 and path.startswith("api/gpumem"):
        out.error = "no jupyter_gpumem extension enabled there (404)"
    elif out.status is not None and out.status >= 400:
        out.error = f"HTTP {out.status}{_message(body)}"
    elif body:
        try:
            out.answer = json.loads(body)
        except ValueError:
            out.error = "an answer that is not JSON"
    return out


def _message(body: bytes) -> str:
    try:
        return ": " + str(json.loads(body)["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return ""


def ask_all(infos: list[dict], method: str, path: str, timeout: float = TIMEOUT) -> list[Asked]:
    """Each server asked at once (a thread each), each within ``timeout``."""
    if not infos:
        return []
    with ThreadPoolExecutor(max_workers=min(len(infos), 16)) as pool:
        return list(pool.map(lambda i: request(i, method, path, timeout), infos))


def kernel_url(kernel_id: str) -> str:
    return "api/kernels/" + quote(kernel_id, safe="")
