"""The namespace is touched on the main thread only (jupyter_gpumem/handoff.py), in a real
IPython shell: what another thread hands over runs on the main thread, between cells.
A real kernel's side of it (subshells, the comm) is in tests/views/test_comm_kernel.py."""
from __future__ import annotations

import threading

from tornado.ioloop import IOLoop

from conftest import run
from jupyter_gpumem.handoff import CANCELLED, DONE, MainThreadQueue
from jupyter_gpumem.session import session_of


def _from_thread(fn):
    """Call ``fn()`` on a new thread; its return value."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    return out["value"]


def test_on_the_main_thread_between_cells_it_runs_at_once(ip):
    queue = session_of(ip).handoff
    seen = []
    ticket = queue.submit(lambda: seen.append(threading.current_thread()) or 7, what="probe")
    assert ticket.state == DONE and ticket.result == 7 and not ticket.queued
    assert seen == [threading.main_thread()] and not ticket.cancel()


def test_asked_from_a_thread_while_a_cell_runs_it_runs_as_the_cell_ends(ip):
    queue = session_of(ip).handoff
    ip.user_ns["_handoff"] = queue
    ip.user_ns["_from_thread"] = _from_thread
    order = ip.user_ns["order"] = []
    run(ip, "t = _from_thread(lambda: _handoff.submit("
            "lambda: order.append(('purge', __import__('threading').current_thread())),"
            " what='purge'))\n"
            "order.append(('cell ran', t.queued, t.state, _handoff.cell_running))")
    ticket = ip.user_ns["t"]
    assert order[0] == ("cell ran", True, "pending", True)
    assert order[1] == ("purge", threading.main_thread()), order
    assert ticket.state == DONE and ticket.thread is threading.main_thread()
    assert not queue.cell_running and not queue.pending()


def test_a_queued_request_cancelled_never_runs(ip):
    queue = session_of(ip).handoff
    ip.user_ns.update(_handoff=queue, _from_thread=_from_thread, ran=[])
    run(ip, "t = _from_thread(lambda: _handoff.submit(lambda: ran.append(1), what='purge'))\n"
            "cancelled = _from_thread(t.cancel)\n"
            "again = t.cancel()")
    ticket = ip.user_ns["t"]
    assert ip.user_ns["cancelled"] is True and ip.user_ns["again"] is False
    assert ticket.state == CANCELLED and ticket.done and ip.user_ns["ran"] == []


def test_a_failing_request_keeps_its_error_and_the_next_still_runs(ip, capsys):
    queue = session_of(ip).handoff
    ip.user_ns.update(_handoff=queue, _from_thread=_from_thread, ran=[])
    run(ip, "bad = _from_thread(lambda: _handoff.submit(lambda: 1 / 0, what='purge'))\n"
            "good = _from_thread(lambda: _handoff.submit(lambda: ran.append(2), what='scan'))")
    assert isinstance(ip.user_ns["bad"].error, ZeroDivisionError)
    assert ip.user_ns["ran"] == [2] and ip.user_ns["good"].state == DONE
    assert "purge failed: ZeroDivisionError" in capsys.readouterr().err


def test_asked_from_a_thread_while_idle_it_runs_on_the_main_threads_loop():
    """A kernel's idle main thread: the queue hands the request to its event loop."""
    loop = IOLoop(make_current=False)
    queue = MainThreadQueue(loop_of=lambda: loop)
    seen = []

    def ask():
        ticket = queue.submit(lambda: seen.append(threading.current_thread()), what="scan")
        loop.add_callback(loop.stop)        # after the handed request, in order
        return ticket

    ticket = _from_thread(ask)
    assert not ticket.queued and ticket.state == "pending" and seen == []
    loop.start()
    loop.close()
    assert seen == [threading.main_thread()] and ticket.state == DONE


def test_without_a_loop_a_request_from_a_thread_waits_for_the_next_cell(ip):
    queue = session_of(ip).handoff
    ran = []
    ticket = _from_thread(lambda: queue.submit(
        lambda: ran.append(threading.current_thread()), what="purge"))
    assert ticket.queued and ran == [], "a terminal IPython has no loop to hand it to"
    run(ip, "x = 1")
    assert ran == [threading.main_thread()] and ticket.state == DONE


def test_closing_the_session_cancels_what_waits(ip):
    queue = session_of(ip).handoff
    ticket = _from_thread(lambda: queue.submit(lambda: None, what="purge"))
    run(ip, "%unload_ext jupyter_gpumem")
    try:
        assert ticket.state == CANCELLED
        late = queue.submit(lambda: None, what="purge")
        assert late.state == CANCELLED
    finally:
        run(ip, "%load_ext jupyter_gpumem")


def test_a_request_waiting_for_a_cell_whose_end_never_came_runs_once_that_is_known(ip):
    """IPython fires "pre" without "post" for a cell run by awaiting ``run_cell_async``:
    a request queued behind it runs as soon as its end is known (the next cell's "pre"),
    before that cell's own code, not after the next cell that happens to end."""
    import asyncio

    queue = session_of(ip).handoff
    asyncio.run(ip.run_cell_async("unseen = 1", transformed_cell="unseen = 1\n"))  # no "post"
    assert queue.cell_running
    order = ip.user_ns["order"] = []
    ticket = _from_thread(lambda: queue.submit(lambda: order.append("request"), what="probe"))
    assert ticket.queued and ticket.state == "pending"
    run(ip, "order.append('next cell')")
    assert order == ["request", "next cell"], order
    assert ticket.thread is threading.main_thread() and not queue.pending()
