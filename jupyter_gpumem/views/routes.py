"""Keep a view's comms answering on the subshell the frontend sends on.

JupyterLab 4.6 sends comm messages over kernel subshells, so a request can be answered
while the main thread runs a cell (and handed to it by the session's ``handoff``). But
ipykernel 7.4 routes a comm's incoming messages to the subshell that last *published* on
that comm (``ipykernel/comm/comm.py``: ``_reply_subshell_for``, ``_reply_subshell_id``),
and a message sent from a thread of ours (the sampling thread) or from the main thread
carries the parent of the last shell message: the running cell's. One kernel message on a
view's comm during a cell, and the frontend's next click or request waits for the cell.

A :class:`Route` notes the subshell of each message from the frontend (:meth:`heard`)
and, after each message the kernel sends on a comm it follows, puts that comm's route back
to it (:meth:`keep`). The sidebar's channel and the panel's widgets share this one rule.
A comm without ipykernel's routing (another kernel, a test's comm) is left as it is.

A followed comm is never routed to a subshell the kernel does not have
(:func:`guard`): JupyterLab can hand a new comm a subshell it is deleting (its comm
handler shares one subshell per comm target and kernel, and deletes it after the last comm
of the target closed even when a new one took it meanwhile), and ipykernel then drops each
message with "Unknown subshell_id". Such a message goes to the main shell instead.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

_UNKNOWN = object()


class Route:
    """The subshell a frontend's messages come on, kept as the route of the comms it
    follows (see the module docstring)."""

    def __init__(self) -> None:
        self.subshell: Any = _UNKNOWN
        self._lock = threading.Lock()
        self._comms: weakref.WeakSet = weakref.WeakSet()     # the widgets' comms followed

    @property
    def known(self) -> bool:
        return self.subshell is not _UNKNOWN

    def heard(self, msg: Any) -> None:
        """Note the subshell a message from the frontend came on (None: the main shell)."""
        header = msg.get("header") if isinstance(msg, dict) else None
        if not isinstance(header, dict):
            return
        with self._lock:
            changed = self.subshell != header.get("subshell_id")
            self.subshell = header.get("subshell_id")
        if changed:         # every comm followed answers there from now on
            for comm in list(self._comms):
                self.keep(comm)

    def keep(self, comm: Any) -> None:
        """Route the frontend's next messages on ``comm`` to its subshell, not to the
        thread that sent the kernel's last message on it."""
        lock = getattr(comm, "_reply_subshell_lock", None)
        if lock is None:
            return
        guard(comm)
        subshell = self.subshell
        if subshell is _UNKNOWN:
            return
        with lock:
            comm._reply_subshell_id = subshell

    def follow_widget(self, widget: Any) -> None:
        """Follow an ipywidgets widget's comm: hear its messages from the frontend and
        keep its route after each message it publishes."""
        comm = getattr(widget, "comm", None)
        handle = getattr(widget, "_handle_msg", None)
        if comm is None or handle is None or getattr(comm, "_gpumem_route", None) is self:
            return
        comm._gpumem_route = self

        def on_msg(msg: Any) -> None:
            self.heard(msg)
            handle(msg)

        publish = comm.publish_msg

        def publish_msg(*args: Any, **kwargs: Any) -> Any:
            try:
                return publish(*args, **kwargs)
            finally:
                self.keep(comm)

        comm.on_msg(on_msg)
        comm.publish_msg = publish_msg
        self._comms.add(comm)
        self.keep(comm)


def _subshells(comm: Any) -> "list[str] | None":
    """The subshells the kernel of ``comm`` has now, or None where it cannot be told."""
    kernel = getattr(comm, "kernel", None)
    manager = getattr(getattr(kernel, "shell_channel_thread", None), "manager", None)
    listed = getattr(manager, "list_subshell", None)
    if listed is None:
        return None
    try:
        return list(listed())
    except Exception:  # noqa: BLE001 - a kernel shutting down: leave the route alone
        return None


def guard(comm: Any) -> None:
    """Route the frontend's messages on ``comm`` to the main shell wherever ipykernel
    would route them to a subshell it does not have (see the module docstring). Once per
    comm; the comm is held weakly."""
    if getattr(comm, "_gpumem_guarded", False):
        return
    route = getattr(type(comm), "_reply_subshell_for", None)
    if route is None:
        return
    ref = weakref.ref(comm)

    def routed(data: Any, default: Any) -> Any:
        held = ref()
        subshell = route(held, data, default) if held is not None else default
        if subshell is None:
            return None
        known = _subshells(held)
        return subshell if known is None or subshell in known else None

    comm._reply_subshell_for = routed
    comm._gpumem_guarded = True
