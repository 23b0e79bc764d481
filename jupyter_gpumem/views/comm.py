"""Comm target ``jupyter_gpumem``: the kernel side of the JupyterLab sidebar.

It answers ``hello``, sends ``devices`` from the session's sampling thread (device
counters only) and a ``snapshot`` after each cell (the session's). Requests are checked
field by field before anything runs; a malformed one gets an ``error`` reply and changes
nothing; no text from the frontend is executed. What reads or changes the namespace goes
through the session's :class:`~jupyter_gpumem.handoff.MainThreadQueue` (rule 8), and
:mod:`.routes` keeps the comm's route on the frontend's subshell. The messages:
docs/PROTOCOL.md; the threads: docs/ARCHITECTURE.md#the-live-panel-and-the-sidebars-comm.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from ..api import __version__
from ..core import devices as _devices
from ..core.processes import orphans as _orphans
from ..core import purge as _purge
from ..core.sampler import Subscription
from ..session import close_session, open_session, session_of
from ..units import one_line
from .routes import Route

TARGET = "jupyter_gpumem"
INTERVAL = 1.0  # seconds between two ``devices`` messages
JOIN_TIMEOUT = 5.0  # seconds to wait for the sampling thread on unload
MAX_NAMES = 4096
MAX_NAME_LENGTH = 512
MAX_DEVICE_LENGTH = 32
MAX_ERROR_LENGTH = 300
TIMELINE_SECONDS = 600.0  # the timeline a ``hello`` carries: the last 10 minutes,
TIMELINE_POINTS = 600     # at most this many points
QUEUED = "queued: runs when the cell ends"
#: requests that read or change the user's namespace: run on the main thread, between cells
NAMESPACE_REQUESTS = ("refresh", "set_device", "purge", "purge_orphans")

# Fields each request may carry besides "type" and "id": name -> required.
_REQUEST_FIELDS: dict[str, dict[str, bool]] = {
    "refresh": {},
    "purge": {"names": True, "dry_run": False},
    "set_device": {"device": True},
    "purge_orphans": {"dry_run": False},
    "hello": {},
    "cancel": {"request": True},
}

class MessageError(ValueError):
    """A request from the frontend that does not follow the protocol."""


def register_comm(ip: Any) -> None:
    """Register the comm target and the after-cell hook on the shell ``ip``.

    Called by ``load_ipython_extension``; calling it again is harmless.
    """
    owns_session = session_of(ip) is None
    session = open_session(ip)
    if session.comm_hub is not None:
        return
    hub = session.comm_hub = _Hub(ip, session, owns_session)
    hub.start()


def hub_of(ip: Any) -> "_Hub | None":
    """What :func:`register_comm` added to the shell ``ip`` (kept by its session)."""
    session = session_of(ip)
    return session.comm_hub if session is not None else None


def unregister_comm(ip: Any) -> None:
    """Remove what :func:`register_comm` added: comm target, open comms and their
    sampling; the session too where the comm made it (registered without the extension:
    its close is the teardown, the hub's included)."""
    session = session_of(ip)
    hub = session.comm_hub if session is not None else None
    if hub is None:
        return
    if hub.owns_session:
        close_session(ip)
    else:
        session.comm_hub = None
        hub.close()


def _short(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and len(value) <= 128


def parse_request(data: Any) -> tuple[str, Any, dict]:
    """Check one request from the sidebar; return ``(type, id, fields)``.

    Raises :class:`MessageError` with a one-line reason for anything that is
    not exactly a protocol request: wrong types, unknown types or fields,
    too many or too long names.
    """
    if not isinstance(data, dict):
        raise MessageError("a request must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise MessageError('a request needs a string "type"')
    if "id" in data and not _valid_id(data["id"]):
        raise MessageError('"id" must be a string or an integer')
    spec = _REQUEST_FIELDS.get(kind)
    if spec is None:
        raise MessageError(f"unknown request type {_short(kind)}")
    extra = sorted(str(k) for k in data if k not in spec and k not in ("type", "id"))
    if extra:
        raise MessageError(f"unknown field(s) for {kind!r}: {', '.join(map(_short, extra))}")
    missing = [k for k, required in spec.items() if required and k not in data]
    if missing:
        raise MessageError(f"{kind!r} needs {', '.join(repr(m) for m in missing)}")
    fields = {k: data[k] for k in spec if k in data}
    if kind in ("purge", "purge_orphans"):
        if kind == "purge":
            fields["names"] = _check_names(fields["names"])
        dry_run = fields.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise MessageError('"dry_run" must be true or false')
        fields["dry_run"] = dry_run
    elif kind == "cancel":
        if not _valid_id(fields["request"]):
            raise MessageError('"request" must be the id of a queued request')
    elif kind == "set_device":
        device = fields["device"]
        if not isinstance(device, str) or not 0 < len(device) <= MAX_DEVICE_LENGTH:
            raise MessageError('"device" must be a short string such as "cpu" or "cuda:0"')
    return kind, data.get("id"), fields


def _check_names(names: Any) -> list[str]:
    if not isinstance(names, list) or not names:
        raise MessageError('"names" must be a non-empty list of strings')
    if len(names) > MAX_NAMES:
        raise MessageError(f'"names" holds {len(names)} names; at most {MAX_NAMES}')
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise MessageError('"names" must be a non-empty list of strings')
        if len(name) > MAX_NAME_LENGTH or not name.isprintable():
            raise MessageError(f"not a name: {_short(name)}")
    return list(names)


class _Channel:
    """One open comm: its device selection and its request handling."""

    def __init__(self, hub: "_Hub", comm: Any):
        self.hub = hub
        self.comm = comm
        self.device = hub.session.default_device
        self.closed = False
        #: request id -> its ticket, while it waits for the running cell (``cancel``)
        self.queued: dict[Any, Any] = {}
        # held while a request is handed over and its "queued" sent: its own replies
        # (on the main thread, at the cell's end) never go before that
        self._handing = threading.RLock()
        #: the subshell the frontend's messages come on, kept as the comm's route
        self.route = Route()

    def send(self, data: dict) -> bool:
        """Send one message; False (and forget this comm) if it cannot go."""
        if self.closed:
            return False
        try:
            self.comm.send(data)
        except Exception:  # noqa: BLE001 - a broken comm must not break the kernel
            self.hub.forget(self)
            return False
        self.route.keep(self.comm)
        return True

    def error(self, message: str, reply_to: Any = None) -> None:
        data = {"type": "error", "message": one_line(message, MAX_ERROR_LENGTH)}
        if reply_to is not None:
            data["reply_to"] = reply_to
        self.send(data)

    def on_msg(self, msg: dict) -> None:
        """Handle one request (any thread); never raises. What touches the namespace is
        handed to the main thread (the session's ``handoff``)."""
        self.route.heard(msg)
        data = (msg.get("content") or {}).get("data") if isinstance(msg, dict) else None
        rid = data.get("id") if isinstance(data, dict) and _valid_id(data.get("id")) else None
        try:
            kind, rid, fields = parse_request(data)
            if kind == "set_device":
                fields["device"] = _devices.parse_device(fields["device"])
        except (MessageError, ValueError) as exc:
            self.error(str(exc), rid)
            return
        if kind == "hello":
            self.send(self.hub.hello(self, rid))
        elif kind == "cancel":
            self.cancel(fields["request"], rid)
        else:
            self.hand_over(kind, fields, rid)

    def hand_over(self, kind: str, fields: dict, rid: Any) -> None:
        """Run the request on the main thread between cells; say "queued" at once when
        it waits for a running cell."""
        def run() -> None:
            with self._handing:         # the "queued" reply, if any, went first
                self.queued.pop(rid, None)
            self.run(kind, fields, rid)

        with self._handing:
            ticket = self.hub.session.handoff.submit(run, what=f"the sidebar's {kind}")
            if ticket.queued and not ticket.done:
                if rid is not None:
                    self.queued[rid] = ticket
                data = {"type": "queued", "request": kind, "message": QUEUED}
                if rid is not None:
                    data["reply_to"] = rid
                self.send(data)
            elif ticket.state == "cancelled":
                self.error(f"{kind} not run: the kernel's extension is unloading", rid)

    def cancel(self, request: Any, rid: Any) -> None:
        with self._handing:
            ticket = self.queued.pop(request, None)
        if ticket is not None and ticket.cancel():
            data = {"type": "cancelled", "request": request}
            if rid is not None:
                data["reply_to"] = rid
            self.send(data)
        elif ticket is not None:
            self.error(f"request {_short(str(request))} already ran", rid)
        else:
            self.error(f"no queued request {_short(str(request))}: it already ran "
                       "or was never queued", rid)

    def run(self, kind: str, fields: dict, rid: Any) -> None:
        """Run one request that touches the namespace (main thread, between cells)."""
        if self.closed:
            return
        try:
            if kind == "refresh":
                self.send_snapshot(reply_to=rid)
            elif kind == "set_device":
                self.device = fields["device"]
                self.send_snapshot(reply_to=rid)
            elif kind == "purge":
                self.purge(fields["names"], fields["dry_run"], rid)
            elif kind == "purge_orphans":
                self.purge_orphans(fields["dry_run"], rid)
        except Exception as exc:  # noqa: BLE001 - never raise into the kernel
            self.error(f"{kind} failed: {type(exc).__name__}: {exc}", rid)

    def purge(self, names: list[str], dry_run: bool, rid: Any) -> None:
        try:
            result = self.hub.session.purge(names, dry_run=dry_run, device=self.device,
                                            time_limit=self.hub.session.time_limit)
        except _purge.PurgeError as exc:
            self.error(str(exc), rid)
            return
        self.send({"type": "purge_result", "result": result.to_json(), "reply_to": rid})
        if dry_run:
            return
        self.hub.session.refresh_now()   # every open view (this one, others, the panel)

    def purge_orphans(self, dry_run: bool, rid: Any) -> None:
        """This user's orphans on the GPUs ended (the sidebar confirmed it first)."""
        result = _orphans.purge_orphans(dry_run=dry_run)
        self.send({"type": "orphans_result", "result": result.to_json(), "reply_to": rid})
        if not dry_run:
            self.hub.session.refresh_now()

    def send_snapshot(self, reply_to: Any = None) -> None:
        self.show_snapshot(self.hub.session.snapshot_json(self.device), reply_to)

    def show_error(self, text: str) -> None:
        self.error(text)

    def show_snapshot(self, snap: dict, reply_to: Any = None) -> None:
        """Send a PROTOCOL snapshot (the session's after a cell, or one asked for)."""
        data = {"type": "snapshot", "snapshot": snap}
        if reply_to is not None:
            data["reply_to"] = reply_to
        self.send(data)

    def on_close(self, msg: Any = None) -> None:
        self.hub.forget(self)


class _Hub:
    """Everything the comm target added to one shell."""

    def __init__(self, shell: Any, session: Any, owns_session: bool):
        self.shell = shell
        self.session = session
        #: the session was made for the comm (registered without the extension)
        self.owns_session = owns_session
        #: seconds between two ``devices`` messages (read when the sampler starts)
        self.interval = INTERVAL
        self._channels: list[_Channel] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._sampler: Subscription | None = None   # to the session's sampling thread
        self._last_thread_error: str | None = None
        #: the kernel's timeline while a channel is open: (unix s, {device id: figures})
        self._timeline: collections.deque = collections.deque(maxlen=TIMELINE_POINTS)

    # -- set up and tear down (main thread) -------------------------------
    def start(self) -> None:
        import comm

        comm.get_comm_manager().register_target(TARGET, self.on_open)

    def close(self) -> None:
        """Unregister the target, close the open comms and end their sampling (the
        session closes it, or :func:`unregister_comm`)."""
        self._stopped.set()
        try:
            import comm

            manager = comm.get_comm_manager()
            if manager.targets.get(TARGET) == self.on_open:
                manager.unregister_target(TARGET, self.on_open)
        except Exception:  # noqa: BLE001 - unloading must not fail halfway
            pass
        with self._lock:
            channels, self._channels = self._channels, []
            sampler, self._sampler = self._sampler, None
        for channel in channels:
            channel.closed = True
            self.session.remove_view(channel)
            try:
                channel.comm.close()
            except Exception:  # noqa: BLE001
                pass
        if sampler is not None:
            sampler.stop(JOIN_TIMEOUT)

    @property
    def thread(self) -> Subscription | None:
        """The hub's subscription to the session's sampling thread while a channel is open
        (``is_alive()``, ``join()`` as a thread's; for tests and unload)."""
        return self._sampler

    @property
    def channels(self) -> list[_Channel]:
        with self._lock:
            return list(self._channels)

    # -- comm events (main thread) ----------------------------------------
    def on_open(self, comm: Any, open_msg: dict) -> None:
        """Target callback: a sidebar opened a comm."""
        channel = _Channel(self, comm)
        channel.route.heard(open_msg)
        comm.on_msg(channel.on_msg)
        comm.on_close(channel.on_close)
        with self._lock:
            if self._stopped.is_set():
                channel.closed = True
                stopped = True
            else:
                self._channels.append(channel)
                self.session.add_view(channel)
                stopped = False
        if stopped:
            comm.close()
            return
        channel.send(self.hello(channel))
        with self._lock:
            if ((self._sampler is None or self._sampler.stopped)
                    and not self._stopped.is_set() and self._channels):
                self._sampler = self.session.sampler.subscribe(self._tick, self.interval,
                                                               name="devices")

    def hello(self, channel: _Channel, reply_to: Any = None) -> dict:
        """What a newly opened view needs: the kernel's state (``busy``: a cell runs) and
        its timeline so far (at most the last 10 minutes, 600 points)."""
        data = {"type": "hello", "version": __version__, "device": channel.device,
                "busy": self.session.handoff.cell_running, "timeline": self.timeline()}
        if reply_to is not None:
            data["reply_to"] = reply_to
        return data

    def timeline(self) -> list[dict]:
        since = time.time() - TIMELINE_SECONDS
        with self._lock:
            points = [p for p in self._timeline if p[0] >= since]
        return [{"time": t, "devices": {k: dict(v) for k, v in d.items()}} for t, d in points]

    def _record(self, now: float, readings: dict) -> None:
        point: dict[str, dict] = {}
        for devices in readings.values():
            for d in devices or ():
                point[str(d.get("id"))] = {k: d.get(k) for k in
                                           ("allocated", "reserved", "used_process")}
        if point:
            with self._lock:
                self._timeline.append((now, point))

    def forget(self, channel: _Channel) -> None:
        """A channel is gone; the last one gone, the hub's sampling stops."""
        channel.closed = True
        self.session.remove_view(channel)
        sampler = None
        with self._lock:
            if channel in self._channels:
                self._channels.remove(channel)
            if not self._channels:
                sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop(JOIN_TIMEOUT)

    # -- sampling thread: counters only, never the namespace ---------------
    def _tick(self) -> None:
        """One reading per device the open channels show (shared with the thread's other
        subscribers that read the same devices in the same tick); no channel left, the
        hub's sampling stops."""
        sampler = None
        with self._lock:
            channels = list(self._channels)
            if not channels:
                sampler, self._sampler = self._sampler, None
        if not channels:
            if sampler is not None:
                sampler.stop()
            return
        read = self.session.sampler.read
        readings: dict[str, Any] = {}
        running = self.session.handoff.cell_running
        now = time.time()
        for channel in channels:
            if channel.device not in readings:
                readings[channel.device] = self._read(read, channel.device)
            devices = readings[channel.device]
            if devices is not None:
                channel.send({"type": "devices", "time": now, "devices": devices,
                              "cell_running": running})
        self._record(now, readings)

    def _read(self, read_devices: Callable, device: str) -> list[dict] | None:
        try:
            devices = [d.to_json() for d in read_devices(device)]
        except Exception as exc:  # noqa: BLE001 - report once, keep sampling
            line = one_line(f"reading devices failed: {type(exc).__name__}: {exc}",
                            MAX_ERROR_LENGTH)
            if line != self._last_thread_error:
                self._last_thread_error = line
                for channel in self.channels:
                    channel.error(line)
            return None
        self._last_thread_error = None
        return devices
